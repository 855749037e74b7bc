//! One partition's owner: reads the partition's state from its log, takes
//! the log over (fencing the owner before), publishes what that owner
//! committed but had not published, then reads the partition's input from
//! the committed position, batch by batch, through the same shard state
//! the local backends use ([`LocalShard`]) into the partition's committer.
//!
//! The receive clock of a fix is when the engine stored it, not when this
//! owner read it: every owner that reads the fix sees the same time, so
//! the reorder window, the device clock check and idle expiry decide the
//! same after an owner change as an uninterrupted owner would.

use super::dead_letters::{DeadLetters, Record};
use super::output_cursor::Cursor;
use super::outputs::{OutputsContext, PartitionOutputs, TakeoverPoint};
use crate::codec::{self, CodecSettings};
use crate::delivery::outbox::FenceProperties;
use crate::geofence::{Evaluator, EvaluatorSettings, FenceIndex, Fix};
use crate::model::{Telemetry, VehicleId};
use crate::pipeline::metrics::{
    DUPLICATES_IGNORED_TOTAL, EVENTS_EVALUATED_TOTAL, EVENTS_INVALID_TOTAL, EVENTS_RECEIVED_TOTAL,
    FIXES_LATE_TOTAL, MESSAGES_IGNORED_TOTAL,
};
use crate::source::jetstream::{InputFix, PartitionInput};
use crate::state::local::shard::LocalShard;
use crate::state::partitioned::PartitionError;
use crate::state::partitioned::commit_body::{CommitBody, Kind};
use crate::state::partitioned::commit_log::CommitLog;
use crate::state::partitioned::committer::PartitionCommitter;
use crate::state::partitioned::events_stream::EventsStream;
use crate::state::partitioned::metrics::PARTITION_LAG_MESSAGES;
use crate::state::partitioned::restore;
use crate::state::{Batch, Completion, Outcomes, ShardState, SourcePosition};
use async_nats::jetstream;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Fixes read at most per batch: a commit of one batch stays well below
/// the engine's message limit (a fix adds its vehicle's record and its
/// transitions, a few hundred bytes).
const BATCH_MAX: usize = 500;

/// How long a read waits for the first fix; an idle partition still gets
/// a batch this often, for what falls due by the receive clock.
const IDLE_TICK: Duration = Duration::from_millis(250);

/// An idle partition's receive clock runs this far behind this machine's,
/// so that a fix the engine stores later, by a clock a little behind ours,
/// is not overtaken by a timer that fired on ours.
const CLOCK_MARGIN_MS: i64 = 1000;

/// What an owner needs besides its partition.
#[derive(Clone)]
pub struct OwnerContext {
    pub js: jetstream::Context,
    pub instance: String,
    pub codec: Arc<CodecSettings>,
    pub settings: EvaluatorSettings,
    pub fences: watch::Receiver<Arc<FenceIndex>>,
    pub snapshot_every: u64,
    /// Which fence properties event lines carry.
    pub fence_properties: FenceProperties,
    /// `[state] keep_input`.
    pub keep_input: bool,
    /// `[state] events_max_age_s`.
    pub events_max_age: Duration,
    pub per_fence_labels: bool,
    pub dead_letters: DeadLetters,
    /// Fixes per second at most (`pipeline.sustained_rate`; 0: no cap):
    /// models a slower evaluator, as it does for a shard worker.
    pub sustained_rate: f64,
    /// `[events] mqtt` and `[events.webhook]`, run for each partition owned.
    pub outputs: OutputsContext,
}

