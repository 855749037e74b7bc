//! What an output after the events file (MQTT, the webhook) has been handed
//! and not yet delivered, bounded, with a maximum age.
//!
//! * **Bounded.** The relay takes [`Room`] for a batch's entries before it
//!   completes the batch; the output gives it back as entries leave its
//!   queue. A full queue therefore holds the relay, and the acks behind it:
//!   intake pushes back instead of memory growing.
//! * **A maximum age.** An entry older than the output's `max_age` that it
//!   still has not delivered goes to the dead letter (reason
//!   `<output>_expired`, see [`Expired`]), and the queue moves past it. One
//!   dead endpoint then holds up geofencing for at most `max_age`, and no
//!   entry is ever dropped silently.
//! * **A cursor.** The output's cursor (what the store prunes its outbox
//!   against) is the seq just before the first entry still queued: an
//!   entry leaves the queue only once delivered or written to the dead
//!   letter, so after a crash everything after the cursor is sent again.

use super::metrics::{
    OUTPUT_DELIVERED_TOTAL, OUTPUT_EXPIRED_TOTAL, OUTPUT_LATENCY_SECONDS, OUTPUT_PENDING_ENTRIES,
    output_labels,
};
use super::outbox::OutboxEntry;
use crate::clock::receive_now_ms;
use crate::shutdown::Drain;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// How an output after the events file is bounded.
#[derive(Debug, Clone, Copy)]
pub struct OutputLimits {
    /// Entries queued for it at most (see [`Room`]).
    pub max_pending: usize,
    /// Past this, an undelivered entry goes to the dead letter.
    pub max_age: Duration,
}

/// Room in an output's queue, counted in entries.
#[derive(Clone)]
pub struct Room {
    free: Arc<Semaphore>,
    size: usize,
}

impl Room {
    pub fn new(size: usize) -> Self {
        let size = size.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            free: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// The most one [`Self::take`] may ask for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Waits for room for `n` entries (at most [`Self::size`]); false if
    /// the drain deadline passed first.
    pub async fn take(&self, n: usize, drain: &mut Drain) -> bool {
        let n = u32::try_from(n.min(self.size)).unwrap_or(u32::MAX);
        tokio::select! {
            permits = self.free.acquire_many(n) => match permits {
                Ok(permits) => {
                    permits.forget();
                    true
                }
                Err(_) => false,
            },
            _ = drain.wait() => false,
        }
    }

    fn give_back(&self, n: usize) {
        self.free.add_permits(n);
    }
}

/// The relay's end of an output's queue.
#[derive(Clone)]
pub struct OutputFeed {
    tx: mpsc::UnboundedSender<Vec<OutboxEntry>>,
    room: Room,
}

impl OutputFeed {
    /// A feed with `room`, and the output's end of it.
    pub fn new(room: Room) -> (Self, mpsc::UnboundedReceiver<Vec<OutboxEntry>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx, room }, rx)
    }

    /// The most entries one [`Self::make_room`] may ask for.
    pub fn chunk(&self) -> usize {
        self.room.size()
    }

    /// Waits until the queue has room for `n` entries (at most
    /// [`Self::chunk`]); false if the drain deadline passed first.
    pub async fn make_room(&self, n: usize, drain: &mut Drain) -> bool {
        self.room.take(n, drain).await
    }

    /// Hands over entries room was made for; false if the output has
    /// stopped.
    pub fn send(&self, entries: Vec<OutboxEntry>) -> bool {
        self.tx.send(entries).is_ok()
    }
}

/// Entries an output gave up on, for the dead letter. `written` is told
/// once their records are written (as `[dead_letter] fsync` says); only
/// then does the output's cursor move past them.
#[derive(Debug)]
pub struct Expired {
    /// `mqtt` or `webhook`, and why it gave up (`expired`, or for the
    /// webhook `gone` and `rejected`): the reason is `<output>_<why>`.
    pub output: &'static str,
    pub why: &'static str,
    pub entries: Vec<OutboxEntry>,
    /// Why, for the records' detail.
    pub detail: String,
    pub written: oneshot::Sender<()>,
}

/// Where outputs send what they give up on: the router, which owns the
/// dead letter.
pub type DeadLetterQueue = mpsc::UnboundedSender<Expired>;

/// One output's queue: entries in seq order, the first `in_flight` of them
/// handed to the output and not yet confirmed.
pub struct OutputQueue {
    output: &'static str,
    entries: VecDeque<OutboxEntry>,
    in_flight: usize,
    /// The last seq handed to this queue (or the cursor it started at).
    seen_seq: u64,
    cursor: Arc<AtomicU64>,
    room: Room,
    max_age_ms: i64,
    dead_letter: Option<DeadLetterQueue>,
    /// The dead letter could not take the last entries given up on (said
    /// once until it takes some again).
    dead_letter_failing: bool,
    delivered: metrics::Counter,
    expired: metrics::Counter,
    pending: metrics::Gauge,
    latency: metrics::Histogram,
}

