//! `[pipeline]`: shards, queues, the watermark, decode lanes, draining.

use crate::admission::AdmissionPolicy;
use crate::problems::Problems;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Worker shards; 0 means one per available core.
    pub shards: usize,
    pub queue_capacity: usize,
    pub watermark: f64,
    /// Optional cap on each worker's evaluations per second; 0 = off.
    pub sustained_rate: f64,
    /// How long shutdown may spend draining queues.
    pub drain_deadline_s: f64,
    /// Decode lanes (tasks decoding payloads beside the router), split by
    /// topic; 0 means one per available core but the router's: one on a
    /// single core, at least two on two cores or more.
    pub decode_lanes: usize,
    /// The runtime's threads ask Linux for `SCHED_BATCH`: no preemption on
    /// wake-up (see [`crate::runtime`]).
    pub sched_batch: bool,
    /// How long each fix waits in its vehicle's reorder window, in ms of
    /// the receive clock, so that fixes arriving out of order (a device's
    /// buffer sent after its live fix, or newest first) are applied in
    /// fix-time order. Unset: [`DEFAULT_REORDER_WINDOW_MS`].
    pub reorder_window_ms: Option<u64>,
}

/// The reorder window's default (docs/decisions/0020-reorder-window-default.md).
pub const DEFAULT_REORDER_WINDOW_MS: u64 = 2_000;

/// Most decode lanes: more only adds tasks that wait.
pub const MAX_DECODE_LANES: usize = 64;

/// Most worker shards: far past any machine's cores, and within the key
/// ranges a durable store gives shards for held fixes
/// (`state::local::held_keys`).
pub const MAX_SHARDS: usize = 4096;

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            decode_lanes: 0,
            sched_batch: true,
            shards: 0,
            queue_capacity: 4096,
            watermark: crate::admission::watermark::DEFAULT_WATERMARK,
            sustained_rate: 0.0,
            drain_deadline_s: 10.0,
            reorder_window_ms: None,
        }
    }
}

impl PipelineConfig {
    pub fn shard_count(&self) -> usize {
        if self.shards == 0 {
            cores()
        } else {
            self.shards
        }
    }

    pub fn decode_lane_count(&self) -> usize {
        if self.decode_lanes == 0 {
            default_decode_lanes(cores())
        } else {
            self.decode_lanes
        }
    }
}

/// A lane per core but the router's, one on a single core, and at least
/// two on two cores: one lane leaves decoding serial, and on 2 cores two
/// lanes ran the in-process pipeline faster in 12 of 16 alternating
/// rounds, with the live drain level by the median
/// (docs/decisions/0002-decode-lanes-by-topic-hash.md).
fn default_decode_lanes(cores: usize) -> usize {
    cores
        .saturating_sub(1)
        .max(cores.min(2))
        .clamp(1, MAX_DECODE_LANES)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl PipelineConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.queue_capacity == 0 {
            problems.add("pipeline.queue_capacity", "must be ≥ 1");
        }
        if let Err(e) = AdmissionPolicy::new(self.watermark, self.queue_capacity.max(1)) {
            problems.add("pipeline.watermark", e.to_string());
        }
        if self.shards > MAX_SHARDS {
            problems.add(
                "pipeline.shards",
                format!(
                    "must be 0 (one per core) to {MAX_SHARDS}, got {}",
                    self.shards
                ),
            );
        }
        if self.decode_lanes > MAX_DECODE_LANES {
            problems.add(
                "pipeline.decode_lanes",
                format!(
                    "must be 0 (cores − 1, at least 1, and at least 2 on 2 cores or more) to {MAX_DECODE_LANES}, got {}",
                    self.decode_lanes
                ),
            );
        }
        if !(self.sustained_rate.is_finite() && self.sustained_rate >= 0.0) {
            problems.add(
                "pipeline.sustained_rate",
                format!(
                    "must be a finite number ≥ 0 (0 = off), got {}",
                    self.sustained_rate
                ),
            );
        }
        if !(self.drain_deadline_s.is_finite() && self.drain_deadline_s >= 0.0) {
            problems.add("pipeline.drain_deadline_s", "must be a finite number ≥ 0");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One lane on one core, two on two and three, then a lane per core
    /// but the router's, never more than the cap.
    #[test]
    fn default_decode_lanes_by_core_count() {
        let lanes: Vec<_> = [1, 2, 3, 4, 8, 64, 65, 200]
            .into_iter()
            .map(default_decode_lanes)
            .collect();
        assert_eq!(lanes, [1, 2, 2, 3, 7, 63, 64, MAX_DECODE_LANES]);
    }
}