/// Owns `partition` until `stop` is set, or another owner is found to
/// have taken it. Returns once everything it read is committed (or
/// refused to a deposed owner).
pub async fn own(
    partition: u32,
    mut ctx: OwnerContext,
    stop: watch::Receiver<bool>,
) -> Result<(), PartitionError> {
    let mut mirror = restore::load(&ctx.js, partition).await?;
    let takeover = CommitBody {
        kind: Kind::Takeover,
        base: mirror.base,
        input_through: mirror.input_through,
        next_seq: mirror.next_seq,
        totals: mirror.totals,
        vehicles: Vec::new(),
        held: Vec::new(),
        lines: Vec::new(),
        owner: ctx.instance.clone(),
    };
    let log = CommitLog::take_over(
        &ctx.js,
        partition,
        mirror.last,
        Bytes::from(takeover.encode()),
    )
    .await?;
    mirror.last = log.last();
    let events = EventsStream::open(&ctx.js, partition, ctx.events_max_age).await?;
    if events.published() > mirror.last {
        return Err(PartitionError::Unreadable {
            partition,
            seq: mirror.last,
            detail: format!(
                "the events stream holds commit {} of this partition, past its log's last commit {}: the log was made again under an events stream that outlived it; move GEOGATE_EVENTS's events.{partition} aside (or delete the partition's messages in it) before this partition can be owned; its outputs then start again at the stream's end",
                events.published(),
                mirror.last
            ),
        });
    }
    mirror
        .unpublished
        .retain(|(commit, _)| *commit > events.published());
    // Where the outputs start: one with no cursor yet after the last
    // transition the stream holds now, worked out before this owner
    // publishes anything.
    let unpublished_lines: usize = mirror
        .unpublished
        .iter()
        .map(|(_, lines)| {
            lines
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count()
        })
        .sum();
    let at = TakeoverPoint {
        fresh: Cursor {
            seq: mirror.next_seq.saturating_sub(1 + unpublished_lines as u64),
            read_from: events.last_position() + 1,
        },
        committed: mirror.next_seq.saturating_sub(1),
    };
    let outputs = PartitionOutputs::start(&ctx.outputs, &ctx.js, partition, at, stop.clone());
    tracing::info!(
        partition,
        position = mirror.input_through,
        vehicles = mirror.records.len(),
        "partition taken over"
    );

    let index = ctx.fences.borrow_and_update().clone();
    let mut evaluator =
        Evaluator::new(index, ctx.settings).tracking_changes(mirror.next_held_key());
    for (vehicle, snapshot) in mirror.vehicles().map_err(|e| PartitionError::Unreadable {
        partition,
        seq: mirror.last,
        detail: e.to_string(),
    })? {
        evaluator.restore(vehicle, &snapshot);
    }
    let mut input = PartitionInput::open(&ctx.js, partition, mirror.input_through)
        .await
        .map_err(|e| PartitionError::Engine {
            partition,
            what: e.stream.clone(),
            detail: e.detail.clone(),
        })?;
    let (commits, requests) = mpsc::channel(4);
    let committer = tokio::spawn(
        PartitionCommitter {
            partition,
            log,
            events,
            mirror,
            owner: ctx.instance.clone(),
            snapshot_every: ctx.snapshot_every,
            properties: ctx.fence_properties.clone(),
            stop: stop.clone(),
            input_stream: (!ctx.keep_input)
                .then(|| crate::source::jetstream::stream_name(partition)),
        }
        .run(requests),
    );
    let mut shard = LocalShard::new(
        partition as usize,
        evaluator,
        commits,
        true,
        ctx.per_fence_labels,
    );
    let lag = metrics::gauge!(PARTITION_LAG_MESSAGES, "partition" => partition.to_string());
    let mut last_watermark = i64::MIN;
    let mut stop_read = stop.clone();
    let (batch_max, pace) = if ctx.sustained_rate > 0.0 {
        // A tenth of a second's fixes a batch, so the pace is smooth.
        let n = (ctx.sustained_rate / 10.0).clamp(1.0, BATCH_MAX as f64);
        (
            n as usize,
            Some(Duration::from_secs_f64(n / ctx.sustained_rate)),
        )
    } else {
        (BATCH_MAX, None)
    };
    let mut next_slot = tokio::time::Instant::now();
    loop {
        if *stop_read.borrow() {
            break;
        }
        if let Some(pace) = pace {
            tokio::time::sleep_until(next_slot).await;
            next_slot = next_slot.max(tokio::time::Instant::now()) + pace;
        }
        let read = tokio::select! {
            read = input.next_batch(batch_max, IDLE_TICK) => read,
            _ = stop_read.changed() => continue,
        };
        let batch = match read {
            Ok(batch) => batch,
            Err(e) => {
                tracing::warn!("{e}; reading again");
                tokio::time::sleep(IDLE_TICK).await;
                continue;
            }
        };
        lag.set(batch.behind as f64);
        let fixes = batch.fixes;
        let decoded = decode(partition, &fixes, &ctx.codec);
        ctx.dead_letters.write(decoded.refused).await;
        // The receive clock runs with the log; only a partition read to
        // its end lets it run with this machine's.
        let watermark = match fixes.last() {
            Some(last) => last.stored_ms,
            None if input.caught_up().await.unwrap_or(false) => {
                crate::clock::receive_now_ms() - CLOCK_MARGIN_MS
            }
            None => last_watermark,
        };
        last_watermark = last_watermark.max(watermark);
        let applied: Vec<Fix<'_>> = decoded
            .fixes
            .iter()
            .map(|(t, stored_ms, digest, _)| Fix {
                vehicle: &t.vehicle,
                fix_ms: t.fix_time_ms,
                lat: t.lat,
                lon: t.lon,
                redelivered: false,
                received_ms: *stored_ms,
                digest: *digest,
            })
            .collect();
        let position = SourcePosition {
            through: input.position(),
            read: fixes.len() as u64,
            refused: decoded.refused_count,
            ignored: decoded.ignored_count,
        };
        let done = Box::new(Counted {
            partition,
            applied: decoded
                .fixes
                .iter()
                .map(|(t, _, _, i)| (*i, t.vehicle.clone(), t.fix_time_ms))
                .collect(),
            fixes: Arc::new(fixes),
            dead_letters: ctx.dead_letters.clone(),
        });
        let fences = ctx
            .fences
            .has_changed()
            .unwrap_or(false)
            .then(|| ctx.fences.borrow_and_update().clone());
        let applied = shard
            .apply(
                Batch {
                    fences,
                    fixes: &applied,
                    watermark: Some(last_watermark),
                    closing: false,
                    position: Some(position),
                },
                done,
            )
            .await;
        if applied.is_err() {
            // The committer has stopped: its error says why.
            break;
        }
    }
    drop(shard);
    lag.set(0.0);
    let committed = committer.await.unwrap_or_else(|e| {
        Err(PartitionError::Engine {
            partition,
            what: "committer".into(),
            detail: e.to_string(),
        })
    });
    // Finished well, the outputs deliver what the stream holds now; an
    // owner that failed or was deposed drops them, and whoever owns the
    // partition next goes on from their stored cursors.
    if committed.is_ok() {
        outputs.finish().await;
    }
    committed
}

