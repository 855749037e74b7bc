//! Acks finished QoS 1 messages: in receive order, only on the connection
//! each one arrived on, and at most once per packet id per connection.
//!
//! Why the connection matters: a packet id means something only on the
//! connection that carried it. After a reconnect the broker either resumes
//! the session and redelivers what was unacked (with the same ids), or
//! starts a new session whose ids begin again at 1. Acking a message from
//! the old connection on the new one is then a *stale* ack: with a kept
//! session it acks the redelivered copy a second time; with a new session
//! it acks a different, newer message before it was evaluated. mosquitto
//! 2.0.11 (Debian 12) also frees an inflight slot for an ack of an id it no
//! longer holds, and can then send newer messages ahead of queued older
//! ones. So a message from an older connection is never acked: with a kept
//! session its redelivered copy is acked instead (it is registered later,
//! so it is acked only after the original is finished), and with a new
//! session there is nothing left to ack.
//!
//! The ack is handed to the client while [`LiveConnection`]'s lock is held,
//! and the poll task takes that lock to mark a connection dead before it
//! purges unsent acks from the client's queue, so no ack of a dead
//! connection can slip through to the next one.

use crate::source::AckToken;
use crate::source::mqtt::metrics::{MQTT_ACKS_TOTAL, MQTT_UNACKED};
use rumqttc::{AsyncClient, ClientError, Publish};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// Numbers the intake connections of one process, from 1.
pub type ConnectionId = u64;

/// The connection that is up now, if any.
#[derive(Debug, Default)]
pub struct LiveConnection(Mutex<Option<ConnectionId>>);

impl LiveConnection {
    pub fn lock(&self) -> MutexGuard<'_, Option<ConnectionId>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A received QoS 1 message the acker must answer for.
#[derive(Debug)]
pub struct Registration {
    pub token: AckToken,
    pub connection: ConnectionId,
    /// The publish with its topic and payload moved out: an ack needs only
    /// the packet id and QoS, so no copy is made per message.
    pub publish: Publish,
}

struct Pending {
    registration: Registration,
    done: bool,
    /// A later copy with the same (connection, packet id) is registered:
    /// that copy carries the one ack.
    superseded: bool,
}

/// What the acker did with finished messages, for tests and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AckCounts {
    pub acked: u64,
    pub old_connection: u64,
    pub superseded: u64,
}

/// The ordered acker's state, apart from the channels that feed it.
pub struct Acker {
    client: AsyncClient,
    live: Arc<LiveConnection>,
    /// Registered and not yet answered, in receive (token) order.
    pending: VecDeque<Pending>,
    /// The newest pending token per (connection, packet id).
    newest: HashMap<(ConnectionId, u16), AckToken>,
    counts: AckCounts,
    acked: metrics::Counter,
    withheld_old_connection: metrics::Counter,
    withheld_superseded: metrics::Counter,
    unacked: metrics::Gauge,
}

impl Acker {
    pub fn new(client: AsyncClient, live: Arc<LiveConnection>) -> Self {
        let outcome = |o: &'static str| metrics::counter!(MQTT_ACKS_TOTAL, "outcome" => o);
        Self {
            client,
            live,
            pending: VecDeque::new(),
            newest: HashMap::new(),
            counts: AckCounts::default(),
            acked: outcome("acked"),
            withheld_old_connection: outcome("withheld_old_connection"),
            withheld_superseded: outcome("withheld_superseded"),
            unacked: metrics::gauge!(MQTT_UNACKED),
        }
    }

    pub fn counts(&self) -> AckCounts {
        self.counts
    }

    /// Runs until every sender of finished tokens is gone (the router and
    /// the workers have stopped), then returns.
    pub async fn run(
        mut self,
        mut registrations: mpsc::UnboundedReceiver<Registration>,
        mut finished: mpsc::UnboundedReceiver<AckToken>,
    ) -> AckCounts {
        let mut batch = Vec::with_capacity(256);
        loop {
            tokio::select! {
                biased;
                n = registrations.recv_many(&mut batch, 256), if !registrations.is_closed() || !registrations.is_empty() => {
                    if n == 0 { continue; }
                    for r in batch.drain(..) {
                        self.register(r);
                    }
                }
                token = finished.recv() => {
                    let Some(token) = token else { break };
                    // A token's registration was sent before its message
                    // entered the pipeline: take every registration that
                    // is waiting before looking the token up.
                    while let Ok(r) = registrations.try_recv() {
                        self.register(r);
                    }
                    self.finish(token);
                    while let Ok(token) = finished.try_recv() {
                        self.finish(token);
                    }
                    self.ack_finished_prefix().await;
                }
            }
            self.unacked.set(self.pending.len() as f64);
        }
        self.unacked.set(self.pending.len() as f64);
        self.counts
    }

