//! Committed transitions over MQTT, at least once: each to
//! `geogate/events/{vehicle}` at QoS 1 on a connection of its own, so a
//! broker outage never holds up the events file or the acks.
//!
//! Entries wait in an [`OutputQueue`]: bounded (a full one pushes back on
//! intake), and past `events.mqtt_max_age_s` written to the dead letter as
//! `mqtt_expired`, so a dead events broker never holds up geofencing for
//! longer, nor grows memory. At most [`UNCONFIRMED_WINDOW`] publishes are
//! handed to the client at a time.
//!
//! The cursor (the last seq the broker has everything up to) moves only
//! when the broker has acked every publish handed to the client since it
//! last moved; until then the entries stay queued and in the outbox, so a
//! crash sends them again (same `id`).
//! When entries in flight expire, the connection is replaced, so that acks
//! for publishes given up on are never counted for later ones. The
//! connection keeps
//! its session, so across a reconnect the client retransmits what was not
//! acked and the count of acks stays whole. A broker that lost the session
//! (a new session after the first) drops those in flight: the publisher
//! then replaces the connection, so that nothing the old client still held
//! is acked into the new count, and sends every unconfirmed entry again on
//! the new one.
//!
//! Waits are bounded by the drain deadline, so a broker that never acks
//! cannot hold up shutdown: what is unconfirmed or unsent then is sent
//! again after the restart.

use super::metrics::{EVENTS_PUBLISH_SKIPPED_TOTAL, OUTPUT_RETRIES_TOTAL, output_labels};
use super::outbox::OutboxEntry;
use super::output_queue::{DeadLetterQueue, OutputFeed, OutputLimits, OutputQueue, Room};
use crate::clock::receive_now_ms;
use crate::crash_point;
use crate::model::check_vehicle_id;
use crate::shutdown::Drain;
use crate::sink::metrics::SINK_HEALTHY;
use rumqttc::{AsyncClient, ClientError, Event, MqttOptions, NetworkOptions, Packet, QoS};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Publishes handed to the client and not yet confirmed, at most: bounds
/// what a crash makes it send twice, and what the client holds while the
/// broker is away.
const UNCONFIRMED_WINDOW: usize = 1000;

/// What the connection's poll task has seen.
#[derive(Debug, Default)]
struct ConnectionEvents {
    acked: AtomicU64,
    /// New sessions after the first: the broker forgot what was in flight.
    sessions_lost: AtomicU64,
    connected: AtomicBool,
}

/// One client and the task that polls it; dropped, the connection closes
/// and whatever the client still held is gone.
struct Connection {
    client: AsyncClient,
    events: Arc<ConnectionEvents>,
    task: JoinHandle<()>,
}

