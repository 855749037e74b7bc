//! The metrics of the state backends: each name written once, here, with its
//! description; the code records through these constants.

use crate::sampling::SAMPLE_EVERY;
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const EVALUATION_DURATION_SECONDS: &str = "geogate_evaluation_duration_seconds";
pub const STATE_COMMIT_DURATION_SECONDS: &str = "geogate_state_commit_duration_seconds";
pub const STATE_COMMIT_BATCHES: &str = "geogate_state_commit_batches";
pub const FENCE_SETS_LIVE: &str = "geogate_fence_sets_live";
pub const STATE_STORE_BYTES: &str = "geogate_state_store_bytes";
pub const FENCE_TRANSITIONS_BY_FENCE_TOTAL: &str = "geogate_fence_transitions_by_fence_total";
pub const FENCE_TRANSITIONS_TOTAL: &str = "geogate_fence_transitions_total";
pub const MEMBERSHIP_OVERFLOW_TOTAL: &str = "geogate_membership_overflow_total";
pub const TRANSITION_LATENCY_SECONDS: &str = "geogate_transition_latency_seconds";
pub const REORDER_WINDOW_FIXES: &str = "geogate_reorder_window_fixes";
pub const VEHICLES_EXPIRED_TOTAL: &str = "geogate_vehicles_expired_total";
pub const DWELLS_DROPPED_TOTAL: &str = "geogate_dwells_dropped_total";

/// Describes them to the exporter.
pub fn describe() {
    describe_histogram!(
        TRANSITION_LATENCY_SECONDS,
        Unit::Seconds,
        "Receive to written: from when geogate received the message that caused a transition (for an expiry, when it fell due) to when its line was in the events file (memory and embedded state), or in the engine's events stream (partitioned state: received is when the engine stored the fix). Includes the time a fix waited in its reorder window."
    );
    describe_gauge!(
        REORDER_WINDOW_FIXES,
        Unit::Count,
        "Fixes waiting in reorder windows now, by shard (pipeline.reorder_window_ms)."
    );
    describe_counter!(
        VEHICLES_EXPIRED_TOTAL,
        Unit::Count,
        "Vehicles forgotten after fences.idle_expiry_s without a message (receive clock), each with an exit (cause expired) for every fence it was in."
    );
    describe_counter!(
        DWELLS_DROPPED_TOTAL,
        Unit::Count,
        "Dwells in progress dropped because their fence was deleted before they were confirmed."
    );
    describe_histogram!(
        EVALUATION_DURATION_SECONDS,
        Unit::Seconds,
        format!(
            "Time to evaluate one fix, sampled: every {SAMPLE_EVERY}th evaluation of each worker is timed (memory and embedded state), so the count is about 1/{SAMPLE_EVERY} of the fixes evaluated. Where a worker looks up a batch's fences together (a fence set past the cache), each sample carries an equal share of that lookup."
        )
    );
    describe_histogram!(
        STATE_COMMIT_DURATION_SECONDS,
        Unit::Seconds,
        "One state transaction: the vehicle records and outbox entries of every batch waiting for it (memory and embedded state)."
    );
    describe_histogram!(
        STATE_COMMIT_BATCHES,
        Unit::Count,
        "Worker batches per state transaction (group commit)."
    );
    describe_gauge!(
        FENCE_SETS_LIVE,
        Unit::Count,
        "Distinct fence sets (fence file and rule settings) among the live partitioned instances, as their heartbeats' fingerprints say (backend = partitioned); above 1 while a rollout is half done."
    );
    describe_gauge!(
        STATE_STORE_BYTES,
        Unit::Bytes,
        "Bytes the state store occupies (file and write-ahead log); 0 for the memory backend."
    );
    describe_counter!(
        FENCE_TRANSITIONS_BY_FENCE_TOTAL,
        Unit::Count,
        "Transitions per fence; only with metrics.per_fence_labels = true."
    );
    describe_counter!(
        FENCE_TRANSITIONS_TOTAL,
        Unit::Count,
        "Enter and exit transitions emitted."
    );
    describe_counter!(
        MEMBERSHIP_OVERFLOW_TOTAL,
        Unit::Count,
        "Enters not recorded because the vehicle already held fences.max_memberships fences."
    );
}

/// What the membership rules produced, counted as a shard's state applies
/// each batch, by whichever backend runs the rules.
pub struct RuleCounters {
    transitions: [metrics::Counter; 2],
    overflows: metrics::Counter,
}

impl Default for RuleCounters {
    fn default() -> Self {
        Self {
            transitions: ["enter", "exit"]
                .map(|kind| metrics::counter!(FENCE_TRANSITIONS_TOTAL, "kind" => kind)),
            overflows: metrics::counter!(MEMBERSHIP_OVERFLOW_TOTAL),
        }
    }
}

impl RuleCounters {
    pub fn record(&self, enters: u64, exits: u64, overflows: u64) {
        self.transitions[0].increment(enters);
        self.transitions[1].increment(exits);
        self.overflows.increment(overflows);
    }
}
