//! The reorder window: what it recovers, what it adds to latency, and what
//! it costs in rate.
//!
//! `cargo bench --bench reorder_window -- recovery` (deterministic, on the
//! evaluator's injectable clock): for each window, the transitions of
//! (1) the bundled capture (`replay/shift-change.ndjson.gz`, its recorded
//! receive times, the demo fences) and (2) a coverage-loss fleet, against
//! the in-order truth (every fix applied in fix-time order): how many are
//! right, missing and spurious, how many fixes were late, and how long a
//! transition waited in the window (median and p99, receive to release).
//!
//! `cargo bench --bench reorder_window -- cost [rounds]`: a steady stream
//! (8 million fixes of 200,000 vehicles) whose fix and
//! receive times advance with the real clock, through the
//! memory backend's shard state (evaluation, commit, events file), so the
//! window releases continuously. Rounds alternate window 0 and the default;
//! prints each round's rate, then the medians, their ratio and the spread.
//! Then, at 25%, 50% and 90% of the measured capacity (paced), the
//! transition latency (receive to written in the events file) with and
//! without the window: median and p99.

use geogate::clock::receive_now_ms;
use geogate::codec::{CodecSettings, decode};
use geogate::config::{StateBackend, StateConfig};
use geogate::geofence::{Evaluator, EvaluatorSettings, FenceIndex, Fix, Transition, load_fences};
use geogate::model::VehicleId;
use geogate::pipeline::config::DEFAULT_REORDER_WINDOW_MS;
use geogate::replay::capture;
use geogate::shutdown::Drain;
use geogate::state::{Backend, Batch, Completion, OpenContext, Outcomes};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WINDOWS_MS: [i64; 9] = [
    0, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 120_000, 600_000,
];

/// The box around every fence.
fn area(index: &FenceIndex) -> geo::Rect<f64> {
    let mut min = geo::Coord {
        x: f64::MAX,
        y: f64::MAX,
    };
    let mut max = geo::Coord {
        x: f64::MIN,
        y: f64::MIN,
    };
    for (a, b) in index
        .fences()
        .flat_map(|f| f.parts.iter().flat_map(|p| p.envelopes()))
    {
        (min.x, min.y) = (min.x.min(a.x), min.y.min(a.y));
        (max.x, max.y) = (max.x.max(b.x), max.y.max(b.y));
    }
    geo::Rect::new(min, max)
}

fn fences() -> Arc<FenceIndex> {
    Arc::new(FenceIndex::new(
        load_fences(Path::new("config/fences.geojson")).expect("demo fences"),
    ))
}

/// (vehicle, fix ms, lat, lon, received ms, digest), in receive order.
type Arrival = (VehicleId, i64, f64, f64, i64, u64);

type Key = (String, String, &'static str, i64);

fn key(t: &Transition) -> Key {
    (
        t.vehicle.to_string(),
        t.fence.to_string(),
        t.event.as_str(),
        t.ts,
    )
}

/// The in-order truth: every fix applied in fix-time order (arrival order
/// among equal times), no expiry.
fn truth(index: &Arc<FenceIndex>, arrivals: &[Arrival]) -> BTreeMap<Key, usize> {
    let mut sorted: Vec<&Arrival> = arrivals.iter().collect();
    sorted.sort_by_key(|a| a.1);
    let mut ev = Evaluator::new(index.clone(), EvaluatorSettings::default());
    let mut out = Vec::new();
    for a in sorted {
        ev.evaluate_fix(fix(a), &mut out);
    }
    multiset(&out)
}

fn fix(a: &Arrival) -> Fix<'_> {
    Fix {
        vehicle: &a.0,
        fix_ms: a.1,
        lat: a.2,
        lon: a.3,
        redelivered: false,
        received_ms: a.4,
        digest: a.5,
    }
}

fn multiset(out: &[Transition]) -> BTreeMap<Key, usize> {
    let mut set = BTreeMap::new();
    for t in out {
        *set.entry(key(t)).or_default() += 1;
    }
    set
}