/// A batch's fixes decoded: those for the state (with their receive time,
/// digest and place in the batch), and the refused ones' records.
struct Decoded {
    fixes: Vec<(Telemetry, i64, u64, usize)>,
    refused: Vec<Record>,
    refused_count: u64,
    ignored_count: u64,
}

fn decode(partition: u32, fixes: &[InputFix], codec: &CodecSettings) -> Decoded {
    let mut out = Decoded {
        fixes: Vec::with_capacity(fixes.len()),
        refused: Vec::new(),
        refused_count: 0,
        ignored_count: 0,
    };
    let received = metrics::counter!(EVENTS_RECEIVED_TOTAL);
    received.increment(fixes.len() as u64);
    for (i, f) in fixes.iter().enumerate() {
        let fix = codec::decode(&f.topic, &f.payload, codec).and_then(|fix| {
            codec.check_clock(fix.fix_time_ms, f.stored_ms)?;
            Ok(fix)
        });
        match fix {
            Ok(fix) => {
                let digest = codec::message_digest(&f.topic, &f.payload);
                out.fixes.push((fix, f.stored_ms, digest, i));
            }
            // Routine traffic that is not a fix (an OwnTracks status, a
            // retained message cleared): ignored, as the MQTT pipeline does.
            Err(e) if e.reason.is_ignored() => {
                metrics::counter!(MESSAGES_IGNORED_TOTAL, "reason" => e.reason.as_str())
                    .increment(1);
                out.ignored_count += 1;
            }
            Err(e) => {
                metrics::counter!(EVENTS_INVALID_TOTAL, "reason" => e.reason.as_str()).increment(1);
                out.refused_count += 1;
                out.refused.push(Record {
                    received_ms: f.stored_ms,
                    topic: f.topic.clone(),
                    reason: e.reason.as_str(),
                    detail: e.detail,
                    payload: f.payload.clone(),
                    partition,
                });
            }
        }
    }
    out
}

/// A batch's completion: counts it, and dead-letters the fixes the state
/// did not apply (late, or the same message again).
struct Counted {
    partition: u32,
    /// The batch as read.
    fixes: Arc<Vec<InputFix>>,
    /// The fixes handed to the state, in order: where each is in `fixes`,
    /// its vehicle and its time.
    applied: Vec<(usize, VehicleId, i64)>,
    dead_letters: DeadLetters,
}

impl Completion for Counted {
    fn complete(self: Box<Self>, outcomes: Outcomes) {
        metrics::counter!(EVENTS_EVALUATED_TOTAL, "shard" => self.partition.to_string())
            .increment(outcomes.evaluated + outcomes.held);
        metrics::counter!(FIXES_LATE_TOTAL).increment(outcomes.late.len() as u64);
        // Counted as the pipeline counts a duplicate its state found.
        let duplicates = outcomes.duplicates.len() as u64;
        metrics::counter!(DUPLICATES_IGNORED_TOTAL, "by" => "state").increment(duplicates);
        metrics::counter!(EVENTS_INVALID_TOTAL, "reason" => "duplicate").increment(duplicates);
        let mut records = Vec::new();
        for late in &outcomes.late {
            if let Some((at, vehicle, fix_ms)) = self.applied.get(late.index) {
                records.push(self.record(*at, "late", format!(
                    "fix of {vehicle} at {fix_ms} ms is {:.3} s older than its vehicle's last applied fix, after the reorder window (pipeline.reorder_window_ms): no transition; reprocess it from here if it matters",
                    late.by_ms as f64 / 1000.0
                )));
            }
        }
        for &i in &outcomes.duplicates {
            if let Some((at, vehicle, fix_ms)) = self.applied.get(i) {
                records.push(self.record(*at, "duplicate", format!(
                    "fix of {vehicle} at {fix_ms} ms was applied already: the vehicle's state holds this message"
                )));
            }
        }
        self.dead_letters.send(records);
    }
}

impl Counted {
    fn record(&self, at: usize, reason: &'static str, detail: String) -> Record {
        let fix = &self.fixes[at];
        Record {
            received_ms: fix.stored_ms,
            topic: fix.topic.clone(),
            reason,
            detail,
            payload: fix.payload.clone(),
            partition: self.partition,
        }
    }
}
