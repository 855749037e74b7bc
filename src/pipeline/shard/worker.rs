//! A shard worker: drains its queue in batches into the evaluator, writes
//! each fix's transitions, and only then reports the fix finished (so its
//! ack never precedes its transitions). A write that fails is retried with
//! backoff, the fix staying unfinished, until the sink recovers or the
//! drain deadline passes.

use super::Admitted;
use crate::geofence::{Evaluator, FenceIndex, FixOutcome, TransitionKind};
use crate::pipeline::accounting::Accounting;
use crate::sink::events::EventSink;
use crate::sink::health::{retry_until, wait_deadline};
use crate::source::Completions;
use metrics::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Everything a worker needs besides its queue.
pub struct WorkerContext {
    pub shard: usize,
    pub fences: watch::Receiver<Arc<FenceIndex>>,
    pub events: Arc<EventSink>,
    pub completions: Completions,
    pub accounting: Arc<Accounting>,
    /// Evaluations per second cap; 0 = none.
    pub sustained_rate: f64,
    /// Set at shutdown: stop at this instant even if the queue is not empty.
    pub deadline: watch::Receiver<Option<Instant>>,
    /// Label transitions by fence id (opt-in).
    pub per_fence_labels: bool,
}

/// Drains one shard into its evaluator until the queue closes or the drain
/// deadline passes.
pub async fn worker(
    mut rx: mpsc::Receiver<Admitted>,
    mut evaluator: Evaluator,
    mut ctx: WorkerContext,
) {
    let label = ctx.shard.to_string();
    let evaluated = metrics::counter!("geogate_events_evaluated_total", "shard" => label);
    let out_of_order = metrics::counter!("geogate_fixes_out_of_order_total");
    let overflow = metrics::counter!("geogate_membership_overflow_total");
    let mut overflow_seen = 0;
    let eval_time: Histogram = metrics::histogram!("geogate_evaluation_duration_seconds");
    let latency: Histogram = metrics::histogram!("geogate_end_to_end_latency_seconds");
    let transitions_metric = [TransitionKind::Enter, TransitionKind::Exit]
        .map(|k| metrics::counter!("geogate_fence_transitions_total", "kind" => k.as_str()));
    let pace =
        (ctx.sustained_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / ctx.sustained_rate));
    let mut next_slot = Instant::now();
    let mut transitions = Vec::new();
    let mut batch = Vec::with_capacity(256);
    'batches: loop {
        // One wake-up per batch, not per event: measured in
        // benches/pipeline.rs, per-event parking cost a third of the time.
        let received = tokio::select! {
            n = rx.recv_many(&mut batch, 256) => n,
            _ = wait_deadline(&mut ctx.deadline) => 0,
        };
        if received == 0 {
            break;
        }
        // Read under the watch's lock once per batch, and again only when
        // it changes (a lock-free check): every worker shares that lock.
        let mut deadline = *ctx.deadline.borrow();
        for item in batch.drain(..) {
            if ctx.deadline.has_changed().unwrap_or(false) {
                deadline = *ctx.deadline.borrow_and_update();
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Past the drain deadline: what is left stays unacked.
                break 'batches;
            }
            if ctx.fences.has_changed().unwrap_or(false) {
                let index = ctx.fences.borrow_and_update().clone();
                evaluator.swap_index(index);
            }
            if let Some(pace) = pace {
                let now = Instant::now();
                if next_slot > now {
                    tokio::time::sleep(next_slot - now).await;
                }
                next_slot = next_slot.max(now) + pace;
            }
            let started = Instant::now();
            transitions.clear();
            let outcome = evaluator.evaluate(
                &item.vehicle,
                item.fix_ms,
                item.lat,
                item.lon,
                &mut transitions,
            );
            eval_time.record(started.elapsed().as_secs_f64());
            let overflowed = evaluator.stats().membership_overflow;
            if overflowed > overflow_seen {
                overflow.increment(overflowed - overflow_seen);
                overflow_seen = overflowed;
            }
            if let Err(first) = ctx.events.write(&transitions) {
                let events = &ctx.events;
                if !retry_until(events.health(), &mut ctx.deadline, first, || events.retry()).await
                {
                    // Shutdown came first: this fix and the rest stay
                    // unacked and come back after the restart.
                    break 'batches;
                }
            }
            ctx.events.publish(&transitions).await;
            for t in &transitions {
                transitions_metric[t.event as usize].increment(1);
                if ctx.per_fence_labels {
                    metrics::counter!("geogate_fence_transitions_by_fence_total", "fence" => t.fence.to_string(), "kind" => t.event.as_str()).increment(1);
                }
            }
            ctx.accounting.transitions(transitions.len() as u64);
            match outcome {
                FixOutcome::Applied => {
                    ctx.accounting.evaluated();
                    evaluated.increment(1);
                }
                FixOutcome::OutOfOrder => {
                    ctx.accounting.out_of_order();
                    out_of_order.increment(1);
                }
            }
            latency.record(item.received_at.elapsed().as_secs_f64());
            ctx.completions.done(item.token);
        }
    }
}
