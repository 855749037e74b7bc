//! Transitions from the shared outbox over MQTT, at least once, each to
//! `geogate/events/{vehicle}` at QoS 1 with its stable `id`.
//!
//! The outbox consumer hands over each batch after writing it to the events
//! file and before `XACK`, and waits here until the broker has acked every
//! publish of the batch. A crash anywhere before that leaves the entries
//! pending in Redis for this consumer (or for a live one, by claim), and
//! they are published again, with the same `id`: at least once, never
//! lost. A broker that lost the session drops what was in flight, so the
//! batch is sent again whole.
//!
//! While the broker is away the batch waits, and the next entries wait in
//! the outbox stream (in Redis, not in memory); the intake rides on the
//! same broker and stops too.

use crate::state::publisher::{ConnectionEvents, drive_connection};
use rumqttc::{AsyncClient, MqttOptions, NetworkOptions, QoS};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A line to publish and the vehicle whose topic it goes to.
pub struct Copy {
    pub vehicle: String,
    pub line: Vec<u8>,
}

pub struct MqttCopy {
    client: AsyncClient,
    connection: Arc<ConnectionEvents>,
    /// `acked` when the count was last based.
    acked_base: u64,
    sessions_lost_seen: u64,
    skipped: metrics::Counter,
}

impl MqttCopy {
    /// Connects with a kept session, so that across a reconnect the client
    /// retransmits what the broker had not acked.
    pub fn connect(mut options: MqttOptions, network: NetworkOptions) -> Self {
        options.set_clean_session(false);
        let (client, mut eventloop) = AsyncClient::new(options, 10_000);
        eventloop.set_network_options(network);
        let connection = Arc::new(ConnectionEvents::default());
        tokio::spawn(drive_connection(eventloop, connection.clone()));
        Self {
            client,
            connection,
            acked_base: 0,
            sessions_lost_seen: 0,
            skipped: metrics::counter!("geogate_events_publish_skipped_total"),
        }
    }

    /// Publishes `batch` and waits until the broker has acked all of it.
    /// An error (the drain deadline passed, the client stopped) leaves the
    /// batch to be sent again from the outbox.
    pub async fn publish_confirmed(
        &mut self,
        batch: &[Copy],
        deadline: &watch::Receiver<Option<Instant>>,
    ) -> Result<(), String> {
        let batch: Vec<&Copy> = batch
            .iter()
            .filter(|copy| {
                // Not a valid topic level; the events file has it.
                let wild = copy.vehicle.contains(['+', '#']);
                if wild {
                    tracing::warn!(
                        "events over MQTT: a transition of vehicle {:?} not published: its id holds an MQTT wildcard",
                        copy.vehicle
                    );
                    self.skipped.increment(1);
                }
                !wild
            })
            .collect();
        self.acked_base = self.connection.acked();
        self.sessions_lost_seen = self.connection.sessions_lost();
        let mut requested = self.send(&batch).await?;
        loop {
            let lost = self.connection.sessions_lost();
            if lost != self.sessions_lost_seen {
                tracing::warn!(
                    "events over MQTT: the broker lost the session; sending {} transition(s) again",
                    batch.len()
                );
                self.sessions_lost_seen = lost;
                self.acked_base = self.connection.acked();
                requested = self.send(&batch).await?;
            }
            // Acks are counted, not matched: a duplicate ack from before a
            // session loss can count for this batch (see `publisher`).
            if self.connection.acked().saturating_sub(self.acked_base) >= requested {
                return Ok(());
            }
            if deadline.borrow().is_some_and(|d| Instant::now() >= d) {
                return Err(format!(
                    "events over MQTT: {} transition(s) unconfirmed at the drain deadline; sent again after the restart",
                    batch.len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Hands `batch` to the client; returns how many publishes it made.
    async fn send(&mut self, batch: &[&Copy]) -> Result<u64, String> {
        for copy in batch {
            self.client
                .publish(
                    format!("geogate/events/{}", copy.vehicle),
                    QoS::AtLeastOnce,
                    false,
                    copy.line.clone(),
                )
                .await
                .map_err(|e| format!("events over MQTT: the client has stopped: {e}"))?;
        }
        Ok(batch.len() as u64)
    }
}
