//! Transitions out: appended to an NDJSON file and/or published at QoS 1 to
//! `geogate/events/{vehicle}`. MQTT output uses its own connection so that
//! publishing can never wait on the intake connection (see `source::mqtt`).
//!
//! The file comes first: a fix's message is acked only once its
//! transitions are in the file, so a write that fails is retried (by the
//! worker, see [`super::health`]) while the message stays unacked, and the
//! MQTT copy goes out once, after the file has them.

use super::append_file::AppendFile;
use super::health::SinkHealth;
use crate::geofence::Transition;
use rumqttc::{AsyncClient, QoS};
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

pub struct EventSink {
    /// Shared by every worker; bytes one worker could not write are
    /// written by the next attempt of any of them, in order.
    file: Option<Mutex<AppendFile>>,
    mqtt: Option<AsyncClient>,
    health: SinkHealth,
}

impl EventSink {
    pub fn new(path: Option<&Path>, mqtt: Option<AsyncClient>) -> io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(AppendFile::open(p)?)),
            None => None,
        };
        let health = SinkHealth::new("events", path.unwrap_or(Path::new("(no file)")));
        Ok(Self { file, mqtt, health })
    }

    /// Shared by every worker writing here.
    pub fn health(&self) -> &SinkHealth {
        &self.health
    }

    /// Appends one fix's transitions to the file. On error they stay
    /// queued in order: call [`Self::retry`], never `write` again.
    pub fn write(&self, transitions: &[Transition]) -> io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        if transitions.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(96 * transitions.len());
        for t in transitions {
            serde_json::to_writer(&mut buf, t)?;
            buf.push(b'\n');
        }
        let mut file = lock(file);
        file.queue(&buf);
        file.write_unwritten()
    }

    /// Writes whatever earlier writes left queued.
    pub fn retry(&self) -> io::Result<()> {
        match &self.file {
            Some(file) => lock(file).write_unwritten(),
            None => Ok(()),
        }
    }

    /// Publishes one fix's transitions over MQTT (after [`Self::write`]).
    pub async fn publish(&self, transitions: &[Transition]) {
        let Some(client) = &self.mqtt else {
            return;
        };
        for t in transitions {
            let Ok(body) = serde_json::to_vec(t) else {
                continue;
            };
            let topic = format!("geogate/events/{}", t.vehicle);
            if let Err(e) = client.publish(topic, QoS::AtLeastOnce, false, body).await {
                tracing::warn!("publishing transition: {e}");
            }
        }
    }

    /// Syncs the file to stable storage (shutdown). Bytes still unwritten
    /// belong to messages left unacked, which come back after a restart,
    /// so they are not written now.
    pub fn flush(&self) {
        if let Some(file) = &self.file {
            let mut f = lock(file);
            if let Err(e) = f.sync_data() {
                tracing::error!("events file {}: {e}", f.path().display());
            }
        }
    }
}

fn lock(file: &Mutex<AppendFile>) -> MutexGuard<'_, AppendFile> {
    file.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
