//! The router: takes decoded messages from the decode lanes
//! ([`crate::pipeline::decode`]), dedups, routes each fix to its shard and
//! applies the shared admission rule ([`crate::admission::Admission`]). Every
//! refusal is written to the dead letter before its message is reported
//! finished (and so before its ack); a dead letter that cannot be written
//! is retried with backoff while the message stays unacked.

use super::Admitted;
use super::input::{BURST, ShardInput};
use crate::admission::{ShedCause, Verdict};
use crate::allowance::Spend;
use crate::clock::Clock;
use crate::codec::{self, CodecSettings, Dedup, Reason};
use crate::delivery::output_queue::Expired;
use crate::model::Priority;
use crate::pipeline::accounting::Accounting;
use crate::pipeline::decode::Decoded;
use crate::pipeline::metrics::{
    DUPLICATES_IGNORED_TOTAL, EVENTS_INVALID_TOTAL, EVENTS_RECEIVED_TOTAL, FIXES_LATE_TOTAL,
    MESSAGES_IGNORED_TOTAL,
};
use crate::shutdown::Drain;
use crate::sink::dead_letter::{DeadLetter, DeadLetterSink};
use crate::sink::metrics::DEAD_LETTER_WRITTEN_TOTAL;
use crate::source::{AckToken, Completions, Envelope};
use crate::stable_hash::VehicleHash;
use rumqttc::{AsyncClient, QoS};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Optional mirror of dead letters to an MQTT topic.
pub struct DeadLetterMirror {
    pub client: AsyncClient,
    pub topic: String,
}

/// Decodes, dedups, routes and admits. Generic over its [`Clock`] so the
/// same code runs on the monotonic clock live and on a manual one in tests.
pub struct Router<C: Clock> {
    pub shards: Vec<ShardInput>,
    pub codec: CodecSettings,
    pub dedup: Dedup,
    pub dead_letter: DeadLetterSink,
    pub mirror: Option<DeadLetterMirror>,
    pub completions: Completions,
    pub accounting: Arc<Accounting>,
    pub clock: C,
    /// Shutdown's drain deadline: past it, a dead letter that still cannot
    /// be written is given up on and its message left unacked.
    pub drain: Drain,
    /// Refusals whose records wait in the dead letter's queue, in order.
    pub refused: Vec<Refused>,
    pub counters: RefusalCounters,
    /// Fixes the state did not apply, to be dead-lettered and then acked.
    pub unapplied: mpsc::UnboundedReceiver<Unapplied>,
    /// Transitions an output gave up on past its maximum age.
    pub expired: mpsc::UnboundedReceiver<Expired>,
}

/// A fix the state did not apply: its message goes to the dead letter, so
/// that nothing is dropped silently and it can be reprocessed, and is
/// acked only then.
#[derive(Debug)]
pub struct Unapplied {
    pub token: Option<AckToken>,
    pub topic: String,
    pub payload: bytes::Bytes,
    pub vehicle: crate::model::VehicleId,
    pub fix_ms: i64,
    pub why: Why,
}

/// Why the state did not apply a fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Older than its vehicle's last applied fix once its window had
    /// passed, by this many ms.
    Late { by_ms: i64 },
    /// The state knew it as applied already.
    Duplicate,
}

/// The slot of `shed` among the dead-letter counters, after the codec's
/// reasons; `late` follows it.
const SHED: usize = Reason::ALL.len();
const LATE: usize = SHED + 1;

/// The refusal metrics' handles, looked up once. Why: a `counter!` with a
/// label is a registry lookup (a hash of the name and labels, and a read
/// lock) on every refusal, and refusals come by the thousand exactly when a
/// gate sheds a burst.
pub struct RefusalCounters {
    /// `geogate_events_invalid_total{reason}`, by [`Reason`] as an index.
    invalid: [metrics::Counter; Reason::ALL.len()],
    /// `geogate_dead_letter_written_total{reason}`: each [`Reason`] at its
    /// index, then `shed` at [`SHED`] and `late` at [`LATE`].
    written: [metrics::Counter; LATE + 1],
    /// `geogate_duplicates_ignored_total{by="window"}`.
    window_duplicates: metrics::Counter,
    /// `geogate_messages_ignored_total{reason}`, by [`Reason`] as an index
    /// (only the ignored reasons' are ever incremented).
    ignored: [metrics::Counter; Reason::ALL.len()],
    /// `geogate_fixes_late_total`.
    late: metrics::Counter,
    /// `geogate_duplicates_ignored_total{by="state"}`.
    state_duplicates: metrics::Counter,
}

