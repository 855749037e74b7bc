//! Virtual-time what-if: a capture through the same codec, dedup, shard
//! router, watermark policy and gate as the live pipeline, with each shard's
//! worker modelled as a FIFO server at a fixed service rate. No clocks, no
//! threads: identical inputs give identical reports.
//!
//! Model conventions:
//! * an event arrives at its capture `t_ns`; the router handles events one
//!   at a time, so a High event waiting for room in a full queue delays
//!   every later arrival (head-of-line, as in the live router);
//! * queue length at an arrival is the number of events waiting (not the one
//!   in service), as the live channel counts;
//! * admission is [`Admission::decide`], the live router's own rule: a Low
//!   event at a full queue is shed without asking an unpaced gate;
//! * a shaped event waits in its shard's lane until its release time, then
//!   for room, and joins the queue (it is never queued past capacity);
//! * percentiles are nearest-rank.

use crate::admission::{Admission, AdmissionPolicy, GateSpec, Verdict};
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::codec::{CodecSettings, Dedup, decode, message_digest};
use crate::model::Priority;
use crate::replay::capture::CaptureRecord;
use crate::stable_hash::VehicleHash;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

#[derive(Debug, Clone, Serialize)]
pub struct SimSettings {
    pub shards: usize,
    pub queue_capacity: usize,
    pub watermark: f64,
    /// Evaluations per second per shard worker.
    pub service_rate: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateReport {
    pub gate: String,
    pub offered: u64,
    pub invalid: BTreeMap<String, u64>,
    pub admitted: u64,
    pub shed: u64,
    pub low_offered: u64,
    pub shed_pct_of_all: f64,
    pub shed_pct_of_low: f64,
    /// Highest queue fill seen at an arrival, as a fraction of capacity.
    pub peak_fill: f64,
    /// Longest total time any one shard spent at or above the watermark.
    pub seconds_above_watermark: f64,
    pub high_delay_p50_ms: f64,
    pub high_delay_p99_ms: f64,
    /// Shed events per capture second, from second 0.
    pub shed_per_second: Vec<u64>,
}

/// The nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Rounds to 3 decimals so reports stay short and stable.
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One shard's queue and worker: a FIFO single server with a fixed service
/// time, plus the shaper's lane in front of it.
#[derive(Default)]
struct ShardModel {
    /// Service start times of queued events, ascending (FIFO).
    starts: VecDeque<Nanos>,
    /// Entry times of queued events that had to wait for room and so enter
    /// later than they were scheduled; not yet in the queue before then.
    late_entries: Vec<Nanos>,
    /// Shaped events admitted by the gate, by release time.
    lane: VecDeque<Nanos>,
    busy_until: Nanos,
    above_since: Option<Nanos>,
    above_total: Nanos,
}

impl ShardModel {
    /// Events in the queue at `t`: entered, not yet in service (as the live
    /// channel counts them; the lane is not the queue).
    fn fill_at(&mut self, t: Nanos) -> usize {
        while self.starts.front().is_some_and(|&s| s <= t) {
            self.starts.pop_front();
        }
        self.late_entries.retain(|&e| e > t);
        self.starts.len() - self.late_entries.len()
    }

    /// When an event that wants in at `t` finds room: at once, or when
    /// enough of those ahead of it have started.
    fn room_at(&mut self, t: Nanos, capacity: usize) -> Nanos {
        self.fill_at(t);
        let waiting = self.starts.len();
        if waiting < capacity {
            t
        } else {
            self.starts[waiting - capacity]
        }
    }

    /// Queues an event that wants in at `t`; returns (entry, service start).
    fn enqueue(&mut self, t: Nanos, capacity: usize, service: Nanos) -> (Nanos, Nanos) {
        let enter = self.room_at(t, capacity);
        if enter > t {
            self.late_entries.push(enter);
        }
        let start = self.busy_until.max(enter);
        self.busy_until = start + service;
        self.starts.push_back(start);
        (enter, start)
    }

    /// Moves shaped events whose release time has come into the queue.
    fn release_due(&mut self, t: Nanos, capacity: usize, service: Nanos) {
        while let Some(&release) = self.lane.front() {
            if release > t {
                break;
            }
            self.lane.pop_front();
            self.enqueue(release, capacity, service);
        }
    }
}

/// One decision of the replay, for tests that hold it against the live
/// router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// When the router handled the event (later than its arrival if a full
    /// queue made an earlier High event wait).
    pub handled_at: Nanos,
    pub shard: usize,
    pub fill: usize,
    pub verdict: Verdict,
    /// The shard gate's level just after the decision.
    pub gate_level: f64,
}