/// One window over the arrivals: the watermark follows each arrival's
/// receive time, and between arrivals the idle tick's (every 250 ms), as
/// in a worker; everything left is released at the end. Returns the
/// transitions, the late count, and each transition's wait in the window.
fn run_window(
    index: &Arc<FenceIndex>,
    arrivals: &[Arrival],
    window_ms: i64,
) -> (BTreeMap<Key, usize>, u64, Vec<i64>) {
    const TICK_MS: i64 = 250;
    let settings = EvaluatorSettings {
        reorder_window_ms: window_ms,
        idle_expiry_ms: i64::MAX / 4,
        ..EvaluatorSettings::default()
    };
    let mut ev = Evaluator::new(index.clone(), settings);
    let mut all = Vec::new();
    let mut waits = Vec::new();
    let mut out = Vec::new();
    let mut release = |ev: &mut Evaluator, at: i64, out: &mut Vec<Transition>| {
        ev.release_due(at, out);
        waits.extend(out.iter().map(|t| at - t.received_ms));
        all.append(out);
    };
    let mut next_tick = arrivals.first().map_or(0, |a| a.4);
    for a in arrivals {
        while next_tick < a.4 {
            release(&mut ev, next_tick, &mut out);
            next_tick += TICK_MS;
        }
        ev.evaluate_fix(fix(a), &mut out);
        release(&mut ev, a.4, &mut out);
    }
    let end = arrivals.last().map_or(0, |a| a.4) + window_ms + TICK_MS;
    while next_tick <= end {
        release(&mut ev, next_tick, &mut out);
        next_tick += TICK_MS;
    }
    (multiset(&all), ev.stats().late, waits)
}

fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The bundled capture, received at its recorded offsets.
fn capture_arrivals() -> Vec<Arrival> {
    let records = capture::read(Path::new("replay/shift-change.ndjson.gz")).expect("capture");
    let codec = CodecSettings::default();
    let t0 = 1_772_427_600_000;
    records
        .iter()
        .filter_map(|r| {
            let payload = r.payload_bytes();
            let f = decode(&r.topic, &payload, &codec).ok()?;
            Some((
                f.vehicle,
                f.fix_time_ms,
                f.lat,
                f.lon,
                t0 + (r.t_ns / 1_000_000) as i64,
                geogate::codec::message_digest(&r.topic, &payload),
            ))
        })
        .collect()
}

/// 400 vehicles crossing the demo fences' area west to east, a fix every
/// 5 s for 10 minutes. A third lose coverage for 40–160 s at a random
/// time; on reconnect each sends its live fix, then, after a delay drawn
/// from 0–3 s, its buffer 20 ms apart, half of them newest first.
fn coverage_arrivals(index: &FenceIndex) -> Vec<Arrival> {
    let area = area(index);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let t0 = 1_772_427_600_000i64;
    let mut arrivals = Vec::new();
    for v in 0..400u64 {
        let vehicle: VehicleId = format!("cov{v}").into();
        let lat = area.min().y + (area.max().y - area.min().y) * ((next() % 1000) as f64 / 1000.0);
        let fixes: Vec<(i64, f64)> = (0..120)
            .map(|k| {
                let lon = area.min().x + (area.max().x - area.min().x) * k as f64 / 120.0;
                (t0 + 5_000 * k, lon)
            })
            .collect();
        let outage = (v % 3 == 0).then(|| {
            let start = 5 + (next() % 90) as usize;
            (start, start + 8 + (next() % 25) as usize)
        });
        for (k, &(ts, lon)) in fixes.iter().enumerate() {
            let digest = (v << 32) | k as u64;
            match outage {
                Some((from, to)) if (from..to).contains(&k) => {}
                Some((from, to)) if k == to => {
                    arrivals.push((vehicle.clone(), ts, lat, lon, ts + 300, digest));
                    let delay = (next() % 3_000) as i64;
                    let mut buffer: Vec<usize> = (from..to).collect();
                    if v % 2 == 1 {
                        buffer.reverse();
                    }
                    for (i, b) in buffer.into_iter().enumerate() {
                        let (bts, blon) = fixes[b];
                        let at = ts + 300 + delay + 20 * (i as i64 + 1);
                        arrivals.push((vehicle.clone(), bts, lat, blon, at, (v << 32) | b as u64));
                    }
                }
                _ => arrivals.push((vehicle.clone(), ts, lat, lon, ts + 300, digest)),
            }
        }
    }
    arrivals.sort_by_key(|a| a.4);
    arrivals
}

