//! How far this instance's transitions have gone over an output after its
//! events file (MQTT, the webhook), kept beside that file
//! (`{events}.mqtt-cursor`, `{events}.webhook-cursor`: the last seq the
//! output confirmed with everything before it).
//!
//! With the redis backend the events file is the truth of what this
//! instance delivered: the outbox consumer writes and `XACK`s as without
//! other outputs, and hands what it wrote to each output's queue
//! ([`crate::delivery::output_queue`]), whose cursor moves only on
//! confirmation. So an output never holds up the acks in Redis beyond its
//! queue's bound, and a crash costs at most a resend: at start everything
//! in the file after the cursor is sent again (same `id`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::watch;

/// How often a moved cursor is written; a crash resends at most this much
/// more than was unconfirmed.
const KEEP_EVERY: Duration = Duration::from_millis(100);

pub struct OutputCursor {
    path: PathBuf,
    /// `mqtt` or `webhook`, for the file's name and the log.
    output: &'static str,
}

impl OutputCursor {
    pub fn beside(events: &Path, output: &'static str) -> Self {
        let mut path = events.as_os_str().to_owned();
        path.push(format!(".{output}-cursor"));
        Self {
            path: path.into(),
            output,
        }
    }

    /// The stored cursor, given `file_seq`, the events file's last seq.
    /// With no cursor yet, `file_seq` is stored and returned: the output starts
    /// from now, not from the file's history. A cursor past `file_seq`
    /// (the file was moved away or lost its end) is brought back to it,
    /// or every transition up to the old cursor would be skipped.
    pub fn load(&self, file_seq: u64) -> Result<u64, String> {
        let stored = match std::fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse::<u64>().map_err(|e| {
                format!(
                    "{}: not a seq ({e}). Write the last seq of the events file the broker is known to have, or delete the file to start from the events file's end (what was not yet confirmed is then not sent)",
                    self.path.display()
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.store(file_seq).map_err(|e| self.error(e))?;
                return Ok(file_seq);
            }
            Err(e) => return Err(self.error(e)),
        };
        if stored > file_seq {
            tracing::warn!(
                "{}: {} says seq {stored} was confirmed, but the events file ends at {file_seq}; starting from {file_seq}",
                self.output,
                self.path.display()
            );
            self.store(file_seq).map_err(|e| self.error(e))?;
            return Ok(file_seq);
        }
        Ok(stored)
    }

    /// Deletes a cursor left from a run with the output on: if it is
    /// turned on again, it starts from then, not from this old point.
    pub fn forget(&self) -> Result<(), String> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                tracing::info!("{} is off: removed {}", self.output, self.path.display());
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }

    fn error(&self, e: io::Error) -> String {
        format!("{}: cursor {}: {e}", self.output, self.path.display())
    }

    /// Replaces the file whole (written and synced beside it, then
    /// renamed), so a crash or a power loss leaves the old cursor or the
    /// new one, never an empty file.
    pub fn store(&self, seq: u64) -> io::Result<()> {
        use std::io::Write;
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(format!("{seq}\n").as_bytes())?;
        file.sync_data()?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Writes the cursor whenever the output moved it from `stored` (what
    /// the file holds), until `stop` turns true; then once more.
    pub async fn keep(
        self,
        mut stored: u64,
        cursor: Arc<AtomicU64>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut failing = false;
        loop {
            let stopping = *stop.borrow();
            let now = cursor.load(Relaxed);
            if now != stored {
                match self.store(now) {
                    Ok(()) => {
                        stored = now;
                        failing = false;
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(
                            "{}: cursor {} not written ({e}); until it is, a restart sends more again",
                            self.output,
                            self.path.display()
                        );
                    }
                    Err(_) => {}
                }
            }
            if stopping {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(KEEP_EVERY) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_starts_at_the_file_end_and_never_stays_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = OutputCursor::beside(&dir.path().join("events.ndjson"), "mqtt");
        assert_eq!(cursor.path, dir.path().join("events.ndjson.mqtt-cursor"));
        // None yet: from the file's end, and created at once.
        assert_eq!(cursor.load(40), Ok(40));
        assert_eq!(std::fs::read_to_string(&cursor.path).unwrap(), "40\n");
        cursor.store(30).unwrap();
        assert_eq!(cursor.load(40), Ok(30));
        // The file was moved away: back to its end.
        assert_eq!(cursor.load(5), Ok(5));
        assert_eq!(cursor.load(40), Ok(5));
        std::fs::write(&cursor.path, "").unwrap();
        let err = cursor.load(40).unwrap_err();
        assert!(err.contains("mqtt-cursor: not a seq"), "{err}");
        cursor.forget().unwrap();
        assert!(!cursor.path.exists());
        cursor.forget().unwrap();
    }

    #[tokio::test]
    async fn the_keeper_stores_each_move_and_the_last_one_at_stop() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = OutputCursor::beside(&dir.path().join("events.ndjson"), "mqtt");
        let path = cursor.path.clone();
        let cursors = Arc::new(crate::delivery::Cursors::new(u64::MAX, 0, u64::MAX));
        let (stop, stop_rx) = watch::channel(false);
        assert_eq!(cursor.load(0), Ok(0));
        let keeper = tokio::spawn(cursor.keep(0, cursors.mqtt.clone(), stop_rx));
        cursors.mqtt.store(7, Relaxed);
        let stored = || std::fs::read_to_string(&path).ok();
        for _ in 0..100 {
            if stored().as_deref() == Some("7\n") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(stored().as_deref(), Some("7\n"));
        cursors.mqtt.store(9, Relaxed);
        stop.send(true).unwrap();
        keeper.await.unwrap();
        assert_eq!(stored().as_deref(), Some("9\n"));
    }
}
