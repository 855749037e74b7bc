//! A shard's bounded queue, which carries the router's bursts whole.
//!
//! Why not a bounded `mpsc::channel::<Admitted>`: that pushes every event
//! into the channel's block list and wakes the receiver for each, even
//! when the router hands over a burst of [`super::input::BURST`] events
//! under one reservation. Here a burst is one channel message, and room is
//! a semaphore of `capacity` permits taken for the burst at once.
//!
//! The fill the watermark reads is kept exactly as the channel kept it: an
//! event takes a permit when it is sent and gives it back when the worker
//! takes it out of the queue (not when it arrives in the worker's buffer),
//! so a paced worker taking one event at a time still leaves its backlog
//! counted.

use super::Admitted;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

/// A queue of `capacity` events for one shard's worker.
pub fn queue(capacity: usize) -> (QueueSender, QueueReceiver) {
    let room = Arc::new(Semaphore::new(capacity));
    let (tx, rx) = mpsc::unbounded_channel();
    (
        QueueSender {
            tx,
            room: room.clone(),
            capacity,
        },
        QueueReceiver {
            rx,
            room,
            held: Vec::new().into_iter(),
        },
    )
}

/// The worker has gone: nothing it was sent will be taken.
#[derive(Debug)]
pub struct Closed;

/// The sending side, cloned by the router and a shaper lane.
#[derive(Clone)]
pub struct QueueSender {
    tx: mpsc::UnboundedSender<Vec<Admitted>>,
    room: Arc<Semaphore>,
    capacity: usize,
}

impl QueueSender {
    pub fn max_capacity(&self) -> usize {
        self.capacity
    }

    /// Events sent and not yet taken by the worker.
    pub fn len(&self) -> usize {
        self.capacity - self.room.available_permits()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sends `burst` (at most `max_capacity` events), waiting until there
    /// is room for all of it. On [`Closed`] the events are dropped
    /// unfinished, so never acked, as a failed `mpsc::Sender::send` would.
    pub async fn send_burst(&self, burst: Vec<Admitted>) -> Result<(), Closed> {
        if burst.is_empty() {
            return Ok(());
        }
        // More than the capacity would wait forever; callers split bursts.
        debug_assert!(burst.len() <= self.capacity, "burst past the queue's capacity");
        let n = u32::try_from(burst.len()).map_err(|_| Closed)?;
        self.room
            .acquire_many(n)
            .await
            .map_err(|_| Closed)?
            .forget();
        self.tx.send(burst).map_err(|_| Closed)
    }

    /// Sends one event, waiting for room.
    pub async fn send(&self, item: Admitted) -> Result<(), Closed> {
        self.send_burst(vec![item]).await
    }

    /// A handle that reads the fill without keeping the queue open.
    pub fn fill_view(&self) -> FillView {
        FillView {
            room: self.room.clone(),
            capacity: self.capacity,
        }
    }
}

/// Reads a queue's fill, for gauges and progress displays.
#[derive(Clone)]
pub struct FillView {
    room: Arc<Semaphore>,
    capacity: usize,
}

impl FillView {
    /// Events queued, or `None` once the worker has gone.
    pub fn depth(&self) -> Option<usize> {
        (!self.room.is_closed()).then(|| self.capacity - self.room.available_permits())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// The worker's side.
pub struct QueueReceiver {
    rx: mpsc::UnboundedReceiver<Vec<Admitted>>,
    room: Arc<Semaphore>,
    /// What is left of the last burst received: still in the queue, and
    /// still counted in its fill.
    held: std::vec::IntoIter<Admitted>,
}

impl QueueReceiver {
    /// Waits for at least one event, then moves up to `limit` of those
    /// already queued into `out` and frees their room. Returns how many it
    /// moved; 0 only once every sender has gone and the queue is empty.
    /// Cancel safe, as `mpsc::Receiver::recv_many` is: a cancelled call has
    /// taken nothing.
    pub async fn recv_many(&mut self, out: &mut Vec<Admitted>, limit: usize) -> usize {
        if limit == 0 {
            return 0;
        }
        if self.held.len() == 0 {
            match self.rx.recv().await {
                Some(burst) => self.held = burst.into_iter(),
                None => return 0,
            }
        }
        let mut taken = 0;
        loop {
            let n = self.held.len().min(limit - taken);
            out.extend(self.held.by_ref().take(n));
            taken += n;
            if taken == limit {
                break;
            }
            match self.rx.try_recv() {
                Ok(burst) => self.held = burst.into_iter(),
                Err(_) => break,
            }
        }
        self.room.add_permits(taken);
        taken
    }

    /// Takes one event if one is queued, without waiting.
    #[cfg(test)]
    pub(crate) fn try_take(&mut self) -> Option<Admitted> {
        if self.held.len() == 0 {
            self.held = self.rx.try_recv().ok()?.into_iter();
        }
        let item = self.held.next()?;
        self.room.add_permits(1);
        Some(item)
    }
}

impl Drop for QueueReceiver {
    /// Senders waiting for room would otherwise wait forever.
    fn drop(&mut self) {
        self.room.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn event(fix_ms: i64) -> Admitted {
        Admitted {
            token: None,
            vehicle: "v".into(),
            fix_ms,
            lat: 0.0,
            lon: 0.0,
            received_at: Instant::now(),
            redelivered: false,
        }
    }

    fn fixes(items: &[Admitted]) -> Vec<i64> {
        items.iter().map(|a| a.fix_ms).collect()
    }

    #[tokio::test]
    async fn events_are_taken_in_order_across_bursts_and_room_returns_as_they_are_taken() {
        let (tx, mut rx) = queue(5);
        tx.send_burst((0..3).map(event).collect()).await.unwrap();
        tx.send(event(3)).await.unwrap();
        assert_eq!(tx.len(), 4);
        let mut out = Vec::new();
        // One at a time, as a paced worker takes them: the rest stay counted.
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        assert_eq!(tx.len(), 3);
        assert_eq!(rx.recv_many(&mut out, 10).await, 3);
        assert_eq!(fixes(&out), [0, 1, 2, 3]);
        assert!(tx.is_empty());
    }

    #[tokio::test]
    async fn a_full_queue_makes_the_sender_wait_until_the_worker_takes_events() {
        let (tx, mut rx) = queue(2);
        tx.send_burst(vec![event(0), event(1)]).await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(event(2)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "sent past capacity");
        let mut out = Vec::new();
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        waiting.await.unwrap().unwrap();
        assert_eq!(tx.len(), 2);
        out.clear();
        assert_eq!(rx.recv_many(&mut out, 10).await, 2);
        assert_eq!(fixes(&out), [1, 2]);
    }

    #[tokio::test]
    async fn a_gone_worker_releases_a_waiting_sender_and_ends_the_fill_view() {
        let (tx, rx) = queue(1);
        let view = tx.fill_view();
        tx.send(event(0)).await.unwrap();
        assert_eq!(view.depth(), Some(1));
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(event(1)).await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        assert!(waiting.await.unwrap().is_err());
        assert_eq!(view.depth(), None);
    }

    #[tokio::test]
    async fn the_worker_sees_the_end_only_after_the_last_event() {
        let (tx, mut rx) = queue(4);
        tx.send_burst(vec![event(0), event(1)]).await.unwrap();
        drop(tx);
        let mut out = Vec::new();
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        assert_eq!(rx.recv_many(&mut out, 1).await, 0);
        assert_eq!(fixes(&out), [0, 1]);
    }
}
