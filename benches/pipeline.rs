//! Decode cost per format, and the in-process pipeline (decode → admit →
//! bounded channel → evaluate) with 1 and 2 shards, against the decode-only
//! rate on the same payloads: the ceiling for any JSON pipeline.
//!
//! Payloads are the bundled capture's (`replay/shift-change.ndjson.gz`),
//! evaluated against the demo fences.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geogate::admission::{AdmissionPolicy, Decision, Gate, GateSpec, Route};
use geogate::capture;
use geogate::clock::{Clock, MonotonicClock};
use geogate::codec::{CodecSettings, decode};
use geogate::geofence::{Evaluator, EvaluatorSettings, FenceIndex, load_fences};
use geogate::model::Telemetry;
use geogate::shard::shard_of;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

fn payloads() -> Vec<(String, Vec<u8>)> {
    capture::read(Path::new("replay/shift-change.ndjson.gz"))
        .expect("bundled capture")
        .into_iter()
        .map(|r| {
            let bytes = r.payload_bytes();
            (r.topic, bytes)
        })
        .collect()
}

fn decode_formats(c: &mut Criterion) {
    let settings = CodecSettings::default();
    let native = br#"{"vehicle":"van0042","ts":1772427600000,"lat":52.512345,"lon":13.398765,"speed_kmh":37.5,"kind":"move"}"#;
    let owntracks = br#"{"_type":"location","lat":52.512345,"lon":13.398765,"tst":1772427600,"vel":38,"t":"u"}"#;
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(1));
    group.bench_function("native", |b| {
        b.iter(|| {
            decode(
                black_box("fleet/van0042/telemetry"),
                black_box(native),
                &settings,
            )
        })
    });
    group.bench_function("owntracks", |b| {
        b.iter(|| {
            decode(
                black_box("owntracks/driver0042/van"),
                black_box(owntracks),
                &settings,
            )
        })
    });
    group.finish();
}

/// Runs every payload through decode → admission → channel → evaluator on
/// `shards` worker tasks; returns how many were evaluated.
fn run_pipeline(
    runtime: &tokio::runtime::Runtime,
    payloads: &[(String, Vec<u8>)],
    index: &Arc<FenceIndex>,
    shards: usize,
) -> usize {
    runtime.block_on(async {
        let settings = CodecSettings {
            dedup_window: 0,
            ..CodecSettings::default()
        };
        let policy = AdmissionPolicy::new(0.6, 4096).expect("policy");
        let spec: GateSpec = "token:rate=1000000,burst=100000".parse().expect("gate");
        let mut gates: Vec<_> = (0..shards).map(|_| spec.build().expect("gate")).collect();
        let mut senders = Vec::new();
        let mut workers = Vec::new();
        for _ in 0..shards {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Telemetry>(4096);
            senders.push(tx);
            let mut evaluator = Evaluator::new(index.clone(), EvaluatorSettings::default());
            workers.push(tokio::spawn(async move {
                let (mut out, mut batch) = (Vec::new(), Vec::with_capacity(256));
                let mut n = 0;
                // Drain in batches, as the shard worker does: one wake-up per
                // batch rather than per event.
                while rx.recv_many(&mut batch, 256).await > 0 {
                    for t in batch.drain(..) {
                        out.clear();
                        evaluator.evaluate(&t.vehicle, t.fix_time_ms, t.lat, t.lon, &mut out);
                        n += 1;
                    }
                }
                n
            }));
        }
        let clock = MonotonicClock::new();
        for (topic, payload) in payloads {
            let Ok(fix) = decode(topic, payload, &settings) else {
                continue;
            };
            let s = shard_of(&fix.vehicle, shards);
            let tx = &senders[s];
            match policy.route(tx.max_capacity() - tx.capacity(), fix.priority) {
                Route::Enqueue | Route::Backpressure => {
                    let _ = tx.send(fix).await;
                }
                Route::Gate => {
                    if let Decision::Admit { .. } = gates[s].try_admit(clock.now(), 1) {
                        let _ = tx.send(fix).await;
                    }
                }
            }
        }
        drop(senders);
        let mut total = 0;
        for w in workers {
            total += w.await.unwrap_or(0);
        }
        total
    })
}

fn pipeline(c: &mut Criterion) {
    let payloads = payloads();
    let index = Arc::new(FenceIndex::new(
        load_fences(Path::new("config/fences.geojson")).expect("demo fences"),
    ));
    let settings = CodecSettings {
        dedup_window: 0,
        ..CodecSettings::default()
    };
    let mut group = c.benchmark_group("in_process");
    group.throughput(Throughput::Elements(payloads.len() as u64));
    group.sample_size(20);
    group.bench_function("decode_only", |b| {
        b.iter(|| {
            payloads
                .iter()
                .filter(|(t, p)| decode(t, p, &settings).is_ok())
                .count()
        })
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for shards in [1, 2] {
        group.bench_with_input(
            BenchmarkId::new("pipeline", shards),
            &shards,
            |b, &shards| b.iter(|| run_pipeline(&runtime, &payloads, &index, shards)),
        );
    }
    group.finish();
}

criterion_group!(benches, decode_formats, pipeline);
criterion_main!(benches);
