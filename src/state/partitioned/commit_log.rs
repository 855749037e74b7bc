//! A partition's commit log: one JetStream stream per partition
//! (`GEOGATE_STATE_<p>`, subject `state.<p>`), holding every commit of the
//! partition's owners in order.
//!
//! Each commit is published expecting the log's last sequence as its
//! writer knows it (`Nats-Expected-Last-Subject-Sequence`), so the engine
//! takes a commit only from whoever wrote, or read and applied, the one
//! before it. The engine checks that expectation against what it has
//! stored only on a stream of one replica on NATS 2.9 (a replicated one
//! checks it again when a message is applied from 2.11 on): the logs are
//! single-replica streams. A
//! new owner starts by writing a takeover commit: from then on, a commit
//! from the owner before it (paused past its lease, say, and resumed) is
//! refused, and that owner learns it was deposed instead of writing on.
//! Two contenders taking over at once are told apart the same way.
//!
//! A commit also carries a message id made of its owner's takeover token
//! and the sequence it expects, so sending it again after an ack was lost
//! (the engine restarted, the connection dropped) is taken as the same
//! commit, not refused as another owner's.
//!
//! A stream per partition rather than one stream read through a subject
//! filter per partition: NATS 2.9 reads a filtered consumer about 55×
//! slower (decision 0025).

use super::PartitionError;
use crate::jetstream_link::{file_stream, reader_after};
use async_nats::jetstream;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;

/// One owner's hold on a partition's commit log.
pub struct CommitLog {
    js: jetstream::Context,
    partition: u32,
    /// Sequence of the last commit this owner wrote (or, right after the
    /// takeover, its takeover commit).
    last: u64,
    /// Unique to this takeover: with the expected sequence, a commit's id.
    token: String,
}

/// A commit as read back: its sequence in the log and what was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub seq: u64,
    pub body: Bytes,
}

pub fn stream_name(partition: u32) -> String {
    format!("GEOGATE_STATE_{partition}")
}

fn subject(partition: u32) -> String {
    format!("state.{partition}")
}

/// The longest a read of the log waits for a batch the engine says it has.
const FETCH_WAIT: Duration = Duration::from_secs(1);

impl CommitLog {
    /// Takes the partition's log over: makes the stream if it is new, and
    /// writes `takeover` expecting `applied`, the last commit the new
    /// owner has read and applied (0 for a log it found empty). Refused
    /// ([`PartitionError::Deposed`]) if the log holds anything after it:
    /// another owner committed after the new one read the log.
    pub async fn take_over(
        js: &jetstream::Context,
        partition: u32,
        applied: u64,
        takeover: Bytes,
    ) -> Result<Self, PartitionError> {
        file_stream(js, stream_name(partition), subject(partition))
            .await
            .map_err(|e| engine(partition, e))?;
        let mut log = Self {
            js: js.clone(),
            partition,
            last: applied,
            token: random_token(),
        };
        log.append(takeover).await?;
        Ok(log)
    }

    /// Appends a commit after this owner's last one; its sequence in the
    /// log. [`PartitionError::Deposed`] if another owner took over since.
    /// After an engine error the same body must be sent again: the engine
    /// may have stored it, and its id makes the resend that commit.
    pub async fn append(&mut self, body: Bytes) -> Result<u64, PartitionError> {
        let partition = self.partition;
        let id = format!("{}.{}", self.token, self.last);
        let publish = jetstream::message::PublishMessage::build()
            .payload(body)
            .message_id(id.as_str())
            .expected_last_subject_sequence(self.last);
        let ack = self
            .js
            .send_publish(subject(self.partition), publish)
            .await
            .map_err(|e| engine(partition, e))?
            .await;
        match ack {
            Ok(ack) => {
                self.last = ack.sequence;
                Ok(ack.sequence)
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                // A resend past the engine's duplicate window finds its own
                // commit last, not another owner's.
                let (seq, last_id) = self.last_commit_id().await?;
                if last_id == id {
                    self.last = seq;
                    return Ok(seq);
                }
                Err(PartitionError::Deposed {
                    partition,
                    expected: self.last,
                })
            }
            Err(e) => Err(engine(partition, e)),
        }
    }

    /// The last commit's sequence and message id.
    async fn last_commit_id(&self) -> Result<(u64, String), PartitionError> {
        let partition = self.partition;
        let last = last_message(&self.js, partition)
            .await?
            .ok_or_else(|| engine(partition, "the log is empty"))?;
        let id = last
            .headers
            .get("Nats-Msg-Id")
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        Ok((last.sequence, id))
    }

