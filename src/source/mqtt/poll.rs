//! The poll task: drives the intake connection, hands publishes to the
//! pipeline, and keeps the session subscribed.
//!
//! **A poll is never cut short.** `EventLoop::poll` performs the whole
//! connect (TCP, TLS, CONNECT/CONNACK) as well as the reads and writes, and
//! it is not cancel-safe: a connect cancelled half-way starts again from
//! zero (a broker more than ~100 ms away was never reached when a periodic
//! timeout wrapped it), and a write cancelled half-way loses the request.
//! So one poll future is pinned and driven to completion while the task
//! reacts, beside it, to shutdown and to the subscription timer. A connect
//! is bounded only by `mqtt.connect_timeout_s`; a failed one is logged with
//! the broker's address and retried after a jittered backoff (100 ms
//! doubling to 10 s, ±50%).
//!
//! **Connections are numbered.** Each CONNACK starts a new
//! [`ConnectionId`], published in [`LiveConnection`] for the acker. When a
//! connection fails the task marks it dead under that lock and then purges
//! the client's request queue of acks (`EventLoop::clean` drops queued
//! PubAcks), so nothing acks a dead connection's packet ids on the next.
//! Publishes rumqttc had already read when the read failed stay in its
//! event queue and would come out after the next CONNACK; the task takes
//! them at the failure instead, as the dead connection's (found by the
//! wire observer in `tests/mqtt_session.rs`: acks of old ids on a new
//! session).
//!
//! **Subscribing is confirmed.** After every CONNACK (a kept session can
//! still have lost its subscriptions) the task sends one SUBSCRIBE for all
//! filters and waits for its SUBACK. A SUBSCRIBE that cannot be queued (the
//! request queue is full of acks after an outage), a SUBACK that does not
//! come within [`SUBACK_WAIT`], and a refused filter are all logged and
//! retried; `geogate_mqtt_subscribed` is 1 only while every filter is
//! confirmed.

use super::acker::{ConnectionId, LiveConnection, Registration};
use crate::backoff::Backoff;
use crate::source::intake::Intake;
use crate::source::mqtt::metrics::{
    MQTT_CONNECTED, MQTT_LEFT_FOR_REDELIVERY_TOTAL, MQTT_RECONNECTS_TOTAL, MQTT_SUBSCRIBED,
};
use crate::source::{AckToken, Envelope};
use rumqttc::{AsyncClient, Event, EventLoop, Outgoing, Packet, QoS, SubscribeFilter};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How long a SUBSCRIBE may wait for its SUBACK before it is sent again.
pub const SUBACK_WAIT: Duration = Duration::from_secs(10);
/// Wait before re-queueing a SUBSCRIBE the client's queue had no room for.
const SUBSCRIBE_REQUEUE: Duration = Duration::from_millis(200);
/// Wait before asking again for filters the broker refused.
const REFUSED_RETRY: Duration = Duration::from_secs(10);
/// Longest the task lingers after shutdown to put the last acks and the
/// DISCONNECT on the wire.
const DISCONNECT_GRACE: Duration = Duration::from_secs(2);

/// Where shutdown has got to, as the poll task needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Taking messages.
    Open,
    /// Later publishes are left unacked for redelivery; the pipeline drains.
    Closing,
    /// Every ack has been handed to the client: disconnect and stop.
    AcksFlushed,
}

/// The shutdown switch the pipeline holds and the poll task watches.
#[derive(Debug)]
pub struct IntakeControl(watch::Sender<Phase>);

impl Default for IntakeControl {
    fn default() -> Self {
        Self(watch::channel(Phase::Open).0)
    }
}

impl IntakeControl {
    pub fn close(&self) {
        self.0.send_replace(Phase::Closing);
    }

    pub fn acks_flushed(&self) {
        self.0.send_replace(Phase::AcksFlushed);
    }

    pub fn watch(&self) -> watch::Receiver<Phase> {
        self.0.subscribe()
    }
}

/// Everything the poll task owns.
pub struct PollTask {
    pub client: AsyncClient,
    pub eventloop: EventLoop,
    pub filters: Vec<SubscribeFilter>,
    /// `host:port`, named in every connect log line.
    pub broker: String,
    pub intake: Intake,
    pub registrations: mpsc::UnboundedSender<Registration>,
    pub live: Arc<LiveConnection>,
    pub phase: watch::Receiver<Phase>,
    /// True while every filter is confirmed, for in-process publishers
    /// (the demo) that must not publish before the broker routes to us.
    pub subscribed: watch::Sender<bool>,
}

/// Where the subscription of the current connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subscription {
    /// No connection.
    Idle,
    /// To be sent at this instant.
    Wanted(Instant),
    /// Sent (its packet id once the client reports it); the SUBACK is due
    /// by `due`.
    Sent {
        pkid: Option<u16>,
        due: Instant,
    },
    Confirmed,
}

impl Subscription {
    fn timer(&self) -> Option<Instant> {
        match *self {
            Subscription::Wanted(at) => Some(at),
            Subscription::Sent { due, .. } => Some(due),
            _ => None,
        }
    }
}