/// Runs the capture through one gate.
pub fn simulate(
    capture: &[CaptureRecord],
    spec: &GateSpec,
    settings: &SimSettings,
    codec: &CodecSettings,
) -> Result<GateReport, String> {
    simulate_steps(capture, spec, settings, codec).map(|(report, _)| report)
}

/// [`simulate`], also returning every admission decision in order.
pub fn simulate_steps(
    capture: &[CaptureRecord],
    spec: &GateSpec,
    settings: &SimSettings,
    codec: &CodecSettings,
) -> Result<(GateReport, Vec<Step>), String> {
    let shards = settings.shards.max(1);
    let policy = AdmissionPolicy::new(settings.watermark, settings.queue_capacity)
        .map_err(|e| e.to_string())?;
    if !(settings.service_rate.is_finite() && settings.service_rate > 0.0) {
        return Err(format!(
            "service rate must be > 0, got {}",
            settings.service_rate
        ));
    }
    let service = ((NANOS_PER_SEC as f64 / settings.service_rate).ceil() as Nanos).max(1);
    let mut admissions = (0..shards)
        .map(|_| spec.build().map(|gate| Admission::new(policy, gate)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut models: Vec<ShardModel> = (0..shards).map(|_| ShardModel::default()).collect();
    let mut dedup = Dedup::new(codec.dedup_window);
    let mut report = GateReport {
        gate: spec.label(),
        offered: capture.len() as u64,
        invalid: BTreeMap::new(),
        admitted: 0,
        shed: 0,
        low_offered: 0,
        shed_pct_of_all: 0.0,
        shed_pct_of_low: 0.0,
        peak_fill: 0.0,
        seconds_above_watermark: 0.0,
        high_delay_p50_ms: 0.0,
        high_delay_p99_ms: 0.0,
        shed_per_second: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut high_delays = Vec::new();
    let mut router_free_at: Nanos = 0;
    let capacity = settings.queue_capacity;
    for record in capture {
        let t = record.t_ns.max(router_free_at);
        let payload = record.payload_bytes();
        let decoded =
            decode(&record.topic, &payload, codec).map(|fix| (VehicleHash::of(&fix.vehicle), fix));
        let (routing, fix) = match decoded {
            Ok((routing, fix)) if dedup.first_sighting(message_digest(&record.topic, &payload)) => {
                (routing, fix)
            }
            Ok(_) => {
                *report.invalid.entry("duplicate".into()).or_default() += 1;
                continue;
            }
            Err(e) => {
                *report.invalid.entry(e.reason.as_str().into()).or_default() += 1;
                continue;
            }
        };
        let s = routing.shard(shards);
        let model = &mut models[s];
        model.release_due(t, capacity, service);
        let len = model.fill_at(t);
        report.peak_fill = report.peak_fill.max(len as f64 / capacity as f64);
        let above = len >= policy.threshold();
        match (above, model.above_since) {
            (true, None) => model.above_since = Some(t),
            (false, Some(since)) => {
                model.above_total += t - since;
                model.above_since = None;
            }
            _ => {}
        }
        if fix.priority == Priority::Low {
            report.low_offered += 1;
        }
        let verdict = admissions[s].decide(len, fix.priority, || t);
        match verdict {
            Verdict::Enqueue => {
                // A full queue makes the router wait until there is room.
                let (enter, start) = model.enqueue(t, capacity, service);
                router_free_at = router_free_at.max(enter);
                report.admitted += 1;
                if fix.priority == Priority::High {
                    high_delays.push(start - record.t_ns);
                }
            }
            Verdict::Release { at } => {
                if admissions[s].paces() {
                    model.lane.push_back(at);
                } else {
                    model.enqueue(at, capacity, service);
                }
                report.admitted += 1;
            }
            Verdict::Shed(_) => {
                report.shed += 1;
                let second = (record.t_ns / NANOS_PER_SEC) as usize;
                if report.shed_per_second.len() <= second {
                    report.shed_per_second.resize(second + 1, 0);
                }
                report.shed_per_second[second] += 1;
            }
        }
        steps.push(Step {
            handled_at: t,
            shard: s,
            fill: len,
            verdict,
            gate_level: admissions[s].level(t),
        });
    }
    let end = capture.last().map_or(0, |r| r.t_ns).max(router_free_at);
    let worst = models
        .iter()
        .map(|m| m.above_total + m.above_since.map_or(0, |s| end.saturating_sub(s)))
        .max()
        .unwrap_or(0);
    let duration_s = (end / NANOS_PER_SEC) as usize + 1;
    report
        .shed_per_second
        .resize(duration_s.max(report.shed_per_second.len()), 0);
    report.seconds_above_watermark = r3(worst as f64 / 1e9);
    report.peak_fill = r3(report.peak_fill);
    report.shed_pct_of_all = r3(100.0 * report.shed as f64 / report.offered.max(1) as f64);
    report.shed_pct_of_low = r3(100.0 * report.shed as f64 / report.low_offered.max(1) as f64);
    high_delays.sort_unstable();
    report.high_delay_p50_ms = r3(percentile(&high_delays, 0.50) as f64 / 1e6);
    report.high_delay_p99_ms = r3(percentile(&high_delays, 0.99) as f64 / 1e6);
    Ok((report, steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    /// A burst of pings far above the service rate: the queue fills, and
    /// at a full queue an unpaced gate is never asked (a twin gate asked
    /// only on the other gated events makes the same decisions); no shard
    /// ever holds more than its capacity, shaper included.
    #[test]
    fn a_burst_that_fills_the_queue_spends_nothing_on_refusals_and_never_overfills() {
        use crate::admission::{Decision, Gate, ShedCause};
        let mut capture = Vec::new();
        for i in 0..3000u64 {
            let body = format!(
                r#"{{"vehicle":"v{}","ts":{},"lat":1,"lon":1,"kind":"ping"}}"#,
                i % 7,
                1_750_000_000_000 + i
            );
            capture.push(CaptureRecord::new(
                i * 50_000,
                "fleet/v/telemetry",
                body.as_bytes(),
            ));
        }
        let settings = SimSettings {
            shards: 2,
            queue_capacity: 20,
            watermark: 0.6,
            service_rate: 500.0,
        };
        for spec in [
            "token:rate=400,burst=30",
            "leaky_meter:rate=400,burst=30",
            "leaky_shaper:rate=400,burst=30",
        ] {
            let spec: GateSpec = spec.parse().unwrap();
            let (report, steps) =
                simulate_steps(&capture, &spec, &settings, &CodecSettings::default()).unwrap();
            assert!(
                steps.iter().all(|s| s.fill <= settings.queue_capacity),
                "{spec:?}"
            );
            assert!(report.peak_fill <= 1.0, "{spec:?}: {report:?}");
            if spec.kind == crate::admission::GateKind::LeakyShaper {
                continue;
            }
            let full = steps
                .iter()
                .filter(|s| s.verdict == Verdict::Shed(ShedCause::QueueFull))
                .count();
            assert!(full > 100, "{spec:?}: the burst filled the queue ({full})");
            let mut twins = [spec.build().unwrap(), spec.build().unwrap()];
            for s in &steps {
                if s.fill < 12 || s.verdict == Verdict::Shed(ShedCause::QueueFull) {
                    continue;
                }
                let twin = match twins[s.shard].try_admit(s.handled_at, 1) {
                    Decision::Admit { release_at } => Verdict::Release { at: release_at },
                    Decision::Reject {
                        retry_after,
                        reason,
                    } => Verdict::Shed(ShedCause::Gate {
                        retry_after,
                        reason,
                    }),
                };
                assert_eq!(s.verdict, twin, "{spec:?}");
                assert_eq!(s.gate_level, twins[s.shard].level(s.handled_at));
            }
        }
    }

    #[test]
    fn a_burst_of_pings_is_shed_and_high_is_not() {
        let mut capture = Vec::new();
        for i in 0..1000u64 {
            let body = format!(
                r#"{{"vehicle":"v","ts":{},"lat":1,"lon":1,"kind":"ping"}}"#,
                1_750_000_000_000 + i
            );
            capture.push(CaptureRecord::new(
                i * 100_000,
                "fleet/v/telemetry",
                body.as_bytes(),
            ));
        }
        let body = r#"{"vehicle":"v","ts":1750000009999,"lat":1,"lon":1,"speed_kmh":40}"#;
        capture.push(CaptureRecord::new(
            100_000_000,
            "fleet/v/telemetry",
            body.as_bytes(),
        ));
        let settings = SimSettings {
            shards: 1,
            queue_capacity: 100,
            watermark: 0.6,
            service_rate: 1000.0,
        };
        let spec: GateSpec = "token:rate=100,burst=50".parse().unwrap();
        let r = simulate(&capture, &spec, &settings, &CodecSettings::default()).unwrap();
        assert_eq!(r.admitted + r.shed, 1001);
        assert!(r.shed > 500, "{r:?}");
        assert_eq!(r.low_offered, 1000);
        assert!(r.peak_fill >= 0.6);
        assert!(r.high_delay_p99_ms > 0.0);
        assert_eq!(r.shed_per_second.iter().sum::<u64>(), r.shed);
    }
}
