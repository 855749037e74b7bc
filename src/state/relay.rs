//! Committed transitions out: the relay appends them to the events file,
//! the publisher sends them over MQTT. Each keeps a cursor (the last seq it
//! has delivered) that the committer reads to prune the outbox, so an entry
//! leaves the store only once both have it.
//!
//! * **File: exactly once.** Lines are written in seq order and skipped at
//!   or below the file's last seq, which is read from the file itself at
//!   start ([`super::events_file`]): a crash between a write and its cursor
//!   cannot write a line twice, and one mid-write cannot skip one.
//! * **MQTT: at least once.** The cursor moves only when the broker has
//!   acked every publish so far; after a crash everything past it is sent
//!   again, with the same `id`. Publishing runs apart from the file so a
//!   broker outage never holds up the file, or the acks that wait for it.

use super::commit::{Committed, Cursors, Finished};
use super::crash_point;
use super::outbox::OutboxEntry;
use crate::config::FsyncPolicy;
use crate::sink::append_file::AppendFile;
use crate::sink::health::{SinkHealth, retry_until, wait_deadline};
use rumqttc::{AsyncClient, Event, Packet, QoS};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Publishes not yet acked by the broker before the publisher waits for
/// them; bounds what a crash makes it send twice.
const UNCONFIRMED_WINDOW: u64 = 1000;

/// Appends committed transitions to the events file.
pub struct Relay {
    pub file: Option<(AppendFile, SinkHealth)>,
    pub fsync: FsyncPolicy,
    /// The last seq the file holds.
    pub file_seq: u64,
    pub cursors: Arc<Cursors>,
    pub publisher: Option<mpsc::UnboundedSender<Vec<OutboxEntry>>>,
    pub deadline: watch::Receiver<Option<Instant>>,
    /// Dropped when the relay stops: the committer waits for that.
    pub done: std::sync::mpsc::Sender<()>,
}

impl Relay {
    /// Writes the recovered backlog, then each committed batch, until the
    /// committer hangs up.
    pub async fn run(
        mut self,
        backlog: Vec<OutboxEntry>,
        mut rx: mpsc::UnboundedReceiver<Committed>,
    ) {
        self.deliver(backlog, Vec::new()).await;
        while let Some(committed) = rx.recv().await {
            if !self.deliver(committed.entries, committed.finished).await {
                // The drain deadline passed with the file still failing:
                // later batches' messages stay unacked too.
                break;
            }
        }
        if let Some((file, _)) = &mut self.file
            && let Err(e) = file.sync_data()
        {
            tracing::error!("events file {}: {e}", file.path().display());
        }
    }

    async fn deliver(&mut self, entries: Vec<OutboxEntry>, finished: Vec<Finished>) -> bool {
        if !self.write_file(&entries).await {
            return false;
        }
        finished.into_iter().for_each(Finished::complete);
        if let Some(publisher) = &self.publisher {
            let _ = publisher.send(entries);
        }
        true
    }

    /// False if the drain deadline passed before the file took the lines.
    async fn write_file(&mut self, entries: &[OutboxEntry]) -> bool {
        let Some((file, health)) = &mut self.file else {
            return true;
        };
        let mut lines = Vec::new();
        let mut last = self.file_seq;
        for e in entries.iter().filter(|e| e.seq > self.file_seq) {
            lines.extend_from_slice(&e.line);
            lines.push(b'\n');
            last = e.seq;
        }
        if lines.is_empty() {
            return true;
        }
        if crash_point::armed("relay.mid_line") {
            let half = lines.len() / 2;
            file.queue(&lines[..half]);
            let _ = file.write_unwritten();
            crash_point::reached("relay.mid_line");
            file.queue(&lines[half..]);
        } else {
            file.queue(&lines);
        }
        let fsync = self.fsync;
        let mut attempt = || {
            file.write_unwritten()?;
            match fsync {
                FsyncPolicy::Always => file.sync_data(),
                FsyncPolicy::Flush => Ok(()),
            }
        };
        if let Err(first) = attempt()
            && !retry_until(health, &mut self.deadline, first, attempt).await
        {
            return false;
        }
        crash_point::reached("relay.before_cursor");
        self.file_seq = last;
        self.cursors.file.store(last, Relaxed);
        true
    }
}

/// Publishes committed transitions to `geogate/events/{vehicle}` at QoS 1
/// on a connection of its own.
pub struct Publisher {
    pub client: AsyncClient,
    /// PubAcks the connection has received (see [`drive_events_connection`]).
    pub acked: Arc<AtomicU64>,
    pub requested: u64,
    /// The last seq the broker has acked with everything before it.
    pub mqtt_seq: u64,
    /// The last seq handed to the client.
    pub sent_seq: u64,
    pub cursors: Arc<Cursors>,
    pub deadline: watch::Receiver<Option<Instant>>,
    pub done: std::sync::mpsc::Sender<()>,
}

impl Publisher {
    pub async fn run(
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
                _ = tick.tick() => self.confirm(),
            }
        }
        // Shutdown: give the broker until the drain deadline to ack.
        let mut deadline = self.deadline.clone();
        tokio::select! {
            _ = self.wait_confirmed() => {}
            _ = wait_deadline(&mut deadline) => {
                tracing::warn!(
                    "events over MQTT: {} publish(es) unacked at the drain deadline; sent again after the restart",
                    self.requested.saturating_sub(self.acked.load(Relaxed))
                );
            }
        }
    }

    async fn publish(&mut self, entries: &[OutboxEntry]) {
        // Acks for the last batch have usually come in by now.
        self.confirm();
        for e in entries {
            if e.seq <= self.sent_seq {
                continue;
            }
            if self.requested.saturating_sub(self.acked.load(Relaxed)) >= UNCONFIRMED_WINDOW {
                self.wait_confirmed().await;
            }
            let topic = format!("geogate/events/{}", e.vehicle);
            if let Err(e) = self
                .client
                .publish(topic, QoS::AtLeastOnce, false, e.line.clone())
                .await
            {
                tracing::warn!("publishing transition: {e}");
                return;
            }
            self.requested += 1;
            self.sent_seq = e.seq;
        }
        self.confirm();
    }

    async fn wait_confirmed(&mut self) {
        while self.acked.load(Relaxed) < self.requested {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.confirm();
    }

    /// Moves the cursor once the broker has acked every publish so far.
    fn confirm(&mut self) {
        if self.sent_seq > self.mqtt_seq && self.acked.load(Relaxed) >= self.requested {
            crash_point::reached("relay.before_mqtt_cursor");
            self.mqtt_seq = self.sent_seq;
            self.cursors.mqtt.store(self.sent_seq, Relaxed);
        }
    }
}

/// Polls the publisher's connection, counting the broker's PubAcks.
pub async fn drive_events_connection(mut eventloop: rumqttc::EventLoop, acked: Arc<AtomicU64>) {
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::PubAck(_))) => {
                acked.fetch_add(1, Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("events connection: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
