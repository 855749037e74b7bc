//! `geogate synth shift-change`: a deterministic slice of a delivery fleet's
//! day, as a capture.
//!
//! Phases (capture time):
//! 1. **overnight**: every vehicle parked at its depot sends an idle ping
//!    every `ping_interval_s`;
//! 2. **shift start**: each vehicle powers on at a random moment within
//!    `spread_s` and flushes the `buffered_pings` idle pings it stored
//!    offline at once: the shift-change burst of low-priority traffic;
//! 3. **driving**: each vehicle drives depot → three stops → depot at 25–50
//!    km/h, reporting a movement fix every `fix_interval_s`, crossing the
//!    demo fences in `config/fences.geojson`.
//!
//! Fix times run `time_scale` times faster than capture time, so a two-minute
//! capture covers an hour of driving. Payloads mix native JSON and OwnTracks
//! (`owntracks_share`), and a `malformed_share` are corrupted in one of
//! several realistic ways. The same arguments always give the same bytes.

use crate::geofence::generate::SplitMix64;
use crate::replay::capture::CaptureRecord;
use serde::Serialize;

/// Fix time of capture offset 0: 2026-03-02T05:00:00Z.
pub const START_MS: i64 = 1_772_427_600_000;

/// Stops near the demo fences: depots, yard, centre, hospital, customers.
const DEPOTS: [(f64, f64); 2] = [(13.3740, 52.5325), (13.4140, 52.4725)];
const STOPS: [(f64, f64); 10] = [
    (13.3950, 52.5030),
    (13.3900, 52.5150),
    (13.4120, 52.5140),
    (13.3770, 52.5260),
    (13.3850, 52.4950),
    (13.4020, 52.4850),
    (13.3650, 52.5150),
    (13.4150, 52.5000),
    (13.3950, 52.5250),
    (13.4300, 52.5100),
];

#[derive(Debug, Clone, Serialize)]
pub struct ShiftChange {
    pub vehicles: usize,
    pub seed: u64,
    pub overnight_s: f64,
    pub ping_interval_s: f64,
    pub spread_s: f64,
    pub buffered_pings: usize,
    pub drive_s: f64,
    pub fix_interval_s: f64,
    pub time_scale: f64,
    pub owntracks_share: f64,
    pub malformed_share: f64,
}

impl Default for ShiftChange {
    fn default() -> Self {
        Self {
            vehicles: 300,
            seed: 1,
            overnight_s: 20.0,
            ping_interval_s: 10.0,
            spread_s: 10.0,
            buffered_pings: 40,
            drive_s: 90.0,
            fix_interval_s: 1.0,
            time_scale: 30.0,
            owntracks_share: 0.3,
            malformed_share: 0.01,
        }
    }
}

struct Vehicle {
    id: String,
    owntracks: bool,
    depot: (f64, f64),
    route: Vec<(f64, f64)>,
    /// Metres per second of fix time.
    speed: f64,
}

fn metres(a: (f64, f64), b: (f64, f64)) -> f64 {
    let dx = (b.0 - a.0) * a.1.to_radians().cos() * 111_195.0;
    let dy = (b.1 - a.1) * 111_195.0;
    dx.hypot(dy)
}

impl Vehicle {
    /// Position after `d` metres along the route (parked at the end).
    fn position(&self, mut d: f64) -> (f64, f64) {
        for w in self.route.windows(2) {
            let len = metres(w[0], w[1]);
            if d <= len {
                let f = if len > 0.0 { d / len } else { 0.0 };
                return (
                    w[0].0 + (w[1].0 - w[0].0) * f,
                    w[0].1 + (w[1].1 - w[0].1) * f,
                );
            }
            d -= len;
        }
        *self.route.last().unwrap_or(&self.depot)
    }
}

fn payload(
    v: &Vehicle,
    fix_ms: i64,
    pos: (f64, f64),
    speed_kmh: f64,
    ping: bool,
) -> (String, String) {
    if v.owntracks {
        (
            format!("owntracks/{}", v.id),
            format!(
                r#"{{"_type":"location","lat":{:.6},"lon":{:.6},"tst":{},"vel":{},"t":"{}"}}"#,
                pos.1,
                pos.0,
                fix_ms / 1000,
                speed_kmh.round(),
                if ping { "p" } else { "u" }
            ),
        )
    } else {
        (
            format!("fleet/{}/telemetry", v.id),
            format!(
                r#"{{"vehicle":"{}","ts":{},"lat":{:.6},"lon":{:.6},"speed_kmh":{:.1},"kind":"{}"}}"#,
                v.id,
                fix_ms,
                pos.1,
                pos.0,
                speed_kmh,
                if ping { "ping" } else { "move" }
            ),
        )
    }
}

