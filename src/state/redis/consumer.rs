//! Delivers the partitions' outbox streams to this instance's events file.
//!
//! Every instance reads every partition through one consumer group, so the
//! broker-like stream hands each transition to one instance: `XREADGROUP`
//! moves it into that instance's pending list, the line is written and
//! synced (under either fsync policy: each delivery pass is one sync), and
//! only then does `XACK` remove it: what a power loss takes from the file's
//! unsynced tail is still pending, and written again. A crash between the write and the ack leaves it pending for the
//! same consumer name: at
//! start the instance reads its own pending entries first and skips those
//! whose `id` its file already ends with. An instance that stays away
//! longer than `claim_idle_s` has its pending entries claimed
//! (`XAUTOCLAIM`) by a live one, which writes them.
//!
//! With `events.mqtt` or `[events.webhook]` on, what was written is also
//! handed to each output's queue
//! (see [`super::output_cursor`]); an output never holds up the acks
//! here beyond its queue's bound.
//!
//! Streams are trimmed to the oldest entry the group still needs.

use super::SharedKeys;
use super::fence_sets::FenceSets;
use crate::backoff::Backoff;
use crate::crash_point;
use crate::delivery::events_backlog::Backlog as FileBacklog;
use crate::delivery::outbox::{OutboxEntry, transition_id};
use crate::delivery::output_queue::OutputFeed;
use crate::delivery::writer::EventsWriter;
use crate::geofence::{Transition, TransitionKind};
use crate::redis_link::RedisLink;
use crate::shutdown::Drain;
use crate::state::metrics::{
    OUTBOX_CLAIMED_TOTAL, OUTBOX_DELIVERED_TOTAL, OUTBOX_LAG_ENTRIES, OUTBOX_PENDING_ENTRIES,
    STATE_REDIS_CONNECTED, STATE_REDIS_ERRORS_TOTAL, STATE_REDIS_UNAVAILABLE_SECONDS,
};
use redis::AsyncCommands;
use redis::streams::{StreamAutoClaimOptions, StreamId, StreamReadOptions, StreamReadReply};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The consumer group every instance reads through.
pub const GROUP: &str = "geogate";

/// Entries read per partition per call.
const READ_COUNT: usize = 256;
/// Lines of the events file checked for ids at start: more than one
/// read's worth for every partition.
pub const RECENT_LINES: usize = 8192;
/// Pause when every partition was empty.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// How often abandoned entries are looked for and streams trimmed.
const HOUSEKEEPING: Duration = Duration::from_secs(2);
/// Lines of an output's backlog read at a time at start: memory stays
/// bounded however far behind it is.
const BACKLOG_PAGE: usize = 4096;

pub struct OutboxConsumer {
    pub link: RedisLink,
    pub keys: SharedKeys,
    pub partitions: u32,
    /// This instance's consumer name (its MQTT client id).
    pub me: String,
    pub file: EventsWriter,
    /// Seq for the next line.
    pub next_seq: u64,
    /// Ids on the file's last lines, checked against this consumer's own
    /// pending entries once, at start.
    pub recent: HashSet<String>,
    pub claim_idle: Duration,
    /// Entries written to the file whose ack has not gone through yet,
    /// by (partition, stream id), with the seq of their line (0: none was
    /// written): never written again, whoever hands them back (a re-read
    /// of the own pending list, a claim), and acked only once the file is
    /// synced past that seq.
    pub unacked: std::collections::BTreeMap<(u32, String), u64>,
    /// Registers this instance's fence set each housekeeping pass.
    pub fence_sets: FenceSets,
    /// Each output after the file (MQTT, the webhook): its queue's feed,
    /// and what the events files hold that it has not confirmed (handed
    /// over first, a page at a time).
    pub outputs: Vec<(OutputFeed, Option<FileBacklog>)>,
}

impl OutboxConsumer {
    /// Runs until `stop` turns true and a pass finds nothing more to
    /// deliver, or the drain deadline passes; then leaves the register of
    /// fence sets (and hangs up on the outputs).
    pub async fn run(mut self, stop: watch::Receiver<bool>, drain: Drain) {
        self.deliver_until(stop, drain).await;
        // Hung up first: the outputs start their final wait.
        self.outputs.clear();
        self.fence_sets.leave(&mut self.link).await;
    }

