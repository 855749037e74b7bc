//! The outputs after the events stream (`[events] mqtt`, `[events.webhook]`)
//! for one partition, run by its owner: each reads the partition's
//! transitions from `GEOGATE_EVENTS` (`events.<p>`), in seq order, and
//! hands them to the same publisher and webhook the local backends use
//! ([`crate::delivery`]): bounded queues, a maximum age past which a
//! transition goes to the dead letter, and a cursor that moves only as
//! delivery is confirmed.
//!
//! * **At least once, by id.** Each output's cursor for the partition is
//!   kept in the engine ([`super::output_cursor`]) every half second while
//!   it moves (apart from reading, which may wait for room in the queue)
//!   and when the owner finishes; a new owner, on any machine, goes on
//!   from it, sending again, with the same ids, what was in flight.
//! * **In order per vehicle.** A vehicle lives in one partition, and a
//!   partition's transitions go out in seq order, one partition's queue
//!   per output. A repeat after an owner change that was not graceful (a
//!   crash, a pause) can arrive after later transitions: consumers drop
//!   it by its id.
//! * **Nothing lost silently.** The events stream keeps transitions for
//!   `[state] events_max_age_s`, at least twice any output's maximum age
//!   (`config check` sees to it), so each is delivered or dead-lettered
//!   before the stream lets it go. Should transitions be gone all the same
//!   (a fleet down for longer, the stream purged by hand), the gap in seqs
//!   is found and written to the dead letter as `events_missing`.
//! * **From when it was added.** An output with no cursor for a partition
//!   starts after the last transition the stream held when the owner took
//!   the partition over (read before that owner publishes anything), as an
//!   output added to the local backends does: it is not sent the
//!   stream's history.

use super::dead_letters::{DeadLetters, Record};
use super::output_cursor::{Cursor, OutputCursor};
use crate::crash_point;
use crate::delivery::metrics::{OUTPUT_PENDING_ENTRIES, output_labels};
use crate::delivery::outbox::OutboxEntry;
use crate::delivery::output_queue::{Expired, OutputFeed, OutputLimits};
use crate::delivery::publisher::Publisher;
use crate::delivery::targets::{MqttTarget, Targets};
use crate::delivery::webhook::{Webhook, WebhookTarget};
use crate::jetstream_link::subject_reader_after;
use crate::shutdown::{Drain, DrainControl};
use crate::sink::metrics::SINK_HEALTHY;
use crate::state::partitioned::events_stream::{STREAM, subject};
use async_nats::jetstream::consumer::{Consumer, pull};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// How often an output's cursor is written to the engine while it runs.
const PERSIST_EVERY: Duration = Duration::from_millis(500);

/// Events messages (one per commit) read at a time, and how long a read
/// waits for the first.
const READ_MAX: usize = 100;
const READ_WAIT: Duration = Duration::from_millis(250);

/// Where a partition stood as its owner took it over, for its outputs.
#[derive(Debug, Clone, Copy)]
pub struct TakeoverPoint {
    /// Where an output with no cursor yet starts: after the last
    /// transition the events stream held (worked out from the log before
    /// the owner publishes anything).
    pub fresh: Cursor,
    /// The last transition the log holds, published or not: a cursor past
    /// it belongs to a log made again.
    pub committed: u64,
}

/// What every partition's outputs share.
#[derive(Clone)]
pub struct OutputsContext {
    pub targets: Targets,
    /// This instance's name: its MQTT client ids are made from it.
    pub instance: String,
    pub dead_letters: DeadLetters,
    /// How long a finishing output may take to deliver what it holds
    /// (`pipeline.drain_deadline_s`).
    pub deadline: Duration,
}

#[derive(Clone)]
enum Output {
    Mqtt(MqttTarget),
    Webhook(WebhookTarget, OutputLimits),
}

impl Output {
    fn name(&self) -> &'static str {
        match self {
            Output::Mqtt(_) => "mqtt",
            Output::Webhook(..) => "webhook",
        }
    }
}

/// A task aborted when its handle is dropped: an output's parts never
/// outlive the owner that started them.
struct TaskGuard<T>(JoinHandle<T>);

