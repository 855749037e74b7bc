//! The embedded MQTT broker (rumqttd) behind `--embedded-broker` and
//! `geogate demo`: one process, nothing else to install. It listens on
//! 127.0.0.1 only. It suits single-node and demo use; production should
//! point geogate at mosquitto or EMQX, which persist sessions to disk.

use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// `[embedded_broker]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedBrokerConfig {
    /// Port for `--embedded-broker`, always on 127.0.0.1.
    pub port: u16,
}

impl Default for EmbeddedBrokerConfig {
    fn default() -> Self {
        Self { port: 1883 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("embedded broker config: {0}")]
    Config(String),
    #[error("embedded broker did not accept connections on {addr} within {waited:?}")]
    NotListening { addr: SocketAddr, waited: Duration },
}

/// Handle to a running embedded broker; it runs on its own threads until
/// the process exits (rumqttd has no stop call).
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedBroker {
    pub addr: SocketAddr,
}

/// Largest payload the embedded broker forwards; geogate's own cap
/// (`codec.max_payload_bytes`) refuses, and dead-letters, anything bigger
/// that it receives, so the broker allows more than the codec.
const MAX_PAYLOAD_BYTES: usize = 2 * 1024 * 1024;

/// Starts rumqttd on `127.0.0.1:port` (MQTT 3.1.1) and waits until it
/// accepts TCP connections.
pub fn start(port: u16) -> Result<EmbeddedBroker, BrokerError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let toml = format!(
        r#"
id = 0
[router]
max_connections = 1000
max_outgoing_packet_count = 20000
max_segment_size = 104857600
max_segment_count = 10

[v4.1]
name = "geogate-embedded"
listen = "{addr}"
next_connection_delay_ms = 1
[v4.1.connections]
connection_timeout_ms = 60000
max_payload_size = {MAX_PAYLOAD_BYTES}
max_inflight_count = 16384
dynamic_filters = true
"#
    );
    let config: rumqttd::Config =
        toml::from_str(&toml).map_err(|e| BrokerError::Config(e.to_string()))?;
    let mut broker = rumqttd::Broker::new(config);
    std::thread::Builder::new()
        .name("geogate-broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!("embedded broker stopped: {e}");
            }
        })
        .map_err(|e| BrokerError::Config(e.to_string()))?;
    let started = Instant::now();
    let wait = Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if started.elapsed() > wait {
            return Err(BrokerError::NotListening { addr, waited: wait });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(EmbeddedBroker { addr })
}