    async fn deliver_until(&mut self, mut stop: watch::Receiver<bool>, mut drain: Drain) {
        for i in 0..self.outputs.len() {
            if let Some(backlog) = self.outputs[i].1.take()
                && !self.hand_over_backlog(i, backlog, &mut drain).await
            {
                return;
            }
        }
        let errors = metrics::counter!(STATE_REDIS_ERRORS_TOTAL);
        let delivered = metrics::counter!(OUTBOX_DELIVERED_TOTAL);
        let claimed = metrics::counter!(OUTBOX_CLAIMED_TOTAL);
        let pending_gauge = metrics::gauge!(OUTBOX_PENDING_ENTRIES);
        let lag_gauge = metrics::gauge!(OUTBOX_LAG_ENTRIES);
        // The consumer calls Redis every pass, busy or idle, so it is the
        // one that tells whether Redis answers.
        let connected = metrics::gauge!(STATE_REDIS_CONNECTED);
        let unavailable = metrics::gauge!(STATE_REDIS_UNAVAILABLE_SECONDS);
        let mut failing_since: Option<Instant> = None;
        let mut backoff = Backoff::new();
        // Own pending entries first (id 0), then new ones (>).
        let mut reading_own = vec![true; self.partitions as usize];
        // The first pass does housekeeping: the fence set registers at once.
        let mut housekeeping = Instant::now()
            .checked_sub(HOUSEKEEPING)
            .unwrap_or_else(Instant::now);
        loop {
            let stopping = *stop.borrow();
            if drain.passed() {
                return;
            }
            let mut moved = 0usize;
            let mut failed = self.ack_written(&mut drain).await.err();
            for p in 0..self.partitions {
                let own = reading_own[p as usize];
                match self.read(p, if own { "0" } else { ">" }).await {
                    Ok(entries) => {
                        if own && entries.is_empty() {
                            reading_own[p as usize] = false;
                        }
                        match self.deliver(p, &entries, &mut drain).await {
                            Ok(n) => {
                                moved += entries.len();
                                delivered.increment(n);
                            }
                            Err(e) => failed = Some(e),
                        }
                    }
                    Err(e) => failed = Some(e),
                }
            }
            let mut registered = Ok(());
            if housekeeping.elapsed() >= HOUSEKEEPING {
                housekeeping = Instant::now();
                registered = self.fence_sets.register(&mut self.link).await;
                let mut pending = Some(0);
                let mut lag = Some(0);
                for p in 0..self.partitions {
                    match self.claim(p).await {
                        Ok(entries) if !entries.is_empty() => {
                            claimed.increment(entries.len() as u64);
                            match self.deliver(p, &entries, &mut drain).await {
                                Ok(n) => delivered.increment(n),
                                Err(e) => failed = Some(e),
                            }
                        }
                        Ok(_) => {}
                        Err(e) => failed = Some(e),
                    }
                    match self.trim(p).await {
                        Ok(backlog) => {
                            pending = pending.map(|n| n + backlog.pending);
                            lag = lag.zip(backlog.lag).map(|(n, m)| n + m);
                        }
                        Err(e) => {
                            (pending, lag) = (None, None);
                            failed = Some(e);
                        }
                    }
                }
                // Set only when every partition answered (and, for the
                // lag, Redis could tell: it cannot before 7.0).
                if let Some(n) = pending {
                    pending_gauge.set(n as f64);
                }
                if let Some(n) = lag {
                    lag_gauge.set(n as f64);
                }
            }
            if let Some(e) = failed {
                errors.increment(1);
                connected.set(0.0);
                let now = Instant::now();
                match failing_since.replace(now) {
                    Some(since) => unavailable.increment((now - since).as_secs_f64()),
                    None => tracing::warn!("outbox: {e}; retrying"),
                }
                tokio::time::sleep(backoff.step()).await;
                continue;
            }
            if let Err(e) = registered {
                // Redis answers (the pass went through): the register
                // itself failed. Said, not counted as an outage.
                tracing::warn!("fence sets: not registered: {e}");
            }
            if let Some(since) = failing_since.take() {
                unavailable.increment(since.elapsed().as_secs_f64());
                tracing::info!("outbox: Redis answers again");
            }
            connected.set(1.0);
            backoff.reset();
            if moved == 0 {
                if stopping {
                    // What is written is acked once it is on disk; what
                    // is not stays pending, and is skipped at the restart
                    // if the file has it.
                    let _ = self.ack_written(&mut drain).await;
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }

    async fn read(&mut self, p: u32, from: &str) -> Result<Vec<StreamId>, String> {
        let options = StreamReadOptions::default()
            .group(GROUP, &self.me)
            .count(READ_COUNT);
        let reply: Option<StreamReadReply> = self
            .link
            .xread_options(&[self.keys.outbox(p)], &[from], &options)
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default())
    }

    async fn claim(&mut self, p: u32) -> Result<Vec<StreamId>, String> {
        let reply: redis::streams::StreamAutoClaimReply = self
            .link
            .xautoclaim_options(
                self.keys.outbox(p),
                GROUP,
                &self.me,
                self.claim_idle.as_millis() as u64,
                "0-0",
                StreamAutoClaimOptions::default().count(READ_COUNT),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply.claimed)
    }

    /// Writes `entries` (skipping any the file already ends with), then
    /// acks them all. Returns how many lines were written.
    async fn deliver(
        &mut self,
        p: u32,
        entries: &[StreamId],
        drain: &mut Drain,
    ) -> Result<u64, String> {
        if entries.is_empty() {
            return Ok(0);
        }
        crash_point::reached("outbox.read");
        let mut written = Vec::new();
        let mut lines = Vec::with_capacity(entries.len());
        // Its age for the outputs after the file counts from here.
        let now_ms = crate::clock::receive_now_ms();
        for entry in entries {
            let key = (p, entry.id.clone());
            if self.unacked.contains_key(&key) {
                // Written already; only its ack is outstanding.
                continue;
            }
            let Some(t) = transition_of(entry) else {
                tracing::error!(
                    "outbox {}: entry {} is not a transition; acked and skipped",
                    self.keys.outbox(p),
                    entry.id
                );
                lines.push((key, 0));
                continue;
            };
            if self.recent.remove(&transition_id(&t)) {
                // The file had it at start, synced when it was opened.
                lines.push((key, 0));
                continue;
            }
            written.push(OutboxEntry::new(self.next_seq, &t).committed_at(now_ms));
            lines.push((key, self.next_seq));
            self.next_seq += 1;
        }
        if !self.file.write(&written, drain).await {
            // Past the deadline: the entries stay pending for this
            // consumer, and the queued lines are dropped with the process.
            return Err(format!("events file {}: not writable", path_of(&self.file)));
        }
        crash_point::reached("outbox.written");
        let count = written.len() as u64;
        // Written: from here on these entries must be acked, never
        // delivered again, so they are kept until an ack succeeds.
        self.unacked.extend(lines);
        if !self.publish(written, drain).await {
            return Err("the drain deadline passed with the MQTT queue full".into());
        }
        self.ack_written(drain).await?;
        Ok(count)
    }

    /// Hands written entries to every output once its queue has room for
    /// them (a full one holds this consumer, and the streams keep the
    /// rest); false if the drain deadline passed first.
    async fn publish(&mut self, entries: Vec<OutboxEntry>, drain: &mut Drain) -> bool {
        for i in 0..self.outputs.len() {
            if !self.hand_over(i, entries.clone(), drain).await {
                return false;
            }
        }
        true
    }

    /// Hands an output what the events files hold past its cursor, a
    /// page at a time, read off the runtime's threads; a failing read is
    /// retried until the drain deadline (false), when the output's cursor
    /// brings the rest back at the next start.
    async fn hand_over_backlog(
        &mut self,
        output: usize,
        mut backlog: FileBacklog,
        drain: &mut Drain,
    ) -> bool {
        let mut backoff = Backoff::new();
        loop {
            let read = tokio::task::spawn_blocking(move || {
                let page = backlog.next_page(BACKLOG_PAGE);
                (backlog, page)
            })
            .await;
            let page = match read {
                Ok((rest, Ok(page))) => {
                    backlog = rest;
                    backoff.reset();
                    page
                }
                Ok((rest, Err(e))) => {
                    backlog = rest;
                    tracing::warn!(
                        "events file {}: reading an output's backlog: {e}; retrying",
                        path_of(&self.file)
                    );
                    if drain.passed() {
                        return false;
                    }
                    tokio::time::sleep(backoff.step()).await;
                    continue;
                }
                Err(e) => {
                    tracing::error!("reading an output's backlog: {e}");
                    return false;
                }
            };
            if page.is_empty() {
                return true;
            }
            if !self.hand_over(output, page, drain).await {
                return false;
            }
        }
    }

    async fn hand_over(
        &mut self,
        output: usize,
        entries: Vec<OutboxEntry>,
        drain: &mut Drain,
    ) -> bool {
        let feed = &self.outputs[output].0;
        for piece in entries.chunks(feed.chunk().max(1)) {
            if !feed.make_room(piece.len(), drain).await {
                return false;
            }
            if !feed.send(piece.to_vec()) {
                // An output outlives this consumer unless it failed; its
                // cursor brings these back at the next start.
                tracing::error!(
                    "an output after the events file has stopped; its transitions wait in the events file until a restart"
                );
                return true;
            }
        }
        true
    }

    /// Acks every entry whose line is on disk, each partition on its own:
    /// a partition whose node is down does not hold back the others' acks.
    async fn ack_written(&mut self, drain: &mut Drain) -> Result<(), String> {
        // Synced first, whatever the fsync policy: an entry acked while its
        // line is not on disk would be lost to a power loss, and one kept
        // pending for a later sync would be claimed by another instance,
        // and written twice, if this one crashed meanwhile.
        if self
            .unacked
            .values()
            .any(|&seq| seq > self.file.synced_seq())
            && !self.file.sync_now(drain).await
        {
            return Err(format!(
                "events file {}: not synced by the drain deadline",
                path_of(&self.file)
            ));
        }
        let synced = self.file.synced_seq();
        let mut ready: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
        for ((p, id), seq) in &self.unacked {
            if *seq <= synced {
                ready.entry(*p).or_default().push(id.clone());
            }
        }
        let mut failure = None;
        for (p, ids) in ready {
            let acked: Result<u64, _> = self.link.xack(self.keys.outbox(p), GROUP, &ids).await;
            match acked {
                Ok(_) => {
                    for id in ids {
                        self.unacked.remove(&(p, id));
                    }
                }
                Err(e) => failure = Some(e.to_string()),
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Deletes what every consumer has been given and acked; on the way,
    /// reads the group's backlog on `p`.
    async fn trim(&mut self, p: u32) -> Result<Backlog, String> {
        let key = self.keys.outbox(p);
        let groups: redis::streams::StreamInfoGroupsReply = self
            .link
            .xinfo_groups(&key)
            .await
            .map_err(|e| e.to_string())?;
        let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else {
            return Ok(Backlog {
                pending: 0,
                lag: Some(0),
            });
        };
        let backlog = Backlog {
            pending: group.pending,
            lag: group.lag,
        };
        let pending: redis::streams::StreamPendingReply = self
            .link
            .xpending(&key, GROUP)
            .await
            .map_err(|e| e.to_string())?;
        // Everything before the oldest pending entry, or before the last
        // one handed out when nothing is pending, has been acked.
        let keep_from = match &pending {
            redis::streams::StreamPendingReply::Data(d) => d.start_id.clone(),
            _ => group.last_delivered_id.clone(),
        };
        let _: u64 = redis::cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg(&keep_from)
            .query_async(&mut self.link)
            .await
            .map_err(|e| e.to_string())?;
        Ok(backlog)
    }
}

/// A partition's entries the group has handed out and not had acked, and
/// (Redis ≥ 7) those not yet handed out.
struct Backlog {
    pending: usize,
    lag: Option<usize>,
}

fn path_of(file: &EventsWriter) -> String {
    file.path().display().to_string()
}

fn field(entry: &StreamId, name: &str) -> Option<String> {
    match entry.map.get(name)? {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn transition_of(entry: &StreamId) -> Option<Transition> {
    let event = match field(entry, "e")?.as_str() {
        "enter" => TransitionKind::Enter,
        "exit" => TransitionKind::Exit,
        _ => return None,
    };
    Some(Transition {
        vehicle: field(entry, "v")?.into(),
        fence: field(entry, "f")?.into(),
        event,
        ts: field(entry, "t")?.parse().ok()?,
        cause: None,
        received_ms: 0,
    })
}
