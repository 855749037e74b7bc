//! Appends outbox entries to the events file as lines, in seq order, and
//! makes them as durable as `[state] fsync` says before the caller moves
//! its cursor or acks anything. A write that fails is retried with backoff
//! (the sink's health gauge and log follow it) until it works or the drain
//! deadline passes.

use super::outbox::OutboxEntry;
use crate::crash_point;
use crate::shutdown::Drain;
use crate::sink::append_file::AppendFile;
use crate::sink::config::FsyncPolicy;
use crate::sink::health::SinkHealth;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

pub struct EventsWriter {
    file: AppendFile,
    health: SinkHealth,
    fsync: FsyncPolicy,
    /// The last seq the file holds.
    last_seq: u64,
    /// The last seq known to be on disk, and when the file was last
    /// synced: the store prunes its outbox only up to it, so that what a
    /// power loss takes from the file's tail under `flush` is still in the
    /// outbox, and written again at the restart.
    synced_seq: u64,
    last_sync: Instant,
    /// Set once a sync has failed: the kernel reports a lost write-back
    /// once, so a later sync that works proves nothing about the lines
    /// before it, and the cursor stays where it was for this process's
    /// life (the outbox keeps the rest; writing them again after such a
    /// failure is not built yet).
    sync_failed: bool,
}

/// How often, at most, the file is synced under `fsync = "flush"`: the
/// outbox keeps up to about this much more, and the file costs one sync
/// per interval while lines arrive.
const SYNC_EVERY: Duration = Duration::from_secs(1);

impl EventsWriter {
    /// Opens `path` for appending; `last_seq` is the seq on its last line
    /// (0: none), and `held` says what waits while it fails, for the log.
    pub fn open(
        path: &Path,
        fsync: FsyncPolicy,
        last_seq: u64,
        held: &'static str,
    ) -> io::Result<Self> {
        let mut file = AppendFile::open(path)?;
        // What an earlier process wrote may not be on disk yet: known to
        // be once this sync works (a file that cannot sync yet counts as
        // holding nothing synced, so the outbox keeps everything).
        let synced_seq = if file.sync_data().is_ok() {
            last_seq
        } else {
            0
        };
        Ok(Self {
            file,
            health: SinkHealth::new("events", path, held),
            fsync,
            last_seq,
            synced_seq,
            last_sync: Instant::now(),
            sync_failed: false,
        })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The last seq the file holds.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The last seq known to be on disk.
    pub fn synced_seq(&self) -> u64 {
        self.synced_seq
    }

    /// Under `flush`, syncs what was written if the last sync is
    /// [`SYNC_EVERY`] old (under `always` every write is synced already).
    /// On a blocking thread: a second's lines can take a while to reach
    /// the disk, and the runtime's threads run the shards meanwhile.
    pub async fn sync_if_due(&mut self, now: Instant) -> io::Result<()> {
        if self.sync_failed
            || self.synced_seq == self.last_seq
            || now.duration_since(self.last_sync) < SYNC_EVERY
        {
            return Ok(());
        }
        self.last_sync = now;
        let upto = self.last_seq;
        let synced = match self.file.sync_handle() {
            Ok(handle) => tokio::task::spawn_blocking(move || handle.sync_data())
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e))),
            Err(e) => Err(e),
        };
        match synced {
            Ok(()) => self.synced_seq = upto,
            Err(_) => self.sync_failed = true,
        }
        synced
    }

    /// Writes the entries past the file's last seq, as the fsync policy
    /// says; true once they are written, false if the drain deadline
    /// passed first (their lines are then never written by this process).
    pub async fn write(&mut self, entries: &[OutboxEntry], drain: &mut Drain) -> bool {
        let mut lines = Vec::new();
        let mut last = self.last_seq;
        for e in entries.iter().filter(|e| e.seq > self.last_seq) {
            lines.extend_from_slice(&e.line);
            lines.push(b'\n');
            last = e.seq;
        }
        if lines.is_empty() {
            return true;
        }
        let file = &mut self.file;
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
            && !drain.retry(&self.health, first, attempt).await
        {
            return false;
        }
        self.last_seq = last;
        if fsync == FsyncPolicy::Always {
            self.synced_seq = last;
        }
        true
    }

    /// Syncs what was written.
    pub fn sync(&mut self) -> io::Result<()> {
        if let Err(e) = self.file.sync_data() {
            self.sync_failed = true;
            return Err(e);
        }
        if !self.sync_failed {
            self.synced_seq = self.last_seq;
        }
        self.last_sync = Instant::now();
        Ok(())
    }
}
