//! Shards: the router that decodes and admits, and the workers that
//! evaluate. `hash(vehicle) % N` picks the shard, so one vehicle's fixes are
//! evaluated in order by one worker that owns its membership state.

use crate::accounting::Accounting;
use crate::admission::{AdmissionPolicy, AnyGate, Decision, Gate, Route};
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::codec::{self, CodecSettings, Dedup, Reason};
use crate::geofence::{Evaluator, FenceIndex, TransitionKind};
use crate::model::{Priority, VehicleId};
use crate::sink::dead_letter::{DeadLetter, DeadLetterSink};
use crate::sink::events::EventSink;
use crate::source::mqtt::{AckMsg, Intake};
use metrics::{Counter, Gauge, Histogram};
use rumqttc::{AsyncClient, QoS};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// An admitted fix on its way to a worker.
#[derive(Debug)]
pub struct Admitted {
    pub seq: Option<u64>,
    pub vehicle: VehicleId,
    pub fix_ms: i64,
    pub lat: f64,
    pub lon: f64,
    pub received_at: Instant,
}

/// Stable across runs and platforms (SipHash with fixed keys), so a vehicle
/// lands on the same shard after a restart.
pub fn shard_of(vehicle: &str, shards: usize) -> usize {
    let mut h = std::hash::DefaultHasher::new();
    vehicle.hash(&mut h);
    (h.finish() % shards.max(1) as u64) as usize
}

/// Most events a shard holds back before handing them to its worker.
const BURST: usize = 128;

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
    pub tx: mpsc::Sender<Admitted>,
    pub gate: AnyGate,
    /// For a shaper: admitted events wait here until their release time.
    pub shaper_lane: Option<mpsc::UnboundedSender<(Nanos, Admitted)>>,
    pending: Vec<Admitted>,
    admitted: [Counter; 2],
    shed: Counter,
    depth: Gauge,
    level: Gauge,
    backpressure: Counter,
    gate_admitted: Counter,
}

impl ShardInput {
    pub fn new(
        shard: usize,
        tx: mpsc::Sender<Admitted>,
        gate: AnyGate,
        shaper_lane: Option<mpsc::UnboundedSender<(Nanos, Admitted)>>,
    ) -> Self {
        let label = shard.to_string();
        metrics::gauge!("geogate_queue_capacity", "shard" => label.clone())
            .set(tx.max_capacity() as f64);
        Self {
            admitted: [Priority::Low, Priority::High].map(|p| {
                metrics::counter!("geogate_events_admitted_total", "shard" => label.clone(), "priority" => p.as_str())
            }),
            shed: metrics::counter!("geogate_events_shed_total", "shard" => label.clone(), "gate" => gate.name()),
            depth: metrics::gauge!("geogate_queue_depth", "shard" => label.clone()),
            level: metrics::gauge!("geogate_gate_level", "shard" => label.clone()),
            backpressure: metrics::counter!("geogate_backpressure_waits_total", "shard" => label.clone()),
            gate_admitted: metrics::counter!("geogate_gate_admitted_total", "shard" => label, "gate" => gate.name()),
            pending: Vec::with_capacity(if shaper_lane.is_some() { 0 } else { BURST }),
            tx,
            gate,
            shaper_lane,
        }
    }

    /// Events queued or pending: what the watermark is measured against.
    fn len(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity() + self.pending.len()
    }

    fn is_full(&self) -> bool {
        self.len() >= self.tx.max_capacity()
    }

    /// Queues `item` now or with the next burst; waits only when the queue
    /// is full (backpressure, for High and below-watermark events).
    async fn enqueue(&mut self, item: Admitted) {
        // A shaper lane also feeds this queue, so room counted now could be
        // gone at flush time: shaped shards send straight away.
        if self.shaper_lane.is_some() || self.is_full() {
            self.flush().await;
            let _ = self.tx.send(item).await;
        } else {
            self.pending.push(item);
        }
    }

