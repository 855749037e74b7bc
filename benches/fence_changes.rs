//! A fence change at 10k fences (seeded city blocks, three 10k-vertex
//! polygons among them), two claims:
//!
//! * **apply**: one upsert made live by [`FenceIndex::apply`] (the changed
//!   fence in the delta's index beside the untouched base) against the
//!   peer, rebuilding the whole index for each change, alternated round by
//!   round;
//! * **request to live**: `PUT /fences/{id}` through the real API and
//!   HTTP, made durable in the embedded store through its committer, then
//!   live: from sending the request to its answer (sent once the set is
//!   live), p50 and p99 of each round's requests.
//!
//! `GEOGATE_ROUNDS` rounds (default 5), each reported, then the median and
//! the spread [min–max] across rounds.
//!
//! `cargo bench --bench fence_changes`

use geogate::api::{Api, ApiConfig};
use geogate::config::{StateBackend, StateConfig};
use geogate::geofence::config::FencesSource;
use geogate::geofence::generate::{random_fences, to_geojson};
use geogate::geofence::registry::FenceRegistry;
use geogate::geofence::{EvaluatorSettings, Fence, FenceChange, FenceIndex, parse_fences};
use geogate::shutdown::Drain;
use geogate::state::{FenceSupply, OpenContext};
use serde_json::Value;
use std::time::{Duration, Instant};

const FENCES: usize = 10_000;
/// Changes timed per round on the overlay, and with a full rebuild (each
/// costs a whole index).
const APPLIED: usize = 400;
const REBUILT: usize = 40;
/// Requests per round through the API.
const REQUESTS: usize = 400;
const TOKEN: &str = "bench-token-0123456789";

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// The seeded fences, read back from their GeoJSON so that each carries
/// its Feature (what the store keeps and the API serves).
fn fences() -> (Vec<Fence>, Vec<Value>) {
    let (fences, _) = random_fences(10, FENCES, 3, 10_000);
    let doc = to_geojson(&fences);
    let features = doc["features"].as_array().cloned().unwrap_or_default();
    (
        parse_fences(&doc.to_string()).expect("generated fences are valid"),
        features,
    )
}

/// Feature `i`, moved a little east: a changed geometry under the same id.
fn moved(features: &[Value], i: usize, by: f64) -> Value {
    let mut f = features[i % features.len()].clone();
    let shift = |c: &mut Value| {
        if let Some(x) = c[0].as_f64() {
            c[0] = Value::from(x + by);
        }
    };
    match f["geometry"]["type"].as_str() {
        Some("Point") => shift(&mut f["geometry"]["coordinates"]),
        Some("Polygon") => {
            for ring in f["geometry"]["coordinates"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                ring.as_array_mut().into_iter().flatten().for_each(shift);
            }
        }
        _ => {
            for poly in f["geometry"]["coordinates"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                for ring in poly.as_array_mut().into_iter().flatten() {
                    ring.as_array_mut().into_iter().flatten().for_each(shift);
                }
            }
        }
    }
    f
}

fn one_fence(feature: &Value) -> Fence {
    let doc = serde_json::json!({"type": "FeatureCollection", "features": [feature]});
    parse_fences(&doc.to_string())
        .expect("a moved fence is valid")
        .remove(0)
}

