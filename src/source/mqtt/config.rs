//! `[mqtt]`: the intake connection.

use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub host: String,
    pub port: u16,
    /// Required and stable: the broker keeps the session (and the unacked
    /// messages) under this id across restarts.
    pub client_id: String,
    pub topics: Vec<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default = "default_max_packet_bytes")]
    pub max_packet_bytes: usize,
    #[serde(default = "default_keep_alive_s")]
    pub keep_alive_s: u64,
    /// Budget for one whole connect (TCP, TLS, CONNECT/CONNACK). A connect
    /// is never cut short by anything else; past this it is logged and
    /// retried with backoff.
    #[serde(default = "default_connect_timeout_s")]
    pub connect_timeout_s: u64,
    /// Most QoS 1 messages held unacked before intake stops reading.
    #[serde(default = "default_max_unacked")]
    pub max_unacked: usize,
    /// Subscription QoS: 1 (default) acks each message only after it is
    /// evaluated or dead-lettered, so a crash loses nothing; 0 has no acks
    /// and no redelivery, for fleets that resend often and want raw speed.
    #[serde(default = "default_subscribe_qos")]
    pub subscribe_qos: u8,
    /// MQTT over TLS (rustls): verify the broker against `ca_file`, and
    /// optionally present a client certificate.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA(s) that signed the broker's certificate.
    pub ca_file: PathBuf,
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
}

impl fmt::Debug for MqttConfig {
    /// Redacts the password: configs get logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("client_id", &self.client_id)
            .field("topics", &self.topics)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("max_packet_bytes", &self.max_packet_bytes)
            .field("keep_alive_s", &self.keep_alive_s)
            .field("connect_timeout_s", &self.connect_timeout_s)
            .field("max_unacked", &self.max_unacked)
            .field("subscribe_qos", &self.subscribe_qos)
            .field("tls", &self.tls)
            .finish()
    }
}

fn default_max_packet_bytes() -> usize {
    8 * 1024 * 1024
}

fn default_keep_alive_s() -> u64 {
    30
}

fn default_connect_timeout_s() -> u64 {
    10
}

fn default_max_unacked() -> usize {
    4096
}

fn default_subscribe_qos() -> u8 {
    1
}

impl MqttConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.client_id.trim().is_empty() {
            problems.add(
                "mqtt.client_id",
                "must be a stable, non-empty id (the broker keeps the session under it)",
            );
        }
        if self.topics.is_empty() {
            problems.add("mqtt.topics", "needs at least one topic filter");
        }
        if self.host.is_empty() {
            problems.add("mqtt.host", "must not be empty");
        }
        if let Some(tls) = &self.tls {
            if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
                problems.add(
                    "mqtt.tls",
                    "client_cert_file and client_key_file go together",
                );
            }
            for (field, path) in [
                ("mqtt.tls.ca_file", Some(&tls.ca_file)),
                ("mqtt.tls.client_cert_file", tls.client_cert_file.as_ref()),
                ("mqtt.tls.client_key_file", tls.client_key_file.as_ref()),
            ] {
                if let Some(path) = path
                    && let Err(e) = std::fs::metadata(path)
                {
                    problems.add(field, format!("cannot read {}: {e}", path.display()));
                }
            }
        }
        if self.connect_timeout_s == 0 {
            problems.add("mqtt.connect_timeout_s", "must be ≥ 1 (seconds)");
        }
        if self.max_unacked == 0 {
            problems.add("mqtt.max_unacked", "must be ≥ 1");
        }
        if self.subscribe_qos > 1 {
            problems.add(
                "mqtt.subscribe_qos",
                format!(
                    "{} is not supported: use 1 (at least once, acked after evaluation) or 0 (at most once, no redelivery)",
                    self.subscribe_qos
                ),
            );
        }
    }
}
