//! The embedded store's size at a million tracked vehicles, and that what
//! it holds reads back intact after the file is closed and opened again.

use geogate::config::{FsyncPolicy, StateBackend, StateConfig};
use geogate::geofence::VehicleSnapshot;
use geogate::model::VehicleId;
use geogate::state::EmbeddedConfig;
use geogate::state::embedded::EmbeddedStore;
use geogate::state::local::record;
use geogate::state::local::store::{CommitBatch, Store};

const VEHICLES: usize = 1_000_000;

/// A realistic mix: a third in no fence, a third in one, a third in two
/// with a dwell pending in a third.
fn snapshot(i: usize) -> VehicleSnapshot {
    VehicleSnapshot {
        last_fix_ms: 1_772_427_600_000 + i as i64,
        members: (0..i % 3).map(|f| format!("depot-{f:02}").into()).collect(),
        pending: if i % 3 == 2 {
            vec![("yard-north".into(), 1_772_427_500_000)]
        } else {
            Vec::new()
        },
        last_digests: vec![i as u64 * 0x9e37_79b9_7f4a_7c15],
        last_heard_ms: 1_772_427_600_500 + i as i64,
        window: Vec::new(),
        position: Some((52.52 + i as f64 * 1e-6, 13.40)),
        fences_version: 41,
    }
}

#[test]
fn a_million_vehicles_take_at_most_300_bytes_each_and_read_back_intact() {
    let dir = tempfile::tempdir().unwrap();
    let config = StateConfig {
        backend: StateBackend::Embedded,
        embedded: EmbeddedConfig {
            path: dir.path().join("state.sqlite"),
        },
        fsync: FsyncPolicy::Flush,
        ..StateConfig::default()
    };
    let (mut store, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
    assert!(recovered.created && recovered.vehicles.is_empty());
    for start in (0..VEHICLES).step_by(20_000) {
        let vehicles = (start..start + 20_000)
            .map(|i| {
                let mut bytes = Vec::new();
                record::encode(&snapshot(i), &mut bytes);
                (VehicleId::from(format!("van{i:07}")), Some(bytes))
            })
            .collect();
        store.commit(&CommitBatch::vehicles_only(vehicles)).unwrap();
    }
    let per_vehicle = store.size_bytes() as f64 / VEHICLES as f64;
    eprintln!("{per_vehicle:.1} bytes per vehicle");
    assert!(per_vehicle <= 300.0, "{per_vehicle:.1} bytes per vehicle");
    drop(store);

    let (_store, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
    assert!(!recovered.created);
    assert_eq!(recovered.vehicles.len(), VEHICLES);
    for (id, got) in recovered.vehicles.iter().step_by(9973) {
        let i: usize = id.trim_start_matches("van").parse().unwrap();
        assert_eq!(*got, snapshot(i), "{id}");
    }
}
