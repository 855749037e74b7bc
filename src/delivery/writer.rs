//! Appends outbox entries to the events file as lines, in seq order, and
//! makes them as durable as `[state] fsync` says before the caller moves
//! its cursor or acks anything. A write that fails is retried with backoff
//! (the sink's health gauge and log follow it) until it works or the drain
//! deadline passes.
//!
//! A failed sync is never retried as such: the kernel reports a lost
//! write-back once, and a later sync (on a new descriptor, or the same)
//! that works says nothing about the bytes before it. The writer keeps
//! every line written since the last sync that worked; after a failure
//! it cuts the file back to its length at that sync and writes those lines
//! again, then syncs, so the file holds each seq once whichever of its
//! pages reached the disk.

use super::config::Rotation;
use super::events_file;
use super::outbox::OutboxEntry;
use crate::crash_point;
use crate::shutdown::Drain;
use crate::sink::append_file::{AppendFile, FileChange};
use crate::sink::config::FsyncPolicy;
use crate::sink::health::SinkHealth;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct EventsWriter {
    file: AppendFile,
    health: Arc<SinkHealth>,
    fsync: FsyncPolicy,
    /// The last seq the file holds.
    last_seq: u64,
    /// The last seq known to be on disk, and when the file was last
    /// synced: the store prunes its outbox only up to it, so that what a
    /// power loss takes from the file's tail under `flush` is still in the
    /// outbox, and written again at the restart.
    synced_seq: u64,
    last_sync: Instant,
    /// The file's length at the last sync that worked, and every line
    /// queued since: what a failed sync makes the writer write again.
    synced_len: u64,
    unsynced: Vec<u8>,
    /// A sync failed and the file has not been cut back to `synced_len`
    /// (with `unsynced` queued again) yet: the next attempt does that
    /// first.
    must_rewrite: bool,
    /// When the file is rotated; the first seq the current file holds,
    /// and when it was started.
    rotation: Option<Rotation>,
    first_seq: Option<u64>,
    started: Instant,
    /// `<path>.lock`, held for the writer's life: no second geogate
    /// writes the file.
    _lock: File,
}

/// How often, at most, the file is synced under `fsync = "flush"`: the
/// outbox keeps up to about this much more, and the file costs one sync
/// per interval while lines arrive.
const SYNC_EVERY: Duration = Duration::from_secs(1);