fn recovery() {
    let index = fences();
    for (name, arrivals) in [
        ("capture", capture_arrivals()),
        ("coverage-loss fleet", coverage_arrivals(&index)),
    ] {
        let want = truth(&index, &arrivals);
        let total: usize = want.values().sum();
        println!(
            "{name}: {} fixes, {total} in-order transitions",
            arrivals.len()
        );
        println!("window_ms  right  missing  spurious  late_fixes  wait_p50_ms  wait_p99_ms");
        for w in WINDOWS_MS {
            let (got, late, mut waits) = run_window(&index, &arrivals, w);
            let right: usize = want
                .iter()
                .map(|(k, n)| (*n).min(got.get(k).copied().unwrap_or(0)))
                .sum();
            let produced: usize = got.values().sum();
            waits.sort_unstable();
            println!(
                "{w:>9}  {right:>5}  {:>7}  {:>8}  {late:>10}  {:>11}  {:>11}",
                total - right,
                produced - right,
                percentile(&waits, 0.5),
                percentile(&waits, 0.99)
            );
        }
    }
}

/// Records when each batch was finished (its lines in the events file),
/// with its transition count, in finishing order.
#[derive(Clone, Default)]
struct Finishes(Arc<Mutex<Vec<(i64, u64)>>>);

struct Finish(Finishes, tokio::sync::mpsc::UnboundedSender<()>);

impl Completion for Finish {
    fn complete(self: Box<Self>, o: Outcomes) {
        let mut f = (self.0).0.lock().expect("not poisoned");
        f.push((receive_now_ms(), o.enters + o.exits));
        let _ = self.1.send(());
    }
}

struct Stream {
    vehicles: Vec<VehicleId>,
    lat: Vec<f64>,
    step: f64,
    west: f64,
    east: f64,
}

impl Stream {
    /// 200,000 vehicles driving east across the fences' area and around:
    /// at a million fixes a second, each reports five times a second, so
    /// a 2 s window holds about ten of its fixes.
    fn new(index: &FenceIndex) -> Self {
        let area = area(index);
        let n = 200_000;
        Self {
            vehicles: (0..n).map(|v| format!("s{v}").into()).collect(),
            lat: (0..n)
                .map(|v| area.min().y + (area.max().y - area.min().y) * (v as f64 / n as f64))
                .collect(),
            step: (area.max().x - area.min().x) / 40.0,
            west: area.min().x,
            east: area.max().x,
        }
    }

    /// Fix `i`: vehicle i mod n, on its lap.
    fn lon(&self, i: usize) -> f64 {
        let lap = ((i / self.vehicles.len()) as f64 * self.step) % (self.east - self.west);
        self.west + lap
    }
}

