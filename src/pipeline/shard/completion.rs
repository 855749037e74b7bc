//! A batch's messages, finished together once the state backend says its
//! effects are durable: each counted where the accounting line says, its
//! latency recorded, its token acked. The backend reports through
//! [`Completion`]; what finishing means (accounting, acks) stays here, in
//! the pipeline.

use super::router::{Unapplied, Why};
use crate::model::VehicleId;
use crate::pipeline::accounting::Accounting;
use crate::pipeline::metrics::{
    END_TO_END_LATENCY_SECONDS, EVENTS_EVALUATED_TOTAL, FIXES_HELD_TOTAL, FIXES_RELEASED_TOTAL,
};
use crate::sampling::SAMPLE_EVERY;
use crate::source::{AckToken, Completions};
use crate::state::{Completion, Outcomes};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;
use tokio::sync::mpsc;

/// Counts for one shard, kept as metric handles (no lookups per batch).
pub struct ShardCounters {
    evaluated: metrics::Counter,
    held: metrics::Counter,
    released: metrics::Counter,
    latency: metrics::Histogram,
    /// Messages finished so far, for the latency's sampling stride.
    latency_seen: AtomicU64,
    accounting: Arc<Accounting>,
    completions: Completions,
    /// Where fixes the state did not apply go to be dead-lettered (by the
    /// router) and acked.
    unapplied: mpsc::UnboundedSender<Unapplied>,
}

impl ShardCounters {
    pub fn new(
        shard: usize,
        accounting: Arc<Accounting>,
        completions: Completions,
        unapplied: mpsc::UnboundedSender<Unapplied>,
    ) -> Self {
        Self {
            evaluated: metrics::counter!(EVENTS_EVALUATED_TOTAL, "shard" => shard.to_string()),
            held: metrics::counter!(FIXES_HELD_TOTAL),
            released: metrics::counter!(FIXES_RELEASED_TOTAL),
            latency: metrics::histogram!(END_TO_END_LATENCY_SECONDS),
            latency_seen: AtomicU64::new(0),
            accounting,
            completions,
            unapplied,
        }
    }
}

/// One message of a batch, kept until the batch is finished: its ack
/// token and receive time, and what its dead-letter record needs should
/// its fix prove late.
pub struct Message {
    pub token: Option<AckToken>,
    pub received_at: Instant,
    pub topic: String,
    pub payload: bytes::Bytes,
    pub vehicle: VehicleId,
    pub fix_ms: i64,
}

/// One batch's messages. Dropped unfinished (shutdown before the batch was
/// durable), they stay unacked and `in_queue`, and come back after the
/// restart.
pub struct Finished {
    pub counters: Arc<ShardCounters>,
    pub messages: Vec<Message>,
}

impl Completion for Finished {
    fn complete(self: Box<Self>, o: Outcomes) {
        let c = &self.counters;
        c.accounting.finished(o.evaluated, o.held);
        c.accounting.transitions(o.enters + o.exits);
        // The metric counts every evaluation; the accounting line counts
        // each message once, when it finishes (a released fix finished as
        // held).
        c.evaluated.increment(o.evaluated + o.released);
        c.held.increment(o.held);
        c.released.increment(o.released);
        // One clock read for the batch: its messages finish together.
        let now = Instant::now();
        let first = c
            .latency_seen
            .fetch_add(self.messages.len() as u64, Relaxed);
        let mut late = o.late.iter().peekable();
        let mut duplicates = o.duplicates.iter().peekable();
        for (i, m) in self.messages.into_iter().enumerate() {
            let why = if let Some(l) = late.next_if(|l| l.index == i) {
                Some(Why::Late { by_ms: l.by_ms })
            } else {
                duplicates.next_if(|&&d| d == i).map(|_| Why::Duplicate)
            };
            if let Some(why) = why {
                // Finished by the router once its dead letter is written;
                // if the router has gone (shutdown), it stays unacked.
                let _ = c.unapplied.send(Unapplied {
                    token: m.token,
                    topic: m.topic,
                    payload: m.payload,
                    vehicle: m.vehicle,
                    fix_ms: m.fix_ms,
                    why,
                });
                continue;
            }
            if (first + i as u64).is_multiple_of(SAMPLE_EVERY) {
                c.latency
                    .record(now.saturating_duration_since(m.received_at).as_secs_f64());
            }
            c.completions.done(m.token);
        }
    }
}
