//! Points per second through the R-tree at 1k, 10k and 100k fences (seeded
//! city blocks of 8–64 vertices, holes, MultiPolygons, circles, plus three
//! 10k-vertex polygons), point by point and in one batch, against the
//! linear scan at 1k and 10k; and fixes per second through the evaluator,
//! fix by fix and batch by batch (`evaluator/*`).
//!
//! Each run also exports its data to `target/geofence-bench/<n>/` so that
//! `benches/peers/shapely_strtree.py` can query the identical fences and
//! points with Shapely 2 in the same session.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geo::Coord;
use geogate::geofence::generate::{SplitMix64, random_fences, to_geojson};
use geogate::geofence::{Coverings, Evaluator, EvaluatorSettings, FenceIndex, Fix};
use geogate::model::VehicleId;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;

const POINTS: usize = 10_000;

/// How many 10k-vertex polygons to mix in (`GEOGATE_BENCH_BIG`, default 3),
/// so their share of the cost can be measured by setting it to 0.
fn big_polygons() -> usize {
    std::env::var("GEOGATE_BENCH_BIG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

fn export(n: usize, index: &FenceIndex, points: &[Coord<f64>]) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/geofence-bench/{n}"));
    let written = std::fs::create_dir_all(&dir).and_then(|_| {
        std::fs::write(
            dir.join("fences.geojson"),
            to_geojson(index.fences()).to_string(),
        )?;
        let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("points.f64"))?);
        for p in points {
            f.write_all(&p.x.to_le_bytes())?;
            f.write_all(&p.y.to_le_bytes())?;
        }
        f.flush()
    });
    if let Err(e) = written {
        eprintln!("could not export bench data to {}: {e}", dir.display());
    }
}

fn evaluation(c: &mut Criterion) {
    let mut group = c.benchmark_group("containment");
    group.throughput(Throughput::Elements(POINTS as u64));
    for n in [1_000, 10_000, 100_000] {
        let (fences, area) = random_fences(n as u64, n, big_polygons(), 10_000);
        let index = FenceIndex::new(fences);
        let mut rng = SplitMix64::new(1);
        let points: Vec<Coord<f64>> = (0..POINTS).map(|_| area.random_point(&mut rng)).collect();
        export(n, &index, &points);
        let mut out = Vec::new();
        let hits = points
            .iter()
            .filter(|p| {
                index.containing(**p, &mut out);
                !out.is_empty()
            })
            .count();
        eprintln!("{n} fences: {hits} of {POINTS} points hit at least one fence");
        group.bench_with_input(BenchmarkId::new("rtree", n), &points, |b, points| {
            let mut out = Vec::with_capacity(16);
            b.iter(|| {
                let mut found = 0;
                for p in points {
                    index.containing(black_box(*p), &mut out);
                    found += out.len();
                }
                found
            })
        });
        group.bench_with_input(BenchmarkId::new("rtree_batch", n), &points, |b, points| {
            let mut coverings = Coverings::default();
            b.iter(|| {
                index.containing_batch(black_box(points), &mut coverings);
                (0..coverings.len())
                    .map(|i| coverings.of(i).len())
                    .sum::<usize>()
            })
        });
        if n <= 10_000 {
            group.bench_with_input(BenchmarkId::new("linear_scan", n), &points, |b, points| {
                let mut out = Vec::with_capacity(16);
                b.iter(|| {
                    let mut found = 0;
                    for p in &points[..POINTS / 10] {
                        index.containing_linear(black_box(*p), &mut out);
                        found += out.len();
                    }
                    found * 10
                })
            });
        }
    }
    group.finish();
}

/// The shard worker's evaluation, state and all, at 10k fences (with the
/// big polygons) and at 100 (without: an index that stays in cache): 10,000
/// fixes of 1,000 vehicles in batches of 256 (the worker's largest), fix
/// by fix through the point query against each batch's fences looked up
/// together (what the worker does for an index past 1 MiB). Why: the batch
/// query's gain measured alone could vanish between the state updates of a
/// real evaluation.
fn evaluator(c: &mut Criterion) {
    /// The shard worker's largest batch (its private `BATCH`).
    const BATCH: usize = 256;
    let mut group = c.benchmark_group("evaluator");
    group.throughput(Throughput::Elements(POINTS as u64));
    for (n, big) in [(100, 0), (10_000, big_polygons())] {
        let (fences, area) = random_fences(n as u64, n, big, 10_000);
        let index = std::sync::Arc::new(FenceIndex::new(fences));
        let mut rng = SplitMix64::new(1);
        let vehicles: Vec<VehicleId> = (0..1_000)
            .map(|v| VehicleId::from(format!("v{v}")))
            .collect();
        let fixes: Vec<(usize, i64, Coord<f64>)> = (0..POINTS)
            .map(|i| {
                (
                    i % vehicles.len(),
                    1_800_000_000_000 + i as i64,
                    area.random_point(&mut rng),
                )
            })
            .collect();
        let fresh = || Evaluator::new(index.clone(), EvaluatorSettings::default());
        let fix = |&(v, t, p): &(usize, i64, Coord<f64>)| Fix {
            vehicle: &vehicles[v],
            fix_ms: t,
            lat: p.y,
            lon: p.x,
            redelivered: false,
            received_ms: t,
            digest: t as u64,
        };
        for (name, batched) in [("per_fix", false), ("batch_covered", true)] {
            group.bench_function(BenchmarkId::new(name, n), |b| {
                let mut out = Vec::new();
                b.iter_batched_ref(
                    fresh,
                    |evaluator| {
                        for batch in fixes.chunks(BATCH) {
                            out.clear();
                            if batched {
                                evaluator.cover_batch(batch.iter().map(fix));
                            }
                            for (i, f) in batch.iter().enumerate() {
                                if batched {
                                    evaluator.evaluate_covered(i, fix(f), &mut out);
                                } else {
                                    evaluator.evaluate_fix(fix(f), &mut out);
                                }
                            }
                        }
                        evaluator.stats().evaluated
                    },
                    criterion::BatchSize::LargeInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, evaluation, evaluator);
criterion_main!(benches);
