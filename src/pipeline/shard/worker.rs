//! A shard worker: drains its queue in batches into the evaluator and
//! hands each batch (the vehicles it changed, the transitions it produced,
//! its messages) to the committer. Nothing is acked here: a message is
//! finished only once its batch is committed and its transitions are in
//! the events file (see `state::commit`).
//!
//! With the redis backend the worker keeps no vehicle state: it probes each
//! fix against its fences and the batch is applied in Redis
//! (`state::shared`); its messages are finished once Redis has it.

use super::Admitted;
use super::queue::QueueReceiver;
use crate::geofence::{Evaluator, FenceIndex, FixOutcome, TransitionKind, VehicleSnapshot};
use crate::metrics::SAMPLE_EVERY;
use crate::model::VehicleId;
use crate::sink::health::wait_deadline;
use crate::state::commit::{CommitRequest, Finished, ShardCounters};
use crate::state::record;
use crate::state::shared::SharedApplier;
use metrics::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Most fixes taken from the queue per batch (and so per commit request).
const BATCH: usize = 256;

/// Everything a worker needs besides its queue.
pub struct WorkerContext {
    pub shard: usize,
    pub fences: watch::Receiver<Arc<FenceIndex>>,
    /// Where batches go to be committed and finished.
    pub sink: BatchSink,
    pub counters: Arc<ShardCounters>,
    /// Evaluations per second cap; 0 = none.
    pub sustained_rate: f64,
    /// Set at shutdown: stop at this instant even if the queue is not empty.
    pub deadline: watch::Receiver<Option<Instant>>,
    /// Label transitions by fence id (opt-in).
    pub per_fence_labels: bool,
}

/// Where a worker's batches go.
pub enum BatchSink {
    /// The local store's committer (embedded or memory backend).
    Commit(mpsc::Sender<CommitRequest>),
    /// Redis, shared with other instances.
    Shared(SharedApplier),
}

