//! The local backends' way out: committed batches in commit order to the
//! events file ([`EventsWriter`]), then room in each later output's queue
//! ([`super::output_queue`]), then each batch's completion.
//!
//! * **File: exactly once.** Lines are written in seq order and skipped at
//!   or below the file's last seq, which is read from the file itself at
//!   start ([`super::events_file`]): a crash between a write and its cursor
//!   cannot write a line twice, and one mid-write cannot skip one. The
//!   file's cursor, which the store prunes its outbox against, is the last
//!   seq synced to disk (every write under `always`, about once a second
//!   under `flush`): what a power loss takes from the file's tail is still
//!   in the outbox, and written again at the restart.
//! * **MQTT and the webhook: at least once.** Each output's cursor moves
//!   only as it confirms delivery (or dead-letters what passed its maximum
//!   age); after a crash everything past it is sent again, with the same
//!   `id`. Each runs apart from the file, with a bounded queue of its own:
//!   an outage holds up neither the file nor the acks until that queue is
//!   full.
//!
//! Completions wait for the file and for room in the queues: acking
//! before would survive a crash just as well (the outbox holds the
//! lines), but waiting keeps "acked ⇒ in the file" true for readers of the
//! file, and a broken events file or a dead output pushes back on the
//! broker instead of growing the outbox and memory without bound.

use super::Cursors;
use super::outbox::OutboxEntry;
use super::output_queue::OutputFeed;
use super::writer::EventsWriter;
use crate::crash_point;
use crate::shutdown::Drain;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use tokio::sync::mpsc;

/// One commit's entries, and what to run once the file holds them.
pub struct Committed {
    pub entries: Vec<OutboxEntry>,
    pub then: Box<dyn FnOnce() + Send>,
}

/// Appends committed transitions to the events file.
pub struct Relay {
    pub file: Option<EventsWriter>,
    pub cursors: Arc<Cursors>,
    /// The outputs after the file (MQTT, the webhook), each with a
    /// bounded queue.
    pub outputs: Vec<OutputFeed>,
    pub drain: Drain,
    /// Dropped when the relay stops: the committer waits for that.
    pub done: std::sync::mpsc::Sender<()>,
}

impl Relay {
    /// Delivers each committed batch (the committer sends what a restart
    /// found in the outbox first, a page at a time), until the committer
    /// hangs up.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Committed>) {
        while let Some(committed) = rx.recv().await {
            if !self.deliver(committed.entries, Some(committed.then)).await {
                // The drain deadline passed with the file still failing:
                // later batches' messages stay unacked too.
                break;
            }
        }
        if let Some(file) = &mut self.file
            && file.sync_now(&mut self.drain).await
        {
            // The committer's last commit records it.
            self.cursors.file.store(file.synced_seq(), Relaxed);
        }
    }

    async fn deliver(
        &mut self,
        entries: Vec<OutboxEntry>,
        then: Option<Box<dyn FnOnce() + Send>>,
    ) -> bool {
        if let Some(file) = &mut self.file {
            let before = file.last_seq();
            if !file.write(&entries, &mut self.drain).await {
                return false;
            }
            if file.last_seq() > before {
                crash_point::reached("relay.before_cursor");
                if !file.sync_if_due(Instant::now(), &mut self.drain).await {
                    // Past the drain deadline: the outbox keeps everything
                    // after the last sync, and later batches stay unacked.
                    return false;
                }
                if file.synced_seq() < file.last_seq() {
                    crash_point::reached("relay.unsynced");
                }
                self.cursors.file.store(file.synced_seq(), Relaxed);
            }
        }
        // Room in every output's queue before the acks: a full one (an
        // output that is down, not yet past its maximum age) holds them,
        // and intake pushes back. A backlog larger than a queue goes in
        // pieces, each once there is room for it.
        if !self.outputs.is_empty() {
            let piece = self
                .outputs
                .iter()
                .map(OutputFeed::chunk)
                .min()
                .unwrap_or(1);
            for piece in entries.chunks(piece.max(1)) {
                for output in &self.outputs {
                    if !output.make_room(piece.len(), &mut self.drain).await {
                        return false;
                    }
                }
                for output in &self.outputs {
                    output.send(piece.to_vec());
                }
            }
        }
        if let Some(then) = then {
            then();
        }
        true
    }
}
