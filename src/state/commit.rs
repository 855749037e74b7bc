//! Group commit: one thread owns the store and commits whatever batches the
//! shard workers have handed it since its last commit in one transaction,
//! so the cost of a commit is shared by every batch waiting for it.
//!
//! Order of effects, for each transaction (the exactly-once argument in
//! ARCHITECTURE.md rests on it): vehicle records and outbox entries are
//! committed together; only then are the entries handed to the relay,
//! which acks the batches' messages once the events file has their lines.
//! (Acking before the file would survive a crash just as well, the outbox
//! holds the lines; waiting keeps "acked ⇒ in the file" true for readers
//! of the file, and a broken events file pushes back on the broker instead
//! of growing the outbox without bound.)

use super::outbox::OutboxEntry;
use super::{CommitBatch, Store, VehicleChange, crash_point};
use crate::backoff::Backoff;
use crate::geofence::Transition;
use crate::metrics::SAMPLE_EVERY;
use crate::model::VehicleId;
use crate::pipeline::accounting::Accounting;
use crate::source::{AckToken, Completions};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Batches waiting beyond this many are left for the next transaction, so
/// that one transaction (and the acks behind it) stays short. Also how many
/// the workers may queue for the committer before they wait (4 a shard
/// past 16 shards): for a durable store, enough for every batch a spaced
/// commit ([`COMMIT_SPACING`]) lets gather; for the memory store, see
/// `state::stage`.
pub const MAX_BATCHES_PER_COMMIT: usize = 64;

/// A durable store's commit starts no sooner than this after the previous
/// one ended. Why: most of a commit's cost is per vehicle and per page,
/// not per batch, and the same vehicles recur from batch to batch, so a
/// commit that takes the batches of 2 ms writes far fewer rows and pages
/// than several taking one each (BENCHMARKS.md, "The outbox a row per
/// commit, and commits spaced"). The price: a waiting batch is in the
/// next commit, which may start up to this much later, so its acks may
/// wait that much longer; only under load, since a batch that arrives
/// after a quiet spell is committed at once, and so is a full commit's
/// worth.
const COMMIT_SPACING: Duration = Duration::from_millis(2);

/// How long a commit about to start at `now` waits, the previous one
/// having ended at `previous`.
fn spacing_wait(previous: Option<Instant>, now: Instant) -> Duration {
    previous.map_or(Duration::ZERO, |end| {
        (end + COMMIT_SPACING).saturating_duration_since(now)
    })
}

/// Keeps one record per vehicle in a group commit: the latest. A worker's
/// batch lists each vehicle it changed once, but the batches one commit
/// groups come mostly from the same workers, so the same vehicles recur;
/// each recurrence would be one more upsert in the transaction, and the
/// last one decides the stored state anyway.
#[derive(Default)]
struct LatestChanges {
    /// Where each vehicle's record is in the commit's list, once a second
    /// batch joins (a lone batch needs no index).
    at: HashMap<VehicleId, usize, foldhash::fast::RandomState>,
    batches: usize,
}

impl LatestChanges {
    fn add(&mut self, into: &mut Vec<VehicleChange>, changes: Vec<VehicleChange>) {
        self.batches += 1;
        if self.batches == 1 {
            *into = changes;
            return;
        }
        if self.at.is_empty() {
            self.at
                .extend(into.iter().enumerate().map(|(i, (id, _))| (id.clone(), i)));
        }
        for (id, record) in changes {
            match self.at.entry(id) {
                Entry::Occupied(seen) => into[*seen.get()].1 = record,
                Entry::Vacant(new) => {
                    into.push((new.key().clone(), record));
                    new.insert(into.len() - 1);
                }
            }
        }
    }
}

/// One worker batch: what it changed and what finishing it means.
pub struct CommitRequest {
    pub vehicles: Vec<VehicleChange>,
    pub transitions: Vec<Transition>,
    pub finished: Finished,
}

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
            evaluated: metrics::counter!("geogate_events_evaluated_total", "shard" => shard.to_string()),
            out_of_order: metrics::counter!("geogate_fixes_out_of_order_total"),
            duplicates: metrics::counter!("geogate_duplicates_ignored_total", "by" => "state"),
            invalid_duplicates: metrics::counter!("geogate_events_invalid_total", "reason" => "duplicate"),
            latency: metrics::histogram!("geogate_end_to_end_latency_seconds"),
            latency_seen: AtomicU64::new(0),
            accounting,
            completions,
        }
    }
}

