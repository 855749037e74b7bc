//! The state stage as the pipeline (and its benchmark) starts it: the
//! store opened and read back, the committer on a thread of its own, the
//! relay and, when transitions also go over MQTT, the publisher.

use super::commit::{CommitRequest, Committer, Cursors, MAX_BATCHES_PER_COMMIT};
use super::publisher::Publisher;
use super::relay::Relay;
use super::{StateError, open};
use crate::config::StateConfig;
use crate::geofence::{Evaluator, EvaluatorSettings, FenceIndex, VehicleSnapshot};
use crate::model::VehicleId;
use crate::pipeline::shard::shard_of;
use crate::sink::append_file::AppendFile;
use crate::sink::health::SinkHealth;
use rumqttc::{MqttOptions, NetworkOptions};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub struct StateStage {
    /// Where workers send their batches.
    pub commits: mpsc::Sender<CommitRequest>,
    durable: bool,
    /// Committed vehicle state, by shard, until its worker starts.
    restored: Vec<Vec<(VehicleId, VehicleSnapshot)>>,
    committer: JoinHandle<()>,
    relay: JoinHandle<()>,
    publisher: Option<JoinHandle<()>>,
}

impl StateStage {
    /// Opens the store (see [`super::open`] for what refuses a start) and
    /// starts the committer, relay and publisher. Workers must be started
    /// with [`Self::evaluator`].
    pub fn start(
        config: &StateConfig,
        events_path: Option<&Path>,
        events_connection: Option<(MqttOptions, NetworkOptions)>,
        shards: usize,
        deadline: watch::Receiver<Option<Instant>>,
    ) -> Result<Self, StateError> {
        let opened = open(config, events_path)?;
        let durable = opened.store.durable();
        let recovered = opened.recovered;
        if durable {
            tracing::info!(
                vehicles = recovered.vehicles.len(),
                outbox = recovered.outbox.len(),
                "state {} opened{}",
                config.path.display(),
                if recovered.created { " (new)" } else { "" }
            );
        }
        let mut restored: Vec<Vec<_>> = (0..shards.max(1)).map(|_| Vec::new()).collect();
        for (vehicle, snapshot) in recovered.vehicles {
            restored[shard_of(&vehicle, shards)].push((vehicle, snapshot));
        }
        // A destination that is not configured never holds the outbox back.
        let cursors = Arc::new(Cursors {
            file: AtomicU64::new(events_path.map_or(u64::MAX, |_| opened.file_seq)),
            mqtt: AtomicU64::new(
                // Stored as "all" while no broker was configured: one
                // configured since then starts after what is committed,
                // not after everything that will ever be.
                events_connection.as_ref().map_or(u64::MAX, |_| {
                    recovered
                        .mqtt_cursor
                        .min(recovered.next_seq.saturating_sub(1))
                }),
            ),
        });
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // The file first: if it cannot be opened, nothing has been started.
        let file = match events_path {
            Some(path) => {
                let file = AppendFile::open(path).map_err(|source| StateError::EventsFile {
                    path: path.to_owned(),
                    source,
                })?;
                Some((
                    file,
                    SinkHealth::new("events", path, "its message stays unacked"),
                ))
            }
            None => None,
        };
        let (publisher, to_publisher) = match events_connection {
            Some(connection) => {
                let (publisher, tx) = Publisher::spawn(
                    connection,
                    cursors.clone(),
                    deadline.clone(),
                    done_tx.clone(),
                    recovered.outbox.clone(),
                );
                (Some(publisher), Some(tx))
            }
            None => (None, None),
        };
        let (committed_tx, committed_rx) = mpsc::unbounded_channel();
        let relay = Relay {
            file,
            fsync: config.fsync,
            file_seq: opened.file_seq,
            cursors: cursors.clone(),
            publisher: to_publisher,
            deadline: deadline.clone(),
            done: done_tx,
        };
        let relay = tokio::spawn(relay.run(recovered.outbox, committed_rx));
        // Room for what a spaced commit gathers, and the same for the
        // memory store: with `pipeline.sched_batch` (the default) the
        // committer's thread, woken, waits for a core instead of preempting,
        // and with the memory store's old 4 batches a shard the workers
        // kept filling the queue, parking and being woken again. 64 for 2
        // shards: `pipeline_memory/2` 1.04–1.06× faster, about 37% fewer
        // context switches; level with `sched_batch = false`
        // (BENCHMARKS.md, "A longer commit queue").
        let (commits, commits_rx) = mpsc::channel(MAX_BATCHES_PER_COMMIT.max(shards * 4));
        let committer = Committer {
            store: opened.store,
            next_seq: recovered.next_seq,
            cursors,
            relay: committed_tx,
            relay_done: done_rx,
            deadline,
        };
        let committer = tokio::task::spawn_blocking(move || committer.run(commits_rx));
        Ok(Self {
            commits,
            durable,
            restored,
            committer,
            relay,
            publisher,
        })
    }

    /// The evaluator for `shard`, holding that shard's committed vehicles.
    pub fn evaluator(
        &mut self,
        shard: usize,
        index: Arc<FenceIndex>,
        settings: EvaluatorSettings,
    ) -> Evaluator {
        let mut evaluator = Evaluator::new(index, settings);
        if self.durable {
            evaluator = evaluator.tracking_changes();
        }
        if let Some(vehicles) = self.restored.get_mut(shard) {
            for (vehicle, snapshot) in vehicles.drain(..) {
                evaluator.restore(vehicle, &snapshot);
            }
        }
        evaluator
    }

    /// Resolves once every batch the workers sent is committed and out:
    /// the committer ends when the last worker drops its sender, then
    /// waits for the relay and the publisher.
    pub fn finish(self) -> impl Future<Output = ()> {
        let Self {
            commits,
            committer,
            relay,
            publisher,
            ..
        } = self;
        drop(commits);
        async move {
            let _ = committer.await;
            let _ = relay.await;
            if let Some(publisher) = publisher {
                let _ = publisher.await;
            }
        }
    }
}