/// Hands publishes to the pipeline and registers them with the acker.
struct Handoff {
    intake: Option<Intake>,
    registrations: Option<mpsc::UnboundedSender<Registration>>,
    next_token: u64,
    left_for_redelivery: metrics::Counter,
}

impl Handoff {
    /// Shutdown: later publishes are left unacked for redelivery, and
    /// dropping both senders lets the router drain and the acker finish.
    fn close(&mut self) {
        self.intake = None;
        self.registrations = None;
    }

    /// Takes one publish that arrived on `connection`.
    async fn publish(&mut self, mut publish: rumqttc::Publish, connection: ConnectionId) {
        let (Some(tx), Some(registrations)) = (&self.intake, &self.registrations) else {
            self.left_for_redelivery.increment(1);
            return;
        };
        let token = (publish.qos != QoS::AtMostOnce).then(|| {
            self.next_token += 1;
            AckToken(self.next_token)
        });
        let item = Envelope {
            token,
            topic: std::mem::take(&mut publish.topic),
            payload: std::mem::take(&mut publish.payload),
            received_at: std::time::Instant::now(),
            redelivered: publish.dup,
        };
        if let Some(token) = token {
            let _ = registrations.send(Registration {
                token,
                connection,
                publish,
            });
        }
        if tx.send(item).await.is_err() {
            // The router is gone: never received, never acked.
            self.left_for_redelivery.increment(1);
            tracing::warn!("intake closed while a message was in hand; left for redelivery");
        }
    }
}

/// What a poll came back with, or why the wait for it ended early.
enum Wake {
    Polled(Result<Event, rumqttc::ConnectionError>),
    /// The disconnect grace ran out: leave without the last poll.
    GraceOver,
}

/// `geogate_mqtt_subscribed` for operators, and the same fact for callers
/// in this process.
struct SubscribedFlag {
    gauge: metrics::Gauge,
    watch: watch::Sender<bool>,
}

impl SubscribedFlag {
    fn set(&self, confirmed: bool) {
        self.gauge.set(if confirmed { 1.0 } else { 0.0 });
        self.watch.send_replace(confirmed);
    }
}

