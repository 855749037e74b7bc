//! Where the outputs after the events file deliver, as `[events]` and
//! `[mqtt]` configure them: read once, by whichever backend runs them (the
//! local backends' relay, or each partition's owner).

use super::config::EventsConfig;
use super::output_queue::OutputLimits;
use super::webhook::WebhookTarget;
use crate::source::mqtt::{self, config::MqttConfig};
use rumqttc::{MqttOptions, NetworkOptions};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("events.webhook.url: {0}")]
    Url(String),
    #[error("{0}")]
    Secret(String),
    #[error("events over MQTT: {0}")]
    Mqtt(#[from] std::io::Error),
}

/// The events broker's connection, for a client id of the caller's.
#[derive(Clone)]
pub struct MqttTarget {
    pub broker: MqttConfig,
    pub limits: OutputLimits,
}

impl MqttTarget {
    /// The connection as client `id`.
    pub fn connection(&self, id: &str) -> Result<(MqttOptions, NetworkOptions), TargetError> {
        Ok((
            mqtt::connection(&self.broker, id)?,
            mqtt::network_options(&self.broker),
        ))
    }
}

/// The configured outputs after the file.
#[derive(Clone, Default)]
pub struct Targets {
    pub mqtt: Option<MqttTarget>,
    pub webhook: Option<(WebhookTarget, OutputLimits)>,
}

impl Targets {
    /// Reads `[events]`: the events broker is `[mqtt]`'s unless
    /// `events.mqtt_host`/`mqtt_port` name another (with the same
    /// credentials and TLS); the webhook's secret is read here, so a
    /// missing secret file stops the start.
    pub fn configured(events: &EventsConfig, intake: &MqttConfig) -> Result<Self, TargetError> {
        let mqtt = events.mqtt.then(|| {
            let mut broker = intake.clone();
            if let Some(host) = &events.mqtt_host {
                broker.host.clone_from(host);
            }
            if let Some(port) = events.mqtt_port {
                broker.port = port;
            }
            MqttTarget {
                broker,
                limits: events.mqtt_limits(),
            }
        });
        let webhook = match &events.webhook {
            Some(w) => Some((
                WebhookTarget {
                    url: reqwest::Url::parse(&w.url)
                        .map_err(|e| TargetError::Url(e.to_string()))?,
                    secret: w.load_secret().map_err(TargetError::Secret)?.into(),
                    batch: w.batch,
                    timeout: Duration::from_millis(w.timeout_ms),
                },
                w.limits(events.max_pending),
            )),
            None => None,
        };
        Ok(Self { mqtt, webhook })
    }
}
