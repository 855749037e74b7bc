//! A partition owner's committer: takes the batches its shard evaluated
//! ([`CommitRequest`], as the local backends' committer does), writes
//! each group as one commit of the partition's log, with the input
//! position and the transitions, then publishes the transitions to the
//! events stream, and only then completes the batches. Every so many
//! commits it writes a snapshot and removes the log before it.

use super::PartitionError;
use super::commit_body::{CommitBody, Kind};
use super::commit_log::CommitLog;
use super::events_stream::EventsStream;
use super::metrics::{FENCED_WRITES_TOTAL, PARTITION_COMMIT_SECONDS, SNAPSHOTS_TOTAL};
use super::mirror::Mirror;
use crate::delivery::outbox::{FenceProperties, partition_line};
use crate::state::local::commit::CommitRequest;
use crate::state::metrics::TRANSITION_LATENCY_SECONDS;
use bytes::Bytes;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// A commit's body stays below this, and NATS's default 1 MiB message
/// limit: a group of batches is cut here, a snapshot split in parts.
pub const MAX_COMMIT_BYTES: usize = 512 * 1024;

/// When a write to the engine is sent again: after an engine error, with a
/// growing pause, unless the owner is stopping or the message can never
/// fit. A deposed owner's write is counted and never sent again.
struct Retry {
    pause: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            pause: Duration::from_millis(50),
        }
    }
}

impl Retry {
    /// `Ok` once it is time to send again; the error otherwise.
    async fn after(
        &mut self,
        e: PartitionError,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), PartitionError> {
        if matches!(e, PartitionError::Deposed { .. }) {
            metrics::counter!(FENCED_WRITES_TOTAL).increment(1);
            return Err(e);
        }
        if *stop.borrow() || too_large(&e) {
            return Err(e);
        }
        tracing::warn!("{e}; trying again in {:?}", self.pause);
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        Ok(())
    }
}

/// A message past the engine's size limit: sending it again fails again.
fn too_large(e: &PartitionError) -> bool {
    matches!(e, PartitionError::Engine { detail, .. } if detail.contains("Payload size limit") || detail.to_ascii_lowercase().contains("maximum payload"))
}

/// Batches in one commit at most.
const MAX_BATCHES_PER_COMMIT: usize = 16;

pub struct PartitionCommitter {
    pub partition: u32,
    pub log: CommitLog,
    pub events: EventsStream,
    /// The state as the log holds it, kept current commit by commit.
    pub mirror: Mirror,
    pub owner: String,
    /// Commits between snapshots.
    pub snapshot_every: u64,
    /// Which fence properties event lines carry.
    pub properties: FenceProperties,
    /// Set when the owner stops: an engine error is then not tried again.
    pub stop: watch::Receiver<bool>,
    /// The partition's input stream, whose part a snapshot covers is
    /// removed (no owner reads before the last commit's position); `None`
    /// keeps it (`[state] keep_input`).
    pub input_stream: Option<String>,
}

impl PartitionCommitter {
    /// Commits every request until the shard closes the channel; the
    /// error that ended it otherwise. A deposed owner's requests are left
    /// incomplete: their input is the new owner's to read again.
    pub async fn run(
        mut self,
        mut requests: mpsc::Receiver<CommitRequest>,
    ) -> Result<(), PartitionError> {
        self.publish_committed().await?;
        let commit_time = metrics::histogram!(PARTITION_COMMIT_SECONDS);
        let latency = metrics::histogram!(TRANSITION_LATENCY_SECONDS);
        let mut commits = 0u64;
        while let Some(first) = requests.recv().await {
            let mut group = vec![first];
            let mut size = group[0].estimated_bytes();
            while group.len() < MAX_BATCHES_PER_COMMIT && size < MAX_COMMIT_BYTES / 2 {
                let Ok(next) = requests.try_recv() else { break };
                size += next.estimated_bytes();
                group.push(next);
            }
            let body = self.body_of(&group);
            let started = std::time::Instant::now();
            let seq = self.append(&body).await?;
            self.apply(seq, &body)?;
            crate::crash_point::reached("partition.committed");
            self.publish_committed().await?;
            crate::crash_point::reached("partition.published");
            commit_time.record(started.elapsed().as_secs_f64());
            // Receive (when the engine stored the fix) to written (in the
            // events stream), on this machine's clock.
            let now = crate::clock::receive_now_ms();
            for t in group.iter().flat_map(|r| &r.transitions) {
                latency.record((now - t.received_ms).max(0) as f64 / 1000.0);
            }
            for request in group {
                request.done.complete(request.outcomes);
            }
            commits += 1;
            if commits.is_multiple_of(self.snapshot_every.max(1)) {
                self.snapshot().await?;
            }
        }
        Ok(())
    }

