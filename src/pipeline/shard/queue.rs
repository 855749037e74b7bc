//! A shard's bounded queue, which carries the router's bursts whole.
//!
//! Why not a bounded `mpsc::channel::<Admitted>`: that pushes every event
//! into the channel's block list and tries a wake for each, even when the
//! router hands over a burst of [`super::input::BURST`] events under one
//! reservation. Here a burst is one channel message, and room is a
//! semaphore of `capacity` permits taken for the burst at once (tokio's
//! bounded channel keeps its room in the same kind of semaphore).
//!
//! The fill the watermark reads is kept as the channel kept it: an event
//! takes a permit when it is sent and gives it back when the worker takes
//! it out of the queue (not when it arrives in the worker's buffer), so a
//! paced worker taking one event at a time still leaves its backlog
//! counted; and when the worker goes, what it left gives its room back.

use super::Admitted;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

/// A queue of `capacity` events for one shard's worker.
///
/// # Panics
/// If `capacity` is 0 (config check refuses it), as `mpsc::channel` does.
pub fn queue(capacity: usize) -> (QueueSender, QueueReceiver) {
    assert!(capacity > 0, "a shard queue needs room for one event");
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

    /// Events sent and not yet taken by the worker, and the room a burst
    /// still waiting for the rest of its room has already taken (as with
    /// the bounded channel's own semaphore).
    pub fn len(&self) -> usize {
        self.capacity - self.room.available_permits()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sends `burst`, waiting until there is room for all of it. On
    /// [`Closed`] the events are dropped unfinished, so never acked, as a
    /// failed `mpsc::Sender::send` would.
    ///
    /// # Panics
    /// If `burst` holds more than `max_capacity` events: it would wait
    /// forever. Callers split their bursts.
    pub async fn send_burst(&self, burst: Vec<Admitted>) -> Result<(), Closed> {
        if burst.is_empty() {
            return Ok(());
        }
        assert!(
            burst.len() <= self.capacity,
            "burst past the queue's capacity"
        );
        let n = u32::try_from(burst.len()).expect("a queue's capacity fits in u32");
        let room = self.room.acquire_many(n).await.map_err(|_| Closed)?;
        self.tx.send(burst).map_err(|_| Closed)?;
        // Given back by the worker as it takes the events (or by its drop).
        room.forget();
        Ok(())
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
        while self.held.len() == 0 {
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

    /// Whether nothing is queued now: every event sent so far has been
    /// taken.
    pub fn is_empty(&self) -> bool {
        self.held.len() == 0 && self.rx.is_empty()
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
    /// Closes the queue, so that senders waiting for room stop waiting,
    /// and gives back the room of what was never taken, as the bounded
    /// channel's receiver does: a router still deciding for this shard
    /// (its worker gone at the drain deadline, say) must not read a full
    /// queue that holds nothing, and shed on it.
    fn drop(&mut self) {
        self.room.close();
        self.rx.close();
        let mut left = self.held.len();
        while let Ok(burst) = self.rx.try_recv() {
            left += burst.len();
        }
        self.room.add_permits(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::{Pin, pin};
    use std::task::Poll;
    use std::time::Instant;

    fn event(fix_ms: i64) -> Admitted {
        Admitted {
            token: None,
            vehicle: "v".into(),
            fix_ms,
            lat: 0.0,
            lon: 0.0,
            received_at: Instant::now(),
            received_ms: fix_ms,
            redelivered: false,
            digest: fix_ms as u64,
            topic: String::new(),
            payload: bytes::Bytes::new(),
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

    /// Polls `future` once: whether it is still waiting.
    async fn waits<F: Future>(future: Pin<&mut F>) -> bool {
        let mut future = future;
        std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
    }

    #[tokio::test]
    async fn a_full_queue_makes_the_sender_wait_until_the_worker_takes_events() {
        let (tx, mut rx) = queue(2);
        tx.send_burst(vec![event(0), event(1)]).await.unwrap();
        let mut send = pin!(tx.send(event(2)));
        assert!(waits(send.as_mut()).await, "sent past capacity");
        let mut out = Vec::new();
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        send.await.unwrap();
        assert_eq!(tx.len(), 2);
        out.clear();
        assert_eq!(rx.recv_many(&mut out, 10).await, 2);
        assert_eq!(fixes(&out), [1, 2]);
    }

    #[tokio::test]
    async fn a_burst_waiting_for_room_counts_what_it_holds_and_keeps_its_place() {
        let (tx, mut rx) = queue(3);
        tx.send_burst(vec![event(0), event(1)]).await.unwrap();
        let mut burst = pin!(tx.send_burst(vec![event(2), event(3)]));
        assert!(waits(burst.as_mut()).await);
        // One of its two permits is taken: the queue reads full, as the
        // bounded channel's did.
        assert_eq!(tx.len(), 3);
        let mut single = pin!(tx.send(event(4)));
        assert!(waits(single.as_mut()).await);
        let mut out = Vec::new();
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        burst.await.unwrap();
        assert!(
            waits(single.as_mut()).await,
            "jumped ahead of the full queue"
        );
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        single.await.unwrap();
        assert_eq!(rx.recv_many(&mut out, 10).await, 3);
        assert_eq!(fixes(&out), [0, 1, 2, 3, 4]);
        assert!(tx.is_empty());
    }

    #[tokio::test]
    async fn a_limit_smaller_than_the_bursts_takes_across_them_in_order() {
        let (tx, mut rx) = queue(8);
        tx.send_burst((0..3).map(event).collect()).await.unwrap();
        tx.send_burst((3..6).map(event).collect()).await.unwrap();
        let mut out = Vec::new();
        for (expected_len, expected_left) in [(2, 4), (4, 2), (6, 0)] {
            assert_eq!(rx.recv_many(&mut out, 2).await, 2);
            assert_eq!((out.len(), tx.len()), (expected_len, expected_left));
        }
        assert_eq!(fixes(&out), [0, 1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn a_cancelled_take_loses_nothing() {
        let (tx, mut rx) = queue(4);
        let mut out = Vec::new();
        {
            let mut take = pin!(rx.recv_many(&mut out, 4));
            assert!(waits(take.as_mut()).await);
        }
        tx.send(event(7)).await.unwrap();
        assert_eq!(rx.recv_many(&mut out, 4).await, 1);
        assert_eq!(fixes(&out), [7]);
    }

    #[tokio::test]
    async fn a_gone_worker_releases_a_waiting_sender_and_gives_back_its_room() {
        let (tx, mut rx) = queue(3);
        let view = tx.fill_view();
        tx.send_burst(vec![event(0), event(1)]).await.unwrap();
        tx.send(event(2)).await.unwrap();
        // One taken, one left in the worker's hands (`held`), one queued.
        assert_eq!(rx.recv_many(&mut Vec::new(), 1).await, 1);
        assert_eq!(view.depth(), Some(2));
        tx.send(event(3)).await.unwrap();
        let mut waiting = pin!(tx.send(event(4)));
        assert!(waits(waiting.as_mut()).await);
        drop(rx);
        assert!(waiting.await.is_err());
        assert_eq!(view.depth(), None);
        // The router reads an empty queue, not a full one holding nothing.
        assert_eq!(tx.len(), 0);
        assert!(tx.send(event(5)).await.is_err());
    }

    #[tokio::test]
    async fn the_worker_sees_the_end_only_after_the_last_event() {
        let (tx, mut rx) = queue(4);
        // A fill view does not keep the queue open.
        let _view = tx.fill_view();
        tx.send_burst(vec![event(0), event(1)]).await.unwrap();
        drop(tx);
        let mut out = Vec::new();
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        assert_eq!(rx.recv_many(&mut out, 1).await, 1);
        assert_eq!(rx.recv_many(&mut out, 1).await, 0);
        assert_eq!(fixes(&out), [0, 1]);
    }
}
