//! The local backends' common half: the memberships live in this process,
//! one [`Evaluator`] per shard ([`shard`]); a committer thread ([`commit`])
//! writes each group of batches to a [`store::Store`] (memory or
//! embedded), then hands their transitions to [`crate::delivery`], which
//! completes the batches once the events file holds them.
//!
//! * [`store`]: what a store commits and gives back at start;
//! * [`record`]: a vehicle's state as the store's bytes;
//! * [`held_keys`]: keys for the store's log of held fixes;
//! * [`held_batch`]: a batch's changes to that log, packed by its shard;
//! * [`shard`]: one shard's evaluator behind the seam;
//! * [`commit`]: the one thread that commits every shard's batches.

pub mod commit;
pub mod held_batch;
pub mod held_keys;
pub mod record;
pub mod shard;
pub mod store;

use super::{Backend, BoxFuture, Completion, FenceSupply, OpenContext, ShardState, StateError};
use crate::delivery::publisher::Publisher;
use crate::delivery::relay::Relay;
use crate::delivery::webhook::Webhook;
use crate::delivery::writer::EventsWriter;
use crate::delivery::{Cursors, events_file};
use crate::geofence::config::FencesSource;
use crate::geofence::registry::{FenceJournal, JournalError, JournalFuture};
use crate::geofence::{Evaluator, EvaluatorSettings, FenceChange, FenceIndex, VehicleSnapshot};
use crate::model::VehicleId;
use crate::state::StateConfig;
use commit::{CommitRequest, Committer, MAX_BATCHES_PER_COMMIT};
use held_batch::HeldBatch;
use shard::LocalShard;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use store::{CommitBatch, FenceRows, Opened, StoredFences};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub struct LocalBackend {
    /// Where shards send their batches.
    commits: mpsc::Sender<CommitRequest>,
    durable: bool,
    settings: EvaluatorSettings,
    per_fence_labels: bool,
    /// Committed vehicle state, until the pipeline takes it.
    restored: Vec<(VehicleId, VehicleSnapshot)>,
    /// The fence set settled at start.
    fences: Arc<FenceIndex>,
    committer: JoinHandle<()>,
    relay: JoinHandle<()>,
    /// The outputs after the file (the publisher, the webhook).
    senders: Vec<JoinHandle<()>>,
}