impl<T> Drop for TaskGuard<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Once this instance runs a partition's output no more (finished,
/// deposed or failed), nothing of it is pending or failing here: a series
/// left at its last value would keep the output-down alert firing for a
/// partition owned elsewhere.
struct SeriesReset(&'static str, u32);

impl Drop for SeriesReset {
    fn drop(&mut self) {
        let labels = |key| output_labels(key, self.0, Some(self.1));
        metrics::gauge!(OUTPUT_PENDING_ENTRIES, &labels("output")).set(0.0);
        metrics::gauge!(SINK_HEALTHY, &labels("sink")).set(1.0);
    }
}

/// One partition's outputs, running.
pub struct PartitionOutputs {
    runs: Vec<(watch::Sender<bool>, TaskGuard<()>)>,
}

impl PartitionOutputs {
    /// Starts every configured output for `partition`. `at`: where the
    /// partition stood as the owner took it over. `owner_stop`: set when
    /// the owner is asked to stop; the outputs' deadline counts from then,
    /// so that they finish within the drain deadline the owner's manager
    /// keeps.
    pub fn start(
        ctx: &OutputsContext,
        js: &jetstream::Context,
        partition: u32,
        at: TakeoverPoint,
        owner_stop: watch::Receiver<bool>,
    ) -> Self {
        let outputs = ctx
            .targets
            .mqtt
            .clone()
            .map(Output::Mqtt)
            .into_iter()
            .chain(
                ctx.targets
                    .webhook
                    .clone()
                    .map(|(target, limits)| Output::Webhook(target, limits)),
            );
        let runs = outputs
            .map(|output| {
                let (stop, stopped) = watch::channel(false);
                let run = Run {
                    output,
                    partition,
                    js: js.clone(),
                    ctx: ctx.clone(),
                    at,
                    owner_stop: owner_stop.clone(),
                };
                (stop, TaskGuard(tokio::spawn(run.deliver(stopped))))
            })
            .collect();
        Self { runs }
    }

    /// Lets each output read the partition to its end, deliver what it
    /// holds (within the deadline) and store its cursor. Called once the
    /// owner has committed and published its last batch.
    pub async fn finish(mut self) {
        for (stop, _) in &self.runs {
            let _ = stop.send(true);
        }
        for (_, task) in &mut self.runs {
            let _ = (&mut task.0).await;
        }
    }
}

struct Run {
    output: Output,
    partition: u32,
    js: jetstream::Context,
    ctx: OutputsContext,
    at: TakeoverPoint,
    owner_stop: watch::Receiver<bool>,
}

impl Run {
    async fn deliver(self, mut stop: watch::Receiver<bool>) {
        let name = self.output.name();
        let p = self.partition;
        let Some((store, start)) = self.open_cursor(&stop).await else {
            return;
        };
        // Once the owner is asked to stop, the output has three quarters
        // of the drain deadline to deliver what it holds: its last cursor
        // is stored before the manager gives up on the owner.
        let (control, mut drain) = DrainControl::new();
        let deadline = self.ctx.deadline.mul_f64(0.75);
        let mut owner_stop = self.owner_stop.clone();
        let _deadline = TaskGuard(tokio::spawn(async move {
            if owner_stop.wait_for(|s| *s).await.is_ok() {
                control.begin(Instant::now() + deadline);
            }
        }));
        let _series = SeriesReset(name, p);
        let cursor = Arc::new(AtomicU64::new(start.seq));
        let placement = Arc::new(Mutex::new(Placement {
            next_read: start.read_from.max(1),
            placed: VecDeque::new(),
        }));
        let (last_store, last_stored) = watch::channel(false);
        let keeper = TaskGuard(tokio::spawn(keep_cursor(
            store,
            cursor.clone(),
            placement.clone(),
            last_stored,
        )));
        let (expired_tx, expired_rx) = mpsc::unbounded_channel();
        let forward = TaskGuard(tokio::spawn(forward_expired(
            expired_rx,
            self.ctx.dead_letters.clone(),
            p,
        )));
        let Some((output, feed)) = self
            .spawn_output(cursor.clone(), &drain, expired_tx, &stop)
            .await
        else {
            return;
        };
        let mut reader = EventsReader::new(&self, start.seq, placement);
        loop {
            let finishing = *stop.borrow_and_update();
            if finishing && drain.passed() {
                tracing::warn!(
                    partition = p,
                    output = name,
                    "not read to the partition's end within the drain deadline; the next owner goes on from the stored cursor"
                );
                break;
            }
            match reader.read_into(&feed, &mut drain).await {
                Ok(0) if finishing => match reader.caught_up().await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(partition = p, output = name, "{e}"),
                },
                Ok(_) => {}
                Err(ReadError::DrainPassed) => break,
                Err(ReadError::Engine(e)) => {
                    tracing::warn!(partition = p, output = name, "reading {STREAM}: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(READ_WAIT * 4) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
        // Hung up, the output delivers what it holds, then stops (at the
        // deadline at the latest); what it gave up on is in the dead letter
        // once the forwarder has written it. Then the cursor is stored a
        // last time.
        drop(feed);
        let _ = output.await_done().await;
        let _ = forward.await_done().await;
        let _ = last_store.send(true);
        let _ = keeper.await_done().await;
    }

    /// Reads the output's cursor, storing where a new one starts; `None`
    /// if the owner finished before the engine answered.
    async fn open_cursor(&self, stop: &watch::Receiver<bool>) -> Option<(OutputCursor, Cursor)> {
        let name = self.output.name();
        let p = self.partition;
        loop {
            let opened = async {
                let mut store = OutputCursor::open(&self.js, name, p).await?;
                let fresh = self.at.fresh;
                let start = match store.stored() {
                    Some(cursor) if cursor.seq <= self.at.committed => Cursor {
                        seq: cursor.seq,
                        // A position past the stream's end: the stream was
                        // made again, its positions start over, and it is
                        // read from its start (lines the output has are
                        // skipped by their seq).
                        read_from: if cursor.read_from <= fresh.read_from {
                            cursor.read_from
                        } else {
                            1
                        },
                    },
                    stored => {
                        if let Some(cursor) = stored {
                            // Past every transition the partition ever
                            // committed: its log was made again (seqs
                            // start over).
                            tracing::warn!(
                                partition = p,
                                output = name,
                                "the stored cursor (seq {}) is past the partition's last transition ({}): its log was made again; starting at the events stream's end",
                                cursor.seq,
                                self.at.committed
                            );
                        }
                        store.reset(fresh).await?;
                        fresh
                    }
                };
                Ok::<_, super::output_cursor::CursorError>((store, start))
            };
            match opened.await {
                Ok(opened) => return Some(opened),
                Err(e) => tracing::warn!(partition = p, output = name, "{e}"),
            }
            if *stop.borrow() {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Starts the publisher or the webhook on `cursor`; `None` if the
    /// owner finished first (a webhook client that cannot be built is
    /// tried again, said each time).
    async fn spawn_output(
        &self,
        cursor: Arc<AtomicU64>,
        drain: &Drain,
        dead_letter: mpsc::UnboundedSender<Expired>,
        stop: &watch::Receiver<bool>,
    ) -> Option<(TaskGuard<()>, OutputFeed)> {
        let p = Some(self.partition);
        loop {
            let (done, _) = std::sync::mpsc::channel();
            let spawned = match &self.output {
                Output::Mqtt(target) => {
                    // A client id per partition and instance: the session
                    // the publisher keeps is this owner's.
                    let id = format!("{}-events-p{}", self.ctx.instance, self.partition);
                    target.connection(&id).map_err(|e| e.to_string()).map(|c| {
                        Publisher::spawn(
                            c,
                            target.limits,
                            p,
                            cursor.clone(),
                            drain.clone(),
                            done,
                            Some(dead_letter.clone()),
                        )
                    })
                }
                Output::Webhook(target, limits) => Webhook::spawn(
                    target.clone(),
                    *limits,
                    p,
                    cursor.clone(),
                    drain.clone(),
                    done,
                    Some(dead_letter.clone()),
                )
                .map_err(|e| format!("{}: {e}", target.url)),
            };
            match spawned {
                Ok((task, feed)) => return Some((TaskGuard(task), feed)),
                Err(e) => tracing::error!(
                    partition = self.partition,
                    output = self.output.name(),
                    "cannot start: {e}; trying again"
                ),
            }
            if *stop.borrow() {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }
}

impl<T> TaskGuard<T> {
    /// Waits for the task to end.
    async fn await_done(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

/// What an output needs of a transition line besides its bytes.
#[derive(Deserialize)]
struct Placed<'a> {
    seq: u64,
    #[serde(borrow)]
    vehicle: std::borrow::Cow<'a, str>,
}

enum ReadError {
    DrainPassed,
    Engine(String),
}

/// Where a reader stands in the stream, shared with the task that stores
/// its cursor.
struct Placement {
    /// The stream position to read from next.
    next_read: u64,
    /// Each message read, as (its last seq, its stream position): where to
    /// read again from, for a cursor.
    placed: VecDeque<(u64, u64)>,
}

impl Placement {
    /// The cursor for `delivered` (the output's last confirmed seq): the
    /// position of the first message it still needs.
    fn cursor(&mut self, delivered: u64) -> Cursor {
        while self
            .placed
            .front()
            .is_some_and(|(last, _)| *last <= delivered)
        {
            self.placed.pop_front();
        }
        Cursor {
            seq: delivered,
            read_from: self.placed.front().map_or(self.next_read, |(_, at)| *at),
        }
    }
}

/// Stores the output's cursor every [`PERSIST_EVERY`] while it moves,
/// apart from reading (which can wait long for room in the output's
/// queue), and a last time once `last` is set.
async fn keep_cursor(
    mut store: OutputCursor,
    delivered: Arc<AtomicU64>,
    placement: Arc<Mutex<Placement>>,
    mut last: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(PERSIST_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last_time = tokio::select! {
            _ = tick.tick() => false,
            stop = last.wait_for(|l| *l) => match stop {
                Ok(_) => true,
                // The run was dropped: nothing more is stored.
                Err(_) => return,
            },
        };
        let cursor = match placement.lock() {
            Ok(mut placement) => placement.cursor(delivered.load(Relaxed)),
            Err(_) => return,
        };
        if store.stored().is_some_and(|c| c.seq < cursor.seq) {
            // Delivered past the stored cursor: a crash now sends it again.
            crash_point::reached("partition.output_store");
        }
        if let Err(e) = store.advance(cursor).await {
            tracing::warn!("{e}");
        }
        if last_time {
            return;
        }
    }
}

/// Reads one partition's transitions from the events stream, in order,
/// from a cursor.
struct EventsReader {
    js: jetstream::Context,
    partition: u32,
    output: &'static str,
    dead_letters: DeadLetters,
    stream: Option<stream::Stream>,
    reader: Option<Consumer<pull::Config>>,
    /// The last seq handed to the output (or its cursor, before any).
    last_seq: u64,
    placement: Arc<Mutex<Placement>>,
}

impl EventsReader {
    fn new(run: &Run, last_seq: u64, placement: Arc<Mutex<Placement>>) -> Self {
        Self {
            js: run.js.clone(),
            partition: run.partition,
            output: run.output.name(),
            dead_letters: run.ctx.dead_letters.clone(),
            stream: None,
            reader: None,
            last_seq,
            placement,
        }
    }

    fn next_read(&self) -> u64 {
        self.placement.lock().map_or(1, |p| p.next_read)
    }

    async fn stream(&mut self) -> Result<&stream::Stream, String> {
        if self.stream.is_none() {
            let stream = self
                .js
                .get_stream(STREAM)
                .await
                .map_err(|e| e.to_string())?;
            self.stream = Some(stream);
        }
        self.stream.as_ref().ok_or_else(|| STREAM.to_owned())
    }

    /// Hands the next transitions to the output, once its queue has room
    /// for them; how many messages it read.
    async fn read_into(
        &mut self,
        feed: &OutputFeed,
        drain: &mut Drain,
    ) -> Result<usize, ReadError> {
        let messages = match self.fetch().await {
            Ok(messages) => messages,
            Err(e) => {
                // Read again from the position before this read.
                self.reader = None;
                self.stream = None;
                return Err(ReadError::Engine(e));
            }
        };
        let read = messages.len();
        let mut entries = Vec::new();
        let mut missing = Vec::new();
        let mut placed = Vec::new();
        let mut next_read = self.next_read();
        for (position, committed_ms, payload) in messages {
            if position < next_read {
                continue;
            }
            next_read = position + 1;
            for line in payload.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let placed = match serde_json::from_slice::<Placed>(line) {
                    Ok(placed) => placed,
                    Err(e) => {
                        missing.push(self.record(
                            committed_ms,
                            format!("{STREAM} message {position}: a line that is not a transition ({e}); not delivered"),
                            line,
                        ));
                        continue;
                    }
                };
                if placed.seq <= self.last_seq {
                    continue;
                }
                if placed.seq > self.last_seq + 1 {
                    missing.push(self.record(
                        committed_ms,
                        format!(
                            "transitions {}..={} of partition {} were gone from {STREAM} when {} came to them (past [state] events_max_age_s, or purged): never delivered over it",
                            self.last_seq + 1,
                            placed.seq - 1,
                            self.partition,
                            self.output
                        ),
                        b"",
                    ));
                }
                self.last_seq = placed.seq;
                entries.push(OutboxEntry {
                    seq: placed.seq,
                    vehicle: placed.vehicle.as_ref().into(),
                    line: line.to_vec(),
                    committed_ms,
                });
            }
            placed.push((self.last_seq, position));
        }
        if let Ok(mut placement) = self.placement.lock() {
            placement.next_read = next_read;
            placement.placed.extend(placed);
        }
        self.dead_letters.write(missing).await;
        for piece in entries.chunks(feed.chunk().max(1)) {
            if !feed.make_room(piece.len(), drain).await {
                return Err(ReadError::DrainPassed);
            }
            feed.send(piece.to_vec());
        }
        Ok(read)
    }

    /// The next messages, each as (stream position, stored at in Unix ms,
    /// body); all or nothing.
    async fn fetch(&mut self) -> Result<Vec<(u64, i64, bytes::Bytes)>, String> {
        if self.reader.is_none() {
            let subject = subject(self.partition);
            let after = self.next_read().saturating_sub(1);
            let stream = self.stream().await?;
            let reader = subject_reader_after(stream, subject, after).await?;
            self.reader = Some(reader);
        }
        let reader = self.reader.as_ref().ok_or("no reader")?;
        let mut batch = reader
            .fetch()
            .max_messages(READ_MAX)
            .expires(READ_WAIT)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        let mut messages = Vec::new();
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| e.to_string())?;
            let info = message.info().map_err(|e| e.to_string())?;
            let stored_ms = (info.published.unix_timestamp_nanos() / 1_000_000) as i64;
            messages.push((
                info.stream_sequence,
                stored_ms,
                message.message.payload.clone(),
            ));
        }
        Ok(messages)
    }

    /// Whether the partition holds nothing past what was read.
    async fn caught_up(&mut self) -> Result<bool, String> {
        let subject = subject(self.partition);
        let next_read = self.next_read();
        match self
            .stream()
            .await?
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(last) => Ok(last.sequence < next_read),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(true),
            Err(e) => Err(e.to_string()),
        }
    }

    fn record(&self, committed_ms: i64, detail: String, payload: &[u8]) -> Record {
        Record {
            received_ms: committed_ms,
            topic: subject(self.partition),
            reason: "events_missing",
            detail,
            payload: bytes::Bytes::copy_from_slice(payload),
            partition: self.partition,
        }
    }
}

/// Writes what an output gave up on to the instance's dead letter (one
/// record each, the line as its payload, as the local backends do), and
/// tells the output once they are written.
async fn forward_expired(
    mut expired: mpsc::UnboundedReceiver<Expired>,
    dead_letters: DeadLetters,
    partition: u32,
) {
    while let Some(e) = expired.recv().await {
        let reason = match (e.output, e.why) {
            ("mqtt", "expired") => "mqtt_expired",
            ("webhook", "expired") => "webhook_expired",
            ("webhook", "gone") => "webhook_gone",
            ("webhook", "rejected") => "webhook_rejected",
            _ => "output_refused",
        };
        let records = e
            .entries
            .iter()
            .map(|x| Record {
                received_ms: x.committed_ms,
                topic: format!("geogate/events/{}", x.vehicle),
                reason,
                detail: format!("seq {}: {}", x.seq, e.detail),
                payload: bytes::Bytes::from(x.line.clone()),
                partition,
            })
            .collect();
        dead_letters.write(records).await;
        let _ = e.written.send(());
    }
}
