//! MQTT intake (rumqttc) with at-least-once delivery end to end.
//!
//! **Acks.** The session is persistent (`clean_session = false`, a stable
//! client id) and acks are manual. Every QoS 1 message gets a sequence
//! number and is registered with the [`Acker`] before it enters the
//! pipeline; a message is *done* once it is evaluated, or durably written to
//! the dead letter. The acker acks the done prefix in receive order, so a
//! crash leaves exactly the unfinished messages unacked, and the broker
//! redelivers them.
//!
//! **Backpressure without deadlock.** The poll task is the only task that
//! drives the connection, so it must never wait on something that waits on
//! it. It forwards each publish into a bounded intake channel; when that is
//! full it waits, which stops reading the socket, so TCP and the broker's
//! inflight window (unacked messages) push back on the publishers. Nothing
//! downstream of intake needs the poll task to make progress: workers finish
//! without it, and acks queue in the client's request channel (sized to hold
//! `max_unacked` of them) until polling resumes. Outgoing transitions use a
//! separate connection for the same reason.
//!
//! **Reconnects.** rumqttc reconnects on the next poll after an error; the
//! poll task sleeps a jittered exponential backoff (100 ms doubling to 10 s,
//! ±50%) first, and subscribes again after every connect.

use crate::accounting::Accounting;
use crate::config::MqttConfig;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, Publish, QoS};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// A received message on its way through the pipeline.
#[derive(Debug)]
pub struct Intake {
    /// Receive-order sequence number; `None` for QoS 0 (nothing to ack).
    pub seq: Option<u64>,
    pub topic: String,
    pub payload: bytes::Bytes,
    /// Monotonic receive time, for end-to-end latency.
    pub received_at: std::time::Instant,
}

/// Messages to the acker.
#[derive(Debug)]
pub enum AckMsg {
    /// The publish with its topic and payload moved out (an ack needs only
    /// its packet id and QoS), so no copy is made per message.
    Register(u64, Publish),
    Done(u64),
}

/// Connection settings shared by the intake and output connections: host,
/// keep-alive, packet cap, credentials and TLS.
pub fn connection(config: &MqttConfig, client_id: &str) -> std::io::Result<MqttOptions> {
    let mut options = MqttOptions::new(client_id, &config.host, config.port);
    options
        .set_keep_alive(Duration::from_secs(config.keep_alive_s.max(5)))
        .set_max_packet_size(config.max_packet_bytes, config.max_packet_bytes);
    if let Some(user) = &config.username {
        options.set_credentials(user, config.password.clone().unwrap_or_default());
    }
    if let Some(tls) = &config.tls {
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        };
        let client_auth = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        options.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Simple {
                ca: read(&tls.ca_file)?,
                alpn: None,
                client_auth,
            },
        ));
    }
    Ok(options)
}

/// The subscription filters for `mqtt.topics` at `mqtt.subscribe_qos`
/// (validated to 0 or 1).
pub fn subscribe_filters(mqtt: &MqttConfig) -> Vec<rumqttc::SubscribeFilter> {
    let qos = if mqtt.subscribe_qos == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    };
    mqtt.topics
        .iter()
        .map(|t| rumqttc::SubscribeFilter::new(t.clone(), qos))
        .collect()
}

/// Intake options: persistent session, manual acks, inflight window.
pub fn options(config: &MqttConfig, client_id: &str) -> std::io::Result<MqttOptions> {
    let mut options = connection(config, client_id)?;
    options
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_inflight(u16::try_from(config.max_unacked.min(u16::MAX as usize)).unwrap_or(u16::MAX));
    Ok(options)
}

/// Says what an operator should check for the errors that need a human.
fn explain(e: &rumqttc::ConnectionError) -> Option<&'static str> {
    match e {
        rumqttc::ConnectionError::ConnectionRefused(_) => Some(
            "the broker refused the connection: check mqtt.username / mqtt.password and the broker's ACL",
        ),
        rumqttc::ConnectionError::Tls(_) => Some(
            "TLS failed: check mqtt.tls.ca_file signs the broker's certificate, its name matches mqtt.host, and any client certificate",
        ),
        _ => None,
    }
}

/// Jittered exponential backoff.
struct Backoff {
    next: Duration,
    seed: u64,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(10);

    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Self {
            next: Self::MIN,
            seed,
        }
    }

    fn reset(&mut self) {
        self.next = Self::MIN;
    }

    fn step(&mut self) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = 0.5 + (self.seed % 1000) as f64 / 1000.0;
        let wait = self.next.mul_f64(jitter);
        self.next = (self.next * 2).min(Self::MAX);
        wait
    }
}

/// Shared switches between the pipeline and the poll task.
#[derive(Debug, Default)]
pub struct IntakeControl {
    /// Cleared at shutdown: later publishes are left unacked for redelivery.
    pub open: AtomicBool,
    /// Set once every ack has been handed to the client: the poll task may
    /// disconnect.
    pub acks_flushed: AtomicBool,
}

