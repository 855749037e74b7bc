//! The two embedded stores on the pipeline's write pattern: one commit of
//! a worker batch (256 vehicle records upserted, 128 outbox lines appended,
//! the meta row updated and confirmed outbox rows pruned) into a store that
//! already tracks 100,000 vehicles.
//!
//! * SQLite through geogate's own `EmbeddedStore` (what `run` uses), with
//!   `fsync = "flush"` (WAL, synchronous=NORMAL: survives a process crash)
//!   and `"always"` (synchronous=FULL: survives power loss);
//! * redb 4 with the same tables, `Durability::Immediate` (its only
//!   crash-safe commit: fsync) and `Durability::None` (not crash-safe: a
//!   kill loses it; shown for scale only).
//!
//! Throughput is in vehicle records per second.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use geogate::config::{FsyncPolicy, StateBackend, StateConfig};
use geogate::delivery::outbox::OutboxEntry;
use geogate::geofence::{Transition, TransitionKind, VehicleSnapshot};
use geogate::model::VehicleId;
use geogate::state::EmbeddedConfig;
use geogate::state::embedded::EmbeddedStore;
use geogate::state::local::record;
use geogate::state::local::store::{CommitBatch, Store};
use redb::{Database, Durability, TableDefinition};

const TRACKED: usize = 100_000;
const BATCH: usize = 256;
const LINES: usize = 128;

const VEHICLES: TableDefinition<&str, &[u8]> = TableDefinition::new("vehicle");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

fn vehicle(i: usize) -> VehicleId {
    format!("van{i:07}").into()
}

fn state_bytes(i: usize, t: i64) -> Vec<u8> {
    let snapshot = VehicleSnapshot {
        last_fix_ms: t,
        members: (0..i % 3).map(|f| format!("depot-{f}").into()).collect(),
        last_digests: vec![i as u64],
        last_heard_ms: t,
        ..VehicleSnapshot::default()
    };
    let mut bytes = Vec::new();
    record::encode(&snapshot, &mut bytes);
    bytes
}

/// Batch `n`: 256 vehicles spread over the fleet, 128 transitions.
fn batch(n: usize, first_seq: u64) -> CommitBatch {
    let t = 1_772_427_600_000 + n as i64 * 1000;
    let vehicles = (0..BATCH)
        .map(|k| {
            let i = (n * 7919 + k * 389) % TRACKED;
            (vehicle(i), Some(state_bytes(i, t)))
        })
        .collect();
    let outbox = (0..LINES)
        .map(|k| {
            let transition = Transition {
                vehicle: vehicle((n * 31 + k) % TRACKED),
                fence: "depot-1".into(),
                event: TransitionKind::Enter,
                ts: t,
                cause: None,
                fence_version: 1,
                received_ms: t,
                source: None,
            };
            OutboxEntry::new(first_seq + k as u64, &transition, &Default::default())
        })
        .collect();
    CommitBatch {
        vehicles,
        held: Default::default(),
        outbox,
        next_seq: first_seq + LINES as u64,
        // The relay is one batch behind.
        file_cursor: first_seq.saturating_sub(1),
        mqtt_cursor: u64::MAX,
        webhook_cursor: u64::MAX,
        fences: Vec::new(),
    }
}

fn fill(store: &mut dyn Store) {
    for chunk in (0..TRACKED).collect::<Vec<_>>().chunks(10_000) {
        let vehicles = chunk
            .iter()
            .map(|&i| (vehicle(i), Some(state_bytes(i, 0))))
            .collect();
        store
            .commit(&CommitBatch::vehicles_only(vehicles))
            .expect("fill");
    }
}

struct Redb {
    db: Database,
    durability: Durability,
}

impl Store for Redb {
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), geogate::state::StateError> {
        let write = || -> Result<(), redb::Error> {
            let mut tx = self.db.begin_write()?;
            tx.set_durability(self.durability)
                .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
            {
                let mut vehicles = tx.open_table(VEHICLES)?;
                for (id, state) in &batch.vehicles {
                    match state {
                        Some(bytes) => {
                            vehicles.insert(&**id, bytes.as_slice())?;
                        }
                        None => {
                            vehicles.remove(&**id)?;
                        }
                    }
                }
                let mut outbox = tx.open_table(OUTBOX)?;
                for e in &batch.outbox {
                    outbox.insert(e.seq, e.line.as_slice())?;
                }
                let confirmed = batch.file_cursor.min(batch.mqtt_cursor);
                outbox.retain_in(..=confirmed, |_, _| false)?;
                let mut meta = tx.open_table(META)?;
                meta.insert("next_seq", batch.next_seq)?;
            }
            tx.commit()?;
            Ok(())
        };
        write().map_err(|e| geogate::state::StateError::Io {
            path: "redb".into(),
            source: std::io::Error::other(e.to_string()),
        })
    }
    fn size_bytes(&self) -> u64 {
        0
    }
    fn durable(&self) -> bool {
        matches!(self.durability, Durability::Immediate)
    }
}

fn stores(c: &mut Criterion) {
    let mut group = c.benchmark_group("state_store");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(30);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut contenders: Vec<(&str, Box<dyn Store>)> = Vec::new();
    for (name, fsync) in [
        ("sqlite_flush", FsyncPolicy::Flush),
        ("sqlite_always", FsyncPolicy::Always),
    ] {
        let config = StateConfig {
            backend: StateBackend::Embedded,
            embedded: EmbeddedConfig {
                path: dir.path().join(format!("{name}.sqlite")),
            },
            fsync,
            reset: true,
            ..StateConfig::default()
        };
        let (store, _) = EmbeddedStore::open(&config.embedded.path, &config).expect("sqlite");
        contenders.push((name, Box::new(store)));
    }
    for (name, durability) in [
        ("redb_immediate", Durability::Immediate),
        ("redb_none_not_crash_safe", Durability::None),
    ] {
        let db = Database::create(dir.path().join(format!("{name}.redb"))).expect("redb");
        contenders.push((name, Box::new(Redb { db, durability })));
    }
    for (name, store) in &mut contenders {
        fill(store.as_mut());
        let mut n = 0;
        let mut seq = 1;
        group.bench_function(*name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    let next = batch(n, seq);
                    seq = next.next_seq;
                    next
                },
                |batch| store.commit(&batch).expect("commit"),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, stores);
criterion_main!(benches);