impl EventsWriter {
    /// Opens `path` for appending; `last_seq` is the seq on its last line
    /// (0: none), and `held` says what waits while it fails, for the log.
    /// What an earlier process wrote may not be on disk yet: it is synced
    /// here. A file that cannot be synced yet (a full or failing device)
    /// counts as holding nothing synced, so the outbox keeps everything
    /// until a later sync works.
    pub fn open(
        path: &Path,
        lock: File,
        fsync: FsyncPolicy,
        rotation: Option<Rotation>,
        last_seq: u64,
        held: &'static str,
    ) -> io::Result<Self> {
        let first_seq = events_file::first_seq(path)?;
        let mut file = AppendFile::open(path)?;
        // A regular file that cannot be synced may have lost what the last
        // process wrote, and a later sync would not say so: refused. A
        // device (a test's /dev/full) has nothing to sync.
        let synced_seq = match file.sync_data() {
            Ok(()) => last_seq,
            Err(e) if std::fs::metadata(path).is_ok_and(|m| m.is_file()) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "not synced at start ({e}): what the last run wrote cannot be trusted; fix the device and start again"
                    ),
                ));
            }
            Err(e) => {
                tracing::warn!("events file {}: not synced at start ({e})", path.display());
                0
            }
        };
        Ok(Self {
            synced_len: file.len(),
            file,
            health: Arc::new(SinkHealth::new("events", path, held)),
            fsync,
            last_seq,
            synced_seq,
            last_sync: Instant::now(),
            unsynced: Vec::new(),
            must_rewrite: false,
            rotation,
            first_seq,
            started: Instant::now(),
            _lock: lock,
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
    /// The sync runs on a blocking thread: a second's lines can take a
    /// while to reach the disk, and the runtime's threads run the shards
    /// meanwhile. After a failure the lines since the last sync are
    /// written again, with backoff, until a sync works (true) or the drain
    /// deadline passes (false).
    pub async fn sync_if_due(&mut self, now: Instant, drain: &mut Drain) -> bool {
        if self.synced_seq == self.last_seq || now.duration_since(self.last_sync) < SYNC_EVERY {
            return true;
        }
        self.sync_now(drain).await
    }

    /// Syncs what was written, as [`Self::sync_if_due`] does once due.
    pub async fn sync_now(&mut self, drain: &mut Drain) -> bool {
        self.last_sync = Instant::now();
        if self.must_rewrite {
            // A plain sync now would be trusted for bytes a failure lost.
            let first = io::Error::other("a sync or write failed before: written again first");
            let health = self.health.clone();
            return drain.retry(&*health, first, || self.write_and_sync()).await;
        }
        let synced = match self.file.sync_handle() {
            Ok(handle) => tokio::task::spawn_blocking(move || handle.sync_data())
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e))),
            Err(e) => Err(e),
        };
        match synced {
            Ok(()) => {
                self.synced();
                true
            }
            Err(first) => {
                self.must_rewrite = true;
                let health = self.health.clone();
                drain.retry(&*health, first, || self.write_and_sync()).await
            }
        }
    }

    /// Everything written is on disk.
    fn synced(&mut self) {
        self.synced_seq = self.last_seq;
        self.synced_len = self.file.len();
        self.unsynced.clear();
    }

    /// One attempt to get everything queued onto the disk: after a failed
    /// sync, the file is first cut back and the unsynced lines queued again.
    fn write_and_sync(&mut self) -> io::Result<()> {
        if self.must_rewrite {
            self.file.cut_back(self.synced_len)?;
            self.file.queue(&self.unsynced);
            self.must_rewrite = false;
        }
        self.file.write_unwritten()?;
        if let Err(e) = self.file.sync_data() {
            self.must_rewrite = true;
            return Err(e);
        }
        self.synced();
        Ok(())
    }

    /// Writes the entries past the file's last seq, as the fsync policy
    /// says; true once they are written, false if the drain deadline
    /// passed first (their lines are then never written by this process).
    pub async fn write(&mut self, entries: &[OutboxEntry], drain: &mut Drain) -> bool {
        if !self.follow_outside_change(drain).await {
            return false;
        }
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
        if self.first_seq.is_none() {
            self.first_seq = entries.iter().map(|e| e.seq).find(|&s| s > self.last_seq);
        }
        self.unsynced.extend_from_slice(&lines);
        if crash_point::armed("relay.mid_line") {
            let half = lines.len() / 2;
            self.file.queue(&lines[..half]);
            let _ = self.file.write_unwritten();
            crash_point::reached("relay.mid_line");
            self.file.queue(&lines[half..]);
        } else {
            self.file.queue(&lines);
        }
        // The seq moves first: a sync that works covers these lines.
        let before = std::mem::replace(&mut self.last_seq, last);
        let always = self.fsync == FsyncPolicy::Always;
        let attempt = |w: &mut Self| {
            if always || w.must_rewrite {
                w.write_and_sync()
            } else {
                // A failed write reopens the file by path: what went
                // through the old descriptor is written again, so no sync
                // on the new one vouches for it.
                w.file
                    .write_unwritten()
                    .inspect_err(|_| w.must_rewrite = true)
            }
        };
        if let Err(first) = attempt(self) {
            let health = self.health.clone();
            if !drain.retry(&*health, first, || attempt(self)).await {
                self.last_seq = before;
                return false;
            }
        }
        self.rotate_if_due(drain).await
    }

    /// Notices what another process did to the file since the last write.
    /// Moved away (a log rotator's rename): everything written is synced
    /// to the moved file, which keeps it, and a new file is started at the
    /// path, seqs going on. Cut shorter than the last sync left it
    /// (`copytruncate`): lines are lost past repair, so nothing more is
    /// written (the sink stays unhealthy, acks stay held) until it is
    /// whole again or geogate restarts, where the start names the gap.
    /// Cut back no further than the last sync: what a lost write-back
    /// leaves, written again as after a failed sync.
    async fn follow_outside_change(&mut self, drain: &mut Drain) -> bool {
        match self.file.change() {
            Ok(FileChange::Same) | Err(_) => true,
            Ok(FileChange::Moved) => {
                if self.synced_seq < self.last_seq && !self.sync_now(drain).await {
                    return false;
                }
                tracing::warn!(
                    "events file {} was moved away by another process with seqs up to {}; a new file is started at the path (use events.rotate_bytes / rotate_interval_s to rotate without one)",
                    self.path().display(),
                    self.last_seq
                );
                self.restart_file();
                true
            }
            Ok(FileChange::Shrunk { found, .. }) if found >= self.synced_len => {
                self.must_rewrite = true;
                true
            }
            Ok(FileChange::Shrunk { expected, found }) => {
                let refusal = || {
                    io::Error::other(format!(
                        "cut from {expected} to {found} bytes by another process (copytruncate?): lines may be lost, so nothing more is written; restore the file or restart geogate, which names the seqs missing"
                    ))
                };
                tracing::error!("events file {}: {}", self.path().display(), refusal());
                let health = self.health.clone();
                drain
                    .retry(&*health, refusal(), || match self.file.change() {
                        Ok(FileChange::Shrunk { found, .. }) if found < self.synced_len => {
                            Err(refusal())
                        }
                        _ => Ok(()),
                    })
                    .await
            }
        }
    }

    /// A new, empty file at the path: the current one was rotated or
    /// moved away.
    fn restart_file(&mut self) {
        if let Err(e) = self.file.reopen() {
            // The next write reports it, and retries.
            tracing::error!("events file {}: {e}", self.path().display());
        }
        self.synced_len = self.file.len();
        self.first_seq = None;
        self.started = Instant::now();
    }

    /// Rotates the file if it is past `events.rotate_bytes` or older than
    /// `rotate_interval_s`: synced first (a rotated file is never cut back,
    /// and the cursor covers it), renamed to `<path>.<first>-<last>`, a new
    /// file started, the directory synced, and the oldest rotated files
    /// past `rotate_keep` deleted. A crash at any step leaves either the
    /// old name or the new one holding every line, and the start reads
    /// the last seq from the newest rotated file when the current one has
    /// none. False if the drain deadline passed first.
    async fn rotate_if_due(&mut self, drain: &mut Drain) -> bool {
        let Some(rotation) = self.rotation else {
            return true;
        };
        let big = rotation.bytes.is_some_and(|b| self.file.len() >= b);
        let old = rotation
            .interval
            .is_some_and(|i| self.started.elapsed() >= i);
        if self.file.is_empty() || !(big || old) {
            return true;
        }
        if self.synced_seq < self.last_seq && !self.sync_now(drain).await {
            return false;
        }
        let path = self.path().to_owned();
        let to = events_file::rotated_path(
            &path,
            self.first_seq.unwrap_or(self.last_seq),
            self.last_seq,
        );
        crash_point::reached("events.before_rotate");
        if let Err(e) = std::fs::rename(&path, &to) {
            tracing::error!(
                "events file {}: not rotated to {} ({e}); tried again after the next write",
                path.display(),
                to.display()
            );
            return true;
        }
        crash_point::reached("events.rotated");
        self.restart_file();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Err(e) = File::open(dir).and_then(|d| d.sync_all())
        {
            tracing::warn!(
                "events file {}: directory not synced after rotating: {e}",
                path.display()
            );
        }
        tracing::info!("events file rotated to {}", to.display());
        self.delete_past_retention(&path, rotation.keep);
        true
    }

    fn delete_past_retention(&self, path: &Path, keep: usize) {
        let rotated = match events_file::rotated_files(path) {
            Ok(rotated) => rotated,
            Err(e) => {
                tracing::warn!(
                    "events file {}: rotated files not listed: {e}",
                    path.display()
                );
                return;
            }
        };
        let past = rotated.len().saturating_sub(keep);
        for old in &rotated[..past] {
            match std::fs::remove_file(&old.path) {
                Ok(()) => tracing::info!(
                    "events file {} deleted (seqs {}..={}, past events.rotate_keep)",
                    old.path.display(),
                    old.first,
                    old.last
                ),
                Err(e) => tracing::warn!("events file {}: not deleted: {e}", old.path.display()),
            }
        }
    }
}
