//! `[events]`: where transitions go, and how far an output after the
//! events file may fall behind.

use super::outbox::FenceProperties;
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
    /// POST transitions to an HTTP endpoint too.
    pub webhook: Option<WebhookConfig>,
    /// Rotate the events file once it holds this many bytes, and/or once
    /// it is this old; keep this many rotated files.
    pub rotate_bytes: Option<u64>,
    pub rotate_interval_s: Option<f64>,
    pub rotate_keep: usize,
    /// Which of a fence's GeoJSON properties each enter and exit carries:
    /// the keys listed, or `["*"]` for all of them (capped at
    /// `delivery::outbox::PROPERTIES_MAX_BYTES`).
    pub fence_properties: Vec<String>,
}

/// When the events file is rotated, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotation {
    pub bytes: Option<u64>,
    pub interval: Option<Duration>,
    pub keep: usize,
}

/// `[events.webhook]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// `http://` or `https://`.
    pub url: String,
    /// The shared secret requests are signed with, or (better: the config
    /// then holds no secret) a file holding it.
    pub secret: Option<String>,
    pub secret_file: Option<PathBuf>,
    /// Transitions per request at most.
    pub batch: usize,
    /// One request's time limit, connecting included.
    pub timeout_ms: u64,
    /// Past this many seconds, a transition the receiver has not accepted
    /// goes to the dead letter as `webhook_expired`.
    pub max_age_s: f64,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            secret: None,
            secret_file: None,
            batch: 100,
            timeout_ms: 10_000,
            max_age_s: 3600.0,
        }
    }
}

impl WebhookConfig {
    fn check(&self, problems: &mut Problems) {
        match reqwest::Url::parse(&self.url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            Ok(_) => problems.add("events.webhook.url", "must be an http:// or https:// URL"),
            Err(e) => problems.add("events.webhook.url", format!("not a URL: {e}")),
        }
        if self.secret.is_some() == self.secret_file.is_some() {
            problems.add(
                "events.webhook.secret",
                "give exactly one of secret and secret_file: requests are signed with it",
            );
        }
        if self.secret.as_deref().is_some_and(str::is_empty) {
            problems.add("events.webhook.secret", "must not be empty");
        }
        if self.batch == 0 {
            problems.add("events.webhook.batch", "must be ≥ 1 (transitions)");
        }
        if self.timeout_ms == 0 {
            problems.add("events.webhook.timeout_ms", "must be ≥ 1");
        }
        if !(self.max_age_s.is_finite() && self.max_age_s > 0.0) {
            problems.add("events.webhook.max_age_s", "must be a number > 0 (seconds)");
        }
    }

    /// The secret, from the config or its file (a trailing newline is not
    /// part of it).
    pub fn load_secret(&self) -> Result<Vec<u8>, String> {
        let secret = match (&self.secret, &self.secret_file) {
            (Some(secret), _) => secret.as_bytes().to_vec(),
            (None, Some(path)) => {
                let mut bytes = std::fs::read(path)
                    .map_err(|e| format!("events.webhook.secret_file {}: {e}", path.display()))?;
                while bytes.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
                    bytes.pop();
                }
                bytes
            }
            (None, None) => Vec::new(),
        };
        if secret.is_empty() {
            return Err("events.webhook: the secret is empty".into());
        }
        Ok(secret)
    }

    pub fn limits(&self, max_pending: usize) -> OutputLimits {
        OutputLimits {
            max_pending,
            max_age: Duration::try_from_secs_f64(self.max_age_s).unwrap_or(Duration::MAX),
        }
    }
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
            webhook: None,
            rotate_bytes: None,
            rotate_interval_s: None,
            rotate_keep: 10,
            fence_properties: Vec::new(),
        }
    }
}

impl EventsConfig {
    /// What the events carry of their fences' properties.
    pub fn fence_properties(&self) -> FenceProperties {
        FenceProperties::new(self.fence_properties.clone())
    }

    pub fn check(&self, problems: &mut Problems) {
        if self.max_pending == 0 {
            problems.add("events.max_pending", "must be ≥ 1 (transitions)");
        }
        if !(self.mqtt_max_age_s.is_finite() && self.mqtt_max_age_s > 0.0) {
            problems.add("events.mqtt_max_age_s", "must be a number > 0 (seconds)");
        }
        if let Some(webhook) = &self.webhook {
            webhook.check(problems);
        }
        if self.rotate_bytes.is_some_and(|b| b < 4096) {
            problems.add("events.rotate_bytes", "must be ≥ 4096");
        }
        if self
            .rotate_interval_s
            .is_some_and(|s| !(s.is_finite() && s >= 1.0))
        {
            problems.add("events.rotate_interval_s", "must be a number ≥ 1 (seconds)");
        }
        if self.rotate_keep == 0 {
            problems.add(
                "events.rotate_keep",
                "must be ≥ 1: a rotated file is kept until this many newer ones exist",
            );
        }
        if (self.rotate_bytes.is_some() || self.rotate_interval_s.is_some()) && self.path.is_none()
        {
            problems.add("events.rotate_bytes", "rotation needs events.path");
        }
    }

    /// When the events file rotates, if it does.
    pub fn rotation(&self) -> Option<Rotation> {
        (self.rotate_bytes.is_some() || self.rotate_interval_s.is_some()).then(|| Rotation {
            bytes: self.rotate_bytes,
            interval: self
                .rotate_interval_s
                .map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)),
            keep: self.rotate_keep,
        })
    }

    /// The MQTT output's bounds.
    pub fn mqtt_limits(&self) -> OutputLimits {
        OutputLimits {
            max_pending: self.max_pending,
            max_age: Duration::try_from_secs_f64(self.mqtt_max_age_s).unwrap_or(Duration::MAX),
        }
    }
}
