//! Where telemetry comes from, and the transport-neutral envelope the rest
//! of the pipeline sees.
//!
//! A source hands the router an [`Envelope`] and later hears, through a
//! [`Completions`] channel, that the envelope's message is finished
//! (evaluated, or durably dead-lettered). What finishing means for the
//! transport (an MQTT PubAck on the right connection, in order) stays
//! inside the source, so the router and workers never import it.

pub mod intake;
pub mod jetstream;
pub mod mqtt;

use tokio::sync::mpsc;

/// One received message on its way through the pipeline.
#[derive(Debug)]
pub struct Envelope {
    /// The source's handle for "this one is finished"; `None` when nothing
    /// needs to be reported (MQTT QoS 0).
    pub token: Option<AckToken>,
    pub topic: String,
    pub payload: bytes::Bytes,
    /// Monotonic receive time, for end-to-end latency.
    pub received_at: std::time::Instant,
    /// The broker marked it as sent before (MQTT DUP): it may have been
    /// applied by a process that crashed before acking it.
    pub redelivered: bool,
}

/// Opaque to the pipeline: the source numbers its messages in receive order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AckToken(pub u64);

/// Where finished tokens go back to their source.
#[derive(Debug, Clone)]
pub struct Completions(mpsc::UnboundedSender<AckToken>);

impl Completions {
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<AckToken>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self(tx), rx)
    }

    /// Reports `token` finished. A source that has gone away (shutdown)
    /// no longer acks anything, so a closed channel is not an error.
    pub fn done(&self, token: Option<AckToken>) {
        if let Some(token) = token {
            let _ = self.0.send(token);
        }
    }
}
