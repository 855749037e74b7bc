//! The metrics of the pipeline (the accounting line's terms, admission,
//! queues, finished messages): each name written once, here, with its description;
//! the code records through these constants.

use crate::sampling::SAMPLE_EVERY;
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const EVENTS_RECEIVED_TOTAL: &str = "geogate_events_received_total";
pub const EVENTS_INVALID_TOTAL: &str = "geogate_events_invalid_total";
pub const EVENTS_ADMITTED_TOTAL: &str = "geogate_events_admitted_total";
pub const EVENTS_SHED_TOTAL: &str = "geogate_events_shed_total";
pub const QUEUE_DEPTH: &str = "geogate_queue_depth";
pub const QUEUE_CAPACITY: &str = "geogate_queue_capacity";
pub const GATE_LEVEL: &str = "geogate_gate_level";
pub const EVENTS_EVALUATED_TOTAL: &str = "geogate_events_evaluated_total";
pub const END_TO_END_LATENCY_SECONDS: &str = "geogate_end_to_end_latency_seconds";
pub const QUEUE_WATERMARK: &str = "geogate_queue_watermark";
pub const GATE_ADMITTED_TOTAL: &str = "geogate_gate_admitted_total";
pub const BACKPRESSURE_WAITS_TOTAL: &str = "geogate_backpressure_waits_total";
pub const FIXES_LATE_TOTAL: &str = "geogate_fixes_late_total";
pub const FIXES_HELD_TOTAL: &str = "geogate_fixes_held_total";
pub const FIXES_RELEASED_TOTAL: &str = "geogate_fixes_released_total";
pub const MESSAGES_IGNORED_TOTAL: &str = "geogate_messages_ignored_total";
pub const DUPLICATES_IGNORED_TOTAL: &str = "geogate_duplicates_ignored_total";
pub const EVENTS_IN_QUEUE: &str = "geogate_events_in_queue";

/// Describes them to the exporter.
pub fn describe() {
    describe_counter!(
        EVENTS_RECEIVED_TOTAL,
        Unit::Count,
        "Messages the router has taken from the source (the received term of the accounting line)."
    );
    describe_counter!(
        EVENTS_INVALID_TOTAL,
        Unit::Count,
        "Messages refused by the codec, by reason."
    );
    describe_counter!(
        EVENTS_ADMITTED_TOTAL,
        Unit::Count,
        "Events enqueued to a shard, by shard and priority."
    );
    describe_counter!(
        EVENTS_SHED_TOTAL,
        Unit::Count,
        "Low-priority events refused by a shard's gate above the watermark."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Events in a shard's queue at the last admission."
    );
    describe_gauge!(QUEUE_CAPACITY, Unit::Count, "Capacity of a shard's queue.");
    describe_gauge!(
        GATE_LEVEL,
        Unit::Count,
        "Gate level at the last gated decision: tokens, fill or backlog."
    );
    describe_counter!(
        EVENTS_EVALUATED_TOTAL,
        Unit::Count,
        "Fixes evaluated against the fences, by shard: on arrival, or on leaving their reorder window (those also in geogate_fixes_released_total)."
    );
    describe_histogram!(
        END_TO_END_LATENCY_SECONDS,
        Unit::Seconds,
        format!(
            "Receive to finished (evaluated and committed, its transitions written), sampled: one finished message in {SAMPLE_EVERY} of each shard, so the count is about 1/{SAMPLE_EVERY} of the messages finished."
        )
    );
    describe_gauge!(
        QUEUE_WATERMARK,
        Unit::Count,
        "Configured watermark as a fraction of queue capacity (for dashboards)."
    );
    describe_counter!(
        GATE_ADMITTED_TOTAL,
        Unit::Count,
        "Low-priority events the gate admitted above the watermark; bounded by b + r·t per shard."
    );
    describe_counter!(
        BACKPRESSURE_WAITS_TOTAL,
        Unit::Count,
        "High-priority events that found their shard queue full and waited (never shed)."
    );
    describe_counter!(
        FIXES_LATE_TOTAL,
        Unit::Count,
        "Fixes older than their vehicle's last applied fix once the reorder window had passed: no transition, dead-lettered with reason late (the late term of the accounting line)."
    );
    describe_counter!(
        FIXES_HELD_TOTAL,
        Unit::Count,
        "Fixes taken into their vehicle's reorder window, applied from there in fix-time order (the held term of the accounting line)."
    );
    describe_counter!(
        FIXES_RELEASED_TOTAL,
        Unit::Count,
        "Fixes that left their reorder window and were evaluated (counted in geogate_events_evaluated_total too, not again in the accounting line)."
    );
    describe_counter!(
        MESSAGES_IGNORED_TOTAL,
        Unit::Count,
        "Routine messages that are not fixes, acked and not dead-lettered: OwnTracks messages that are not locations (reason not_a_location) and empty payloads clearing a retained message (reason retained_clear)."
    );
    describe_counter!(
        DUPLICATES_IGNORED_TOTAL,
        Unit::Count,
        "Redelivered fixes recognised and not applied again: by the codec's dedup window, or by the vehicle state (after a restart). Counted under invalid, reason duplicate."
    );
    describe_gauge!(
        EVENTS_IN_QUEUE,
        Unit::Count,
        "Taken and not finished: the in_queue term of the accounting line."
    );
}