    /// One commit of the group: every vehicle it changed (the last change
    /// of each, in order), its held fixes, its transitions numbered on.
    fn body_of(&self, group: &[CommitRequest]) -> CommitBody {
        let mut totals = self.mirror.totals;
        let mut next_seq = self.mirror.next_seq.max(1);
        let mut input_through = self.mirror.input_through;
        let (mut vehicles, mut held, mut lines) = (Vec::new(), Vec::new(), Vec::new());
        for r in group {
            if let Some(p) = r.position {
                input_through = input_through.max(p.through);
                totals.read += p.read;
                totals.refused += p.refused;
                totals.ignored += p.ignored;
            }
            let o = &r.outcomes;
            totals.evaluated += o.evaluated;
            totals.held += o.held;
            totals.late += o.late.len() as u64;
            totals.duplicates += o.duplicates.len() as u64;
            totals.enters += o.enters;
            totals.exits += o.exits;
            totals.expired += o.expired;
            vehicles.extend(r.vehicles.iter().cloned());
            held.extend_from_slice(&r.held.bytes);
            for t in &r.transitions {
                lines.extend_from_slice(&partition_line(
                    self.partition,
                    next_seq,
                    t,
                    &self.properties,
                ));
                lines.push(b'\n');
                next_seq += 1;
            }
        }
        CommitBody {
            kind: Kind::Batch,
            base: self.mirror.base,
            input_through,
            next_seq,
            totals,
            vehicles,
            held,
            lines,
            owner: self.owner.clone(),
        }
    }

    fn apply(&mut self, seq: u64, body: &CommitBody) -> Result<(), PartitionError> {
        self.mirror
            .apply(seq, body)
            .map_err(|e| PartitionError::Unreadable {
                partition: self.partition,
                seq,
                detail: e.to_string(),
            })
    }

    /// Appends `body`, sending it again after an engine error (its id
    /// makes a resend the same commit) until it is in the log, the owner
    /// stops, or another owner is found to have taken over.
    async fn append(&mut self, body: &CommitBody) -> Result<u64, PartitionError> {
        let bytes = Bytes::from(body.encode());
        let mut retry = Retry::default();
        loop {
            match self.log.append(bytes.clone()).await {
                Ok(seq) => return Ok(seq),
                Err(e) => retry.after(e, &self.stop).await?,
            }
        }
    }

    /// Publishes every committed commit's transitions the events stream
    /// does not hold yet, in commit order.
    async fn publish_committed(&mut self) -> Result<(), PartitionError> {
        for (commit, lines) in std::mem::take(&mut self.mirror.unpublished) {
            let lines = Bytes::from(lines);
            let mut retry = Retry::default();
            loop {
                match self.events.publish(commit, lines.clone()).await {
                    Ok(()) => break,
                    Err(e) => retry.after(e, &self.stop).await?,
                }
            }
        }
        Ok(())
    }

    /// Removes the input the snapshot covers. A failure only leaves more
    /// on disk until the next snapshot.
    async fn purge_input(&self) {
        let Some(input) = &self.input_stream else {
            return;
        };
        let through = self.mirror.input_through;
        let purged = async {
            let stream = self
                .log
                .context()
                .get_stream_no_info(input)
                .await
                .map_err(|e| e.to_string())?;
            stream
                .purge()
                .sequence(through + 1)
                .await
                .map_err(|e| e.to_string())
        };
        if let Err(e) = purged.await {
            tracing::warn!(
                "partition {}: removing input up to {through}: {e}",
                self.partition
            );
        }
    }

    /// Writes the state as snapshot parts, then a commit that makes the
    /// first part the base, then removes the log before it. Written only
    /// when the events stream holds every commit's transitions, so no
    /// commit whose transitions are still to publish is removed.
    async fn snapshot(&mut self) -> Result<(), PartitionError> {
        let parts = self.mirror.snapshot(&self.owner, MAX_COMMIT_BYTES / 2);
        let mut first = None;
        for part in &parts {
            let seq = self.append(part).await?;
            first.get_or_insert(seq);
            self.apply(seq, part)?;
            crate::crash_point::reached("partition.snapshot");
        }
        if let Some(first) = first {
            // A commit naming the snapshot as base before the log under it
            // goes: a new owner reads from the base the last commit names.
            self.mirror.base = first;
            let marker = self.body_of(&[]);
            let seq = self.append(&marker).await?;
            self.apply(seq, &marker)?;
            self.log.purge_before(first).await?;
            self.purge_input().await;
            metrics::counter!(SNAPSHOTS_TOTAL).increment(1);
        }
        Ok(())
    }
}
