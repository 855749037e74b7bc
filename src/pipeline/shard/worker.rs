//! A shard worker: drains its queue in batches and hands each batch to the
//! shard's state ([`ShardState`]) with the completion that finishes its
//! messages. Nothing is acked here: a message is finished only once the
//! state backend says its batch is durable (see [`crate::state`]).

use super::Admitted;
use super::completion::{Finished, Message, ShardCounters};
use super::queue::QueueReceiver;
use crate::clock::receive_now_ms;
use crate::geofence::{FenceIndex, Fix};
use crate::shutdown::Drain;
use crate::state::{Batch, ShardState, VehicleQuery};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Most fixes taken from the queue per batch (and so per commit request).
const BATCH: usize = 256;

/// How often an idle worker hands its state a batch with only the
/// watermark, so that outputs that fall due without a fix (a window's
/// release, an expiry) fire.
/// A quarter second: a window's release waits at most this long past its
/// due time on a quiet shard, for 4 wake-ups a second.
const TICK: Duration = Duration::from_millis(250);

/// Everything a worker needs besides its queue and its state.
pub struct WorkerContext {
    pub fences: watch::Receiver<Arc<FenceIndex>>,
    pub counters: Arc<ShardCounters>,
    /// Evaluations per second cap; 0 = none.
    pub sustained_rate: f64,
    /// Set at shutdown: stop at this instant even if the queue is not empty.
    pub drain: Drain,
    /// Questions about the shard's vehicles (the state query).
    pub queries: mpsc::Receiver<VehicleQuery>,
}

/// Drains one shard into its state until the queue closes, the drain
/// deadline passes or the state stops taking batches.
pub async fn worker(mut rx: QueueReceiver, mut state: Box<dyn ShardState>, mut ctx: WorkerContext) {
    let pace =
        (ctx.sustained_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / ctx.sustained_rate));
    // A paced worker stands in for a slow one, and what a worker holds in
    // its batch is invisible to the watermark: paced, it takes one event at
    // a time so its backlog stays in the queue where the router sees it.
    let batch_limit = if pace.is_some() { 1 } else { BATCH };
    let mut next_slot = Instant::now();
    let mut batch: Vec<Admitted> = Vec::with_capacity(batch_limit);
    // Wakes an idle worker, so that its state hears the clock.
    let mut idle = tokio::time::interval(TICK);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    idle.reset();
    loop {
        // One wake-up per batch, not per event: measured in
        // benches/pipeline.rs, per-event parking cost a third of the time.
        tokio::select! {
            biased;
            // Rare, and answered in order with the batches: first.
            Some(query) = ctx.queries.recv() => {
                if state.query(query).await.is_err() {
                    break;
                }
                continue;
            }
            n = rx.recv_many(&mut batch, batch_limit) => if n == 0 {
                // A graceful stop: the queue is drained and closed.
                close(state.as_mut(), &ctx).await;
                break;
            },
            _ = ctx.drain.wait() => break,
            _ = idle.tick() => {}
        }
        if ctx.drain.passed() {
            // Past the drain deadline: what is left stays unacked.
            break;
        }
        if let Some(pace) = pace
            && !batch.is_empty()
        {
            let now = Instant::now();
            if next_slot > now {
                tokio::time::sleep(next_slot - now).await;
            }
            next_slot = next_slot.max(now) + pace;
        }
        let fences = ctx
            .fences
            .has_changed()
            .unwrap_or(false)
            .then(|| ctx.fences.borrow_and_update().clone());
        // Every message received up to the watermark has been handed in:
        // all of them, when the queue is empty now; else those up to the
        // newest in this batch (the queue is in receive order).
        let watermark = if rx.is_empty() {
            receive_now_ms()
        } else {
            batch
                .iter()
                .map(|a| a.received_ms)
                .max()
                .unwrap_or(i64::MIN)
        };
        let messages = batch
            .iter_mut()
            .map(|a| Message {
                token: a.token,
                received_at: a.received_at,
                topic: std::mem::take(&mut a.topic),
                payload: std::mem::take(&mut a.payload),
                vehicle: a.vehicle.clone(),
                fix_ms: a.fix_ms,
            })
            .collect();
        let fixes: Vec<Fix<'_>> = batch.iter().map(Admitted::fix).collect();
        let done = Box::new(Finished {
            counters: ctx.counters.clone(),
            messages,
        });
        let input = Batch {
            fences,
            fixes: &fixes,
            watermark: Some(watermark),
            closing: false,
            position: None,
        };
        let applied = state.apply(input, done).await;
        drop(fixes);
        batch.clear();
        if applied.is_err() {
            break;
        }
    }
}

/// The last batch of a graceful stop: no fixes, and every fix still in a
/// reorder window released.
async fn close(state: &mut dyn ShardState, ctx: &WorkerContext) {
    let done = Box::new(Finished {
        counters: ctx.counters.clone(),
        messages: Vec::new(),
    });
    let last = Batch {
        fences: None,
        fixes: &[],
        watermark: Some(receive_now_ms()),
        closing: true,
        position: None,
    };
    let _ = state.apply(last, done).await;
}