/// Corrupts a payload in one of several ways seen in real fleets.
fn corrupt(rng: &mut SplitMix64, payload: &str) -> String {
    match rng.below(5) {
        0 => payload[..payload.len() / 2].to_owned(),
        1 => payload
            .replacen("\"lat\":", "\"lat\":1", 1)
            .replacen("\"lat\":15", "\"lat\":95", 1),
        2 => payload.replacen("\"lon\":", "\"lon\":\"NaN\",\"x\":", 1),
        3 => "{\"hello\":\"world\"}".to_owned(),
        _ => payload.replace('}', ",}"),
    }
}

/// Generates the capture, sorted by capture time.
pub fn shift_change(p: &ShiftChange) -> Vec<CaptureRecord> {
    let mut rng = SplitMix64::new(p.seed);
    let vehicles: Vec<Vehicle> = (0..p.vehicles)
        .map(|i| {
            let owntracks = rng.range(0.0, 1.0) < p.owntracks_share;
            let id = if owntracks {
                format!("driver{i:04}/van")
            } else {
                format!("van{i:04}")
            };
            let depot = DEPOTS[i % 2];
            let mut route = vec![depot];
            for _ in 0..3 {
                route.push(STOPS[rng.below(STOPS.len() as u64) as usize]);
            }
            route.push(depot);
            Vehicle {
                id,
                owntracks,
                depot,
                route,
                speed: rng.range(25.0, 50.0) / 3.6,
            }
        })
        .collect();

    // (t_ns, vehicle index, sequence) keeps the sort total and stable.
    let mut events: Vec<(u64, usize, u32, String, String)> = Vec::new();
    let ns = |s: f64| (s * 1e9).round() as u64;
    let fix_ms = |s: f64| START_MS + (s * p.time_scale * 1000.0).round() as i64;
    for (i, v) in vehicles.iter().enumerate() {
        let mut seq = 0u32;
        let mut push = |events: &mut Vec<_>, t: f64, fix_t: f64, pos, kmh, ping| {
            let (topic, body) = payload(v, fix_ms(fix_t), pos, kmh, ping);
            events.push((ns(t), i, seq, topic, body));
            seq += 1;
        };
        // Overnight pings, phase-shifted per vehicle.
        let mut t = rng.range(0.0, p.ping_interval_s);
        while t < p.overnight_s {
            push(&mut events, t, t, v.depot, 0.0, true);
            t += p.ping_interval_s;
        }
        // Power-on: buffered pings flushed at once, their fix times spread
        // over the night (distinct, so they are not duplicates).
        let on = p.overnight_s + rng.range(0.0, p.spread_s);
        for k in 0..p.buffered_pings {
            let fix_t = p.overnight_s * (k as f64 + 0.5) / p.buffered_pings as f64;
            push(
                &mut events,
                on + k as f64 * 1e-4,
                fix_t.min(on),
                v.depot,
                0.0,
                true,
            );
        }
        // Driving.
        let mut t = on + p.fix_interval_s;
        let end = p.overnight_s + p.spread_s + p.drive_s;
        while t < end {
            let driven = (t - on) * p.time_scale * v.speed;
            let pos = v.position(driven);
            let route_len: f64 = v.route.windows(2).map(|w| metres(w[0], w[1])).sum();
            let moving = driven < route_len;
            let kmh = if moving { v.speed * 3.6 } else { 0.0 };
            push(&mut events, t, t, pos, kmh, !moving);
            t += p.fix_interval_s;
        }
    }
    events.sort_unstable_by_key(|e| (e.0, e.1, e.2));
    events
        .into_iter()
        .map(|(t, _, _, topic, body)| {
            let body = if rng.range(0.0, 1.0) < p.malformed_share {
                corrupt(&mut rng, &body)
            } else {
                body
            };
            CaptureRecord::new(t, topic, body.as_bytes())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CodecSettings, decode};
    use crate::model::Priority;

    #[test]
    fn deterministic_mixed_and_bursty() {
        let p = ShiftChange {
            vehicles: 40,
            ..ShiftChange::default()
        };
        let a = shift_change(&p);
        assert_eq!(a, shift_change(&p));
        assert_ne!(
            a,
            shift_change(&ShiftChange {
                seed: 2,
                ..p.clone()
            })
        );
        let codec = CodecSettings::default();
        let decoded: Vec<_> = a
            .iter()
            .map(|r| decode(&r.topic, &r.payload_bytes(), &codec))
            .collect();
        let bad = decoded.iter().filter(|d| d.is_err()).count();
        assert!(
            bad > 0 && bad < a.len() / 20,
            "a small share is malformed: {bad}"
        );
        let low = decoded
            .iter()
            .flatten()
            .filter(|t| t.priority == Priority::Low)
            .count();
        let high = decoded
            .iter()
            .flatten()
            .filter(|t| t.priority == Priority::High)
            .count();
        assert!(low > 40 * 40 && high > 40 * 30, "low {low}, high {high}");
        assert!(a.iter().any(|r| r.topic.starts_with("owntracks/")));
        assert!(a.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    }
}
