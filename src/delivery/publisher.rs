//! Committed transitions over MQTT, at least once: each to
//! `geogate/events/{vehicle}` at QoS 1 on a connection of its own, so a
//! broker outage never holds up the events file or the acks.
//!
//! The cursor (the last seq the broker has everything up to) moves only
//! when the broker has acked every publish handed to the client since it
//! last moved; until then the entries stay in `unconfirmed` and in the
//! outbox (with the redis backend: in the events file after the cursor
//! file's seq, see `state::redis::mqtt_cursor`), so a crash sends them
//! again (same `id`). The connection keeps
//! its session, so across a reconnect the client retransmits what was not
//! acked and the count of acks stays whole. A broker that lost the session
//! (a new session after the first) drops those in flight: the publisher
//! then sends every unconfirmed entry again and counts afresh. A publish
//! handed to the client between that new CONNACK and the publisher noticing
//! it is acked twice (its copy too) and can let the count run one ahead;
//! the window is one publisher step long.
//!
//! Waits are bounded by the drain deadline, so a broker that never acks
//! cannot hold up shutdown: what is unconfirmed or unsent then is sent
//! again after the restart.

use super::Cursors;
use super::metrics::EVENTS_PUBLISH_SKIPPED_TOTAL;
use super::outbox::OutboxEntry;
use crate::crash_point;
use crate::model::check_vehicle_id;
use crate::shutdown::Drain;
use rumqttc::{AsyncClient, ClientError, Event, MqttOptions, NetworkOptions, Packet, QoS};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Unconfirmed publishes before the publisher waits for the broker;
/// bounds what a crash makes it send twice.
const UNCONFIRMED_WINDOW: usize = 1000;

/// What the connection's poll task has seen.
#[derive(Debug, Default)]
struct ConnectionEvents {
    acked: AtomicU64,
    /// New sessions after the first: the broker forgot what was in flight.
    sessions_lost: AtomicU64,
}

pub struct Publisher {
    client: AsyncClient,
    connection: Arc<ConnectionEvents>,
    /// Published, not yet confirmed, in seq order.
    unconfirmed: VecDeque<OutboxEntry>,
    /// Publishes handed to the client since the count was last based.
    requested: u64,
    /// `acked` when the count was last based.
    acked_base: u64,
    sessions_lost_seen: u64,
    /// The last seq the broker has, with everything before it.
    confirmed_seq: u64,
    /// The last seq handed to the client (or skipped).
    sent_seq: u64,
    cursors: Arc<Cursors>,
    drain: Drain,
    skipped: metrics::Counter,
    /// Set when an entry could not be sent (past the drain deadline, or the
    /// client stopped): nothing after it is sent either, so `sent_seq`
    /// never passes an entry that was not.
    gave_up: bool,
    /// Dropped when the publisher stops: the committer waits for that.
    _done: std::sync::mpsc::Sender<()>,
}

impl Publisher {
    /// Connects (a kept session: across a reconnect the client sends again
    /// what the broker had not acked) and starts publishing `backlog`, then
    /// what comes through the returned sender, until it is dropped.
    /// `cursors.mqtt`: the last seq the broker had confirmed before this
    /// start.
    pub fn spawn(
        (mut options, network): (MqttOptions, NetworkOptions),
        cursors: Arc<Cursors>,
        drain: Drain,
        done: std::sync::mpsc::Sender<()>,
        backlog: Vec<OutboxEntry>,
    ) -> (JoinHandle<()>, mpsc::UnboundedSender<Vec<OutboxEntry>>) {
        options.set_clean_session(false);
        let (client, mut eventloop) = AsyncClient::new(options, 10_000);
        eventloop.set_network_options(network);
        let events = Arc::new(ConnectionEvents::default());
        tokio::spawn(drive_connection(eventloop, events.clone()));
        let (tx, rx) = mpsc::unbounded_channel();
        let cursor = cursors.mqtt.load(Relaxed);
        let publisher = Self {
            client,
            connection: events,
            unconfirmed: VecDeque::new(),
            requested: 0,
            acked_base: 0,
            sessions_lost_seen: 0,
            confirmed_seq: cursor,
            sent_seq: cursor,
            cursors,
            drain,
            skipped: metrics::counter!(EVENTS_PUBLISH_SKIPPED_TOTAL),
            gave_up: false,
            _done: done,
        };
        (tokio::spawn(publisher.run(backlog, rx)), tx)
    }

