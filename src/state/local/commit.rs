//! Group commit: one thread owns the store and commits whatever batches the
//! shard workers have handed it since its last commit in one transaction,
//! so the cost of a commit is shared by every batch waiting for it.
//!
//! Order of effects, for each transaction (the exactly-once argument in
//! ARCHITECTURE.md rests on it): vehicle records and outbox entries are
//! committed together; only then are the entries handed to the relay
//! ([`crate::delivery::relay`]), which completes the batches once the
//! events file has their lines.

use super::held_batch::HeldBatch;
use super::store::{CommitBatch, FenceRows, Store, VehicleChange};
use crate::clock::receive_now_ms;
use crate::crash_point;
use crate::delivery::Cursors;
use crate::delivery::outbox::{FenceProperties, OutboxEntry};
use crate::delivery::relay::Committed;
use crate::geofence::Transition;
use crate::model::VehicleId;
use crate::shutdown::Drain;
use crate::sink::metrics::{SINK_HEALTHY, SINK_WRITE_FAILURES_TOTAL};
use crate::state::metrics::{
    STATE_COMMIT_BATCHES, STATE_COMMIT_DURATION_SECONDS, STATE_STORE_BYTES,
    TRANSITION_LATENCY_SECONDS,
};
use crate::state::{Completion, Outcomes, SourcePosition};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Batches waiting beyond this many are left for the next transaction, so
/// that one transaction (and the acks behind it) stays short. Also how many
/// the workers may queue for the committer before they wait (4 a shard
/// past 16 shards): for a durable store, enough for every batch a spaced
/// commit ([`COMMIT_SPACING`]) lets gather; for the memory store, see
/// [`super::LocalBackend`].
pub const MAX_BATCHES_PER_COMMIT: usize = 64;

/// A durable store's commit starts no sooner than this after the previous
/// one ended. Why: most of a commit's cost is per vehicle and per page,
/// not per batch, and the same vehicles recur from batch to batch, so a
/// commit that takes the batches of 2 ms writes far fewer rows and pages
/// than several taking one each
/// (docs/decisions/0005-outbox-row-per-commit-and-spaced-commits.md). The
/// price: a waiting batch is in the
/// next commit, which may start up to this much later, so its acks may
/// wait that much longer; only under load, since a batch that arrives
/// after a quiet spell is committed at once, and so is a full commit's
/// worth.
const COMMIT_SPACING: Duration = Duration::from_millis(2);

/// Outbox entries a restart reads and delivers at a time.
const BACKLOG_PAGE: usize = 4096;

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

/// One shard's batch: what it changed, and the completion to tell once
/// it is committed and in the events file.
pub struct CommitRequest {
    pub vehicles: Vec<VehicleChange>,
    /// Fixes that entered or left a window, in order, packed.
    pub held: HeldBatch,
    pub transitions: Vec<Transition>,
    pub outcomes: Outcomes,
    /// The batch's fixes: its messages, for the log.
    pub fixes: usize,
    /// How far an ordered source was read ([`crate::state::Batch::position`]).
    pub position: Option<SourcePosition>,
    /// A fence change, committed in order with the batches.
    pub fences: Option<FenceRows>,
    pub done: Box<dyn Completion>,
}

impl CommitRequest {
    /// About how many bytes the request adds to a commit (a transition's
    /// line is about 200).
    pub fn estimated_bytes(&self) -> usize {
        let records: usize = self
            .vehicles
            .iter()
            .map(|(id, r)| id.len() + r.as_ref().map_or(0, Vec::len) + 4)
            .sum();
        records + self.held.bytes.len() + 256 * self.transitions.len()
    }
}

pub struct Committer {
    pub store: Box<dyn Store>,
    /// What a restart found in the outbox, from the seq after this one:
    /// delivered before any new commit ([`Self::deliver_backlog`]).
    pub backlog_after: Option<u64>,
    pub next_seq: u64,
    pub cursors: Arc<Cursors>,
    pub relay: mpsc::UnboundedSender<Committed>,
    /// Told when the relay has stopped, for the last prune.
    pub relay_done: std::sync::mpsc::Receiver<()>,
    pub drain: Drain,
    /// Which fence properties event lines carry.
    pub properties: FenceProperties,
}

