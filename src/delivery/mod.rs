//! Committed transitions out, written once for the local state backends:
//! the events file ([`writer`], exactly once by seq) and MQTT
//! ([`publisher`], at least once by id). A backend hands committed
//! [`outbox`] entries to a [`relay`]. (The partitioned backend publishes
//! its own to the engine's events stream instead.)
//!
//! Each output keeps a cursor ([`Cursors`]): the last seq it holds. A
//! store prunes its outbox only up to the lower of the two, so an entry
//! leaves the store once every output has it.
//!
//! * [`outbox`]: a transition as the line that leaves (stable id, seq);
//! * [`events_file`]: what the events file's tail says at start;
//! * [`writer`]: lines appended by the fsync policy, retried while the
//!   file fails;
//! * [`output_queue`]: what an output after the file has yet to deliver,
//!   bounded, with a maximum age past which entries go to the dead letter;
//! * [`publisher`]: the same entries over MQTT;
//! * [`webhook`]: the same entries POSTed to an HTTP endpoint, signed;
//! * [`relay`]: committed batches to the file, then their completions,
//!   then the publisher.

pub mod config;
pub mod events_file;
pub mod metrics;
pub mod outbox;
pub mod output_queue;
pub mod publisher;
pub mod relay;
pub mod targets;
pub mod webhook;
pub mod writer;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// How transitions leave once committed, as configured: the events file's
/// rotation, and the outputs after the file.
#[derive(Default)]
pub struct Outputs {
    pub rotation: Option<config::Rotation>,
    /// The connection transitions are also published on, and how far that
    /// output may fall behind.
    pub mqtt: Option<(
        rumqttc::MqttOptions,
        rumqttc::NetworkOptions,
        output_queue::OutputLimits,
    )>,
    /// Where transitions are also posted, and how far it may fall behind.
    pub webhook: Option<(webhook::WebhookTarget, output_queue::OutputLimits)>,
    /// Where outputs write what they give up on (the router's dead letter).
    pub dead_letter: Option<output_queue::DeadLetterQueue>,
}

/// How far each output has come: the last seq it holds (`u64::MAX` for an
/// output that is not configured, so it never holds the outbox back).
#[derive(Debug)]
pub struct Cursors {
    pub file: Arc<AtomicU64>,
    pub mqtt: Arc<AtomicU64>,
    pub webhook: Arc<AtomicU64>,
}

impl Cursors {
    pub fn new(file: u64, mqtt: u64, webhook: u64) -> Self {
        Self {
            file: Arc::new(file.into()),
            mqtt: Arc::new(mqtt.into()),
            webhook: Arc::new(webhook.into()),
        }
    }

    /// What every output has: the store lets go of the outbox up to here.
    pub fn all_have(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.file
            .load(Relaxed)
            .min(self.mqtt.load(Relaxed))
            .min(self.webhook.load(Relaxed))
    }
}