impl LocalBackend {
    /// Starts the committer, relay and outputs on an opened store. The
    /// events file is cut back to its last whole line here, now that the
    /// store's lock is held.
    pub fn start(
        opened: Opened,
        config: &StateConfig,
        ctx: OpenContext,
    ) -> Result<Self, StateError> {
        let file_seq = opened.file_seq();
        let Opened {
            mut store,
            mut recovered,
            tail,
        } = opened;
        let stored = recovered
            .fences
            .take()
            .map(StoredFences::into_index)
            .transpose()?;
        let (fences, fence_rows) =
            settle_fences(stored, ctx.fences, crate::clock::receive_now_ms())?;
        let events_error = |path: &std::path::Path, source| StateError::EventsFile {
            path: path.to_owned(),
            source,
        };
        let events = ctx.events.as_deref();
        // Before anything touches the file: no second geogate writes it.
        let lock = events
            .map(|path| events_file::lock(path).map_err(|e| events_error(path, e)))
            .transpose()?;
        if tail.torn_bytes > 0
            && let Some(path) = events
        {
            events_file::cut_torn(path, &tail).map_err(|e| events_error(path, e))?;
            tracing::warn!(
                "events file {}: removed a torn last line ({} bytes) left by a crash mid-write; its transition is written again (from the outbox, or from its redelivered message)",
                path.display(),
                tail.torn_bytes
            );
        }
        let durable = store.durable();
        // A destination that is not configured never holds the outbox back.
        let cursors = Arc::new(Cursors::new(
            // No further than the file held on disk at the last commit:
            // its tail may not be synced yet (the writer syncs it once it
            // opens, and the relay moves the cursor on).
            events.map_or(u64::MAX, |_| file_seq.min(recovered.file_cursor)),
            // Stored as "all" while not configured: an output configured
            // since then starts after what is committed, not after
            // everything that will ever be.
            ctx.outputs.mqtt.as_ref().map_or(u64::MAX, |_| {
                recovered
                    .mqtt_cursor
                    .min(recovered.next_seq.saturating_sub(1))
            }),
            ctx.outputs.webhook.as_ref().map_or(u64::MAX, |_| {
                recovered
                    .webhook_cursor
                    .min(recovered.next_seq.saturating_sub(1))
            }),
        ));
        let (restored, mut changes) = prune_to_fences(recovered.vehicles, &fences);
        let (mut restored, down_ms) =
            resume_receive_clock(restored, crate::clock::receive_now_ms());
        let (held, from_records) = held_keys::renumber_restored(&mut restored);
        // Written before anything runs: the store must hold what this
        // process holds, or a reload that brings a fence back, then a
        // crash, would bring its memberships back too; a later restart
        // must not count this outage as idleness again (it measures its
        // own from the newest receive time it finds); held fixes take
        // their new keys; and a window read from a record moves to the
        // log, or the record's next write would drop it.
        let rewritten: Vec<usize> = if down_ms > 0 {
            changes.clear();
            (0..restored.len()).collect()
        } else {
            let pruned: HashSet<&VehicleId> = changes.iter().map(|(id, _)| id).collect();
            from_records
                .into_iter()
                .filter(|&i| !pruned.contains(&restored[i].0))
                .collect()
        };
        for i in rewritten {
            let (id, s) = &restored[i];
            changes.push((id.clone(), Some(record_bytes(s))));
        }
        if durable && !(changes.is_empty() && held.is_empty() && fence_rows.is_none()) {
            tracing::info!(
                vehicles = changes.len(),
                held = held.len(),
                down_s = down_ms / 1000,
                "state: restored vehicles written back (fences no longer in the set dropped, the outage added to their receive times, held fixes in the log)"
            );
            store.commit(&CommitBatch {
                vehicles: changes,
                held: HeldBatch::from_changes(&held),
                outbox: Vec::new(),
                next_seq: recovered.next_seq,
                file_cursor: cursors.file.load(Relaxed),
                mqtt_cursor: cursors.mqtt.load(Relaxed),
                webhook_cursor: cursors.webhook.load(Relaxed),
                fences: fence_rows.into_iter().collect(),
            })?;
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // The file first: if it cannot be opened, nothing has been started.
        let file = match (events, lock) {
            (Some(path), Some(lock)) => Some(
                EventsWriter::open(
                    path,
                    lock,
                    config.fsync,
                    ctx.outputs.rotation,
                    file_seq,
                    "its message stays unacked",
                )
                .map_err(|e| events_error(path, e))?,
            ),
            _ => None,
        };
        let mut outputs = Vec::new();
        let mut senders = Vec::new();
        if let Some((options, network, limits)) = ctx.outputs.mqtt {
            let (task, feed) = Publisher::spawn(
                (options, network),
                limits,
                None,
                cursors.mqtt.clone(),
                ctx.drain.clone(),
                done_tx.clone(),
                ctx.outputs.dead_letter.clone(),
            );
            senders.push(task);
            outputs.push(feed);
        }
        if let Some((target, limits)) = ctx.outputs.webhook {
            let url = target.url.to_string();
            let (task, feed) = Webhook::spawn(
                target,
                limits,
                None,
                cursors.webhook.clone(),
                ctx.drain.clone(),
                done_tx.clone(),
                ctx.outputs.dead_letter.clone(),
            )
            .map_err(|e| StateError::Webhook(format!("{url}: {e}")))?;
            senders.push(task);
            outputs.push(feed);
        }
        let (committed_tx, committed_rx) = mpsc::unbounded_channel();
        let relay = Relay {
            file,
            cursors: cursors.clone(),
            outputs,
            drain: ctx.drain.clone(),
            done: done_tx,
        };
        let relay = tokio::spawn(relay.run(committed_rx));
        // Room for what a spaced commit gathers, and the same for the
        // memory store: with `pipeline.sched_batch` (the default) the
        // committer's thread, woken, waits for a core instead of preempting,
        // and with a shorter queue the workers kept filling it, parking and
        // being woken again (docs/decisions/0007-longer-commit-queue.md).
        let (commits, commits_rx) = mpsc::channel(MAX_BATCHES_PER_COMMIT.max(ctx.shards * 4));
        let committer = Committer {
            store,
            backlog_after: recovered.outbox_first.map(|_| cursors.all_have()),
            next_seq: recovered.next_seq,
            cursors,
            relay: committed_tx,
            relay_done: done_rx,
            drain: ctx.drain,
            properties: ctx.fence_properties,
        };
        let committer = tokio::task::spawn_blocking(move || committer.run(commits_rx));
        Ok(Self {
            commits,
            durable,
            settings: ctx.settings,
            per_fence_labels: ctx.per_fence_labels,
            restored,
            fences: Arc::new(fences),
            committer,
            relay,
            senders,
        })
    }
}

/// The fence set to start with, and the change that makes it, if any, for
/// the start's commit:
/// * `source = "file"`: the file's fences; what differs from the stored
///   set is one change, so that exits owed for fences deleted or changed
///   while geogate was down come from it, dated now;
/// * `source = "store"`: the stored set; an empty store is seeded from the
///   file, when there is one.
fn settle_fences(
    stored: Option<FenceIndex>,
    supply: FenceSupply,
    now_ms: i64,
) -> Result<(FenceIndex, Option<FenceRows>), StateError> {
    let seeded = stored.is_some();
    let base = stored.unwrap_or_else(|| FenceIndex::new(Vec::new()));
    let wanted = match (supply.source, supply.file) {
        (FencesSource::File, None) => return Err(StateError::NoFenceFile),
        (FencesSource::File, Some(file)) => file,
        (FencesSource::Store, _) if seeded => return Ok((base, None)),
        (FencesSource::Store, file) => file.unwrap_or_default(),
    };
    let version = base.version() + 1;
    let Some(change) = base.diff(wanted, version, now_ms.max(base.changed_ms())) else {
        if seeded {
            return Ok((base, None));
        }
        // An empty first set still gets its version, so the store holds one.
        let empty = FenceChange {
            version,
            at_ms: now_ms,
            ..FenceChange::default()
        };
        return Ok((
            base.apply(empty.clone()),
            Some(FenceRows::of(&base, &empty)),
        ));
    };
    let rows = FenceRows::of(&base, &change);
    Ok((base.apply(change), Some(rows)))
}

/// Makes fence changes durable through the committer, in order with the
/// shards' batches. Its sender is weak: the committer ends once the last
/// shard has gone, whoever still holds the journal.
struct CommitterJournal {
    commits: mpsc::WeakSender<CommitRequest>,
}

/// Tells the journal that its change is committed.
struct Committed(tokio::sync::oneshot::Sender<()>);

impl Completion for Committed {
    fn complete(self: Box<Self>, _: super::Outcomes) {
        let _ = self.0.send(());
    }
}

impl FenceJournal for CommitterJournal {
    fn record(&self, before: &FenceIndex, change: &FenceChange) -> JournalFuture {
        let rows = FenceRows::of(before, change);
        let commits = self.commits.upgrade();
        Box::pin(async move {
            let commits = commits.ok_or(JournalError::Stopped)?;
            let (done, committed) = tokio::sync::oneshot::channel();
            let request = CommitRequest {
                vehicles: Vec::new(),
                held: HeldBatch::default(),
                transitions: Vec::new(),
                outcomes: Default::default(),
                fixes: 0,
                position: None,
                fences: Some(rows),
                done: Box::new(Committed(done)),
            };
            commits
                .send(request)
                .await
                .map_err(|_| JournalError::Stopped)?;
            committed.await.map_err(|_| JournalError::Stopped)
        })
    }
}

/// A restored vehicle's record: its held fixes go in the log, not in it.
fn record_bytes(s: &VehicleSnapshot) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32);
    let applied = VehicleSnapshot {
        window: Vec::new(),
        ..s.clone()
    };
    record::encode(&applied, &mut bytes);
    bytes
}