    /// Queues a gate-admitted low-priority event only if there is room now.
    fn try_enqueue(&mut self, item: Admitted) -> bool {
        if self.is_full() {
            return false;
        }
        if self.shaper_lane.is_some() {
            return self.tx.try_send(item).is_ok();
        }
        self.pending.push(item);
        true
    }

    /// Hands pending events to the worker. The router is the only other
    /// sender on an unshaped shard and only counted room that existed, so
    /// the sends find room; `send` rather than `try_send` keeps that true
    /// even if the reasoning were ever wrong.
    async fn flush(&mut self) {
        for item in self.pending.drain(..) {
            let _ = self.tx.send(item).await;
        }
        self.depth
            .set((self.tx.max_capacity() - self.tx.capacity()) as f64);
    }
}

/// Optional mirror of dead letters to an MQTT topic.
pub struct DeadLetterMirror {
    pub client: AsyncClient,
    pub topic: String,
}

/// Decodes, dedups, routes and admits; writes every refusal to the dead
/// letter before marking it done (and so before its ack).
pub struct Router {
    pub shards: Vec<ShardInput>,
    pub policy: AdmissionPolicy,
    pub codec: CodecSettings,
    pub dedup: Dedup,
    pub dead_letter: DeadLetterSink,
    pub mirror: Option<DeadLetterMirror>,
    pub acker: mpsc::UnboundedSender<AckMsg>,
    pub accounting: Arc<Accounting>,
    pub clock: MonotonicClock,
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Router {
    /// Runs [`Self::run`] on a thread of its own (from the runtime's
    /// blocking pool). Why: a task woken from a runtime worker thread goes
    /// to that thread's LIFO slot, which idle threads cannot steal, so the
    /// router and the shard worker it keeps waking ended up taking turns on
    /// one core (1.05 CPUs busy on 2). Woken from outside the worker pool,
    /// a shard worker goes to the shared queue and runs on the idle core.
    /// Measured in benches/pipeline.rs, with the bursts of [`ShardInput`]:
    /// +12–30% in-process throughput, 1.4 CPUs busy instead of 1.05.
    pub fn spawn(self, intake: mpsc::Receiver<Intake>) -> tokio::task::JoinHandle<DeadLetterSink> {
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(self.run(intake)))
    }

    /// Runs until intake closes; returns the dead-letter sink for a final sync.
    pub async fn run(mut self, mut intake: mpsc::Receiver<Intake>) -> DeadLetterSink {
        let mut since_flush = 0;
        while let Some(item) = intake.recv().await {
            self.route(item).await;
            since_flush += 1;
            if intake.is_empty() || since_flush >= BURST {
                self.flush().await;
                since_flush = 0;
            }
        }
        self.flush().await;
        self.dead_letter
    }

    async fn flush(&mut self) {
        for shard in &mut self.shards {
            shard.flush().await;
        }
    }

    /// `reason` is the record's reason as a static label, so the metric
    /// costs no allocation per refusal.
    async fn refuse(&mut self, reason: &'static str, record: DeadLetter, seq: Option<u64>) {
        if let Err(e) = self.dead_letter.write(&record) {
            // Not written, so not acked: the broker will redeliver it.
            tracing::error!("dead letter write failed, leaving message unacked: {e}");
            return;
        }
        metrics::counter!("geogate_dead_letter_written_total", "reason" => reason).increment(1);
        if let Some(m) = &self.mirror
            && let Ok(body) = serde_json::to_vec(&record)
        {
            let _ = m
                .client
                .publish(m.topic.clone(), QoS::AtLeastOnce, false, body)
                .await;
        }
        if let Some(seq) = seq {
            let _ = self.acker.send(AckMsg::Done(seq));
        }
    }