impl Connection {
    fn open((options, network): &(MqttOptions, NetworkOptions), healthy: &metrics::Gauge) -> Self {
        let mut options = options.clone();
        options.set_clean_session(false);
        // Never more queued than the window: a publish never waits here.
        let (client, mut eventloop) = AsyncClient::new(options, UNCONFIRMED_WINDOW + 16);
        eventloop.set_network_options(network.clone());
        let events = Arc::new(ConnectionEvents::default());
        healthy.set(0.0);
        let task = tokio::spawn(drive_connection(eventloop, events.clone(), healthy.clone()));
        Self {
            client,
            events,
            task,
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct Publisher {
    options: (MqttOptions, NetworkOptions),
    connection: Connection,
    queue: OutputQueue,
    /// Publishes handed to the client since the count was last based.
    requested: u64,
    /// `acked` when the count was last based.
    acked_base: u64,
    sessions_lost_seen: u64,
    drain: Drain,
    healthy: metrics::Gauge,
    skipped: metrics::Counter,
    resent: metrics::Counter,
    /// Dropped when the publisher stops: the committer waits for that.
    _done: std::sync::mpsc::Sender<()>,
}

impl Publisher {
    /// Connects (a kept session: across a reconnect the client sends again
    /// what the broker had not acked) and publishes what comes through the
    /// returned feed, until it is dropped. `cursor`: the last seq the
    /// broker had confirmed before this start; moved as it confirms more.
    pub fn spawn(
        options: (MqttOptions, NetworkOptions),
        limits: OutputLimits,
        partition: Option<u32>,
        cursor: Arc<AtomicU64>,
        drain: Drain,
        done: std::sync::mpsc::Sender<()>,
        dead_letter: Option<DeadLetterQueue>,
    ) -> (JoinHandle<()>, OutputFeed) {
        let room = Room::new(limits.max_pending);
        let (feed, rx) = OutputFeed::new(room.clone());
        let healthy = metrics::gauge!(SINK_HEALTHY, &output_labels("sink", "mqtt", partition));
        let publisher = Self {
            connection: Connection::open(&options, &healthy),
            options,
            queue: OutputQueue::new("mqtt", partition, cursor, room, limits.max_age, dead_letter),
            requested: 0,
            acked_base: 0,
            sessions_lost_seen: 0,
            drain,
            healthy,
            skipped: metrics::counter!(EVENTS_PUBLISH_SKIPPED_TOTAL),
            resent: metrics::counter!(
                OUTPUT_RETRIES_TOTAL,
                &output_labels("output", "mqtt", partition)
            ),
            _done: done,
        };
        (tokio::spawn(publisher.run(rx)), feed)
    }

    /// Publishes what the relay hands over until it hangs up; then what is
    /// left, waiting (until the drain deadline) for acks.
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Vec<OutboxEntry>>) {
        // A ticker of its own: a sleep made anew each pass would be reset
        // by every batch and, under steady traffic, never fire.
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(entries) => self.queue.push(entries),
                    None => break,
                },
                _ = tick.tick() => {}
            }
            self.step().await;
        }
        while !self.queue.is_empty() {
            if self.drain.passed() {
                tracing::warn!(
                    "events over MQTT: {} transition(s) unconfirmed at the drain deadline; sent again after the restart",
                    self.queue.len()
                );
                return;
            }
            self.step().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Confirms what the broker acked, sends what the window has room for,
    /// and gives up on what is past the maximum age.
    async fn step(&mut self) {
        self.confirm();
        if self.send().await.is_err() {
            // The client's event loop is gone (it never ends on its own):
            // a new connection takes over what was in flight.
            tracing::warn!("events over MQTT: the client stopped; connecting anew");
            self.reconnect();
        }
        let now = receive_now_ms();
        if self.queue.has_expired(now) {
            let why = format!(
                "the events broker did not confirm it ({} in flight, connection {})",
                self.queue.in_flight(),
                if self.connection.events.connected.load(Relaxed) {
                    "up"
                } else {
                    "down"
                }
            );
            if let Some(in_flight) = self.queue.expire(now, &why).await
                && in_flight > 0
            {
                // The client may still hold some of them and would count
                // their acks: a new connection starts the count afresh,
                // and what stays in flight is sent again on it.
                self.reconnect();
            }
        }
    }

    fn reconnect(&mut self) {
        self.connection = Connection::open(&self.options, &self.healthy);
        self.requested = 0;
        self.acked_base = 0;
        self.sessions_lost_seen = 0;
        self.queue.unsend_all();
    }

    /// Hands the client what the window has room for, in seq order. An
    /// entry whose vehicle id is not a topic level a broker takes is not
    /// published (the events file has it); the rest go on.
    async fn send(&mut self) -> Result<(), ClientError> {
        while self.queue.in_flight() < UNCONFIRMED_WINDOW {
            let Some(e) = self.queue.next_unsent() else {
                break;
            };
            if let Err(why) = check_vehicle_id(&e.vehicle) {
                // Decode refuses such ids; one can still come from a store
                // written before it did.
                tracing::warn!(
                    "events over MQTT: transition {} not published: {why}: {:?}",
                    e.seq,
                    e.vehicle
                );
                self.skipped.increment(1);
            } else {
                let topic = format!("geogate/events/{}", e.vehicle);
                let line = e.line.clone();
                self.connection
                    .client
                    .publish(topic, QoS::AtLeastOnce, false, line)
                    .await?;
                self.requested += 1;
            }
            self.queue.mark_sent(1);
        }
        Ok(())
    }

    /// Sends everything in flight again if the broker lost the session;
    /// moves the cursor once the broker has acked every publish.
    fn confirm(&mut self) {
        let events = &self.connection.events;
        if events.sessions_lost.load(Relaxed) != self.sessions_lost_seen {
            // What the client held across the reconnect went out on the
            // new session too: a new connection starts the count afresh,
            // and everything unconfirmed is sent again on it.
            tracing::warn!(
                "events over MQTT: the broker lost the session; sending {} unconfirmed transition(s) again",
                self.queue.in_flight()
            );
            self.resent.increment(self.queue.in_flight() as u64);
            self.reconnect();
            return;
        }
        let acked = events.acked.load(Relaxed).saturating_sub(self.acked_base);
        if self.queue.in_flight() > 0 && acked >= self.requested {
            crash_point::reached("relay.before_mqtt_cursor");
            self.queue.confirm_in_flight();
            self.acked_base += self.requested;
            self.requested = 0;
        }
    }
}

/// Polls the publisher's connection: counts the broker's PubAcks and the
/// sessions it lost, and shows whether it is connected.
async fn drive_connection(
    mut eventloop: rumqttc::EventLoop,
    events: Arc<ConnectionEvents>,
    healthy: metrics::Gauge,
) {
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
                events.connected.store(true, Relaxed);
                healthy.set(1.0);
            }
            Ok(_) => {}
            Err(e) => {
                events.connected.store(false, Relaxed);
                healthy.set(0.0);
                tracing::warn!("events connection: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