/// Drops the restored memberships and pending dwells of fences neither in
/// `fences` nor deleted on record (a store from before fence sets were
/// kept, under a fence file edited meanwhile), without events; returns
/// the vehicles, and the records of those that changed, for the store. A
/// fence deleted on record keeps its memberships: the evaluator owes them
/// exits ([`Evaluator::restore`]).
fn prune_to_fences(
    mut vehicles: Vec<(VehicleId, VehicleSnapshot)>,
    fences: &FenceIndex,
) -> (Vec<(VehicleId, VehicleSnapshot)>, Vec<store::VehicleChange>) {
    let known = |f: &str| fences.find(f).is_some() || fences.tombstone(f).is_some();
    let mut changed = Vec::new();
    for (id, s) in &mut vehicles {
        let before = (s.members.len(), s.pending.len());
        s.members.retain(|f| known(f));
        s.pending.retain(|(f, _)| known(f));
        if (s.members.len(), s.pending.len()) != before {
            changed.push((id.clone(), Some(record_bytes(s))));
        }
    }
    (vehicles, changed)
}

/// Moves the restored vehicles' receive-clock times forward by the time
/// geogate was down, so that an outage is not idleness: a weekend's stop
/// does not expire the fleet at the restart. The store does not record
/// when it stopped; the last time any vehicle was heard from stands in
/// for it. A record from before receive times were kept counts as heard
/// from now. Returns the vehicles and the outage added (1 ms at least when
/// a record had no receive time, so that it is written back).
pub fn resume_receive_clock(
    mut vehicles: Vec<(VehicleId, VehicleSnapshot)>,
    now_ms: i64,
) -> (Vec<(VehicleId, VehicleSnapshot)>, i64) {
    let stopped = vehicles
        .iter()
        .map(|(_, s)| s.last_heard_ms)
        .filter(|&t| t != record::HEARD_UNKNOWN)
        .max();
    let mut down_ms = stopped.map_or(0, |t| now_ms.saturating_sub(t).max(0));
    if vehicles
        .iter()
        .any(|(_, s)| s.last_heard_ms == record::HEARD_UNKNOWN)
    {
        down_ms = down_ms.max(1);
    }
    for (_, s) in &mut vehicles {
        s.last_heard_ms = if s.last_heard_ms == record::HEARD_UNKNOWN {
            now_ms
        } else {
            s.last_heard_ms.saturating_add(down_ms)
        };
        for held in &mut s.window {
            held.received_ms = held.received_ms.saturating_add(down_ms);
        }
    }
    (vehicles, down_ms)
}