    async fn route(&mut self, item: Intake) {
        let decoded = codec::decode(&item.topic, &item.payload, &self.codec).and_then(|t| {
            if self.dedup.first_sighting(&t.vehicle, t.fix_time_ms) {
                Ok(t)
            } else {
                Err(codec::DecodeError::new(
                    Reason::Duplicate,
                    format!("({}, {}) already seen", t.vehicle, t.fix_time_ms),
                ))
            }
        });
        let fix = match decoded {
            Ok(fix) => fix,
            Err(e) => {
                self.accounting.invalid(e.reason);
                metrics::counter!("geogate_events_invalid_total", "reason" => e.reason.as_str())
                    .increment(1);
                let record = DeadLetter::new(
                    unix_ms(),
                    &item.topic,
                    e.reason.as_str(),
                    e.detail,
                    &item.payload,
                );
                self.refuse(e.reason.as_str(), record, item.seq).await;
                return;
            }
        };
        let shard_index = shard_of(&fix.vehicle, self.shards.len());
        let admitted = Admitted {
            seq: item.seq,
            vehicle: fix.vehicle,
            fix_ms: fix.fix_time_ms,
            lat: fix.lat,
            lon: fix.lon,
            received_at: item.received_at,
        };
        let shard = &mut self.shards[shard_index];
        let route = self.policy.route(shard.len(), fix.priority);
        match route {
            Route::Enqueue | Route::Backpressure => {
                if shard.is_full() {
                    shard.backpressure.increment(1);
                }
                self.accounting.admitted();
                shard.admitted[fix.priority as usize].increment(1);
                // Backpressure: awaiting room stalls intake, never sheds.
                shard.enqueue(admitted).await;
            }
            Route::Gate => {
                let now = self.clock.now();
                // A full queue refuses a low-priority event outright: only
                // High waits for room, and a token is not spent on an event
                // that could not be enqueued anyway.
                let decision = if shard.is_full() && shard.shaper_lane.is_none() {
                    None
                } else {
                    let d = shard.gate.try_admit(now, 1);
                    shard.level.set(shard.gate.level(now));
                    Some(d)
                };
                let refusal = match decision {
                    Some(Decision::Admit { release_at }) => {
                        let queued = match &shard.shaper_lane {
                            Some(lane) if release_at > now => {
                                lane.send((release_at, admitted)).is_ok()
                            }
                            _ => shard.try_enqueue(admitted),
                        };
                        if queued {
                            shard.gate_admitted.increment(1);
                            self.accounting.admitted();
                            shard.admitted[0].increment(1);
                            return;
                        }
                        ("the queue was full".to_owned(), None)
                    }
                    Some(Decision::Reject {
                        retry_after,
                        reason,
                    }) => (format!("{reason:?}"), retry_after),
                    None => ("the queue was full".to_owned(), None),
                };
                self.accounting.shed();
                shard.shed.increment(1);
                let gate = shard.gate.name();
                let mut record = DeadLetter::new(
                    unix_ms(),
                    &item.topic,
                    "shed",
                    format!(
                        "{gate} gate refused a low-priority event above the watermark ({})",
                        refusal.0
                    ),
                    &item.payload,
                );
                record.shard = Some(shard_index);
                record.gate = Some(gate.to_owned());
                record.retry_after_ms = refusal.1.map(|ns| ns as f64 / 1e6);
                self.refuse("shed", record, item.seq).await;
            }
        }
    }
}

/// Holds shaped events until their release time, then enqueues them.
pub async fn shaper_lane(
    clock: MonotonicClock,
    mut rx: mpsc::UnboundedReceiver<(Nanos, Admitted)>,
    tx: mpsc::Sender<Admitted>,
) {
    while let Some((release_at, item)) = rx.recv().await {
        let now = clock.now();
        if release_at > now {
            tokio::time::sleep(Duration::from_nanos(release_at - now)).await;
        }
        if tx.send(item).await.is_err() {
            return;
        }
    }
}

