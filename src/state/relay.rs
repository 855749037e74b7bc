//! Committed transitions out: the relay appends them to the events file,
//! the publisher ([`super::publisher`]) sends them over MQTT. Each keeps a cursor (the last seq it
//! has delivered) that the committer reads to prune the outbox, so an entry
//! leaves the store only once both have it.
//!
//! * **File: exactly once.** Lines are written in seq order and skipped at
//!   or below the file's last seq, which is read from the file itself at
//!   start ([`super::events_file`]): a crash between a write and its cursor
//!   cannot write a line twice, and one mid-write cannot skip one.
//! * **MQTT: at least once.** The cursor moves only when the broker has
//!   acked every publish so far; after a crash everything past it is sent
//!   again, with the same `id`. Publishing runs apart from the file so a
//!   broker outage never holds up the file, or the acks that wait for it.

use super::commit::{Committed, Cursors, Finished};
use super::crash_point;
use super::outbox::OutboxEntry;
use crate::config::FsyncPolicy;
use crate::sink::append_file::AppendFile;
use crate::sink::health::{SinkHealth, retry_until};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use tokio::sync::{mpsc, watch};

/// Appends committed transitions to the events file.
pub struct Relay {
    pub file: Option<(AppendFile, SinkHealth)>,
    pub fsync: FsyncPolicy,
    /// The last seq the file holds.
    pub file_seq: u64,
    pub cursors: Arc<Cursors>,
    pub publisher: Option<mpsc::UnboundedSender<Vec<OutboxEntry>>>,
    pub deadline: watch::Receiver<Option<Instant>>,
    /// Dropped when the relay stops: the committer waits for that.
    pub done: std::sync::mpsc::Sender<()>,
}

impl Relay {
    /// Writes the recovered backlog, then each committed batch, until the
    /// committer hangs up.
    pub async fn run(
        mut self,
        backlog: Vec<OutboxEntry>,
        mut rx: mpsc::UnboundedReceiver<Committed>,
    ) {
        self.deliver(backlog, Vec::new()).await;
        while let Some(committed) = rx.recv().await {
            if !self.deliver(committed.entries, committed.finished).await {
                // The drain deadline passed with the file still failing:
                // later batches' messages stay unacked too.
                break;
            }
        }
        if let Some((file, _)) = &mut self.file
            && let Err(e) = file.sync_data()
        {
            tracing::error!("events file {}: {e}", file.path().display());
        }
    }

    async fn deliver(&mut self, entries: Vec<OutboxEntry>, finished: Vec<Finished>) -> bool {
        if !self.write_file(&entries).await {
            return false;
        }
        finished.into_iter().for_each(Finished::complete);
        if let Some(publisher) = &self.publisher {
            let _ = publisher.send(entries);
        }
        true
    }

    /// False if the drain deadline passed before the file took the lines.
    async fn write_file(&mut self, entries: &[OutboxEntry]) -> bool {
        let Some((file, health)) = &mut self.file else {
            return true;
        };
        let mut lines = Vec::new();
        let mut last = self.file_seq;
        for e in entries.iter().filter(|e| e.seq > self.file_seq) {
            lines.extend_from_slice(&e.line);
            lines.push(b'\n');
            last = e.seq;
        }
        if lines.is_empty() {
            return true;
        }
        if crash_point::armed("relay.mid_line") {
            let half = lines.len() / 2;
            file.queue(&lines[..half]);
            let _ = file.write_unwritten();
            crash_point::reached("relay.mid_line");
            file.queue(&lines[half..]);
        } else {
            file.queue(&lines);
        }
        let fsync = self.fsync;
        let mut attempt = || {
            file.write_unwritten()?;
            match fsync {
                FsyncPolicy::Always => file.sync_data(),
                FsyncPolicy::Flush => Ok(()),
            }
        };
        if let Err(first) = attempt()
            && !retry_until(health, &mut self.deadline, first, attempt).await
        {
            return false;
        }
        crash_point::reached("relay.before_cursor");
        self.file_seq = last;
        self.cursors.file.store(last, Relaxed);
        true
    }
}