impl OutputQueue {
    /// A queue for `output` (of `partition`, with partitioned state)
    /// whose cursor starts at `cursor`'s value.
    pub fn new(
        output: &'static str,
        partition: Option<u32>,
        cursor: Arc<AtomicU64>,
        room: Room,
        max_age: Duration,
        dead_letter: Option<DeadLetterQueue>,
    ) -> Self {
        let labels = output_labels("output", output, partition);
        Self {
            output,
            entries: VecDeque::new(),
            in_flight: 0,
            seen_seq: cursor.load(Relaxed),
            cursor,
            room,
            max_age_ms: i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX),
            dead_letter,
            dead_letter_failing: false,
            delivered: metrics::counter!(OUTPUT_DELIVERED_TOTAL, &labels),
            expired: metrics::counter!(OUTPUT_EXPIRED_TOTAL, &labels),
            pending: metrics::gauge!(OUTPUT_PENDING_ENTRIES, &labels),
            latency: metrics::histogram!(OUTPUT_LATENCY_SECONDS, &labels),
        }
    }

    /// Takes entries the relay made room for. Those at or below the last
    /// seq seen are not queued (a backlog row can hold entries the output
    /// had already), and their room is given back at once.
    pub fn push(&mut self, entries: Vec<OutboxEntry>) {
        let now = receive_now_ms();
        let mut skipped = 0;
        for mut e in entries {
            if e.seq <= self.seen_seq {
                skipped += 1;
                continue;
            }
            self.seen_seq = e.seq;
            if e.committed_ms == 0 {
                e.committed_ms = now;
            }
            self.entries.push_back(e);
        }
        self.room.give_back(skipped);
        self.pending.set(self.entries.len() as f64);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The next entry not yet handed out.
    pub fn next_unsent(&self) -> Option<&OutboxEntry> {
        self.entries.get(self.in_flight)
    }

    /// Up to `n` entries not yet handed out, in order.
    pub fn unsent(&self, n: usize) -> impl Iterator<Item = &OutboxEntry> {
        self.entries.iter().skip(self.in_flight).take(n)
    }

    /// The next `n` unsent entries are handed out.
    pub fn mark_sent(&mut self, n: usize) {
        self.in_flight = (self.in_flight + n).min(self.entries.len());
    }

    /// Everything handed out is to be handed out again (a connection that
    /// lost what it held, a batch to retry).
    pub fn unsend_all(&mut self) {
        self.in_flight = 0;
    }

    /// Every entry handed out has been delivered: they leave the queue and
    /// the cursor moves past them.
    pub fn confirm_in_flight(&mut self) {
        let n = self.in_flight;
        if n == 0 {
            return;
        }
        let now = receive_now_ms();
        for e in self.entries.drain(..n) {
            self.latency
                .record(now.saturating_sub(e.committed_ms).max(0) as f64 / 1000.0);
        }
        self.in_flight = 0;
        self.delivered.increment(n as u64);
        self.left(n);
    }

    /// Whether the oldest entry is past the maximum age at `now_ms`.
    pub fn has_expired(&self, now_ms: i64) -> bool {
        self.entries
            .front()
            .is_some_and(|e| now_ms.saturating_sub(e.committed_ms) > self.max_age_ms)
    }

    /// Writes every entry past the maximum age at `now_ms` (oldest first,
    /// and only from the front: the queue is in seq order) to the dead
    /// letter, and lets them go once written. Returns how many of them had
    /// been handed out (the caller resets what it had sent: they may still
    /// arrive, at least once), or `None` if the dead letter could not take
    /// them (they stay queued).
    pub async fn expire(&mut self, now_ms: i64, why: &str) -> Option<usize> {
        let n = self
            .entries
            .iter()
            .take_while(|e| now_ms.saturating_sub(e.committed_ms) > self.max_age_ms)
            .count();
        if n == 0 {
            return Some(0);
        }
        let detail = format!(
            "not delivered over {} within its maximum age ({} s): {why}",
            self.output,
            self.max_age_ms / 1000
        );
        let was_in_flight = n.min(self.in_flight);
        if !self.dead_letter_front(n, "expired", detail).await {
            return None;
        }
        self.expired.increment(n as u64);
        Some(was_in_flight)
    }

    /// Writes the entries in flight to the dead letter as
    /// `<output>_<why>` (a receiver that refused them for good), and lets
    /// them go once written; false if the dead letter could not take them
    /// (they stay queued, to be sent again).
    pub async fn reject_in_flight(&mut self, why: &'static str, detail: String) -> bool {
        self.dead_letter_front(self.in_flight, why, detail).await
    }

    async fn dead_letter_front(&mut self, n: usize, why: &'static str, detail: String) -> bool {
        if n == 0 {
            return true;
        }
        let Some(dead_letter) = self.dead_letter.as_ref() else {
            return false;
        };
        let (written, done) = oneshot::channel();
        let expired = Expired {
            output: self.output,
            why,
            entries: self.entries.iter().take(n).cloned().collect(),
            detail,
            written,
        };
        if dead_letter.send(expired).is_err() || done.await.is_err() {
            if !std::mem::replace(&mut self.dead_letter_failing, true) {
                tracing::error!(
                    "{}: {n} transition(s) could not be dead-lettered ({why}); they stay queued (and in the outbox)",
                    self.output
                );
            }
            return false;
        }
        self.dead_letter_failing = false;
        let was_in_flight = n.min(self.in_flight);
        self.entries.drain(..n);
        self.in_flight -= was_in_flight;
        self.left(n);
        true
    }

    /// `n` entries left the front: room back, cursor moved.
    fn left(&mut self, n: usize) {
        self.room.give_back(n);
        let cursor = self
            .entries
            .front()
            .map_or(self.seen_seq, |e| e.seq.saturating_sub(1));
        self.cursor.fetch_max(cursor, Relaxed);
        self.pending.set(self.entries.len() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, committed_ms: i64) -> OutboxEntry {
        OutboxEntry {
            seq,
            vehicle: "v".into(),
            line: format!(r#"{{"seq":{seq}}}"#).into_bytes(),
            committed_ms,
        }
    }

    /// Room, cursor and expiry together: the cursor never passes an entry
    /// still queued, expired entries reach the dead letter before they
    /// leave, and every entry that leaves gives its room back.
    #[tokio::test]
    async fn the_cursor_follows_what_left_and_room_comes_back() {
        let cursor = Arc::new(AtomicU64::new(2));
        let room = Room::new(4);
        let (dl, mut dead) = mpsc::unbounded_channel::<Expired>();
        let written = tokio::spawn(async move {
            let mut seqs = Vec::new();
            while let Some(e) = dead.recv().await {
                assert_eq!((e.output, e.why), ("mqtt", "expired"));
                seqs.extend(e.entries.iter().map(|e| e.seq));
                let _ = e.written.send(());
            }
            seqs
        });
        let mut queue = OutputQueue::new(
            "mqtt",
            None,
            cursor.clone(),
            room.clone(),
            Duration::from_millis(1000),
            Some(dl),
        );
        let (_control, mut drain) = crate::shutdown::DrainControl::new();
        assert!(room.take(4, &mut drain).await);
        // Seq 2 was confirmed before this start: skipped, its room back.
        queue.push(vec![
            entry(2, 0),
            entry(3, 100),
            entry(4, 100),
            entry(5, 5_000),
        ]);
        assert_eq!(queue.len(), 3);
        assert_eq!(room.free.available_permits(), 1);
        queue.mark_sent(2);
        // Seqs 3 and 4 are past the age at 1_200; 5 is not.
        assert!(queue.has_expired(1_200));
        assert_eq!(queue.expire(1_200, "test").await, Some(2));
        assert_eq!(cursor.load(Relaxed), 4);
        assert_eq!(queue.in_flight(), 0);
        assert!(!queue.has_expired(1_200));
        queue.mark_sent(1);
        queue.confirm_in_flight();
        assert_eq!(cursor.load(Relaxed), 5);
        assert!(queue.is_empty());
        assert_eq!(room.free.available_permits(), 4);
        drop(queue);
        assert_eq!(written.await.unwrap(), vec![3, 4]);
    }

    /// With no dead letter to take them, expired entries stay queued and
    /// the cursor stays behind them.
    #[tokio::test]
    async fn nothing_leaves_unless_the_dead_letter_has_it() {
        let cursor = Arc::new(AtomicU64::new(0));
        let mut queue = OutputQueue::new(
            "webhook",
            None,
            cursor.clone(),
            Room::new(8),
            Duration::ZERO,
            None,
        );
        queue.push(vec![entry(1, 10), entry(2, 10)]);
        assert_eq!(queue.expire(1_000, "test").await, None);
        assert_eq!(queue.len(), 2);
        assert_eq!(cursor.load(Relaxed), 0);
    }
}
