//! Starts the kernel writing the embedded store's write-ahead log to disk
//! early, under `fsync = "flush"`.
//!
//! Why: with `synchronous=NORMAL` no commit syncs the log, so each
//! checkpoint (SQLite's automatic one every 1,000 pages, and the one when
//! the store closes) first syncs all the log written since the previous
//! one, while the committer, and the acks behind it, wait. Started early,
//! that writing overlaps the run
//! (docs/decisions/0013-state-log-writeback-started-early.md: only the
//! close's checkpoint was measured).
//!
//! Only a hint: `SYNC_FILE_RANGE_WRITE` starts writing and waits for
//! nothing, syncs no metadata and flushes no disk cache, so what a commit
//! survives is unchanged, and SQLite's own syncs still report any write
//! error. The descriptor is the log's alone: SQLite locks only the main
//! file, and closing a descriptor of that file would drop its lock.
//!
//! At most once per [`EVERY`]: consecutive commits share the log's last
//! page, and each call starts writing that page again; where a write must
//! wait for a page under writeback (btrfs, stable-page devices), a commit
//! would otherwise wait once per commit.

use crate::sink::config::FsyncPolicy;
use std::time::{Duration, Instant};

/// The least time between two writeback requests.
const EVERY: Duration = Duration::from_millis(10);

pub struct LogWriteback {
    log: std::fs::File,
    last: Option<Instant>,
}

impl LogWriteback {
    /// For an open store whose log exists: `None` off Linux, under `fsync =
    /// "always"` (every commit syncs the log already), or when the log
    /// cannot be opened. The log's name comes from SQLite, which resolved
    /// the database's path (symlinks, the working directory).
    pub fn open(conn: &rusqlite::Connection, fsync: FsyncPolicy) -> Option<Self> {
        if !cfg!(target_os = "linux") || fsync != FsyncPolicy::Flush {
            return None;
        }
        let db = conn.path().filter(|p| !p.is_empty())?;
        let log = std::fs::File::open(format!("{db}-wal")).ok()?;
        Some(Self { log, last: None })
    }

    /// Whether a request is due at `now`; if so, `now` is the last one.
    fn due(&mut self, now: Instant) -> bool {
        let due = self
            .last
            .is_none_or(|last| now.duration_since(last) >= EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }

    /// After a commit. False when the kernel has no such call for this
    /// file, so that the caller stops asking.
    pub fn after_commit(&mut self, now: Instant) -> bool {
        if !self.due(now) {
            return true;
        }
        self.request()
    }

    #[cfg(target_os = "linux")]
    fn request(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is open for as long as `self`; the call
        // only asks the kernel to start writing the file's dirty pages.
        let done = unsafe {
            libc::sync_file_range(self.log.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        done == 0
            || !matches!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ENOSYS | libc::EINVAL | libc::ESPIPE)
            )
    }

    #[cfg(not(target_os = "linux"))]
    fn request(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &std::path::Path, fsync: FsyncPolicy) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(dir.join(format!("{fsync:?}.sqlite"))).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        conn
    }

    /// Requests go out at most once per interval, the first at once.
    #[test]
    fn requests_are_spaced_by_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let conn = store(dir.path(), FsyncPolicy::Flush);
        let opened = LogWriteback::open(&conn, FsyncPolicy::Flush);
        assert_eq!(
            opened.is_some(),
            cfg!(target_os = "linux"),
            "Linux, flush, a log: opened"
        );
        let Some(mut writeback) = opened else {
            return;
        };
        let t0 = Instant::now();
        let due: Vec<bool> = [0, 3, 9, 10, 12, 19, 20, 35]
            .map(|ms| writeback.due(t0 + Duration::from_millis(ms)))
            .to_vec();
        assert_eq!(due, [true, false, false, true, false, false, true, true]);
        assert!(writeback.after_commit(t0 + Duration::from_millis(50)));
    }

    /// Under `always` every commit syncs the log already.
    #[test]
    fn not_under_always() {
        let dir = tempfile::tempdir().unwrap();
        let conn = store(dir.path(), FsyncPolicy::Always);
        assert!(LogWriteback::open(&conn, FsyncPolicy::Always).is_none());
    }
}