    /// The log's stream, without asking the engine for its state.
    async fn stream(&self) -> Result<jetstream::stream::Stream<()>, PartitionError> {
        self.js
            .get_stream_no_info(stream_name(self.partition))
            .await
            .map_err(|e| engine(self.partition, e))
    }

    /// The engine this log is in.
    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// The sequence of this owner's last commit.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Removes every commit before `seq`, the first part of a snapshot
    /// whose every part is in the log: a new owner reads from there.
    pub async fn purge_before(&self, seq: u64) -> Result<(), PartitionError> {
        let partition = self.partition;
        self.stream()
            .await?
            .purge()
            .sequence(seq)
            .await
            .map_err(|e| engine(partition, e))?;
        Ok(())
    }
}

/// The partition's last commit; `None` for a log that is new or empty.
pub async fn last_commit(
    js: &jetstream::Context,
    partition: u32,
) -> Result<Option<Commit>, PartitionError> {
    Ok(last_message(js, partition).await?.map(|last| Commit {
        seq: last.sequence,
        body: last.payload,
    }))
}

/// The log's last message, read by the sequence the stream's state gives.
/// nats-server 2.9.10 can answer a read of a subject's last message on a
/// stream a purge has just compacted (every snapshot purges the log) with
/// a panic that takes the whole server down, so a log is never read that
/// way. A commit appended between the two reads is simply not seen yet.
async fn last_message(
    js: &jetstream::Context,
    partition: u32,
) -> Result<Option<StreamMessage>, PartitionError> {
    let stream = match js.get_stream(stream_name(partition)).await {
        Ok(stream) => stream,
        Err(e) => {
            return match e.kind() {
                GetStreamErrorKind::JetStream(e)
                    if e.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    Ok(None)
                }
                _ => Err(engine(partition, e)),
            };
        }
    };
    let state = &stream.cached_info().state;
    if state.messages == 0 {
        return Ok(None);
    }
    let last = state.last_sequence;
    stream
        .get_raw_message(last)
        .await
        .map(Some)
        .map_err(|e| engine(partition, e))
}

/// Every commit in the partition's log after sequence `after`, oldest
/// first (none if the log does not exist yet). The first must be the one
/// right after `after`: a log that starts later lost commits (a purge
/// by an owner that has since written a snapshot), and the caller reads
/// again from that snapshot.
pub async fn read_after(
    js: &jetstream::Context,
    partition: u32,
    after: u64,
) -> Result<Vec<Commit>, PartitionError> {
    let mut stream = match js.get_stream(stream_name(partition)).await {
        Ok(stream) => stream,
        Err(e)
            if matches!(e.kind(), GetStreamErrorKind::JetStream(ref js)
                if js.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
        {
            return Ok(Vec::new());
        }
        Err(e) => return Err(engine(partition, e)),
    };
    if stream
        .info()
        .await
        .map_err(|e| engine(partition, e))?
        .state
        .last_sequence
        <= after
    {
        return Ok(Vec::new());
    }
    let mut reader = reader_after(&stream, after)
        .await
        .map_err(|e| engine(partition, e))?;
    let mut commits = Vec::new();
    loop {
        let mut batch = reader
            .fetch()
            .max_messages(1000)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(|e| engine(partition, e))?;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| engine(partition, e))?;
            let seq = message
                .info()
                .map_err(|e| engine(partition, e))?
                .stream_sequence;
            // Each commit right after the one before: a purge under this
            // read (by an owner that finished a snapshot) shows as a gap.
            let expected = commits.last().map_or(after, |c: &Commit| c.seq) + 1;
            if seq != expected {
                return Err(PartitionError::Gap {
                    partition,
                    expected,
                    found: seq,
                });
            }
            commits.push(Commit {
                seq,
                body: message.message.payload.clone(),
            });
        }
        if reader
            .info()
            .await
            .map_err(|e| engine(partition, e))?
            .num_pending
            == 0
        {
            return Ok(commits);
        }
    }
}

/// 128 random bits, from the standard library's randomly keyed hasher:
/// two owners never share a token, whatever their pids and clocks.
fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let draw = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("{:016x}{:016x}", draw(), draw())
}

fn engine(partition: u32, e: impl std::fmt::Display) -> PartitionError {
    PartitionError::engine(partition, &stream_name(partition), e)
}
