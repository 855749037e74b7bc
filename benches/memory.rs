//! Memory per tracked vehicle: RSS with 100k distinct vehicles holding
//! state against 10k fences, above the baseline with the fences loaded.
//! Run: `cargo bench --bench memory` (prints one JSON line; not criterion).

use geo::Coord;
use geogate::geofence::generate::{SplitMix64, random_fences};
use geogate::geofence::{Evaluator, EvaluatorSettings, FenceIndex};
use geogate::model::VehicleId;
use std::sync::Arc;

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing
    // useful either: run the measurement only when asked to bench.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let vehicles = 100_000;
    let (fences, area) = random_fences(11, 10_000, 3, 10_000);
    let index = Arc::new(FenceIndex::new(fences));
    let mut evaluator = Evaluator::new(index, EvaluatorSettings::default());
    let mut rng = SplitMix64::new(5);
    let points: Vec<Coord<f64>> = (0..vehicles).map(|_| area.random_point(&mut rng)).collect();
    let mut ids: Vec<VehicleId> = Vec::with_capacity(vehicles);
    let baseline = rss_bytes();
    // The ids count: a tracked vehicle holds its id (inline up to 23 bytes).
    ids.extend((0..vehicles).map(|i| VehicleId::from(format!("van{i:06}"))));
    let mut out = Vec::new();
    for (id, p) in ids.iter().zip(&points) {
        evaluator.evaluate(id, 1_750_000_000_000, p.y, p.x, &mut out);
        out.clear();
    }
    let loaded = rss_bytes();
    let members: usize = ids
        .iter()
        .take(1000)
        .map(|id| evaluator.memberships(id).len())
        .sum();
    println!(
        "{{\"vehicles\": {vehicles}, \"fences\": 10003, \"baseline_rss\": {baseline}, \"rss\": {loaded}, \"bytes_per_vehicle\": {}, \"avg_memberships\": {:.2}}}",
        (loaded - baseline) / vehicles as u64,
        members as f64 / 1000.0
    );
}
