//! Decode lanes: one task per intake lane turns envelopes into fixes (or
//! decode errors) before the router sees them, so the router's thread
//! spends its time on dedup, routing and admission. Each lane hands over
//! what it decoded in batches, in the order it received them.

use crate::codec::{self, CodecSettings, DecodeError};
use crate::model::Telemetry;
use crate::source::Envelope;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Messages a lane decodes before handing them over.
const BATCH: usize = 64;

/// An envelope and what its payload decoded to.
#[derive(Debug)]
pub struct Decoded {
    pub envelope: Envelope,
    pub fix: Result<Telemetry, DecodeError>,
}

impl Decoded {
    pub fn of(envelope: Envelope, codec: &CodecSettings) -> Self {
        let fix = codec::decode(&envelope.topic, &envelope.payload, codec);
        Self { envelope, fix }
    }
}

/// Starts one decode task per lane; the returned receiver yields their
/// batches and closes once every lane has closed and been drained (so the
/// tasks need no handle: the router's end is theirs).
pub fn start(
    lanes: Vec<mpsc::Receiver<Envelope>>,
    codec: CodecSettings,
) -> mpsc::Receiver<Vec<Decoded>> {
    let codec = Arc::new(codec);
    // A few batches per lane in flight: the router's queue, not a buffer.
    let (tx, rx) = mpsc::channel(4 * lanes.len().max(1));
    for lane in lanes {
        tokio::spawn(decode_lane(lane, codec.clone(), tx.clone()));
    }
    rx
}

async fn decode_lane(
    mut lane: mpsc::Receiver<Envelope>,
    codec: Arc<CodecSettings>,
    router: mpsc::Sender<Vec<Decoded>>,
) {
    let mut envelopes = Vec::with_capacity(BATCH);
    while lane.recv_many(&mut envelopes, BATCH).await > 0 {
        let batch = envelopes
            .drain(..)
            .map(|e| Decoded::of(e, &codec))
            .collect();
        if router.send(batch).await.is_err() {
            // The router is gone (shutdown): what is left was never
            // received, so never acked; the broker sends it again.
            return;
        }
    }
}