impl RefusalCounters {
    /// The handles from the recorder installed now: build after
    /// installing it.
    pub fn new() -> Self {
        Self {
            invalid: Reason::ALL
                .map(|r| metrics::counter!(EVENTS_INVALID_TOTAL, "reason" => r.as_str())),
            written: std::array::from_fn(|i| {
                let reason = match i {
                    SHED => "shed",
                    LATE => "late",
                    _ => Reason::ALL[i].as_str(),
                };
                metrics::counter!(DEAD_LETTER_WRITTEN_TOTAL, "reason" => reason)
            }),
            window_duplicates: metrics::counter!(DUPLICATES_IGNORED_TOTAL, "by" => "window"),
            ignored: Reason::ALL
                .map(|r| metrics::counter!(MESSAGES_IGNORED_TOTAL, "reason" => r.as_str())),
            late: metrics::counter!(FIXES_LATE_TOTAL),
            state_duplicates: metrics::counter!(DUPLICATES_IGNORED_TOTAL, "by" => "state"),
        }
    }
}

impl Default for RefusalCounters {
    fn default() -> Self {
        Self::new()
    }
}

/// A refused message, finished once its dead-letter record is written.
pub struct Refused {
    refusal: Refusal,
    token: Option<AckToken>,
    /// The record for the MQTT mirror, when there is one.
    mirrored: Option<Vec<u8>>,
}

/// What a refusal counts as, once its record is written.
#[derive(Clone, Copy)]
enum Refusal {
    Invalid(Reason),
    /// `global`: refused by the shared allowance, not the shard's gate.
    Shed {
        shard: usize,
        global: bool,
    },
    /// Found by the state (late, or a duplicate): an admitted message.
    Unapplied(Why),
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl<C: Clock + 'static> Router<C> {
    /// Runs [`Self::run`] on a thread of its own (from the runtime's
    /// blocking pool). Why: a task woken from a runtime worker thread goes
    /// to that thread's LIFO slot, which idle threads cannot steal, so the
    /// router and the shard worker it keeps waking ended up taking turns on
    /// one core (1.05 CPUs busy on 2). Woken from outside the worker pool,
    /// a shard worker goes to the shared queue and runs on the idle core.
    /// Measured in benches/pipeline.rs, with the bursts of [`ShardInput`]:
    /// +12–30% in-process throughput, 1.4 CPUs busy instead of 1.05. Since
    /// the decode lanes, a task is level with the thread (1.04× [0.96–1.09],
    /// docs/decisions/0012-router-on-its-own-thread.md), so the thread
    /// stays. Nor
    /// do the lanes route their own batches under a lock on the router:
    /// 0.71× in-process, with fewer cores busy
    /// (docs/decisions/0012-router-on-its-own-thread.md).
    pub fn spawn(
        self,
        intake: mpsc::Receiver<Vec<Decoded>>,
    ) -> tokio::task::JoinHandle<DeadLetterSink> {
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || runtime.block_on(self.run(intake)))
    }
}

impl<C: Clock> Router<C> {
    /// Runs until every decode lane has closed; returns the dead-letter
    /// sink for a final sync.
    pub async fn run(mut self, mut intake: mpsc::Receiver<Vec<Decoded>>) -> DeadLetterSink {
        let received = metrics::counter!(EVENTS_RECEIVED_TOTAL);
        let mut since_flush = 0;
        loop {
            let batch = tokio::select! {
                batch = intake.recv() => match batch {
                    Some(batch) => batch,
                    None => break,
                },
                Some(unapplied) = self.unapplied.recv() => {
                    self.refuse_unapplied(unapplied);
                    while let Ok(unapplied) = self.unapplied.try_recv() {
                        self.refuse_unapplied(unapplied);
                    }
                    self.finish_refusals().await;
                    continue;
                }
                Some(expired) = self.expired.recv() => {
                    self.write_expired(expired).await;
                    continue;
                }
            };
            // Received = taken by the router: a message still in a decode
            // lane at a crash was never counted, nor acked. Counted per
            // batch: every message of it is routed before the next recv.
            self.accounting.received(batch.len() as u64);
            received.increment(batch.len() as u64);
            for decoded in batch {
                self.route_decoded(decoded).await;
                since_flush += 1;
                if since_flush >= BURST {
                    self.flush_shards().await;
                    since_flush = 0;
                }
            }
            // Refusals are written once per lane batch, not with every
            // shard burst: at the bench's 1% of refusals that was a write
            // of a record or two every 128 messages, about 237 writes a
            // run where now about 83
            // (docs/decisions/0011-dead-letter-start-and-writes.md). A
            // refusal still waits only for its own batch.
            if intake.is_empty() {
                self.flush().await;
                since_flush = 0;
            } else {
                self.finish_refusals().await;
            }
        }
        self.flush().await;
        // The workers end once their queues close, which dropping the
        // inputs does; their last unapplied fixes still reach the dead
        // letter, until every sender has gone or the drain deadline passes.
        self.shards.clear();
        loop {
            tokio::select! {
                unapplied = self.unapplied.recv() => match unapplied {
                    Some(unapplied) => {
                        self.refuse_unapplied(unapplied);
                        self.finish_refusals().await;
                    }
                    None => break,
                },
                Some(expired) = self.expired.recv() => self.write_expired(expired).await,
                _ = self.drain.wait() => break,
            }
        }
        self.dead_letter
    }