/// One run of `fixes` fixes through a fresh memory backend: batches of
/// 256, each fix received (and dated) now; `pace` spaces the batches to a
/// rate. Returns the rate and each transition's receive-to-written time.
fn run_stream(
    runtime: &tokio::runtime::Runtime,
    index: &Arc<FenceIndex>,
    stream: &Stream,
    window_ms: i64,
    fixes: usize,
    pace: Option<f64>,
) -> (f64, Vec<i64>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.ndjson");
    runtime.block_on(async {
        let config = StateConfig {
            backend: StateBackend::Memory,
            ..StateConfig::default()
        };
        let settings = EvaluatorSettings {
            reorder_window_ms: window_ms,
            ..EvaluatorSettings::default()
        };
        let mut backend: Box<dyn Backend> = geogate::state::backends::open(
            &config,
            OpenContext {
                events: Some(events.clone()),
                outputs: Default::default(),
                settings,
                fences: geogate::state::FenceSupply::of(index),
                shards: 1,
                per_fence_labels: false,
                fence_properties: Default::default(),
                drain: Drain::never(),
            },
        )
        .await
        .expect("memory backend");
        let mut shard = backend.shard(0, index.clone(), Vec::new());
        let finishes = Finishes::default();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let started = Instant::now();
        let mut batches = 0;
        let mut i = 0;
        while i < fixes {
            if let Some(rate) = pace {
                let due = started + Duration::from_secs_f64(i as f64 / rate);
                let now = Instant::now();
                if due > now {
                    tokio::time::sleep(due - now).await;
                }
            }
            let now = receive_now_ms();
            let n = 256.min(fixes - i);
            let arrivals: Vec<Fix<'_>> = (i..i + n)
                .map(|k| {
                    let v = k % stream.vehicles.len();
                    Fix {
                        vehicle: &stream.vehicles[v],
                        fix_ms: now,
                        lat: stream.lat[v],
                        lon: stream.lon(k),
                        redelivered: false,
                        received_ms: now,
                        digest: k as u64,
                    }
                })
                .collect();
            let batch = Batch {
                fences: None,
                fixes: &arrivals,
                watermark: Some(now),
                closing: false,
                position: None,
            };
            shard
                .apply(batch, Box::new(Finish(finishes.clone(), done_tx.clone())))
                .await
                .expect("applied");
            batches += 1;
            i += n;
        }
        // The rate is the stream's: up to its last fix finished. (A steady
        // stream has no end; the last window's release is not part of it.)
        for _ in 0..batches {
            done_rx.recv().await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        batches = 0;
        // The window's last fixes leave by the clock, as on a quiet shard.
        let end = receive_now_ms();
        while receive_now_ms() < end + window_ms {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let tick = Batch {
                fences: None,
                fixes: &[],
                watermark: Some(receive_now_ms()),
                closing: false,
                position: None,
            };
            shard
                .apply(tick, Box::new(Finish(finishes.clone(), done_tx.clone())))
                .await
                .expect("applied");
            batches += 1;
        }
        for _ in 0..batches {
            done_rx.recv().await;
        }
        drop(shard);
        backend.finish().await;
        let rate = fixes as f64 / elapsed;
        // Lines are written in commit order: each finished batch's
        // transitions are the next lines.
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&events)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a line"))
            .collect();
        let finishes = finishes.0.lock().expect("not poisoned").clone();
        let mut written = Vec::new();
        for (at, n) in finishes {
            written.extend(std::iter::repeat_n(at, n as usize));
        }
        let latencies = lines
            .iter()
            .zip(written)
            .map(|(line, at)| at - line["ts"].as_i64().unwrap_or(0))
            .collect();
        (rate, latencies)
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn cost(rounds: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let index = fences();
    let stream = Stream::new(&index);
    let window = DEFAULT_REORDER_WINDOW_MS as i64;
    // Long enough that the window (2 s) holds a small share of the run.
    let fixes = 8_000_000;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for w in [0, window] {
            let (rate, _) = run_stream(&runtime, &index, &stream, w, fixes, None);
            println!("round {round} window_ms {w}: {rate:.0} fixes/s");
            if w == 0 {
                off.push(rate)
            } else {
                on.push(rate)
            }
        }
    }
    let ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    let (m_off, m_on) = (median(&mut off.clone()), median(&mut on.clone()));
    println!(
        "median: window 0 {m_off:.0} fixes/s, window {window} ms {m_on:.0} fixes/s, ratio {:.3} (rounds {lo:.3}–{hi:.3})",
        m_on / m_off
    );
    let capacity = m_off;
    println!("load  window_ms  latency_p50_ms  latency_p99_ms");
    for load in [0.25, 0.5, 0.9] {
        for w in [0, window] {
            let n = (capacity * load * 4.0) as usize;
            let (_, mut lat) = run_stream(&runtime, &index, &stream, w, n, Some(capacity * load));
            lat.sort_unstable();
            println!(
                "{:>4.0}%  {w:>9}  {:>14}  {:>14}",
                load * 100.0,
                percentile(&lat, 0.5),
                percentile(&lat, 0.99)
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.first().map(String::as_str) {
        Some("recovery") => recovery(),
        Some("cost") => cost(args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5)),
        _ => {
            recovery();
            cost(5);
        }
    }
}
