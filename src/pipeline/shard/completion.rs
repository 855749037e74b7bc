//! A batch's messages, finished together once the state backend says its
//! effects are durable: each counted where the accounting line says, its
//! latency recorded, its token acked. The backend reports through
//! [`Completion`]; what finishing means (accounting, acks) stays here, in
//! the pipeline.

use crate::pipeline::accounting::Accounting;
use crate::pipeline::metrics::{
    DUPLICATES_IGNORED_TOTAL, END_TO_END_LATENCY_SECONDS, EVENTS_EVALUATED_TOTAL,
    EVENTS_INVALID_TOTAL, FIXES_OUT_OF_ORDER_TOTAL,
};
use crate::sampling::SAMPLE_EVERY;
use crate::source::{AckToken, Completions};
use crate::state::{Completion, Outcomes};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Counts for one shard, kept as metric handles (no lookups per batch).
pub struct ShardCounters {
    evaluated: metrics::Counter,
    out_of_order: metrics::Counter,
    duplicates: metrics::Counter,
    /// `geogate_events_invalid_total{reason="duplicate"}`: a redelivery the
    /// state recognised is refused as the dedup window's are.
    invalid_duplicates: metrics::Counter,
    latency: metrics::Histogram,
    /// Messages finished so far, for the latency's sampling stride.
    latency_seen: AtomicU64,
    accounting: Arc<Accounting>,
    completions: Completions,
}

impl ShardCounters {
    pub fn new(shard: usize, accounting: Arc<Accounting>, completions: Completions) -> Self {
        Self {
            evaluated: metrics::counter!(EVENTS_EVALUATED_TOTAL, "shard" => shard.to_string()),
            out_of_order: metrics::counter!(FIXES_OUT_OF_ORDER_TOTAL),
            duplicates: metrics::counter!(DUPLICATES_IGNORED_TOTAL, "by" => "state"),
            invalid_duplicates: metrics::counter!(EVENTS_INVALID_TOTAL, "reason" => "duplicate"),
            latency: metrics::histogram!(END_TO_END_LATENCY_SECONDS),
            latency_seen: AtomicU64::new(0),
            accounting,
            completions,
        }
    }
}

/// One batch's messages: (ack token, received at) each. Dropped
/// unfinished (shutdown before the batch was durable), they stay unacked
/// and `in_queue`, and come back after the restart.
pub struct Finished {
    pub counters: Arc<ShardCounters>,
    pub messages: Vec<(Option<AckToken>, Instant)>,
}

impl Completion for Finished {
    fn complete(self: Box<Self>, o: Outcomes) {
        let c = &self.counters;
        c.accounting
            .finished(o.evaluated, o.out_of_order, o.duplicates);
        c.accounting.transitions(o.enters + o.exits);
        c.evaluated.increment(o.evaluated);
        c.out_of_order.increment(o.out_of_order);
        c.duplicates.increment(o.duplicates);
        c.invalid_duplicates.increment(o.duplicates);
        // One clock read for the batch: its messages finish together.
        let now = Instant::now();
        let first = c
            .latency_seen
            .fetch_add(self.messages.len() as u64, Relaxed);
        for (i, (token, received_at)) in self.messages.into_iter().enumerate() {
            if (first + i as u64).is_multiple_of(SAMPLE_EVERY) {
                c.latency
                    .record(now.saturating_duration_since(received_at).as_secs_f64());
            }
            c.completions.done(token);
        }
    }
}