/// A batch's messages, finished together once its effects are safe: each
/// counted where the accounting line says, its latency recorded, its token
/// acked. Dropped unfinished (shutdown before the commit), they stay
/// unacked and `in_queue`, and come back after the restart.
pub struct Finished {
    pub counters: Arc<ShardCounters>,
    pub messages: Vec<(Option<AckToken>, Instant)>,
    pub evaluated: u64,
    pub out_of_order: u64,
    pub duplicates: u64,
    pub transitions: u64,
}

impl Finished {
    pub fn new(counters: Arc<ShardCounters>) -> Self {
        Self {
            counters,
            messages: Vec::new(),
            evaluated: 0,
            out_of_order: 0,
            duplicates: 0,
            transitions: 0,
        }
    }

    pub fn complete(self) {
        let c = &self.counters;
        c.accounting
            .finished(self.evaluated, self.out_of_order, self.duplicates);
        c.accounting.transitions(self.transitions);
        c.evaluated.increment(self.evaluated);
        c.out_of_order.increment(self.out_of_order);
        c.duplicates.increment(self.duplicates);
        c.invalid_duplicates.increment(self.duplicates);
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

/// The relay's progress, read by each commit to prune the outbox.
#[derive(Debug)]
pub struct Cursors {
    pub file: AtomicU64,
    pub mqtt: AtomicU64,
}

/// Committed entries on their way to the relay, with the messages it
/// finishes once it has written them.
pub struct Committed {
    pub entries: Vec<OutboxEntry>,
    pub finished: Vec<Finished>,
}

pub struct Committer {
    pub store: Box<dyn Store>,
    pub next_seq: u64,
    pub cursors: Arc<Cursors>,
    pub relay: mpsc::UnboundedSender<Committed>,
    /// Told when the relay has stopped, for the last prune.
    pub relay_done: std::sync::mpsc::Receiver<()>,
    pub deadline: watch::Receiver<Option<Instant>>,
}

impl Committer {
    /// Runs on its own thread until every worker has gone, then waits for
    /// the relay and records its final cursors.
    pub fn run(mut self, mut requests: mpsc::Receiver<CommitRequest>) {
        let duration = metrics::histogram!("geogate_state_commit_duration_seconds");
        let batches_per_commit = metrics::histogram!("geogate_state_commit_batches");
        let size = metrics::gauge!("geogate_state_store_bytes");
        let failures = metrics::counter!("geogate_sink_write_failures_total", "sink" => "state");
        let healthy = metrics::gauge!("geogate_sink_healthy", "sink" => "state");
        healthy.set(1.0);
        size.set(self.store.size_bytes() as f64);
        let mut last_size_check = Instant::now();
        let mut waiting = Vec::with_capacity(MAX_BATCHES_PER_COMMIT);
        // Set when a commit was given up at the drain deadline: a later
        // batch holds vehicle states that include the lost one's changes,
        // so committing it would record effects whose transitions were
        // never written. Everything after is left unacked instead.
        let mut gave_up = false;
        // The memory store's commit costs nothing: no reason to wait.
        let spaced = self.store.durable();
        let mut previous_commit: Option<Instant> = None;
        while let Some(first) = requests.blocking_recv() {
            // A full commit's worth already waiting gathers nothing more.
            if spaced && requests.len() + 1 < MAX_BATCHES_PER_COMMIT {
                let wait = spacing_wait(previous_commit, Instant::now());
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
            }
            waiting.push(first);
            while waiting.len() < MAX_BATCHES_PER_COMMIT {
                match requests.try_recv() {
                    Ok(more) => waiting.push(more),
                    Err(_) => break,
                }
            }
            if gave_up {
                waiting.clear();
                continue;
            }
            batches_per_commit.record(waiting.len() as f64);
            let mut batch = CommitBatch::default();
            let mut finished = Vec::with_capacity(waiting.len());
            let first_seq = self.next_seq;
            let mut latest = LatestChanges::default();
            for request in waiting.drain(..) {
                latest.add(&mut batch.vehicles, request.vehicles);
                for t in &request.transitions {
                    batch.outbox.push(OutboxEntry::new(self.next_seq, t));
                    self.next_seq += 1;
                }
                finished.push(request.finished);
            }
            batch.next_seq = self.next_seq;
            batch.file_cursor = self.cursors.file.load(Relaxed);
            batch.mqtt_cursor = self.cursors.mqtt.load(Relaxed);
            crash_point::reached("commit.before");
            let started = Instant::now();
            if !self.commit_until_deadline(&batch, &failures, &healthy) {
                // Shutdown came first: nothing of this batch happened.
                self.next_seq = first_seq;
                gave_up = true;
                tracing::error!(
                    "state: {} message(s) left unacked at the drain deadline, after a commit that kept failing",
                    finished.iter().map(|f| f.messages.len()).sum::<usize>()
                );
                continue;
            }
            duration.record(started.elapsed().as_secs_f64());
            previous_commit = Some(Instant::now());
            crash_point::reached("commit.after");
            let _ = self.relay.send(Committed {
                entries: batch.outbox,
                finished,
            });
            if last_size_check.elapsed() >= Duration::from_secs(1) {
                size.set(self.store.size_bytes() as f64);
                last_size_check = Instant::now();
            }
        }
        // Every worker is gone: let the relay finish, then record where it
        // got to so that a clean restart republishes nothing.
        let Self {
            mut store,
            next_seq,
            cursors,
            relay,
            relay_done,
            deadline,
        } = self;
        drop(relay);
        // The relay and publisher stop by the drain deadline; a little
        // beyond it, stop waiting for them.
        let wait = deadline.borrow().map_or(Duration::from_secs(30), |d| {
            d.saturating_duration_since(Instant::now()) + Duration::from_secs(5)
        });
        let _ = relay_done.recv_timeout(wait);
        let last = CommitBatch {
            next_seq,
            file_cursor: cursors.file.load(Relaxed),
            mqtt_cursor: cursors.mqtt.load(Relaxed),
            ..CommitBatch::default()
        };
        if let Err(e) = store.commit(&last) {
            tracing::warn!("state: recording the relay's final position: {e}");
        }
        size.set(store.size_bytes() as f64);
    }

    /// Commits, retrying with backoff while the store fails, until it works
    /// (true) or the drain deadline passes (false).
    fn commit_until_deadline(
        &mut self,
        batch: &CommitBatch,
        failures: &metrics::Counter,
        healthy: &metrics::Gauge,
    ) -> bool {
        let mut backoff = Backoff::new();
        let mut attempt = 0u64;
        loop {
            match self.store.commit(batch) {
                Ok(()) => {
                    if attempt > 0 {
                        tracing::info!("state: committing again after {attempt} failed attempts");
                        healthy.set(1.0);
                    }
                    return true;
                }
                Err(e) => {
                    attempt += 1;
                    failures.increment(1);
                    healthy.set(0.0);
                    let wait = backoff.step();
                    if attempt % 10 == 1 {
                        tracing::error!(
                            "{e}; the batch's messages stay unacked; attempt {attempt} failed, retrying in {wait:?}"
                        );
                    }
                    if let Some(at) = *self.deadline.borrow()
                        && Instant::now() + wait >= at
                    {
                        return false;
                    }
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_commit_waits_only_within_the_spacing_of_the_previous() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(spacing_wait(None, t0), Duration::ZERO, "the first: at once");
        assert_eq!(spacing_wait(Some(t0), t0), COMMIT_SPACING);
        assert_eq!(spacing_wait(Some(t0), t0 + ms(1)), COMMIT_SPACING - ms(1));
        assert_eq!(spacing_wait(Some(t0), t0 + COMMIT_SPACING), Duration::ZERO);
        assert_eq!(
            spacing_wait(Some(t0), t0 + ms(500)),
            Duration::ZERO,
            "after a quiet spell: at once"
        );
    }

    proptest! {
        /// Merged, the group's records store what applying every batch's
        /// records one after another would: each vehicle's last record.
        #[test]
        fn a_group_keeps_each_vehicles_last_record(
            batches in prop::collection::vec(
                prop::collection::vec((0u8..6, prop::option::of(0u8..4)), 0..8),
                1..6,
            ),
        ) {
            let batches: Vec<Vec<VehicleChange>> = batches
                .into_iter()
                .map(|b| {
                    b.into_iter()
                        .map(|(v, r)| (VehicleId::from(format!("v{v}")), r.map(|r| vec![r])))
                        .collect()
                })
                .collect();
            let mut applied_one_by_one = std::collections::BTreeMap::new();
            for (id, record) in batches.iter().flatten() {
                applied_one_by_one.insert(id.clone(), record.clone());
            }
            let mut merged = Vec::new();
            let mut latest = LatestChanges::default();
            for b in batches.iter().cloned() {
                latest.add(&mut merged, b);
            }
            let mut stored = std::collections::BTreeMap::new();
            for (id, record) in &merged {
                stored.insert(id.clone(), record.clone());
            }
            prop_assert_eq!(&stored, &applied_one_by_one);
            // Past the first batch, each vehicle appears once.
            let first: std::collections::BTreeSet<_> =
                batches[0].iter().map(|(id, _)| id.clone()).collect();
            let later = merged.len() - batches[0].len();
            let distinct_later = applied_one_by_one.keys().filter(|id| !first.contains(*id)).count();
            prop_assert_eq!(later, distinct_later);
        }
    }
}