impl Backend for LocalBackend {
    fn take_restored(&mut self) -> Vec<(VehicleId, VehicleSnapshot)> {
        std::mem::take(&mut self.restored)
    }

    fn fences(&self) -> Arc<FenceIndex> {
        self.fences.clone()
    }

    fn fence_journal(&self) -> Arc<dyn FenceJournal> {
        Arc::new(CommitterJournal {
            commits: self.commits.downgrade(),
        })
    }

    fn shard(
        &mut self,
        shard: usize,
        index: Arc<FenceIndex>,
        restored: Vec<(VehicleId, VehicleSnapshot)>,
    ) -> Box<dyn ShardState> {
        let mut evaluator = Evaluator::new(index, self.settings);
        if self.durable {
            evaluator = evaluator.tracking_changes(held_keys::first_of_shard(shard));
        }
        for (vehicle, snapshot) in restored {
            evaluator.restore(vehicle, &snapshot);
        }
        Box::new(LocalShard::new(
            shard,
            evaluator,
            self.commits.clone(),
            self.durable,
            self.per_fence_labels,
        ))
    }

    /// The committer ends once the last shard has dropped its sender, then
    /// waits for the relay and the outputs.
    fn finish(self: Box<Self>) -> BoxFuture<'static, ()> {
        let Self {
            commits,
            committer,
            relay,
            senders,
            ..
        } = *self;
        drop(commits);
        Box::pin(async move {
            let _ = committer.await;
            let _ = relay.await;
            for sender in senders {
                let _ = sender.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::{Fix, parse_fences};
    use crate::shutdown::Drain;
    use crate::state::{Batch, Completion, Outcomes};

    /// Fence A (10.00–10.01°E, 50.00–50.01°N).
    const FENCE_A: &str = r#"{"type":"FeatureCollection","features":[
 {"type":"Feature","id":"A","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.00,50.00],[10.01,50.00],[10.01,50.01],[10.00,50.01],[10.00,50.00]]]}}]}"#;
    const NO_FENCES: &str = r#"{"type":"FeatureCollection","features":[]}"#;

    struct Told(mpsc::UnboundedSender<Outcomes>);

    impl Completion for Told {
        fn complete(self: Box<Self>, outcomes: Outcomes) {
            let _ = self.0.send(outcomes);
        }
    }

    fn index(text: &str) -> Arc<FenceIndex> {
        Arc::new(FenceIndex::new(parse_fences(text).expect("valid fences")))
    }

    /// One shard, no fences, no MQTT output.
    fn context(events: Option<std::path::PathBuf>, settings: EvaluatorSettings) -> OpenContext {
        OpenContext {
            events,
            outputs: Default::default(),
            settings,
            fences: crate::state::FenceSupply::of(&index(NO_FENCES)),
            shards: 1,
            per_fence_labels: false,
            fence_properties: Default::default(),
            drain: Drain::never(),
        }
    }

    /// Through the seam, on the memory store: a batch's completion hears
    /// what it came to only once the events file holds its transitions; a
    /// fence set that changes applies from its batch on; a watermark alone
    /// completes with nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_completes_once_its_transitions_are_in_the_events_file() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.ndjson");
        let config = StateConfig {
            backend: crate::state::StateBackend::Memory,
            ..StateConfig::default()
        };
        let opened = crate::state::memory::open(Some(&events)).unwrap();
        let ctx = context(Some(events.clone()), EvaluatorSettings::default());
        let mut backend: Box<dyn Backend> =
            Box::new(LocalBackend::start(opened, &config, ctx).unwrap());
        assert!(backend.take_restored().is_empty());
        let mut shard = backend.shard(0, index(NO_FENCES), Vec::new());
        let (told, mut heard) = mpsc::unbounded_channel();
        let vehicle: VehicleId = "v1".into();
        let fix = |fix_ms| Fix {
            vehicle: &vehicle,
            fix_ms,
            lat: 50.005,
            lon: 10.005,
            redelivered: false,
            received_ms: fix_ms,
            digest: Fix::position_digest(fix_ms, 50.005, 10.005),
        };
        let lines = || std::fs::read_to_string(&events).unwrap_or_default();

        // No fence yet: applied, and nothing to write.
        let before = [fix(1_000), fix(500)];
        let batch = Batch {
            fences: None,
            fixes: &before,
            watermark: None,
            closing: false,
            position: None,
        };
        shard
            .apply(batch, Box::new(Told(told.clone())))
            .await
            .unwrap();
        let first = heard.recv().await.unwrap();
        let applied_and_late = Outcomes {
            evaluated: 1,
            late: vec![crate::state::Late {
                index: 1,
                by_ms: 500,
            }],
            ..Outcomes::default()
        };
        assert_eq!(first, applied_and_late);
        assert_eq!(lines(), "");

        // Fence A from this batch on: the vehicle's next fix, at the same
        // place, enters it, and the batch completes with the line written.
        let after = [fix(2_000)];
        let batch = Batch {
            fences: Some(index(FENCE_A)),
            fixes: &after,
            watermark: None,
            closing: false,
            position: None,
        };
        shard
            .apply(batch, Box::new(Told(told.clone())))
            .await
            .unwrap();
        let second = heard.recv().await.unwrap();
        assert_eq!((second.evaluated, second.enters), (1, 1));
        assert!(lines().contains(r#""event":"enter""#), "{}", lines());

        let tick = Batch {
            fences: None,
            fixes: &[],
            watermark: Some(3_000),
            closing: false,
            position: None,
        };
        shard.apply(tick, Box::new(Told(told))).await.unwrap();
        assert_eq!(heard.recv().await.unwrap(), Outcomes::default());

        drop(shard);
        backend.finish().await;
        assert_eq!(lines().lines().count(), 1, "{}", lines());
    }

    /// A record written before the held log kept its window inside it:
    /// the start moves that window to the log, so the record's next write
    /// cannot drop it, and a second start finds it once, in the log. (The
    /// vehicle was heard from after the start's clock reading, so no
    /// outage is written back: the record is rewritten because of its
    /// window alone.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_kept_in_a_record_moves_to_the_held_log_at_start() {
        use crate::geofence::HeldFix;
        use crate::state::embedded::{self, EmbeddedStore};
        use store::Store;
        let dir = tempfile::tempdir().unwrap();
        let mut config = StateConfig {
            backend: crate::state::StateBackend::Embedded,
            ..StateConfig::default()
        };
        config.embedded.path = dir.path().join("state.sqlite");
        let now = crate::clock::receive_now_ms() + 3_600_000;
        let waiting = HeldFix {
            fix_ms: now - 1_000,
            lat: 50.005,
            lon: 10.005,
            received_ms: now,
            digest: 9,
            key: 0,
        };
        let old = VehicleSnapshot {
            last_fix_ms: now - 2_000,
            last_heard_ms: now,
            window: vec![waiting],
            ..VehicleSnapshot::default()
        };
        let mut bytes = Vec::new();
        record::encode(&old, &mut bytes);
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        store
            .commit(&CommitBatch::vehicles_only(vec![(
                "v1".into(),
                Some(bytes),
            )]))
            .unwrap();
        drop(store);
        let start = |config: &StateConfig| {
            let settings = EvaluatorSettings {
                reorder_window_ms: 2_000,
                ..EvaluatorSettings::default()
            };
            let ctx = context(None, settings);
            let opened = embedded::open(config, None).unwrap();
            Box::new(LocalBackend::start(opened, config, ctx).unwrap())
        };
        let mut backend = start(&config);
        let restored = backend.take_restored();
        let window = &restored[0].1.window;
        assert_eq!(window.len(), 1);
        assert_ne!(window[0].key, 0, "given a key in the log");
        let key = window[0].key;
        backend.finish().await;

        let mut again = start(&config);
        let restored = again.take_restored();
        let window = &restored[0].1.window;
        assert_eq!(window.len(), 1, "once, from the log: {window:?}");
        assert_eq!(
            (window[0].key, window[0].fix_ms, window[0].digest),
            (key, waiting.fix_ms, waiting.digest)
        );
        assert_eq!(restored[0].1.last_fix_ms, old.last_fix_ms);
        again.finish().await;
    }
}