    /// Publishes the recovered backlog, then what the relay hands over,
    /// until it hangs up; then waits (until the drain deadline) for acks.
    async fn run(
        mut self,
        backlog: Vec<OutboxEntry>,
        mut rx: mpsc::UnboundedReceiver<Vec<OutboxEntry>>,
    ) {
        self.publish(&backlog).await;
        // A ticker of its own: a sleep made anew each pass would be reset
        // by every batch and, under steady traffic, never fire.
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(entries) => self.publish(&entries).await,
                    None => break,
                },
                _ = tick.tick() => self.confirm().await,
            }
        }
        if !self.wait_confirmed().await {
            tracing::warn!(
                "events over MQTT: {} transition(s) unconfirmed at the drain deadline; sent again after the restart",
                self.unconfirmed.len()
            );
        }
    }

    async fn publish(&mut self, entries: &[OutboxEntry]) {
        // Acks for the last batch have usually come in by now.
        self.confirm().await;
        for e in entries {
            if self.gave_up {
                return;
            }
            if e.seq <= self.sent_seq {
                continue;
            }
            if self.unconfirmed.len() >= UNCONFIRMED_WINDOW && !self.wait_confirmed().await {
                // Past the drain deadline: this and the rest are sent
                // after the restart.
                self.gave_up = true;
                return;
            }
            if let Err(why) = check_vehicle_id(&e.vehicle) {
                // Decode refuses such ids; one can still come from a store
                // written before it did. Not a topic level a broker takes:
                // that one is not published (the events file has it), and
                // the rest go on.
                tracing::warn!(
                    "events over MQTT: transition {} not published: {why}: {:?}",
                    e.seq,
                    e.vehicle
                );
                self.skipped.increment(1);
            } else if self.send(e).await.is_ok() {
                self.unconfirmed.push_back(e.clone());
            } else {
                tracing::warn!("events over MQTT: the client has stopped");
                self.gave_up = true;
                return;
            }
            self.sent_seq = e.seq;
        }
        self.confirm().await;
    }

    async fn send(&mut self, e: &OutboxEntry) -> Result<(), ClientError> {
        // Topic validity is checked by the caller; an error here means the
        // client's event loop is gone.
        let topic = format!("geogate/events/{}", e.vehicle);
        self.client
            .publish(topic, QoS::AtLeastOnce, false, e.line.clone())
            .await?;
        self.requested += 1;
        Ok(())
    }

    /// Waits until every publish is confirmed (true) or the drain deadline
    /// passes (false).
    async fn wait_confirmed(&mut self) -> bool {
        loop {
            self.confirm().await;
            if self.unconfirmed.is_empty() {
                return true;
            }
            if self.drain.passed() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Sends everything unconfirmed again if the broker lost the session;
    /// moves the cursor once the broker has acked every publish.
    async fn confirm(&mut self) {
        let lost = self.connection.sessions_lost.load(Relaxed);
        if lost != self.sessions_lost_seen {
            self.sessions_lost_seen = lost;
            self.acked_base = self.connection.acked.load(Relaxed);
            self.requested = 0;
            tracing::warn!(
                "events over MQTT: the broker lost the session; sending {} unconfirmed transition(s) again",
                self.unconfirmed.len()
            );
            let again: Vec<OutboxEntry> = self.unconfirmed.iter().cloned().collect();
            for e in &again {
                if self.send(e).await.is_err() {
                    break;
                }
            }
        }
        let acked = self
            .connection
            .acked
            .load(Relaxed)
            .saturating_sub(self.acked_base);
        if self.sent_seq > self.confirmed_seq && acked >= self.requested {
            crash_point::reached("relay.before_mqtt_cursor");
            self.unconfirmed.clear();
            self.confirmed_seq = self.sent_seq;
            self.cursors.mqtt.store(self.sent_seq, Relaxed);
        }
    }
}

/// Polls the publisher's connection: counts the broker's PubAcks and the
/// sessions it lost.
async fn drive_connection(mut eventloop: rumqttc::EventLoop, events: Arc<ConnectionEvents>) {
    let mut connected_before = false;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::PubAck(_))) => {
                events.acked.fetch_add(1, Relaxed);
            }
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                if connected_before && !ack.session_present {
                    events.sessions_lost.fetch_add(1, Relaxed);
                }
                connected_before = true;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("events connection: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
