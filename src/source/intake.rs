//! The bounded intake between a source and the pipeline, split into lanes
//! by a stable hash of the topic. Each lane is decoded on a task of its own
//! (`pipeline::decode`), so decoding runs beside the router instead of on
//! its thread, and in parallel when there are several lanes. One topic's
//! messages stay in one lane, in order, so a vehicle that publishes under
//! one topic keeps its fixes' order too. The topic does not always name
//! the vehicle: a native payload with a `vehicle` field names it in its
//! body. One vehicle under two topics can race between lanes; the
//! vehicle's reorder window puts the race back in fix-time order, and past
//! the window a fix older than the vehicle's last applied one changes
//! nothing and is counted `late` (or `duplicate`, when the broker flagged
//! it a redelivery).

use super::Envelope;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The sending side, one sender per lane.
#[derive(Debug, Clone)]
pub struct Intake {
    lanes: Arc<[mpsc::Sender<Envelope>]>,
}

impl Intake {
    /// `lanes` lanes (at least one) of `capacity` messages each.
    pub fn new(lanes: usize, capacity: usize) -> (Self, Vec<mpsc::Receiver<Envelope>>) {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..lanes.max(1))
            .map(|_| mpsc::channel(capacity.max(1)))
            .unzip();
        (
            Self {
                lanes: senders.into(),
            },
            receivers,
        )
    }

    /// The same lane in every run.
    pub fn lane_of(&self, topic: &str) -> usize {
        (crate::stable_hash::fnv1a(topic.as_bytes()) % self.lanes.len() as u64) as usize
    }

    /// Waits for room in the message's lane: a full lane is how intake
    /// pushes back on the source. Gives the message back if the pipeline
    /// has stopped.
    pub async fn send(&self, envelope: Envelope) -> Result<(), Envelope> {
        let lane = self.lane_of(&envelope.topic);
        self.lanes[lane].send(envelope).await.map_err(|e| e.0)
    }

    /// Without waiting: for callers that size the lanes to what they hold.
    pub fn try_send(&self, envelope: Envelope) -> Result<(), Envelope> {
        let lane = self.lane_of(&envelope.topic);
        self.lanes[lane].try_send(envelope).map_err(|e| match e {
            mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(topic: &str, n: u8) -> Envelope {
        Envelope {
            token: None,
            topic: topic.to_owned(),
            payload: bytes::Bytes::from(vec![n]),
            received_at: std::time::Instant::now(),
            redelivered: false,
        }
    }

    #[test]
    fn one_topic_stays_in_one_lane_in_order_and_topics_spread() {
        let (intake, mut lanes) = Intake::new(4, 1000);
        for n in 0..200u8 {
            intake
                .try_send(envelope(&format!("fleet/v{}/telemetry", n % 50), n))
                .unwrap();
        }
        let mut used = 0;
        for (k, lane) in lanes.iter_mut().enumerate() {
            let mut last_of_topic = std::collections::HashMap::new();
            let mut got = 0;
            while let Ok(e) = lane.try_recv() {
                got += 1;
                let n = e.payload[0];
                if let Some(before) = last_of_topic.insert(e.topic.clone(), n) {
                    assert!(before < n, "{}: {before} then {n}", e.topic);
                }
                assert_eq!(intake.lane_of(&e.topic), k, "{} in lane {k}", e.topic);
            }
            used += usize::from(got > 0);
        }
        assert_eq!(used, 4, "50 topics over 4 lanes use them all");
    }

    #[tokio::test]
    async fn a_closed_pipeline_gives_the_message_back() {
        let (intake, lanes) = Intake::new(2, 1);
        drop(lanes);
        let back = intake.send(envelope("t", 7)).await.unwrap_err();
        assert_eq!(back.payload[0], 7);
    }
}