    pub fn register(&mut self, registration: Registration) {
        let key = (registration.connection, registration.publish.pkid);
        if let Some(earlier) = self.newest.insert(key, registration.token)
            && let Some(i) = self.position(earlier)
        {
            self.pending[i].superseded = true;
        }
        self.pending.push_back(Pending {
            registration,
            done: false,
            superseded: false,
        });
    }

    fn position(&self, token: AckToken) -> Option<usize> {
        self.pending
            .binary_search_by_key(&token, |p| p.registration.token)
            .ok()
    }

    pub fn finish(&mut self, token: AckToken) {
        if let Some(i) = self.position(token) {
            self.pending[i].done = true;
        }
    }

    /// Acks (or withholds) the finished prefix, in receive order.
    pub async fn ack_finished_prefix(&mut self) {
        while self.pending.front().is_some_and(|p| p.done) {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            let r = &p.registration;
            let key = (r.connection, r.publish.pkid);
            if self.newest.get(&key) == Some(&r.token) {
                self.newest.remove(&key);
            }
            if p.superseded {
                self.counts.superseded += 1;
                self.withheld_superseded.increment(1);
                continue;
            }
            if self.ack_on_its_connection(&r.publish, r.connection).await {
                self.counts.acked += 1;
                self.acked.increment(1);
            } else {
                self.counts.old_connection += 1;
                self.withheld_old_connection.increment(1);
            }
        }
    }

    /// Hands the ack to the client if `connection` is the live one; false
    /// when it is not (the message belongs to a dead connection). While the
    /// connection lives it waits for room in the client's request queue
    /// rather than give an ack up: a message neither acked nor redelivered
    /// would hold one of the broker's inflight slots until the next
    /// reconnect. The poll task drains that queue and never waits on the
    /// acker, so the wait ends.
    async fn ack_on_its_connection(&self, publish: &Publish, connection: ConnectionId) -> bool {
        loop {
            {
                let live = self.live.lock();
                if *live != Some(connection) {
                    return false;
                }
                match self.client.try_ack(publish) {
                    Ok(()) => return true,
                    // Full, or the event loop is gone (shutdown): a closed
                    // queue is marked dead by the poll task before it goes.
                    Err(ClientError::TryRequest(_) | ClientError::Request(_)) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::{MqttOptions, QoS};

    fn publish(pkid: u16) -> Publish {
        let mut p = Publish::new("t", QoS::AtLeastOnce, Vec::new());
        p.pkid = pkid;
        p
    }

    fn register(acker: &mut Acker, token: u64, connection: ConnectionId, pkid: u16) {
        acker.register(Registration {
            token: AckToken(token),
            connection,
            publish: publish(pkid),
        });
    }

    /// Acks go out as the finished prefix, in receive order, only on the
    /// live connection, and once per (connection, packet id).
    #[tokio::test]
    async fn acks_the_finished_prefix_on_the_live_connection_once() {
        // The event loop is never polled: acks just queue in the client.
        let (client, _eventloop) =
            rumqttc::AsyncClient::new(MqttOptions::new("t", "127.0.0.1", 1), 64);
        let live = Arc::new(LiveConnection::default());
        *live.lock() = Some(1);
        let mut acker = Acker::new(client, live.clone());
        for (token, pkid) in [(1, 10), (2, 11), (3, 12)] {
            register(&mut acker, token, 1, pkid);
        }
        acker.finish(AckToken(3));
        acker.finish(AckToken(2));
        acker.ack_finished_prefix().await;
        assert_eq!(acker.counts(), AckCounts::default(), "1 is not finished");
        acker.finish(AckToken(1));
        acker.ack_finished_prefix().await;
        assert_eq!(acker.counts().acked, 3);

        // Connection 1 dies; 4 arrived on it, 5 is its redelivered copy on
        // connection 2 (same id), 6 and 7 share an id on connection 2.
        register(&mut acker, 4, 1, 13);
        *live.lock() = Some(2);
        register(&mut acker, 5, 2, 13);
        register(&mut acker, 6, 2, 1);
        register(&mut acker, 7, 2, 1);
        for t in 4..=7 {
            acker.finish(AckToken(t));
        }
        acker.ack_finished_prefix().await;
        assert_eq!(
            acker.counts(),
            AckCounts {
                acked: 5,
                old_connection: 1,
                superseded: 1,
            }
        );
    }
}
