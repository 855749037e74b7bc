//! One shard's vehicles in this process: each batch's fixes go through
//! the shard's [`Evaluator`] (memberships, dwell, hysteresis), and what
//! changed goes to the committer with the transitions it produced.

use super::commit::CommitRequest;
use super::held_batch::HeldBatch;
use super::record;
use super::store::VehicleChange;
use crate::geofence::{
    Evaluator, Fix, FixOutcome, HeldChange, Transition, TransitionKind, VehicleSnapshot,
    VehicleView,
};
use crate::model::VehicleId;
use crate::sampling::SAMPLE_EVERY;
use crate::state::metrics::{
    DWELLS_DROPPED_TOTAL, EVALUATION_DURATION_SECONDS, FENCE_TRANSITIONS_BY_FENCE_TOTAL,
    REORDER_WINDOW_FIXES, RuleCounters, VEHICLES_EXPIRED_TOTAL,
};
use crate::state::{
    Batch, BoxFuture, Completion, Late, Outcomes, ShardState, Stopped, VehicleQuery,
};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub struct LocalShard {
    evaluator: Evaluator,
    commits: mpsc::Sender<CommitRequest>,
    /// Whether changed vehicles are encoded for the store.
    durable: bool,
    per_fence_labels: bool,
    eval_time: metrics::Histogram,
    rules: RuleCounters,
    window_fixes: metrics::Gauge,
    expired: metrics::Counter,
    /// Evaluations so far, for the sampling stride of `eval_time`.
    evaluations: u64,
    /// The evaluator's overflow count already reported.
    overflow_seen: u64,
    dwells_dropped: metrics::Counter,
    /// The evaluator's dropped dwells already reported.
    dropped_seen: u64,
    changed: Vec<(VehicleId, Option<VehicleSnapshot>)>,
    /// The evaluator's held-log changes of one batch, before packing.
    held: Vec<HeldChange>,
}