    /// Writes the records of transitions an output gave up on, one each
    /// (the line as its payload, the commit time as its receive time, the
    /// topic it has over MQTT), and tells the output once they are written.
    async fn write_expired(&mut self, expired: Expired) {
        let reason = format!("{}_{}", expired.output, expired.why);
        for e in &expired.entries {
            let topic = format!("geogate/events/{}", e.vehicle);
            let detail = format!("seq {}: {}", e.seq, expired.detail);
            let record = DeadLetter::new(e.committed_ms, &topic, &reason, detail, &e.line);
            self.dead_letter.queue(&record);
        }
        if self.finish_refusals().await {
            metrics::counter!(DEAD_LETTER_WRITTEN_TOTAL, "reason" => reason)
                .increment(expired.entries.len() as u64);
            let _ = expired.written.send(());
        }
    }

    /// Queues the dead-letter record of a fix the state did not apply.
    fn refuse_unapplied(&mut self, u: Unapplied) {
        let (reason, detail) = match u.why {
            Why::Late { by_ms } => (
                "late",
                format!(
                    "fix of {} at {} ms is {:.3} s older than its vehicle's last applied fix, after the reorder window (pipeline.reorder_window_ms): no transition; reprocess it from here if it matters",
                    u.vehicle,
                    u.fix_ms,
                    by_ms as f64 / 1000.0
                ),
            ),
            Why::Duplicate => (
                "duplicate",
                format!(
                    "fix of {} at {} ms was applied already: the vehicle's state holds this message, or it is older than the last applied fix and the broker marked it redelivered (applied before a crash; if it never was, it is late: reprocess it from here)",
                    u.vehicle, u.fix_ms
                ),
            ),
        };
        let record = DeadLetter::new(unix_ms(), &u.topic, reason, detail, &u.payload);
        self.refuse(Refusal::Unapplied(u.why), record, u.token);
    }

    /// Hands every shard's burst to its worker, then finishes the
    /// refusals waiting on the dead letter.
    pub(crate) async fn flush(&mut self) {
        self.flush_shards().await;
        self.finish_refusals().await;
    }

    async fn flush_shards(&mut self) {
        for shard in &mut self.shards {
            shard.flush().await;
        }
    }

    /// Queues a refusal's record in the dead letter; the message is
    /// finished (counted, mirrored, acked) by [`Self::finish_refusals`]
    /// once the record is written: when the lane batch that brought it has
    /// been routed, or earlier, before the router waits for room in a
    /// queue it found full.
    fn refuse(&mut self, refusal: Refusal, record: DeadLetter, token: Option<AckToken>) {
        let line = self.dead_letter.queue(&record);
        let mirrored = self.mirror.as_ref().map(|_| line.to_vec());
        self.refused.push(Refused {
            refusal,
            token,
            mirrored,
        });
    }

