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

pub struct EventsWriter {
    file: AppendFile,
    health: SinkHealth,
    fsync: FsyncPolicy,
    /// The last seq the file holds.
    last_seq: u64,
}

impl EventsWriter {
    /// Opens `path` for appending; `last_seq` is the seq on its last line
    /// (0: none), and `held` says what waits while it fails, for the log.
    pub fn open(
        path: &Path,
        fsync: FsyncPolicy,
        last_seq: u64,
        held: &'static str,
    ) -> io::Result<Self> {
        Ok(Self {
            file: AppendFile::open(path)?,
            health: SinkHealth::new("events", path, held),
            fsync,
            last_seq,
        })
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The last seq the file holds.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
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
        true
    }

    /// Syncs what was written (at shutdown).
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}
