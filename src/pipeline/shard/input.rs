//! The router's view of one shard: its queue, its admission rule, and the
//! burst of admitted events not yet handed to the worker.

use super::Admitted;
use super::queue::QueueSender;
use crate::admission::{Admission, Gate};
use crate::clock::Nanos;
use crate::model::Priority;
use crate::pipeline::metrics::{
    BACKPRESSURE_WAITS_TOTAL, EVENTS_ADMITTED_TOTAL, EVENTS_SHED_TOTAL, GATE_ADMITTED_TOTAL,
    GATE_LEVEL, QUEUE_CAPACITY, QUEUE_DEPTH,
};
use metrics::{Counter, Gauge};
use tokio::sync::mpsc;

/// Most events a shard holds back before handing them to its worker.
pub(crate) const BURST: usize = 128;

/// The router's view of one shard.
///
/// Admitted events are handed to the worker in bursts: they collect in
/// `pending` while more input is already waiting and go out together when
/// the intake runs dry or [`BURST`] is reached. Handed over one by one, a
/// worker faster than the router parked and was woken again (a futex call)
/// for nearly every event; bursts cut the pipeline's CPU per event by
/// 10–27% (benches/pipeline.rs, 1 and 2 shards). Under light load the
/// intake is always dry, so each event goes out at once and no latency is
/// added. Pending events count against the queue capacity exactly as
/// queued ones do.
pub struct ShardInput {
    pub(crate) tx: QueueSender,
    pub(crate) admission: Admission,
    /// For a pacing gate: admitted events wait here until their release
    /// time, then for room in the queue.
    shaper_lane: Option<mpsc::UnboundedSender<(Nanos, Admitted)>>,
    pending: Vec<Admitted>,
    pub(crate) admitted: [Counter; 2],
    pub(crate) shed: Counter,
    /// Sheds by the global allowance, when there is one.
    pub(crate) shed_global: Option<Counter>,
    depth: Gauge,
    pub(crate) level: Gauge,
    pub(crate) backpressure: Counter,
    pub(crate) gate_admitted: Counter,
}

impl ShardInput {
    pub fn new(
        shard: usize,
        tx: QueueSender,
        admission: Admission,
        shaper_lane: Option<mpsc::UnboundedSender<(Nanos, Admitted)>>,
    ) -> Self {
        let label = shard.to_string();
        let gate = admission.gate().name();
        metrics::gauge!(QUEUE_CAPACITY, "shard" => label.clone()).set(tx.max_capacity() as f64);
        Self {
            admitted: [Priority::Low, Priority::High].map(|p| {
                metrics::counter!(EVENTS_ADMITTED_TOTAL, "shard" => label.clone(), "priority" => p.as_str())
            }),
            shed: metrics::counter!(EVENTS_SHED_TOTAL, "shard" => label.clone(), "gate" => gate),
            shed_global: admission.has_global().then(|| metrics::counter!(EVENTS_SHED_TOTAL, "shard" => label.clone(), "gate" => "global")),
            depth: metrics::gauge!(QUEUE_DEPTH, "shard" => label.clone()),
            level: metrics::gauge!(GATE_LEVEL, "shard" => label.clone()),
            backpressure: metrics::counter!(BACKPRESSURE_WAITS_TOTAL, "shard" => label.clone()),
            gate_admitted: metrics::counter!(GATE_ADMITTED_TOTAL, "shard" => label, "gate" => gate),
            pending: Vec::with_capacity(if shaper_lane.is_some() { 0 } else { BURST }),
            tx,
            admission,
            shaper_lane,
        }
    }

    /// Events queued or pending: what the watermark is measured against.
    pub(crate) fn len(&self) -> usize {
        self.tx.len() + self.pending.len()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.tx.max_capacity()
    }

    /// Queues `item` now or with the next burst; waits only when the queue
    /// is full (backpressure, for High and below-watermark events).
    pub(crate) async fn enqueue(&mut self, item: Admitted) {
        // A shaper lane also feeds this queue, so room counted now could be
        // gone at flush time: shaped shards send straight away.
        if self.shaper_lane.is_some() || self.is_full() {
            self.flush().await;
            let _ = self.tx.send(item).await;
        } else {
            self.pending.push(item);
        }
    }

    /// Queues a gate-admitted event for release at `at`. Unpaced, the rule
    /// only admits when there is room, so it joins the burst. Paced, it
    /// always goes through the lane, which keeps shaped events in release
    /// order and waits for room (a released event is never dropped).
    pub(crate) fn release(&mut self, at: Nanos, item: Admitted) {
        match &self.shaper_lane {
            None => self.pending.push(item),
            Some(lane) => {
                let _ = lane.send((at, item));
            }
        }
    }

    /// Hands pending events to the worker, as one message per burst. The
    /// router is the only other sender on an unshaped shard and only
    /// counted room that existed, so the room is there; waiting for it
    /// rather than failing keeps that true even if the reasoning were ever
    /// wrong.
    pub(crate) async fn flush(&mut self) {
        while !self.pending.is_empty() {
            let n = self.pending.len().min(self.tx.max_capacity());
            let burst = if n == self.pending.len() {
                std::mem::replace(&mut self.pending, Vec::with_capacity(BURST))
            } else {
                self.pending.drain(..n).collect()
            };
            // The worker is gone (shutdown): as a failed `send` would, the
            // events are dropped unfinished, so never acked.
            if self.tx.send_burst(burst).await.is_err() {
                self.pending.clear();
            }
        }
        self.depth.set(self.tx.len() as f64);
    }

    pub(crate) fn gate_name(&self) -> &'static str {
        self.admission.gate().name()
    }
}

/// Holds shaped events until their release time, then enqueues them
/// (waiting for room: a released event is never dropped).
pub async fn shaper_lane(
    clock: crate::clock::MonotonicClock,
    mut rx: mpsc::UnboundedReceiver<(Nanos, Admitted)>,
    tx: QueueSender,
) {
    use crate::clock::Clock;
    while let Some((release_at, item)) = rx.recv().await {
        let now = clock.now();
        if release_at > now {
            tokio::time::sleep(std::time::Duration::from_nanos(release_at - now)).await;
        }
        if tx.send(item).await.is_err() {
            return;
        }
    }
}