/// µs per change: the overlay's apply, then the full rebuild.
fn apply_round(fences: &[Fence], features: &[Value], round: usize) -> (f64, f64) {
    let changes: Vec<Fence> = (0..APPLIED)
        .map(|i| one_fence(&moved(features, i * 37 + round, 1e-5)))
        .collect();
    // µs per change over the first `n` changes, `make` turning a set and
    // a change into the next set.
    let timed = |n: usize, make: &dyn Fn(&FenceIndex, FenceChange) -> FenceIndex| {
        let mut set = FenceIndex::first(fences.to_vec(), 0);
        let mut times = Vec::with_capacity(n);
        for (i, fence) in changes.iter().take(n).enumerate() {
            let change = FenceChange {
                version: set.version() + 1,
                at_ms: i as i64,
                upserts: vec![fence.clone()],
                deletes: Vec::new(),
            };
            let started = Instant::now();
            set = make(&set, change);
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
        times
    };
    let mut applied = timed(APPLIED, &|set, change| set.apply(change));
    let mut rebuilt = timed(REBUILT, &|set, change| {
        FenceIndex::new(set.apply(change).fences().cloned().collect())
    });
    (median(&mut applied), median(&mut rebuilt))
}

/// p50, p99 and the slowest of request to live, ms, through the API on a
/// fresh embedded store.
async fn request_round(fences: &[Fence], features: &[Value], round: usize) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut state = StateConfig {
        backend: StateBackend::Embedded,
        ..StateConfig::default()
    };
    state.embedded.path = dir.path().join("state.sqlite");
    let settings = EvaluatorSettings::default();
    let backend = geogate::state::backends::open(
        &state,
        OpenContext {
            events: Some(dir.path().join("events.ndjson")),
            outputs: Default::default(),
            settings,
            fences: FenceSupply {
                source: FencesSource::Store,
                file: Some(fences.to_vec()),
            },
            shards: 1,
            per_fence_labels: false,
            fence_properties: Default::default(),
            drain: Drain::never(),
        },
    )
    .await
    .expect("embedded store");
    let registry = FenceRegistry::new(
        backend.fences(),
        backend.fence_journal(),
        settings,
        FencesSource::Store,
        None,
    );
    let config = ApiConfig::default();
    let api = Api::new(&config, TOKEN, registry, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(geogate::api::serve(listener, api, 64 << 20, async {
        let _ = stopped.await;
    }));
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = reqwest::Client::new();
    let mut latencies = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let feature = moved(features, i * 53 + round, 1e-5 * (round + 1) as f64);
        let id = feature["id"].as_str().unwrap_or("f0").to_owned();
        let body = feature.to_string();
        let started = Instant::now();
        let response = client
            .put(format!("{url}/fences/{id}"))
            .bearer_auth(TOKEN)
            .body(body)
            .send()
            .await
            .expect("the API answers");
        assert!(response.status().is_success(), "{}", response.status());
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let _ = stop.send(());
    let _ = server.await;
    drop(backend);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let slowest = latencies.iter().copied().fold(0.0, f64::max);
    (
        quantile(&mut latencies, 0.5),
        quantile(&mut latencies, 0.99),
        slowest,
    )
}

fn main() {
    let rounds: usize = std::env::var("GEOGATE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let (fences, features) = fences();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (mut applied, mut rebuilt, mut ratio, mut p50, mut p99, mut max) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for round in 0..rounds {
        let (a, r) = apply_round(&fences, &features, round);
        let (q50, q99, slowest) = runtime.block_on(request_round(&fences, &features, round));
        eprintln!(
            "round {round}: apply {a:.0} µs, rebuild {r:.0} µs ({:.0}×); request to live p50 {q50:.2} ms, p99 {q99:.2} ms, slowest {slowest:.2} ms",
            r / a
        );
        max.push(slowest);
        applied.push(a);
        rebuilt.push(r);
        ratio.push(r / a);
        p50.push(q50);
        p99.push(q99);
    }
    let line = |name: &str, unit: &str, v: &mut Vec<f64>| {
        let (lo, hi) = spread(v);
        println!("{name}: {:.2} {unit} [{lo:.2}–{hi:.2}]", median(v));
    };
    println!("{FENCES} fences, {rounds} rounds: median [min–max]");
    line("apply, per change", "µs", &mut applied);
    line("full rebuild, per change", "µs", &mut rebuilt);
    line("rebuild / apply", "×", &mut ratio);
    line("request to live p50", "ms", &mut p50);
    line("request to live p99", "ms", &mut p99);
    line("request to live, slowest", "ms", &mut max);
}
