//! The shared state as the pipeline starts it: Redis reached and checked,
//! the consumer group made, the outbox consumer running; workers get an
//! [`SharedApplier`] each.

use super::applier::SharedApplier;
use super::consumer::{GROUP, OutboxConsumer, RECENT_LINES};
use super::fence_sets::FenceSets;
use super::output_cursor::OutputCursor;
use super::{SharedRules, SharedStateError};
use crate::delivery::Outputs;
use crate::delivery::events_backlog::Backlog;
use crate::delivery::events_file;
use crate::delivery::publisher::Publisher;
use crate::delivery::webhook::Webhook;
use crate::delivery::writer::EventsWriter;
use crate::geofence::{EvaluatorSettings, FenceIndex};
use crate::redis_link::RedisLink;
use crate::shutdown::Drain;
use crate::state::StateConfig;
use crate::state::StateError;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct SharedStage {
    rules: Arc<SharedRules>,
    link: RedisLink,
    stop: watch::Sender<bool>,
    consumer: JoinHandle<()>,
    /// Each output after the events file: its task, what keeps its cursor,
    /// and that one's stop.
    senders: Vec<(JoinHandle<()>, JoinHandle<()>, watch::Sender<bool>)>,
}

impl SharedStage {
    /// Connects, checks that every instance agrees on the partitions, makes
    /// the consumer group, and starts delivering to `events`.
    pub async fn start(
        config: &StateConfig,
        settings: &EvaluatorSettings,
        events: &Path,
        consumer_name: &str,
        outputs: Outputs,
        fence_set: watch::Receiver<String>,
        drain: Drain,
    ) -> Result<Self, StateError> {
        let shared = |e: SharedStateError| StateError::Shared(e.to_string());
        let timeout = Duration::from_millis(config.redis.timeout_ms);
        let mut link = RedisLink::connect(
            &config.redis.urls,
            config.redis.cluster,
            timeout,
            &Default::default(),
        )
        .await
        .map_err(|e| StateError::Shared(e.to_string()))?;
        let rules = Arc::new(SharedRules::new(
            &config.redis.prefix,
            config.redis.partitions,
            settings.max_memberships,
            settings.idle_expiry_ms,
        ));
        rules.agree_on_partitions(&mut link).await.map_err(shared)?;
        for p in 0..config.redis.partitions {
            let made: redis::RedisResult<()> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(rules.keys.outbox(p))
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut link)
                .await;
            if let Err(e) = made
                && e.code() != Some("BUSYGROUP")
            {
                return Err(shared(e.into()));
            }
        }
        let events_error = |source| StateError::EventsFile {
            path: events.to_owned(),
            source,
        };
        // Before anything touches the file: no second geogate writes it.
        let lock = events_file::lock(events).map_err(events_error)?;
        let tail = events_file::read(events).map_err(events_error)?;
        events_file::cut_torn(events, &tail).map_err(events_error)?;
        let recent = events_file::recent_ids(events, RECENT_LINES).map_err(events_error)?;
        let next_seq = tail.last_seq.unwrap_or(0) + 1;
        let mut file = EventsWriter::open(
            events,
            lock,
            config.fsync,
            outputs.rotation,
            next_seq - 1,
            "its transitions stay in the outbox",
        )
        .map_err(events_error)?;
        let (stop, stop_rx) = watch::channel(false);
        // Each output after the file: its cursor beside the file, what the
        // file holds past it (handed over first), and its queue.
        let mut feeds = Vec::new();
        let mut senders = Vec::new();
        let follow = |output: &'static str| -> Result<_, StateError> {
            let cursor = OutputCursor::beside(events, output);
            let confirmed = cursor.load(next_seq - 1).map_err(StateError::Shared)?;
            let until = next_seq - 1;
            let mut backlog = Backlog::open(events, confirmed, until).map_err(events_error)?;
            let first = backlog.first_seq().map_err(events_error)?;
            if first.unwrap_or(next_seq) > confirmed + 1 {
                tracing::error!(
                    "{output}: seqs {}..={} are in none of the events files (moved or deleted by hand); they are not sent",
                    confirmed + 1,
                    first.unwrap_or(next_seq) - 1
                );
            }
            if let Some(first) = first {
                tracing::info!(
                    "{output}: seqs {first}..={until} in {} (and the files rotated from it) after the last confirmed one; sending them again",
                    events.display()
                );
            }
            Ok((cursor, Arc::new(AtomicU64::new(confirmed)), Some(backlog)))
        };
        // Nothing waits for the outputs' `done`: the stage awaits their
        // tasks instead.
        let (done, _) = std::sync::mpsc::channel();
        let mut keep = |cursor: OutputCursor, position: Arc<AtomicU64>, task, feed, backlog| {
            let (keeper_stop, keeper_stop_rx) = watch::channel(false);
            let confirmed = position.load(std::sync::atomic::Ordering::Relaxed);
            file.keep_files_for(position.clone());
            let keeper = tokio::spawn(cursor.keep(confirmed, position, keeper_stop_rx));
            feeds.push((feed, backlog));
            senders.push((task, keeper, keeper_stop));
        };
        match outputs.mqtt {
            Some((options, network, limits)) => {
                let (cursor, position, backlog) = follow("mqtt")?;
                let (task, feed) = Publisher::spawn(
                    (options, network),
                    limits,
                    position.clone(),
                    drain.clone(),
                    done.clone(),
                    outputs.dead_letter.clone(),
                );
                keep(cursor, position, task, feed, backlog);
            }
            None => OutputCursor::beside(events, "mqtt")
                .forget()
                .map_err(StateError::Shared)?,
        }
        match outputs.webhook {
            Some((target, limits)) => {
                let (cursor, position, backlog) = follow("webhook")?;
                let url = target.url.to_string();
                let (task, feed) = Webhook::spawn(
                    target,
                    limits,
                    position.clone(),
                    drain.clone(),
                    done.clone(),
                    outputs.dead_letter.clone(),
                )
                .map_err(|e| StateError::Webhook(format!("{url}: {e}")))?;
                keep(cursor, position, task, feed, backlog);
            }
            None => OutputCursor::beside(events, "webhook")
                .forget()
                .map_err(StateError::Shared)?,
        }
        let consumer = OutboxConsumer {
            link: link.clone(),
            keys: rules.keys.clone(),
            partitions: config.redis.partitions,
            me: consumer_name.to_owned(),
            file,
            next_seq,
            recent,
            claim_idle: Duration::from_secs_f64(config.redis.claim_idle_s),
            fence_sets: FenceSets::new(
                rules.keys.meta("fence_sets"),
                consumer_name,
                fence_set,
                Duration::from_secs_f64(config.redis.claim_idle_s),
            ),
            unacked: Default::default(),
            outputs: feeds,
        };
        tracing::info!(
            "state in redis {} (prefix {}, {} partitions); this instance delivers as {consumer_name}",
            config.redis.urls.join(","),
            config.redis.prefix,
            config.redis.partitions
        );
        Ok(Self {
            rules,
            consumer: tokio::spawn(consumer.run(stop_rx, drain)),
            link,
            stop,
            senders,
        })
    }

    /// A worker's way into the shared state.
    pub fn applier(&self, index: Arc<FenceIndex>, settings: EvaluatorSettings) -> SharedApplier {
        SharedApplier::new(self.rules.clone(), self.link.clone(), index, settings)
    }

    /// After the workers: delivers what is left (until the drain
    /// deadline), then stops.
    pub async fn finish(self) {
        let _ = self.stop.send(true);
        let _ = self.consumer.await;
        // The consumer hung up on the outputs, which deliver what they hold
        // (until the deadline); then each cursor is kept once more.
        for (task, keeper, stop) in self.senders {
            let _ = task.await;
            let _ = stop.send(true);
            let _ = keeper.await;
        }
    }
}