/// Drives the connection until shutdown has flushed every ack.
pub async fn poll_loop(task: PollTask) {
    let PollTask {
        client,
        mut eventloop,
        filters,
        broker,
        intake,
        registrations,
        live,
        mut phase,
        subscribed,
    } = task;
    // However the task ends, no connection is live for the acker after it.
    let _dead_when_gone = MarkDeadOnDrop(live.clone());
    let mut handoff = Handoff {
        intake: Some(intake),
        registrations: Some(registrations),
        next_token: 0,
        left_for_redelivery: metrics::counter!(MQTT_LEFT_FOR_REDELIVERY_TOTAL),
    };
    let mut backoff = Backoff::new();
    let mut connection: ConnectionId = 0;
    let mut connected = false;
    let mut subscription = Subscription::Idle;
    let mut requeue_failures = 0u64;
    let mut leaving_by: Option<Instant> = None;
    // Metric handles resolved once, not per message.
    let subscribed = SubscribedFlag {
        gauge: metrics::gauge!(MQTT_SUBSCRIBED),
        watch: subscribed,
    };
    let connected_gauge = metrics::gauge!(MQTT_CONNECTED);
    loop {
        // Shutdown: stop taking messages, then leave once acks are flushed.
        let now_phase = *phase.borrow_and_update();
        if now_phase != Phase::Open {
            handoff.close();
        }
        if now_phase == Phase::AcksFlushed {
            start_leaving(&client, &mut leaving_by);
        }
        let wake = {
            let poll = eventloop.poll();
            tokio::pin!(poll);
            loop {
                let timer = subscription.timer();
                tokio::select! {
                    event = &mut poll => break Wake::Polled(event),
                    changed = phase.changed(), if leaving_by.is_none() => {
                        if changed.is_err() || *phase.borrow() == Phase::AcksFlushed {
                            start_leaving(&client, &mut leaving_by);
                        }
                        if *phase.borrow() != Phase::Open {
                            handoff.close();
                        }
                    }
                    _ = sleep_until_some(leaving_by) => break Wake::GraceOver,
                    _ = sleep_until_some(timer), if timer.is_some() => {
                        subscription = subscribe_step(subscription, &client, &filters, &mut requeue_failures);
                    }
                }
            }
        };
        let event = match wake {
            Wake::GraceOver => return,
            Wake::Polled(event) => event,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                connection += 1;
                *live.lock() = Some(connection);
                connected = true;
                backoff.reset();
                connected_gauge.set(1.0);
                tracing::info!(
                    broker = %broker,
                    connection,
                    session_present = ack.session_present,
                    "connected to broker"
                );
                subscribed.set(false);
                requeue_failures = 0;
                if leaving_by.is_none() {
                    subscription = subscribe_step(
                        Subscription::Wanted(Instant::now()),
                        &client,
                        &filters,
                        &mut requeue_failures,
                    );
                }
            }
            Ok(Event::Outgoing(Outgoing::Subscribe(pkid))) => {
                if let Subscription::Sent { pkid: None, due } = subscription {
                    subscription = Subscription::Sent {
                        pkid: Some(pkid),
                        due,
                    };
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                let ours = matches!(subscription, Subscription::Sent { pkid, .. } if pkid.is_none_or(|p| p == ack.pkid));
                if !ours {
                    continue;
                }
                // A filter is confirmed only at the QoS asked for: a QoS 0
                // grant for a QoS 1 filter would silently turn off acks and
                // redelivery. A SUBACK with too few codes confirms nothing
                // it leaves out.
                let refused: Vec<&str> = filters
                    .iter()
                    .enumerate()
                    .filter(|(i, f)| {
                        !matches!(ack.return_codes.get(*i),
                            Some(rumqttc::SubscribeReasonCode::Success(granted)) if *granted as u8 >= f.qos as u8)
                    })
                    .map(|(_, f)| f.path.as_str())
                    .collect();
                if refused.is_empty() {
                    subscription = Subscription::Confirmed;
                    subscribed.set(true);
                    let topics: Vec<&str> = filters.iter().map(|f| f.path.as_str()).collect();
                    tracing::info!(connection, "subscribed to {topics:?}");
                } else {
                    subscribed.set(false);
                    tracing::error!(
                        "the broker at {broker} refused the subscription to {refused:?} (or granted a lower QoS): check its ACL for mqtt.topics; asking again in {REFUSED_RETRY:?}"
                    );
                    subscription = Subscription::Wanted(Instant::now() + REFUSED_RETRY);
                }
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                handoff.publish(publish, connection).await;
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) if leaving_by.is_some() => return,
            Ok(_) => {}
            Err(e) => {
                if leaving_by.is_some() {
                    return;
                }
                // Dead for the acker first, then purge the acks it queued.
                *live.lock() = None;
                eventloop.clean();
                // A read can fail after it has already queued packets that
                // came before the failure; rumqttc would hand them out after
                // the next CONNACK, as if they came on the new connection.
                // They belong to this one.
                let buffered: Vec<Event> = eventloop.state.events.drain(..).collect();
                for event in buffered {
                    if let Event::Incoming(Packet::Publish(publish)) = event {
                        handoff.publish(publish, connection).await;
                    }
                }
                connected_gauge.set(0.0);
                subscribed.set(false);
                subscription = Subscription::Idle;
                metrics::counter!(MQTT_RECONNECTS_TOTAL).increment(1);
                let wait = backoff.step();
                let what = if connected {
                    format!("connection {connection} to {broker} lost")
                } else {
                    format!("cannot connect to {broker}")
                };
                connected = false;
                match super::explain(&e) {
                    Some(hint) => tracing::error!("{what}: {e}; {hint}; retrying in {wait:?}"),
                    None => tracing::warn!("{what}: {e}; retrying in {wait:?}"),
                }
                // Sleep the backoff, but leave at once if shutdown finishes.
                let until = Instant::now() + wait;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => break,
                        changed = phase.changed() => {
                            if changed.is_err() || *phase.borrow() == Phase::AcksFlushed {
                                return;
                            }
                            // Closing while the broker is away: let the
                            // router and the acker finish now.
                            handoff.close();
                        }
                    }
                }
            }
        }
    }
}

/// Queues a DISCONNECT (behind every ack, so the acks go out first) and
/// sets how long to wait for it, once.
fn start_leaving(client: &AsyncClient, leaving_by: &mut Option<Instant>) {
    if leaving_by.is_none() {
        let _ = client.try_disconnect();
        *leaving_by = Some(Instant::now() + DISCONNECT_GRACE);
    }
}

/// Clears [`LiveConnection`] when the poll task ends, so an acker waiting
/// for room in a queue nobody drains any more gives up.
struct MarkDeadOnDrop(Arc<LiveConnection>);

impl Drop for MarkDeadOnDrop {
    fn drop(&mut self) {
        *self.0.lock() = None;
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends the SUBSCRIBE that is due, or gives up on a SUBACK that is late.
fn subscribe_step(
    state: Subscription,
    client: &AsyncClient,
    filters: &[SubscribeFilter],
    requeue_failures: &mut u64,
) -> Subscription {
    let now = Instant::now();
    match state {
        Subscription::Wanted(_) => match client.try_subscribe_many(filters.iter().cloned()) {
            Ok(()) => Subscription::Sent {
                pkid: None,
                due: now + SUBACK_WAIT,
            },
            Err(e) => {
                *requeue_failures += 1;
                // The first failure and then one in 25 (every ~5 s).
                if *requeue_failures % 25 == 1 {
                    tracing::warn!(
                        "subscription not sent yet ({e}: the client's request queue is full); retrying every {SUBSCRIBE_REQUEUE:?}"
                    );
                }
                Subscription::Wanted(now + SUBSCRIBE_REQUEUE)
            }
        },
        Subscription::Sent { .. } => {
            tracing::warn!("no SUBACK within {SUBACK_WAIT:?}; subscribing again");
            subscribe_step(Subscription::Wanted(now), client, filters, requeue_failures)
        }
        other => other,
    }
}
