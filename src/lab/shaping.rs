//! `geogate lab shaping`: a gate in front of one FIFO server.
//!
//! Model (all integer nanoseconds, deterministic):
//! * the server takes 10 ms per request (capacity 100 rps); a request is on
//!   time when it completes at most 200 ms after it *arrived* (inclusive);
//! * the gate's sustained rate is 100 rps; the burst dimension is the token
//!   bucket's capacity, or the leaky shaper's queue depth;
//! * demand repeats a valley of 20 rps for 1000 ms, then a spike of 600 rps
//!   for 200 ms, valley first, for a 5 s arrival window. Arrival k of a phase
//!   at rate q falls at `phase_start + floor(k · 1e9 / q)` ns;
//! * the shaper's first release after an idle period is immediate;
//! * p99 is nearest-rank; `downstream_peak` is the most releases in any
//!   aligned 100 ms window, scaled to rps.

use crate::admission::{Decision, Gate, LeakyShaper, Rate, TokenBucket};
use crate::clock::{NANOS_PER_MILLI, NANOS_PER_SEC, Nanos};
use crate::replay::sim::percentile;
use serde::Serialize;

pub const DIMENSIONS: [u32; 10] = [1, 2, 4, 8, 12, 16, 20, 28, 40, 80];
const SERVICE: Nanos = 10 * NANOS_PER_MILLI;
const DEADLINE: Nanos = 200 * NANOS_PER_MILLI;
const GATE_RATE: f64 = 100.0;
const WINDOW_S: u64 = 5;
const BIN: Nanos = 100 * NANOS_PER_MILLI;
/// The dimension the per-window CSV compares at.
pub const WINDOW_DIMENSION: u32 = 20;

pub const CONVENTIONS: &[&str] = &[
    "Arrivals: arrival k of a phase at rate q falls at phase_start + floor(k·1e9/q) ns; valley (20 rps, 1000 ms) first, then spike (600 rps, 200 ms), repeated over a 5 s window.",
    "First release: the leaky shaper releases the first request after an idle period immediately; then one every 10 ms.",
    "Deadline: a request is on time when completion − arrival ≤ 200 ms (inclusive).",
    "p99: nearest rank, ceil(0.99·n)-th smallest.",
    "downstream_peak: the most releases to the server in any aligned 100 ms window, ×10 to rps.",
];

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub limiter: &'static str,
    pub burst: u32,
    pub goodput_rps: f64,
    pub reject_pct: f64,
    pub served_late_pct: f64,
    pub gate_delay_p99: f64,
    pub server_wait_p99: f64,
    pub downstream_peak: u64,
}

/// The demand: arrival times over the 5 s window.
pub fn arrivals() -> Vec<Nanos> {
    let end = WINDOW_S * NANOS_PER_SEC;
    let phases = [
        (1000 * NANOS_PER_MILLI, 20u64),
        (200 * NANOS_PER_MILLI, 600),
    ];
    let mut out = Vec::new();
    let mut start = 0;
    'outer: loop {
        for &(len, rate) in &phases {
            for k in 0.. {
                let t = start + k * NANOS_PER_SEC / rate;
                if t >= start + len {
                    break;
                }
                if t >= end {
                    break 'outer;
                }
                out.push(t);
            }
            start += len;
        }
    }
    out
}

/// What one limiter at one dimension did: releases (arrival, release).
fn releases(limiter: &str, burst: u32, arrivals: &[Nanos]) -> Vec<Option<Nanos>> {
    let rate = Rate::per_second(GATE_RATE).expect("the lab's rate is valid");
    let decide = |d: Decision| match d {
        Decision::Admit { release_at } => Some(release_at),
        Decision::Reject { .. } => None,
    };
    if limiter == "token-bucket" {
        let mut g = TokenBucket::new(rate, burst).expect("burst ≥ 1");
        arrivals
            .iter()
            .map(|&t| decide(g.try_admit(t, 1)))
            .collect()
    } else {
        let mut g = LeakyShaper::new(rate, burst).expect("burst ≥ 1");
        arrivals
            .iter()
            .map(|&t| decide(g.try_admit(t, 1)))
            .collect()
    }
}