    /// Writes the queued dead-letter records in one go, then finishes
    /// their messages. A dead letter that cannot be written is retried
    /// with backoff while those messages stay unacked. False if shutdown's
    /// deadline came first (the records were not written).
    async fn finish_refusals(&mut self) -> bool {
        if self.refused.is_empty() && !self.dead_letter.has_unflushed() {
            return true;
        }
        if let Err(first) = self.dead_letter.flush() {
            let health = self.dead_letter.health();
            let dead_letter = &mut self.dead_letter;
            let written = self
                .drain
                .retry(&*health, first, || dead_letter.flush())
                .await;
            if !written {
                // Shutdown came first: not written, so not finished; the
                // broker redelivers them after the restart.
                self.dead_letter.discard_unwritten();
                for r in self.refused.drain(..) {
                    // An unapplied fix was admitted, so it already counts
                    // as in queue until finished.
                    if !matches!(r.refusal, Refusal::Unapplied(_)) {
                        self.accounting.abandoned();
                    }
                }
                return false;
            }
        }
        let mut refused = std::mem::take(&mut self.refused);
        for r in refused.drain(..) {
            self.finish_refused(r).await;
        }
        self.refused = refused;
        true
    }

    async fn finish_refused(&mut self, refused: Refused) {
        let Refused {
            refusal,
            token,
            mirrored,
        } = refused;
        let written = match refusal {
            Refusal::Invalid(reason) => {
                self.accounting.invalid(reason);
                self.counters.invalid[reason.index()].increment(1);
                reason.index()
            }
            Refusal::Shed { shard, global } => {
                self.accounting.shed();
                if let Some(input) = self.shards.get(shard) {
                    match (global, &input.shed_global) {
                        (true, Some(counter)) => counter.increment(1),
                        _ => input.shed.increment(1),
                    }
                }
                SHED
            }
            Refusal::Unapplied(Why::Late { .. }) => {
                self.accounting.late();
                self.counters.late.increment(1);
                LATE
            }
            Refusal::Unapplied(Why::Duplicate) => {
                self.accounting.state_duplicate();
                self.counters.state_duplicates.increment(1);
                self.counters.invalid[Reason::Duplicate.index()].increment(1);
                Reason::Duplicate.index()
            }
        };
        self.counters.written[written].increment(1);
        if let (Some(m), Some(body)) = (&self.mirror, mirrored) {
            let _ = m
                .client
                .publish(m.topic.clone(), QoS::AtLeastOnce, false, body)
                .await;
        }
        self.completions.done(token);
    }

    /// Decodes and routes one message, as a decode lane and
    /// [`Self::route_decoded`] would (for tests that compare the live path
    /// with the virtual replay).
    #[cfg(test)]
    pub(crate) async fn route(&mut self, item: crate::source::Envelope) -> Option<Verdict> {
        let decoded = Decoded::of(item, &self.codec);
        self.route_decoded(decoded).await
    }

    /// A duplicate is refused as an undecodable payload is: dead-lettered
    /// with its reason and counted invalid, so one path keeps both exact.
    fn refuse_invalid(&mut self, e: codec::DecodeError, item: Envelope) {
        let record = DeadLetter::new(
            unix_ms(),
            &item.topic,
            e.reason.as_str(),
            e.detail,
            &item.payload,
        );
        self.refuse(Refusal::Invalid(e.reason), record, item.token);
    }