/// Everything a worker needs besides its queue.
pub struct WorkerContext {
    pub shard: usize,
    pub fences: watch::Receiver<Arc<FenceIndex>>,
    pub events: Arc<EventSink>,
    pub acker: mpsc::UnboundedSender<AckMsg>,
    pub accounting: Arc<Accounting>,
    /// Evaluations per second cap; 0 = none.
    pub sustained_rate: f64,
    /// Set at shutdown: stop at this instant even if the queue is not empty.
    pub deadline: watch::Receiver<Option<Instant>>,
    /// Label transitions by fence id (opt-in).
    pub per_fence_labels: bool,
}

/// Drains one shard into its evaluator until the queue closes or the drain
/// deadline passes.
pub async fn worker(
    mut rx: mpsc::Receiver<Admitted>,
    mut evaluator: Evaluator,
    mut ctx: WorkerContext,
) {
    let label = ctx.shard.to_string();
    let evaluated = metrics::counter!("geogate_events_evaluated_total", "shard" => label);
    let eval_time: Histogram = metrics::histogram!("geogate_evaluation_duration_seconds");
    let latency: Histogram = metrics::histogram!("geogate_end_to_end_latency_seconds");
    let transitions_metric = [TransitionKind::Enter, TransitionKind::Exit]
        .map(|k| metrics::counter!("geogate_fence_transitions_total", "kind" => k.as_str()));
    let pace =
        (ctx.sustained_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / ctx.sustained_rate));
    let mut next_slot = Instant::now();
    let mut transitions = Vec::new();
    let mut seen_out_of_order = 0;
    let mut batch = Vec::with_capacity(256);
    'batches: loop {
        // One wake-up per batch, not per event: measured in
        // benches/pipeline.rs, per-event parking cost a third of the time.
        let received = tokio::select! {
            n = rx.recv_many(&mut batch, 256) => n,
            _ = wait_deadline(&mut ctx.deadline) => 0,
        };
        if received == 0 {
            break;
        }
        // Read under the watch's lock once per batch, and again only when
        // it changes (a lock-free check): every worker shares that lock.
        let mut deadline = *ctx.deadline.borrow();
        for item in batch.drain(..) {
            if ctx.deadline.has_changed().unwrap_or(false) {
                deadline = *ctx.deadline.borrow_and_update();
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Past the drain deadline: what is left stays unacked.
                break 'batches;
            }
            if ctx.fences.has_changed().unwrap_or(false) {
                let index = ctx.fences.borrow_and_update().clone();
                evaluator.swap_index(index);
            }
            if let Some(pace) = pace {
                let now = Instant::now();
                if next_slot > now {
                    tokio::time::sleep(next_slot - now).await;
                }
                next_slot = next_slot.max(now) + pace;
            }
            let started = Instant::now();
            transitions.clear();
            evaluator.evaluate(
                &item.vehicle,
                item.fix_ms,
                item.lat,
                item.lon,
                &mut transitions,
            );
            eval_time.record(started.elapsed().as_secs_f64());
            for t in &transitions {
                transitions_metric[t.event as usize].increment(1);
                if ctx.per_fence_labels {
                    metrics::counter!("geogate_fence_transitions_by_fence_total", "fence" => t.fence.to_string(), "kind" => t.event.as_str()).increment(1);
                }
            }
            let out_of_order = evaluator.stats().out_of_order;
            if out_of_order > seen_out_of_order {
                metrics::counter!("geogate_fixes_out_of_order_total")
                    .increment(out_of_order - seen_out_of_order);
                seen_out_of_order = out_of_order;
            }
            ctx.accounting.transitions(transitions.len() as u64);
            ctx.events.emit(&transitions).await;
            ctx.accounting.evaluated();
            evaluated.increment(1);
            latency.record(item.received_at.elapsed().as_secs_f64());
            if let Some(seq) = item.seq {
                let _ = ctx.acker.send(AckMsg::Done(seq));
            }
        }
    }
}

async fn wait_deadline(deadline: &mut watch::Receiver<Option<Instant>>) {
    loop {
        let current = *deadline.borrow_and_update();
        match current {
            Some(at) => {
                tokio::time::sleep_until(at.into()).await;
                return;
            }
            None => {
                if deadline.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}
