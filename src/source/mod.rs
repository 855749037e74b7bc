//! Where telemetry comes from, and the transport-neutral envelope the rest
//! of the pipeline sees.
//!
//! A source hands the router an [`Envelope`] and later hears, through a
//! [`Completions`] channel, that the envelope's message is finished
//! (evaluated, or durably dead-lettered). What finishing means for the
//! transport (an MQTT PubAck on the right connection, in order) stays
//! inside the source, so the router and workers never import it.

pub mod intake;
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

/// Opaque to the pipeline: each intake connection (its slot) numbers its
/// messages in receive order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AckToken(pub u64);

/// Bits of an [`AckToken`] below the connection's slot: 2^48 messages per
/// connection and run.
const SLOT_SHIFT: u32 = 48;

impl AckToken {
    /// Message `seq` of the connection in `slot`.
    pub fn new(slot: usize, seq: u64) -> Self {
        Self(((slot as u64) << SLOT_SHIFT) | (seq & ((1 << SLOT_SHIFT) - 1)))
    }

    /// Which connection the message came in on.
    pub fn slot(self) -> usize {
        (self.0 >> SLOT_SHIFT) as usize
    }
}

/// Where finished tokens go back to their source: one channel per intake
/// connection, since a message is acked only on the connection it came in
/// on.
#[derive(Debug, Clone)]
pub struct Completions(std::sync::Arc<[mpsc::UnboundedSender<AckToken>]>);

impl Completions {
    /// One connection's channel.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<AckToken>) {
        let (completions, mut receivers) = Self::channels(1);
        (completions, receivers.remove(0))
    }

    /// A channel per connection slot, `slots` of them (at least one).
    pub fn channels(slots: usize) -> (Self, Vec<mpsc::UnboundedReceiver<AckToken>>) {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..slots.max(1)).map(|_| mpsc::unbounded_channel()).unzip();
        (Self(senders.into()), receivers)
    }

    /// Reports `token` finished to its connection. A source that has gone
    /// away (shutdown) no longer acks anything, so a closed channel is not
    /// an error.
    pub fn done(&self, token: Option<AckToken>) {
        if let Some(token) = token
            && let Some(connection) = self.0.get(token.slot())
        {
            let _ = connection.send(token);
        }
    }
}