    /// Routes one decoded message; returns the verdict for a fix that
    /// reached admission (admitted or shed).
    async fn route_decoded(&mut self, decoded: Decoded) -> Option<Verdict> {
        let Decoded {
            envelope: item,
            fix,
            received_ms,
            digest,
        } = decoded;
        let fix = match fix {
            Ok(fix) => fix,
            Err(e) if e.reason.is_ignored() => {
                // Routine traffic, not bad input: counted and acked.
                self.accounting.ignored();
                self.counters.ignored[e.reason.index()].increment(1);
                self.completions.done(item.token);
                return None;
            }
            Err(e) => {
                self.refuse_invalid(e, item);
                return None;
            }
        };
        if !self.dedup.first_sighting(digest) {
            self.counters.window_duplicates.increment(1);
            let duplicate = codec::DecodeError::new(
                Reason::Duplicate,
                format!(
                    "the same message (topic and payload) was seen within the last codec.dedup_window = {} messages: a redelivery or a repeat",
                    self.codec.dedup_window
                ),
            );
            self.refuse_invalid(duplicate, item);
            return None;
        }
        let shard_index = VehicleHash::of(&fix.vehicle).shard(self.shards.len());
        let admitted = Admitted {
            token: item.token,
            vehicle: fix.vehicle,
            fix_ms: fix.fix_time_ms,
            lat: fix.lat,
            lon: fix.lon,
            received_at: item.received_at,
            received_ms,
            redelivered: item.redelivered,
            digest,
            topic: item.topic,
            payload: item.payload,
        };
        let shard = &mut self.shards[shard_index];
        let clock = &self.clock;
        let mut read_at = None;
        let verdict = shard
            .admission
            .decide(shard.len(), fix.priority, || *read_at.insert(clock.now()));
        // The gate's paths read the clock in `decide`; the gauge shows its
        // level at that instant.
        let gate_time = || read_at.unwrap_or_else(|| clock.now());
        let cause = match verdict {
            Verdict::Enqueue => {
                let full = shard.is_full();
                if full {
                    shard.backpressure.increment(1);
                }
                self.accounting.admitted();
                shard.admitted[fix.priority as usize].increment(1);
                if full {
                    // Refusals queued before this event are not held up
                    // by the wait for room.
                    self.finish_refusals().await;
                }
                // Backpressure: awaiting room stalls intake, never sheds.
                self.shards[shard_index].enqueue(admitted).await;
                return Some(verdict);
            }
            Verdict::Release { at } => {
                shard.level.set(shard.admission.level(gate_time()));
                shard.gate_admitted.increment(1);
                self.accounting.admitted();
                shard.admitted[Priority::Low as usize].increment(1);
                shard.release(at, admitted);
                return Some(verdict);
            }
            Verdict::Shed(cause) => cause,
        };
        let mut gate = shard.gate_name();
        let (why, retry_after) = match cause {
            ShedCause::QueueFull => ("the queue was full".to_owned(), None),
            ShedCause::Gate {
                retry_after,
                reason,
            } => {
                shard.level.set(shard.admission.level(gate_time()));
                (format!("{reason:?}"), retry_after)
            }
            ShedCause::Global(spend) => {
                gate = "global";
                match spend {
                    Spend::Exhausted {
                        retry_after: Some(wait),
                    } => (
                        "the local reserve is spent and the shared bucket was empty at the last refill".to_owned(),
                        Some(wait),
                    ),
                    Spend::Exhausted { retry_after: None } => (
                        "the local reserve is spent and a refill is on its way (raise gate.global.reserve if this is frequent: one instance spends at most a reserve per Redis round trip)".to_owned(),
                        None,
                    ),
                    _ => (
                        "Redis is unreachable and fail_mode = closed".to_owned(),
                        None,
                    ),
                }
            }
        };
        let mut record = DeadLetter::new(
            unix_ms(),
            &admitted.topic,
            "shed",
            format!("{gate} gate refused a low-priority event above the watermark ({why})"),
            &admitted.payload,
        );
        record.shard = Some(shard_index);
        record.gate = Some(gate.into());
        record.retry_after_ms = retry_after.map(|ns| ns as f64 / 1e6);
        self.refuse(
            Refusal::Shed {
                shard: shard_index,
                global: matches!(cause, ShedCause::Global(_)),
            },
            record,
            admitted.token,
        );
        Some(verdict)
    }
}

#[cfg(test)]
mod tests {
    //! The live router against the virtual replay (`sim`), decision by
    //! decision, on random bursts. The live queue is drained to exactly the
    //! fill the replay's worker model reaches at each arrival, so both see
    //! the same queue; then both must reach the same verdict and leave the
    //! gate at the same level. Unpaced gates only: a shaper's lane is a
    //! task of its own live, timed by the runtime, not by the clock.
    use super::*;
    use crate::admission::{Admission, AdmissionPolicy, GateSpec};
    use crate::clock::ManualClock;
    use crate::replay::capture::CaptureRecord;
    use crate::replay::sim::{SimSettings, simulate_steps};
    use crate::sink::config::FsyncPolicy;
    use crate::source::Envelope;
    use proptest::prelude::*;

    const T0: i64 = 1_750_000_000_000;

    fn capture(events: &[(u64, bool)]) -> Vec<CaptureRecord> {
        let mut t = 0;
        events
            .iter()
            .enumerate()
            .map(|(i, &(dt_us, high))| {
                t += dt_us * 1000;
                let (speed, kind) = if high { (40, "move") } else { (0, "ping") };
                let body = format!(
                    r#"{{"vehicle":"v","ts":{},"lat":50.0,"lon":10.0,"speed_kmh":{speed},"kind":"{kind}"}}"#,
                    T0 + i as i64 * 1000
                );
                CaptureRecord::new(t, "fleet/v/telemetry", body.as_bytes())
            })
            .collect()
    }