impl LocalShard {
    pub fn new(
        shard: usize,
        evaluator: Evaluator,
        commits: mpsc::Sender<CommitRequest>,
        durable: bool,
        per_fence_labels: bool,
    ) -> Self {
        Self {
            window_fixes: metrics::gauge!(REORDER_WINDOW_FIXES, "shard" => shard.to_string()),
            expired: metrics::counter!(VEHICLES_EXPIRED_TOTAL),
            evaluator,
            commits,
            durable,
            per_fence_labels,
            rules: RuleCounters::default(),
            eval_time: metrics::histogram!(EVALUATION_DURATION_SECONDS),
            evaluations: 0,
            overflow_seen: 0,
            dwells_dropped: metrics::counter!(DWELLS_DROPPED_TOTAL),
            dropped_seen: 0,
            changed: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Takes the batch's fixes in order, then whatever falls due by the
    /// watermark; returns what they came to and the transitions they
    /// produced. With `release_each` (an ordered source, whose receive
    /// clock is the log's), what falls due by each fix's receive time is
    /// released before the fix is taken: then where a batch ends changes
    /// nothing, and an owner that reads the log in other batches decides
    /// the same.
    fn evaluate(
        &mut self,
        fixes: &[Fix<'_>],
        watermark: Option<i64>,
        release_each: bool,
    ) -> (Outcomes, Vec<Transition>) {
        let mut outcomes = Outcomes::default();
        let mut transitions = Vec::new();
        // `Some` when the batch's fences were looked up together.
        let lookup_share = self.cover_if_large(fixes);
        for (i, fix) in fixes.iter().enumerate() {
            if release_each {
                let before = transitions.len();
                outcomes.released += self
                    .evaluator
                    .release_due(fix.received_ms, &mut transitions);
                self.evaluator.reconcile(fix.received_ms, &mut transitions);
                self.count(&transitions[before..], &mut outcomes);
            }
            let before = transitions.len();
            let timed = self
                .evaluations
                .is_multiple_of(SAMPLE_EVERY)
                .then(Instant::now);
            self.evaluations += 1;
            let outcome = if lookup_share.is_some() {
                self.evaluator.evaluate_covered(i, *fix, &mut transitions)
            } else {
                self.evaluator.evaluate_fix(*fix, &mut transitions)
            };
            if let Some(started) = timed {
                let share = lookup_share.unwrap_or_default();
                self.eval_time
                    .record((started.elapsed() + share).as_secs_f64());
            }
            self.count(&transitions[before..], &mut outcomes);
            match outcome {
                FixOutcome::Applied => outcomes.evaluated += 1,
                FixOutcome::Held => outcomes.held += 1,
                FixOutcome::Late { by_ms } => outcomes.late.push(Late { index: i, by_ms }),
                FixOutcome::Duplicate => outcomes.duplicates.push(i),
            }
        }
        if let Some(watermark) = watermark {
            let before = transitions.len();
            outcomes.released += self.evaluator.release_due(watermark, &mut transitions);
            self.evaluator.reconcile(watermark, &mut transitions);
            outcomes.expired = self.evaluator.expire_idle(watermark, &mut transitions) as u64;
            self.count(&transitions[before..], &mut outcomes);
            self.expired.increment(outcomes.expired);
        }
        if outcomes.held > 0 || outcomes.released > 0 {
            self.window_fixes.set(self.evaluator.held_now() as f64);
        }
        let dropped = self.evaluator.stats().dwells_dropped;
        self.dwells_dropped.increment(dropped - self.dropped_seen);
        self.dropped_seen = dropped;
        let overflowed = self.evaluator.stats().membership_overflow;
        self.rules.record(
            outcomes.enters,
            outcomes.exits,
            overflowed - self.overflow_seen,
        );
        self.overflow_seen = overflowed;
        (outcomes, transitions)
    }

    /// Counts transitions by kind (and by fence, when asked).
    fn count(&self, transitions: &[Transition], outcomes: &mut Outcomes) {
        for t in transitions {
            match t.event {
                TransitionKind::Enter => outcomes.enters += 1,
                TransitionKind::Exit => outcomes.exits += 1,
            }
            if self.per_fence_labels {
                metrics::counter!(FENCE_TRANSITIONS_BY_FENCE_TOTAL, "fence" => t.fence.to_string(), "kind" => t.event.as_str()).increment(1);
            }
        }
    }

    /// Looks up the batch's fences together when that pays: an index past
    /// the cache ([`crate::geofence::FenceIndex::prefers_batches`]) and
    /// more than one fix to overlap (a paced worker hands one at a time).
    /// Returns each fix's share of the lookup's time, for the sampled
    /// evaluation times (zero when none of the batch's fixes will be
    /// sampled, so the clock is not read), or `None` when the fixes are to
    /// be looked up one by one.
    fn cover_if_large(&mut self, fixes: &[Fix<'_>]) -> Option<Duration> {
        // With a reorder window the fixes are held, and looked up when
        // they leave it: a lookup now would be wasted.
        if fixes.len() < 2
            || !self.evaluator.index().prefers_batches()
            || self.evaluator.settings().reorder_window_ms > 0
        {
            return None;
        }
        let n = fixes.len() as u64;
        let sampled = self.evaluations.next_multiple_of(SAMPLE_EVERY) < self.evaluations + n;
        let started = sampled.then(Instant::now);
        self.evaluator.cover_batch(fixes.iter().copied());
        Some(started.map_or(Duration::ZERO, |started| {
            started.elapsed().div_f64(n as f64)
        }))
    }

    /// The fixes that entered or left a window in the batch, packed for
    /// a durable store (none for the memory store).
    fn held_changes(&mut self) -> HeldBatch {
        if !self.durable {
            return HeldBatch::default();
        }
        self.evaluator.take_held(&mut self.held);
        let batch = HeldBatch::from_changes(&self.held);
        self.held.clear();
        batch
    }

    /// The vehicles the batch changed, encoded for a durable store (none
    /// for the memory store, which keeps nothing).
    fn changed_records(&mut self) -> Vec<VehicleChange> {
        if !self.durable {
            return Vec::new();
        }
        self.evaluator.take_changed(&mut self.changed);
        self.changed
            .drain(..)
            .map(|(id, snapshot)| {
                let bytes = snapshot.map(|s| {
                    let mut bytes = Vec::with_capacity(32);
                    record::encode(&s, &mut bytes);
                    bytes
                });
                (id, bytes)
            })
            .collect()
    }
}

/// Sends a vehicle's state once the commits before it are written.
struct Answer {
    reply: tokio::sync::oneshot::Sender<Option<VehicleView>>,
    view: Option<VehicleView>,
}

impl Completion for Answer {
    fn complete(self: Box<Self>, _: Outcomes) {
        let _ = self.reply.send(self.view);
    }
}

impl ShardState for LocalShard {
    fn query(&mut self, query: VehicleQuery) -> BoxFuture<'_, Result<(), Stopped>> {
        let view = self.evaluator.view(&query.vehicle);
        let request = CommitRequest {
            vehicles: Vec::new(),
            held: HeldBatch::default(),
            transitions: Vec::new(),
            outcomes: Outcomes::default(),
            fixes: 0,
            position: None,
            fences: None,
            done: Box::new(Answer {
                reply: query.reply,
                view,
            }),
        };
        Box::pin(async move { self.commits.send(request).await.map_err(|_| Stopped) })
    }

    fn apply<'a>(
        &'a mut self,
        batch: Batch<'a>,
        done: Box<dyn Completion>,
    ) -> BoxFuture<'a, Result<(), Stopped>> {
        Box::pin(async move {
            if let Some(index) = batch.fences {
                self.evaluator.swap_index(index);
            }
            let fixes = batch.fixes.len();
            let release_each = batch.position.is_some();
            let (mut outcomes, mut transitions) =
                self.evaluate(batch.fixes, batch.watermark, release_each);
            if batch.closing {
                let before = transitions.len();
                outcomes.released += self.evaluator.release_all(&mut transitions);
                if let Some(watermark) = batch.watermark {
                    self.evaluator.reconcile(watermark, &mut transitions);
                }
                self.count(&transitions[before..], &mut outcomes);
                self.window_fixes.set(0.0);
            }
            let read = batch.position.is_some_and(|p| p.read > 0);
            if fixes == 0 && !read && transitions.is_empty() && !self.evaluator.has_changes() {
                // Nothing arrived and nothing fell due: nothing to commit.
                done.complete(outcomes);
                return Ok(());
            }
            let request = CommitRequest {
                vehicles: self.changed_records(),
                held: self.held_changes(),
                transitions,
                outcomes,
                fixes,
                position: batch.position,
                fences: None,
                done,
            };
            self.commits.send(request).await.map_err(|_| Stopped)
        })
    }
}
