//! `[events]`: where transitions go, and how far an output after the
//! events file may fall behind.

use super::output_queue::OutputLimits;
use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Append transitions as NDJSON here.
    pub path: Option<PathBuf>,
    /// Publish transitions (QoS 1) to `geogate/events/{vehicle}`.
    pub mqtt: bool,
    /// The broker transitions are published to, when not `[mqtt]`'s own
    /// (the same credentials and TLS settings are used).
    pub mqtt_host: Option<String>,
    pub mqtt_port: Option<u16>,
    /// Transitions queued for an output after the file (MQTT, the webhook)
    /// at most; a full queue holds acks, and intake pushes back.
    pub max_pending: usize,
    /// Past this many seconds, a transition the events broker has not
    /// confirmed goes to the dead letter as `mqtt_expired`.
    pub mqtt_max_age_s: f64,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            path: None,
            mqtt: false,
            mqtt_host: None,
            mqtt_port: None,
            max_pending: 100_000,
            mqtt_max_age_s: 600.0,
        }
    }
}

impl EventsConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.max_pending == 0 {
            problems.add("events.max_pending", "must be ≥ 1 (transitions)");
        }
        if !(self.mqtt_max_age_s.is_finite() && self.mqtt_max_age_s > 0.0) {
            problems.add("events.mqtt_max_age_s", "must be a number > 0 (seconds)");
        }
    }

    /// The MQTT output's bounds.
    pub fn mqtt_limits(&self) -> OutputLimits {
        OutputLimits {
            max_pending: self.max_pending,
            max_age: Duration::try_from_secs_f64(self.mqtt_max_age_s).unwrap_or(Duration::MAX),
        }
    }
}
