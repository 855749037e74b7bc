//! How far this instance's transitions have gone over MQTT, kept beside its
//! events file (`{events}.mqtt-cursor`, the last seq the broker confirmed
//! with everything before it).
//!
//! With the redis backend the events file is the truth of what this
//! instance delivered: the outbox consumer writes and `XACK`s as without
//! MQTT, and hands what it wrote to the publisher
//! ([`crate::state::publisher`]), which moves the cursor only on full
//! confirmation. So the broker never holds up delivery or the acks in
//! Redis, and a crash costs at most a resend: at start everything in the
//! file after the cursor is published again (same `id`).

use crate::state::commit::Cursors;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::watch;

/// How often a moved cursor is written; a crash resends at most this much
/// more than was unconfirmed.
const KEEP_EVERY: Duration = Duration::from_millis(100);

pub struct MqttCursor {
    path: PathBuf,
}

impl MqttCursor {
    pub fn beside(events: &Path) -> Self {
        let mut path = events.as_os_str().to_owned();
        path.push(".mqtt-cursor");
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored cursor; when there is none yet, `file_seq` (the file's
    /// last seq) is stored and returned: MQTT starts from now, not from the
    /// file's history.
    pub fn load_or_start_at(&self, file_seq: u64) -> io::Result<u64> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse().map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a seq: {e}", self.path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.store(file_seq)?;
                Ok(file_seq)
            }
            Err(e) => Err(e),
        }
    }

    /// Replaces the file whole (written beside it, then renamed), so a
    /// crash leaves the old cursor or the new one.
    pub fn store(&self, seq: u64) -> io::Result<()> {
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, format!("{seq}\n"))?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Writes the cursor whenever the publisher moved it, until `stop`
    /// turns true; then once more.
    pub async fn keep(self, cursors: Arc<Cursors>, mut stop: watch::Receiver<bool>) {
        let mut stored = cursors.mqtt.load(Relaxed);
        loop {
            let stopping = *stop.borrow();
            let now = cursors.mqtt.load(Relaxed);
            if now != stored {
                match self.store(now) {
                    Ok(()) => stored = now,
                    Err(e) => tracing::warn!(
                        "events over MQTT: cursor {} not written ({e}); a restart would send more again",
                        self.path.display()
                    ),
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
