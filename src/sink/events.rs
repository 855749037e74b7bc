//! Transitions out: appended to an NDJSON file and/or published at QoS 1 to
//! `geogate/events/{vehicle}`. MQTT output uses its own connection so that
//! publishing can never wait on the intake connection (see `source::mqtt`).

use crate::geofence::Transition;
use rumqttc::{AsyncClient, QoS};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

pub struct EventSink {
    file: Option<Mutex<BufWriter<File>>>,
    mqtt: Option<AsyncClient>,
}

impl EventSink {
    pub fn new(path: Option<&Path>, mqtt: Option<AsyncClient>) -> io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(BufWriter::new(
                OpenOptions::new().create(true).append(true).open(p)?,
            ))),
            None => None,
        };
        Ok(Self { file, mqtt })
    }

    /// Writes a batch of transitions (one fix's worth).
    pub async fn emit(&self, transitions: &[Transition]) {
        if transitions.is_empty() {
            return;
        }
        if let Some(file) = &self.file {
            let mut buf = Vec::with_capacity(96 * transitions.len());
            for t in transitions {
                if serde_json::to_writer(&mut buf, t).is_ok() {
                    buf.push(b'\n');
                }
            }
            if let Ok(mut f) = file.lock()
                && let Err(e) = f.write_all(&buf).and_then(|_| f.flush())
            {
                tracing::error!("writing events: {e}");
            }
        }
        if let Some(client) = &self.mqtt {
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
    }

    pub fn flush(&self) {
        if let Some(file) = &self.file
            && let Ok(mut f) = file.lock()
        {
            let _ = f.flush().and_then(|_| f.get_ref().sync_all());
        }
    }
}