impl Committer {
    /// Runs on its own thread until every worker has gone, then waits for
    /// the relay and records its final cursors.
    pub fn run(mut self, mut requests: mpsc::Receiver<CommitRequest>) {
        let duration = metrics::histogram!(STATE_COMMIT_DURATION_SECONDS);
        let batches_per_commit = metrics::histogram!(STATE_COMMIT_BATCHES);
        let size = metrics::gauge!(STATE_STORE_BYTES);
        let failures = metrics::counter!(SINK_WRITE_FAILURES_TOTAL, "sink" => "state");
        let healthy = metrics::gauge!(SINK_HEALTHY, "sink" => "state");
        let latency = metrics::histogram!(TRANSITION_LATENCY_SECONDS);
        healthy.set(1.0);
        // Batches that came while the backlog was delivered, in order.
        let mut parked = VecDeque::new();
        let backlog_delivered = match self.backlog_after.take() {
            Some(after) => self.deliver_backlog(after, &mut requests, &mut parked),
            None => true,
        };
        size.set(self.store.size_bytes() as f64);
        let mut last_size_check = Instant::now();
        let mut waiting = Vec::with_capacity(MAX_BATCHES_PER_COMMIT);
        // Set when a commit was given up at the drain deadline: a later
        // batch holds vehicle states that include the lost one's changes,
        // so committing it would record effects whose transitions were
        // never written. Everything after is left unacked instead.
        // So is a backlog not delivered by then: a later line in the file
        // would hide it for good.
        let mut gave_up = !backlog_delivered;
        // The memory store's commit costs nothing: no reason to wait.
        let spaced = self.store.durable();
        let mut previous_commit: Option<Instant> = None;
        // The held log's changes of one commit, kept between commits: a
        // window changes it with every fix, and a vector grown afresh for
        // each commit spent its time in page faults.
        let mut held = HeldBatch::default();
        while let Some(first) = parked.pop_front().or_else(|| requests.blocking_recv()) {
            // A full commit's worth already waiting gathers nothing more.
            if spaced && parked.len() + requests.len() + 1 < MAX_BATCHES_PER_COMMIT {
                let wait = spacing_wait(previous_commit, Instant::now());
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
            }
            waiting.push(first);
            while waiting.len() < MAX_BATCHES_PER_COMMIT {
                match parked
                    .pop_front()
                    .ok_or(())
                    .or_else(|()| requests.try_recv())
                {
                    Ok(more) => waiting.push(more),
                    Err(_) => break,
                }
            }
            if gave_up {
                waiting.clear();
                continue;
            }
            batches_per_commit.record(waiting.len() as f64);
            let mut batch = CommitBatch {
                held: std::mem::take(&mut held),
                ..CommitBatch::default()
            };
            let mut finished = Vec::with_capacity(waiting.len());
            let mut messages = 0;
            let first_seq = self.next_seq;
            let mut latest = LatestChanges::default();
            let mut received = Vec::new();
            let committed_ms = receive_now_ms();
            for request in waiting.drain(..) {
                latest.add(&mut batch.vehicles, request.vehicles);
                let mut packed = request.held;
                batch.held.append(&mut packed);
                for t in &request.transitions {
                    batch.outbox.push(
                        OutboxEntry::new(self.next_seq, t, &self.properties)
                            .committed_at(committed_ms),
                    );
                    self.next_seq += 1;
                    received.push(t.received_ms);
                }
                messages += request.fixes;
                batch.fences.extend(request.fences);
                finished.push((request.done, request.outcomes));
            }
            batch.next_seq = self.next_seq;
            batch.file_cursor = self.cursors.file.load(Relaxed);
            batch.mqtt_cursor = self.cursors.mqtt.load(Relaxed);
            batch.webhook_cursor = self.cursors.webhook.load(Relaxed);
            crash_point::reached("commit.before");
            let started = Instant::now();
            if !self.commit_until_deadline(&batch, &failures, &healthy) {
                // Shutdown came first: nothing of this batch happened.
                self.next_seq = first_seq;
                gave_up = true;
                tracing::error!(
                    "state: {messages} message(s) left unacked at the drain deadline, after a commit that kept failing"
                );
                continue;
            }
            duration.record(started.elapsed().as_secs_f64());
            held = std::mem::take(&mut batch.held);
            held.clear();
            previous_commit = Some(Instant::now());
            crash_point::reached("commit.after");
            let latency = latency.clone();
            let _ = self.relay.send(Committed {
                entries: batch.outbox,
                then: Box::new(move || {
                    let written = receive_now_ms();
                    for at in received {
                        latency.record(written.saturating_sub(at).max(0) as f64 / 1000.0);
                    }
                    for (done, outcomes) in finished {
                        done.complete(outcomes);
                    }
                }),
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
            backlog_after: _,
            next_seq,
            cursors,
            relay,
            relay_done,
            drain,
            properties: _,
        } = self;
        drop(relay);
        // The relay and publisher stop by the drain deadline; a little
        // beyond it, stop waiting for them.
        let wait = drain.remaining().map_or(Duration::from_secs(30), |left| {
            left + Duration::from_secs(5)
        });
        let _ = relay_done.recv_timeout(wait);
        let last = CommitBatch {
            next_seq,
            file_cursor: cursors.file.load(Relaxed),
            mqtt_cursor: cursors.mqtt.load(Relaxed),
            webhook_cursor: cursors.webhook.load(Relaxed),
            ..CommitBatch::default()
        };
        if let Err(e) = store.commit(&last) {
            tracing::warn!("state: recording the relay's final position: {e}");
        }
        size.set(store.size_bytes() as f64);
    }

    /// Hands what a restart found in the outbox to the relay a page at a
    /// time, each once the relay has written the last and made room for it
    /// in the outputs' queues: a large outbox (an output down for a long
    /// time) is streamed, never held in memory whole. New batches wait
    /// meanwhile, as they would behind the outputs' full queues.
    ///
    /// The shards' batches are taken meanwhile and parked, in order, so
    /// that nothing upstream waits on this thread: an output that gives
    /// entries up writes them to the dead letter through the router, which
    /// must not be stuck behind a full shard queue. (Parked batches hold
    /// their messages unacked, so the broker's window bounds them.)
    ///
    /// False if the drain deadline came first: no later batch may then be
    /// committed, or its lines would land past the undelivered ones.
    fn deliver_backlog(
        &mut self,
        mut after: u64,
        requests: &mut mpsc::Receiver<CommitRequest>,
        parked: &mut VecDeque<CommitRequest>,
    ) -> bool {
        let mut backoff = crate::backoff::Backoff::new();
        loop {
            let page = match self.store.outbox_after(after, BACKLOG_PAGE) {
                Ok(page) => {
                    backoff.reset();
                    page
                }
                Err(e) if self.drain.passed() => {
                    tracing::error!(
                        "state: reading the outbox after seq {after}: {e}; delivered at the next start"
                    );
                    return false;
                }
                Err(e) => {
                    tracing::warn!("state: reading the outbox after seq {after}: {e}; retrying");
                    std::thread::sleep(backoff.step());
                    continue;
                }
            };
            let Some(last) = page.last().map(|e| e.seq) else {
                return true;
            };
            after = last;
            let (delivered, wait) = std::sync::mpsc::channel();
            let sent = self.relay.send(Committed {
                entries: page,
                then: Box::new(move || {
                    let _ = delivered.send(());
                }),
            });
            if sent.is_err() {
                return false;
            }
            loop {
                match wait.recv_timeout(Duration::from_millis(10)) {
                    Ok(()) => break,
                    // The relay gave up at the drain deadline, dropping the
                    // page: the rest stays in the outbox.
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return false,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        while let Ok(request) = requests.try_recv() {
                            parked.push_back(request);
                        }
                    }
                }
            }
        }
    }

    /// Commits, retrying with backoff while the store fails, until it works
    /// (true) or the drain deadline passes (false).
    fn commit_until_deadline(
        &mut self,
        batch: &CommitBatch,
        failures: &metrics::Counter,
        healthy: &metrics::Gauge,
    ) -> bool {
        let store = &mut self.store;
        let attempts = self.drain.retry_blocking(
            || store.commit(batch),
            |e, attempt, wait| {
                failures.increment(1);
                healthy.set(0.0);
                if attempt % 10 == 1 {
                    tracing::error!(
                        "{e}; the batch's messages stay unacked; attempt {attempt} failed, retrying in {wait:?}"
                    );
                }
            },
        );
        match attempts {
            Ok(0) => true,
            Ok(failed) => {
                tracing::info!("state: committing again after {failed} failed attempts");
                healthy.set(1.0);
                true
            }
            Err(_) => false,
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
