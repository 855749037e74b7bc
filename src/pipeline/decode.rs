//! Decode lanes: one task per intake lane turns envelopes into fixes (or
//! decode errors) before the router sees them, so the router's thread
//! spends its time on dedup, routing and admission. Each lane hands over
//! what it decoded in batches, in the order it received them.

use crate::codec::{self, CodecSettings, DecodeError};
use crate::model::Telemetry;
use crate::source::Envelope;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Most messages a lane decodes before handing them over. A lane takes
/// what is waiting, so under light load a batch is one message and adds no
/// latency; in a backlog, fewer and larger hand-offs mean fewer wake-ups.
/// In-process (benches/pipeline.rs, 2 shards, 5 alternating rounds): 256
/// against 64 was 1.12× [1.11–1.15], 512 against 256 1.07× [1.01–1.11].
const BATCH: usize = 512;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::intake::Intake;

    /// 20,000 fixes of 10 vehicles, queued in 8 lanes before the decoders
    /// start and decoded on two threads: the router sees each vehicle's
    /// fixes in the order they were sent.
    #[test]
    fn each_topic_reaches_the_router_in_order() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let (intake, lanes) = Intake::new(8, 20_000);
        for i in 0..20_000i64 {
            let vehicle = i % 10;
            let payload = format!(
                r#"{{"vehicle":"v{vehicle}","ts":{},"lat":50.0,"lon":10.0,"speed_kmh":30}}"#,
                1_750_000_000_000 + i
            );
            intake
                .try_send(Envelope {
                    token: None,
                    topic: format!("fleet/v{vehicle}/telemetry"),
                    payload: payload.into(),
                    received_at: std::time::Instant::now(),
                    redelivered: false,
                })
                .unwrap();
        }
        drop(intake);
        let last = runtime.block_on(async {
            let mut decoded = start(lanes, CodecSettings::default());
            let mut last = std::collections::HashMap::new();
            while let Some(batch) = decoded.recv().await {
                for d in batch {
                    let fix = d.fix.expect("valid fixes");
                    if let Some(before) = last.insert(fix.vehicle.clone(), fix.fix_time_ms) {
                        assert!(
                            before < fix.fix_time_ms,
                            "{}: {before} then {}",
                            fix.vehicle,
                            fix.fix_time_ms
                        );
                    }
                }
            }
            last
        });
        assert_eq!(last.len(), 10, "every vehicle came through");
    }
}