fn row(limiter: &'static str, burst: u32, arrivals: &[Nanos]) -> Row {
    let released = releases(limiter, burst, arrivals);
    let (mut busy, mut on_time, mut late, mut rejects) = (0, 0u64, 0u64, 0u64);
    let (mut gate_delays, mut waits, mut bins) =
        (Vec::new(), Vec::new(), std::collections::BTreeMap::new());
    for (&arrival, release) in arrivals.iter().zip(&released) {
        let Some(release) = *release else {
            rejects += 1;
            continue;
        };
        let start = busy.max(release);
        busy = start + SERVICE;
        if busy - arrival <= DEADLINE {
            on_time += 1;
        } else {
            late += 1;
        }
        gate_delays.push(release - arrival);
        waits.push(start - release);
        *bins.entry(release / BIN).or_insert(0u64) += 1;
    }
    gate_delays.sort_unstable();
    waits.sort_unstable();
    let offered = arrivals.len() as f64;
    let ms = |ns: u64| ns as f64 / NANOS_PER_MILLI as f64;
    Row {
        limiter,
        burst,
        goodput_rps: on_time as f64 / WINDOW_S as f64,
        reject_pct: 100.0 * rejects as f64 / offered,
        served_late_pct: 100.0 * late as f64 / offered,
        gate_delay_p99: ms(percentile(&gate_delays, 0.99)),
        server_wait_p99: ms(percentile(&waits, 0.99)),
        downstream_peak: bins.values().max().copied().unwrap_or(0) * (NANOS_PER_SEC / BIN),
    }
}

/// Every row of the sweep: token bucket first, then leaky bucket.
pub fn sweep() -> Vec<Row> {
    let a = arrivals();
    ["token-bucket", "leaky-bucket"]
        .iter()
        .flat_map(|&l| DIMENSIONS.iter().map(move |&b| (l, b)))
        .map(|(l, b)| row(l, b, &a))
        .collect()
}

pub fn rows_csv(rows: &[Row]) -> String {
    let mut csv = String::from(
        "limiter,burst,goodput_rps,reject_pct,served_late_pct,gate_delay_p99,server_wait_p99,downstream_peak\n",
    );
    for r in rows {
        csv.push_str(&format!(
            "{},{},{:.1},{:.2},{:.2},{:.1},{:.1},{}\n",
            r.limiter,
            r.burst,
            r.goodput_rps,
            r.reject_pct,
            r.served_late_pct,
            r.gate_delay_p99,
            r.server_wait_p99,
            r.downstream_peak
        ));
    }
    csv
}

/// Per aligned 100 ms window at dimension 20: offered and released rps.
pub fn windows() -> Vec<(u64, u64, u64, u64)> {
    let a = arrivals();
    let count = |times: &mut dyn Iterator<Item = Nanos>| {
        let mut bins = std::collections::BTreeMap::new();
        for t in times {
            *bins.entry(t / BIN).or_insert(0u64) += 1;
        }
        bins
    };
    let offered = count(&mut a.iter().copied());
    let token = count(
        &mut releases("token-bucket", WINDOW_DIMENSION, &a)
            .into_iter()
            .flatten(),
    );
    let leaky = count(
        &mut releases("leaky-bucket", WINDOW_DIMENSION, &a)
            .into_iter()
            .flatten(),
    );
    let last = [&offered, &token, &leaky]
        .iter()
        .filter_map(|m| m.keys().next_back())
        .max()
        .copied()
        .unwrap_or(0);
    let rps = NANOS_PER_SEC / BIN;
    (0..=last)
        .map(|w| {
            let get =
                |m: &std::collections::BTreeMap<u64, u64>| m.get(&w).copied().unwrap_or(0) * rps;
            (
                w * BIN / NANOS_PER_MILLI,
                get(&offered),
                get(&token),
                get(&leaky),
            )
        })
        .collect()
}

pub fn windows_csv() -> String {
    let mut csv = String::from("window_start_ms,offered_rps,token_bucket_rps,leaky_bucket_rps\n");
    for (start, offered, token, leaky) in windows() {
        csv.push_str(&format!("{start},{offered},{token},{leaky}\n"));
    }
    csv
}