/// Drives the connection until shutdown has flushed every ack.
pub async fn poll_loop(
    client: AsyncClient,
    mut eventloop: EventLoop,
    filters: Vec<rumqttc::SubscribeFilter>,
    intake: mpsc::Sender<Intake>,
    acker: mpsc::UnboundedSender<AckMsg>,
    control: Arc<IntakeControl>,
    accounting: Arc<Accounting>,
) {
    let mut intake = Some(intake);
    let mut acker = Some(acker);
    let mut backoff = Backoff::new();
    let mut seq = 0u64;
    // Metric handles resolved once, not per message.
    let received = metrics::counter!("geogate_events_received_total");
    let left_for_redelivery = metrics::counter!("geogate_mqtt_left_for_redelivery_total");
    loop {
        if !control.open.load(Ordering::Acquire) {
            // Closing both lets the router drain and the acker finish.
            intake = None;
            acker = None;
            if control.acks_flushed.load(Ordering::Acquire) {
                // Give the last acks a moment on the wire, then leave.
                let _ = tokio::time::timeout(Duration::from_millis(300), async {
                    loop {
                        if eventloop.poll().await.is_err() {
                            break;
                        }
                    }
                })
                .await;
                let _ = client.try_disconnect();
                let _ = tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await;
                return;
            }
        }
        let event = match tokio::time::timeout(Duration::from_millis(100), eventloop.poll()).await {
            Err(_) => continue, // idle: re-check the shutdown switches
            Ok(event) => event,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                backoff.reset();
                metrics::gauge!("geogate_mqtt_connected").set(1.0);
                tracing::info!(session_present = ack.session_present, "connected to broker");
                // Subscribe on every connect, not only when the broker says
                // it has no session: re-subscribing an existing filter is
                // harmless, and some brokers report a session whose
                // subscriptions are gone (seen with mosquitto behind TLS).
                // One SUBSCRIBE for all filters, so one SubAck confirms them all.
                if let Err(e) = client.try_subscribe_many(filters.iter().cloned()) {
                    tracing::error!("subscribe {filters:?}: {e}");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                let refused = ack
                    .return_codes
                    .iter()
                    .filter(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                    .count();
                if refused > 0 {
                    tracing::error!(
                        "the broker refused {refused} subscription(s): check the broker's ACL for mqtt.topics"
                    );
                } else {
                    tracing::info!("subscribed");
                }
            }
            Ok(Event::Incoming(Packet::Publish(mut publish))) => {
                let Some(tx) = intake
                    .as_ref()
                    .filter(|_| control.open.load(Ordering::Acquire))
                else {
                    left_for_redelivery.increment(1);
                    continue;
                };
                accounting.received();
                received.increment(1);
                let seq = (publish.qos != QoS::AtMostOnce).then(|| {
                    seq += 1;
                    seq
                });
                let item = Intake {
                    seq,
                    topic: std::mem::take(&mut publish.topic),
                    payload: std::mem::take(&mut publish.payload),
                    received_at: std::time::Instant::now(),
                };
                if let (Some(seq), Some(acker)) = (seq, &acker) {
                    let _ = acker.send(AckMsg::Register(seq, publish));
                }
                if tx.send(item).await.is_err() {
                    tracing::warn!("intake closed while a message was in hand");
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics::gauge!("geogate_mqtt_connected").set(0.0);
                metrics::counter!("geogate_mqtt_reconnects_total").increment(1);
                let wait = backoff.step();
                match explain(&e) {
                    Some(hint) => {
                        tracing::error!("mqtt connection error: {e}; {hint}; retrying in {wait:?}")
                    }
                    None => tracing::warn!("mqtt connection error: {e}; retrying in {wait:?}"),
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Acks finished QoS 1 messages in receive order.
pub async fn acker(
    client: AsyncClient,
    mut rx: mpsc::UnboundedReceiver<AckMsg>,
    control: Arc<IntakeControl>,
) {
    // Registered, not yet acked, in receive order: (seq, publish, done).
    let mut pending: VecDeque<(u64, Publish, bool)> = VecDeque::new();
    let unacked = metrics::gauge!("geogate_mqtt_unacked");
    while let Some(msg) = rx.recv().await {
        match msg {
            AckMsg::Register(seq, publish) => pending.push_back((seq, publish, false)),
            AckMsg::Done(seq) => {
                if let Ok(i) = pending.binary_search_by_key(&seq, |(s, _, _)| *s) {
                    pending[i].2 = true;
                }
                while pending.front().is_some_and(|(_, _, done)| *done) {
                    if let Some((_, publish, _)) = pending.pop_front()
                        && let Err(e) = client.ack(&publish).await
                    {
                        tracing::warn!("ack failed (the broker will redeliver): {e}");
                    }
                }
            }
        }
        unacked.set(pending.len() as f64);
    }
    control.acks_flushed.store(true, Ordering::Release);
}