    fn live_fill(router: &Router<ManualClock>) -> usize {
        router.shards[0].len()
    }

    /// Replays `records` through a live router on a manual clock, steered
    /// to the replay's fills; returns the first disagreement, if any.
    async fn compare(
        records: &[CaptureRecord],
        steps: &[crate::replay::sim::Step],
        spec: &GateSpec,
        capacity: usize,
    ) -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (dead_letter, _) =
            DeadLetterSink::open(&dir.path().join("dl.ndjson"), 1 << 30, FsyncPolicy::Flush)
                .map_err(|e| e.to_string())?;
        let (tx, mut rx) = crate::pipeline::shard::queue::queue(capacity);
        let policy = AdmissionPolicy::new(0.6, capacity).map_err(|e| e.to_string())?;
        let gate = spec.build().map_err(|e| e.to_string())?;
        let clock = ManualClock::starting_at(0);
        let (completions, _finished) = Completions::channel();
        let codec = CodecSettings::default();
        let mut router = Router {
            shards: vec![ShardInput::new(0, tx, Admission::new(policy, gate), None)],
            dedup: Dedup::new(codec.dedup_window),
            codec,
            dead_letter,
            mirror: None,
            completions,
            accounting: Arc::new(Accounting::default()),
            clock: clock.clone(),
            drain: Drain::never(),
            refused: Vec::new(),
            counters: RefusalCounters::new(),
            unapplied: mpsc::unbounded_channel().1,
            expired: mpsc::unbounded_channel().1,
        };
        if records.len() != steps.len() {
            return Err(format!("{} records, {} steps", records.len(), steps.len()));
        }
        for (i, (record, step)) in records.iter().zip(steps).enumerate() {
            // The replay's worker has started everything but `fill`. Events
            // may still sit in the router's burst (counted as queued), so
            // they are handed over only when some must be started.
            if live_fill(&router) > step.fill {
                router.flush().await;
                while live_fill(&router) > step.fill && rx.try_take().is_some() {}
            }
            if live_fill(&router) != step.fill {
                return Err(format!(
                    "event {i}: live fill {} vs {}",
                    live_fill(&router),
                    step.fill
                ));
            }
            clock.set(step.handled_at);
            let envelope = Envelope {
                token: None,
                topic: record.topic.clone(),
                payload: record.payload_bytes().into(),
                received_at: std::time::Instant::now(),
                redelivered: false,
            };
            let verdict = if step.fill >= capacity {
                // Decided at the full queue; a High event then waits until
                // the head starts, as the replay moved time to that start.
                let (verdict, _) = tokio::join!(router.route(envelope), async {
                    tokio::task::yield_now().await;
                    if step.verdict == Verdict::Enqueue {
                        rx.recv_many(&mut Vec::new(), 1).await;
                    }
                });
                verdict
            } else {
                router.route(envelope).await
            };
            if verdict != Some(step.verdict) {
                return Err(format!(
                    "event {i}: live {verdict:?} vs virtual {:?}",
                    step.verdict
                ));
            }
            let level = router.shards[0].admission.level(step.handled_at);
            if level != step.gate_level {
                return Err(format!(
                    "event {i}: gate level live {level} vs virtual {}",
                    step.gate_level
                ));
            }
            if live_fill(&router) > capacity {
                return Err(format!("event {i}: live queue past capacity"));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn live_router_and_virtual_replay_reach_the_same_decisions(
            events in prop::collection::vec((0u64..3_000, prop::bool::weighted(0.3)), 1..250),
            capacity in 1usize..12,
            service_us in 200u64..4_000,
            kind in prop::sample::select(vec!["token", "leaky_meter"]),
            burst in 1u32..6,
        ) {
            let spec: GateSpec = format!("{kind}:rate=300,burst={burst}").parse().unwrap();
            let records = capture(&events);
            let settings = SimSettings {
                shards: 1,
                queue_capacity: capacity,
                watermark: 0.6,
                service_rate: 1e6 / service_us as f64,
            };
            let (_, steps) = simulate_steps(&records, &spec, &settings, &CodecSettings::default()).unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let outcome = runtime.block_on(compare(&records, &steps, &spec, capacity));
            prop_assert!(outcome.is_ok(), "{:?}", outcome);
        }
    }
}