/// Drains one shard into its evaluator until the queue closes or the drain
/// deadline passes.
pub async fn worker(mut rx: QueueReceiver, mut evaluator: Evaluator, mut ctx: WorkerContext) {
    let overflow = metrics::counter!("geogate_membership_overflow_total");
    let mut overflow_seen = 0;
    let eval_time: Histogram = metrics::histogram!("geogate_evaluation_duration_seconds");
    let transitions_metric = [TransitionKind::Enter, TransitionKind::Exit]
        .map(|k| metrics::counter!("geogate_fence_transitions_total", "kind" => k.as_str()));
    let pace =
        (ctx.sustained_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / ctx.sustained_rate));
    // A paced worker stands in for a slow one, and what a worker holds in
    // its batch is invisible to the watermark: paced, it takes one event at
    // a time so its backlog stays in the queue where the router sees it.
    let batch_limit = if pace.is_some() { 1 } else { BATCH };
    let mut next_slot = Instant::now();
    let mut evaluations: u64 = 0;
    let mut batch = Vec::with_capacity(batch_limit);
    let mut changed: Vec<(VehicleId, Option<VehicleSnapshot>)> = Vec::new();
    'batches: loop {
        // One wake-up per batch, not per event: measured in
        // benches/pipeline.rs, per-event parking cost a third of the time.
        let received = tokio::select! {
            n = rx.recv_many(&mut batch, batch_limit) => n,
            _ = wait_deadline(&mut ctx.deadline) => 0,
        };
        if received == 0 {
            break;
        }
        let mut finished = Finished::new(ctx.counters.clone());
        finished.messages.reserve_exact(received);
        let mut transitions = Vec::new();
        let mut past_deadline = false;
        swap_if_reloaded(&mut ctx, &mut evaluator);
        // `Some` when the batch's fences were looked up together (local
        // state only: the shared applier probes its own).
        let lookup_share = matches!(ctx.sink, BatchSink::Commit(_))
            .then(|| cover_if_large(&mut evaluator, &batch, evaluations))
            .flatten();
        // Read under the watch's lock once per batch, and again only when
        // it changes (a lock-free check): every worker shares that lock.
        let mut deadline = *ctx.deadline.borrow();
        for (i, item) in batch.drain(..).enumerate() {
            if ctx.deadline.has_changed().unwrap_or(false) {
                deadline = *ctx.deadline.borrow_and_update();
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Past the drain deadline: what is left stays unacked.
                past_deadline = true;
                break;
            }
            if let Some(pace) = pace {
                let now = Instant::now();
                if next_slot > now {
                    tokio::time::sleep(next_slot - now).await;
                }
                next_slot = next_slot.max(now) + pace;
            }
            if let BatchSink::Shared(applier) = &mut ctx.sink {
                applier.add(
                    &item.vehicle,
                    item.fix_ms,
                    item.lat,
                    item.lon,
                    item.redelivered,
                );
                finished.messages.push((item.token, item.received_at));
                continue;
            }
            let before = transitions.len();
            let timed = evaluations.is_multiple_of(SAMPLE_EVERY).then(Instant::now);
            evaluations += 1;
            let outcome = if lookup_share.is_some() {
                evaluator.evaluate_covered(i, item.fix(), &mut transitions)
            } else {
                evaluator.evaluate_fix(item.fix(), &mut transitions)
            };
            if let Some(started) = timed {
                let share = lookup_share.unwrap_or_default();
                eval_time.record((started.elapsed() + share).as_secs_f64());
            }
            for t in &transitions[before..] {
                transitions_metric[t.event as usize].increment(1);
                if ctx.per_fence_labels {
                    metrics::counter!("geogate_fence_transitions_by_fence_total", "fence" => t.fence.to_string(), "kind" => t.event.as_str()).increment(1);
                }
            }
            match outcome {
                FixOutcome::Applied => finished.evaluated += 1,
                FixOutcome::OutOfOrder => finished.out_of_order += 1,
                FixOutcome::Duplicate => finished.duplicates += 1,
            }
            finished.messages.push((item.token, item.received_at));
        }
        if let BatchSink::Shared(applier) = &mut ctx.sink {
            let Some(counts) = applier.apply(&ctx.deadline).await else {
                // Past the drain deadline: the batch stays unacked.
                break 'batches;
            };
            finished.evaluated = counts.evaluated;
            finished.out_of_order = counts.out_of_order;
            finished.duplicates = counts.duplicates;
            finished.transitions = counts.enters + counts.exits;
            transitions_metric[TransitionKind::Enter as usize].increment(counts.enters);
            transitions_metric[TransitionKind::Exit as usize].increment(counts.exits);
            overflow.increment(counts.overflows);
            finished.complete();
            if past_deadline {
                break 'batches;
            }
            continue 'batches;
        }
        finished.transitions = transitions.len() as u64;
        let overflowed = evaluator.stats().membership_overflow;
        if overflowed > overflow_seen {
            overflow.increment(overflowed - overflow_seen);
            overflow_seen = overflowed;
        }
        evaluator.take_changed(&mut changed);
        let vehicles = changed
            .drain(..)
            .map(|(id, snapshot)| {
                let bytes = snapshot.map(|s| {
                    let mut bytes = Vec::with_capacity(32);
                    record::encode(&s, &mut bytes);
                    bytes
                });
                (id, bytes)
            })
            .collect();
        let request = CommitRequest {
            vehicles,
            transitions,
            finished,
        };
        let BatchSink::Commit(commits) = &ctx.sink else {
            break 'batches;
        };
        if commits.send(request).await.is_err() || past_deadline {
            break 'batches;
        }
    }
}

/// Swaps in a reloaded fence set, between batches: a batch's fences are
/// looked up together, against one index.
fn swap_if_reloaded(ctx: &mut WorkerContext, evaluator: &mut Evaluator) {
    if ctx.fences.has_changed().unwrap_or(false) {
        let index = ctx.fences.borrow_and_update().clone();
        if let BatchSink::Shared(applier) = &mut ctx.sink {
            applier.swap_index(index.clone());
        }
        evaluator.swap_index(index);
    }
}

/// Looks up the batch's fences together when that pays: an index past the
/// cache ([`FenceIndex::prefers_batches`]) and more than one fix to overlap
/// (a paced worker takes one at a time). Returns each fix's share of the
/// lookup's time, for the sampled evaluation times (zero when none of the
/// batch's fixes will be sampled, so the clock is not read), or `None`
/// when the fixes are to be looked up one by one.
fn cover_if_large(
    evaluator: &mut Evaluator,
    batch: &[Admitted],
    evaluations: u64,
) -> Option<Duration> {
    if batch.len() < 2 || !evaluator.index().prefers_batches() {
        return None;
    }
    let fixes = batch.len() as u64;
    let sampled = evaluations.next_multiple_of(SAMPLE_EVERY) < evaluations + fixes;
    let started = sampled.then(Instant::now);
    evaluator.cover_batch(batch.iter().map(Admitted::fix));
    Some(started.map_or(Duration::ZERO, |started| {
        started.elapsed().div_f64(fixes as f64)
    }))
}
