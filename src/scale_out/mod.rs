//! Scale-out on ordered partitions (`[state] backend = "partitioned"`,
//! decision 0025): devices publish MQTT to the engine (NATS), whose
//! mapping puts each vehicle in one of a fixed number of partitions, each
//! an ordered stream. Every instance runs this manager:
//!
//! * it heartbeats, and sees which instances are live ([`members`]);
//! * each partition should be owned by the live instance rendezvous
//!   hashing picks, and it holds a lease on those it owns
//!   ([`crate::state::partitioned::lease`]), renewed every third of a term;
//! * a partition whose lease is free, released, or unchanged for a whole
//!   term (its holder dead or paused) is taken, and an [`owner`] runs it;
//! * a partition that should move to another instance (one joined) is
//!   finished (its last batch committed), then its lease released, so the
//!   new owner takes it at once;
//! * a lease found taken by another instance stops the owner; the commit
//!   log refuses anything it still tries to write.
//!
//! A graceful stop (SIGTERM) finishes and releases every partition and
//! says it is leaving, so the others take its partitions within a tick.

pub mod dead_letters;
pub mod engine;
pub mod events_tail;
pub mod members;
pub mod owner;
pub mod status;

use crate::config::Config;
use crate::geofence::reload::{FenceReloader, LiveFences};
use crate::sink::dead_letter::DeadLetterSink;
use crate::state::metrics::FENCE_SETS_LIVE;
use crate::state::partitioned::PartitionError;
use crate::state::partitioned::lease::{ExpiryWatch, Lease, Leases};
use crate::state::partitioned::metrics::{
    FENCED_WRITES_TOTAL, OWNERSHIP_CHANGES_TOTAL, PARTITION_COMMIT_SECONDS, PARTITION_OWNED,
    PARTITIONS, SNAPSHOTS_TOTAL,
};
use dead_letters::DeadLetters;
use members::{Heartbeat, Members, owner_of};
use owner::OwnerContext;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum ScaleOutError {
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error("fences: {0}")]
    Fences(#[from] crate::geofence::FenceErrors),
    #[error("dead letter {path}: {source}")]
    DeadLetter {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Partition(#[from] PartitionError),
}

/// A released lease names no holder: free to take at once.
const RELEASED: &str = "";

struct Owned {
    lease: Lease,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), PartitionError>>,
    /// Finishing to hand over to `to`; released once the task ends.
    handing_to: Option<String>,
    /// When the lease was last renewed, on this machine's clock: an
    /// owner that cannot renew for a whole term stops.
    renewed: Instant,
}

/// Runs this instance's share of the partitions until `shutdown`
/// resolves. `on_ready` gets the fence reloader once the instance has
/// joined.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(FenceReloader),
) -> Result<(), ScaleOutError> {
    let pc = &config.state.partitioned;
    let instance = config.mqtt.client_id.clone();
    let term = Duration::from_secs_f64(pc.lease_term_s);
    let settings = config.evaluator_settings();
    let LiveFences {
        reloader,
        index,
        fingerprint,
    } = FenceReloader::load(&config.fences.path, settings)?;
    let dl = &config.dead_letter;
    let (sink, _) = DeadLetterSink::open(&dl.path, dl.rotate_bytes, dl.fsync)
        .map(|(sink, recovery)| (sink.keeping(dl.rotate_keep), recovery))
        .map_err(|source| ScaleOutError::DeadLetter {
            path: dl.path.display().to_string(),
            source,
        })?;
    let (dead_letters, dead_letter_task) = DeadLetters::start(sink);

    let js = engine::connect(pc, &instance).await?;
    engine::check_partition_count(&js, pc.partitions).await?;
    engine::make_inputs(&js, pc.partitions).await?;
    let leases = Leases::open(&js).await?;
    let mut members = Members::open(&js, term)
        .await
        .map_err(engine::EngineError::JetStream)?;
    let ctx = OwnerContext {
        js: js.clone(),
        instance: instance.clone(),
        codec: Arc::new(config.codec.clone()),
        settings,
        fences: index,
        snapshot_every: pc.snapshot_every,
        keep_input: pc.keep_input,
        events_max_age: Duration::from_secs(pc.events_max_age_s),
        per_fence_labels: config.metrics.per_fence_labels,
        dead_letters,
        sustained_rate: config.pipeline.sustained_rate,
    };
    metrics::gauge!(PARTITIONS).set(f64::from(pc.partitions));
    // Every series at zero from the start: a panel or alert sees a rate of
    // 0, not "no data", before the first change.
    for change in ["taken", "handed_off", "lost"] {
        metrics::counter!(OWNERSHIP_CHANGES_TOTAL, "change" => change).increment(0);
    }
    metrics::counter!(FENCED_WRITES_TOTAL).increment(0);
    metrics::counter!(SNAPSHOTS_TOTAL).increment(0);
    let _ = metrics::histogram!(PARTITION_COMMIT_SECONDS);
    for p in 0..pc.partitions {
        metrics::gauge!(PARTITION_OWNED, "partition" => p.to_string()).set(0.0);
    }
    let heartbeat = |leaving| Heartbeat {
        instance: instance.clone(),
        fences: fingerprint.borrow().clone(),
        leaving,
    };
    members
        .beat(&heartbeat(false))
        .await
        .map_err(engine::EngineError::JetStream)?;
    tracing::info!(instance, partitions = pc.partitions, "joined the fleet");
    on_ready(reloader);

    let mut manager = Manager {
        instance: instance.clone(),
        partitions: pc.partitions,
        term,
        leases,
        watch: ExpiryWatch::new(term),
        owned: BTreeMap::new(),
        ctx,
    };
    let mut tick = tokio::time::interval(term / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = members.beat(&heartbeat(false)).await {
            tracing::warn!("heartbeat: {e}");
        }
        let live = match members.live(&heartbeat(false)).await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!("members: {e}");
                manager.stop_unrenewed().await;
                continue;
            }
        };
        let fence_sets: std::collections::HashSet<&str> =
            live.values().map(|h| h.fences.as_str()).collect();
        metrics::gauge!(FENCE_SETS_LIVE).set(fence_sets.len() as f64);
        manager.tick(&live).await;
    }
    tracing::info!(instance, "leaving: finishing and releasing every partition");
    manager.release_all().await;
    if let Err(e) = members.beat(&heartbeat(true)).await {
        tracing::warn!("leaving heartbeat: {e}");
    }
    drop(manager);
    let _ = dead_letter_task.await;
    Ok(())
}

struct Manager {
    instance: String,
    partitions: u32,
    term: Duration,
    leases: Leases,
    watch: ExpiryWatch,
    owned: BTreeMap<u32, Owned>,
    ctx: OwnerContext,
}

impl Manager {
    async fn tick(&mut self, live: &BTreeMap<String, Heartbeat>) {
        self.reap_ended().await;
        // Every lease is watched from the first tick that sees it, so one
        // left by a dead instance runs out a term after its last renewal,
        // not a term after this instance first wanted its partition.
        let mut leases = match self.leases.all().await {
            Ok(leases) => leases,
            Err(e) => {
                tracing::warn!("{e}");
                self.stop_unrenewed().await;
                return;
            }
        };
        let now = Instant::now();
        for lease in leases.values() {
            self.watch.expired(lease, now);
        }
        for p in 0..self.partitions {
            let wanted = owner_of(p, live.keys().map(String::as_str)).map(str::to_owned);
            let mine = wanted.as_deref() == Some(self.instance.as_str());
            if self.owned.contains_key(&p) {
                self.keep_or_hand_over(p, mine, wanted).await;
            } else if mine {
                self.try_take(p, leases.remove(&p)).await;
            }
        }
        self.stop_unrenewed().await;
    }

    /// Renews a partition it should keep; starts handing over one that
    /// should move.
    async fn keep_or_hand_over(&mut self, p: u32, mine: bool, wanted: Option<String>) {
        let Some(owned) = self.owned.get_mut(&p) else {
            return;
        };
        if !mine && owned.handing_to.is_none() {
            tracing::info!(partition = p, to = ?wanted, "handing the partition over");
            owned.handing_to = wanted;
            let _ = owned.stop.send(true);
        }
        match self.leases.renew(&owned.lease).await {
            Ok(lease) => {
                owned.lease = lease;
                owned.renewed = Instant::now();
            }
            Err(PartitionError::LeaseLost { .. }) => {
                tracing::warn!(
                    partition = p,
                    "lease taken by another instance: stepping down"
                );
                let _ = owned.stop.send(true);
                let owned = self.owned.remove(&p);
                self.ended(p, owned, "lost").await;
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Takes partition `p`, whose lease is `current`, if that is free,
    /// released, this instance's own, or run out.
    async fn try_take(&mut self, p: u32, current: Option<Lease>) {
        let free = match &current {
            None => true,
            Some(l) if l.holder == RELEASED || l.holder == self.instance => true,
            Some(l) => self.watch.expired(l, Instant::now()),
        };
        if !free {
            return;
        }
        let lease = match self.leases.take(p, &self.instance, current.as_ref()).await {
            Ok(lease) => lease,
            Err(PartitionError::LeaseLost { .. }) => return,
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(owner::own(p, self.ctx.clone(), stopped));
        metrics::gauge!(PARTITION_OWNED, "partition" => p.to_string()).set(1.0);
        metrics::counter!(OWNERSHIP_CHANGES_TOTAL, "change" => "taken").increment(1);
        self.owned.insert(
            p,
            Owned {
                lease,
                stop,
                task,
                handing_to: None,
                renewed: Instant::now(),
            },
        );
    }

    /// Removes owners whose task has ended: handed over (then the lease is
    /// released), deposed, or failed.
    async fn reap_ended(&mut self) {
        let ended: Vec<u32> = self
            .owned
            .iter()
            .filter(|(_, o)| o.task.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for p in ended {
            let owned = self.owned.remove(&p);
            let change = if owned.as_ref().is_some_and(|o| o.handing_to.is_some()) {
                "handed_off"
            } else {
                "lost"
            };
            self.ended(p, owned, change).await;
        }
    }

    /// Waits for a stopped owner's task, reports how it ended, and
    /// releases its lease unless it was lost.
    async fn ended(&mut self, p: u32, owned: Option<Owned>, change: &'static str) {
        let Some(owned) = owned else { return };
        match owned.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("partition {p}: owner ended: {e}"),
            Err(e) => tracing::error!("partition {p}: owner failed: {e}"),
        }
        metrics::gauge!(PARTITION_OWNED, "partition" => p.to_string()).set(0.0);
        metrics::counter!(OWNERSHIP_CHANGES_TOTAL, "change" => change).increment(1);
        if change != "lost"
            && let Err(e) = self.leases.take(p, RELEASED, Some(&owned.lease)).await
        {
            tracing::warn!("partition {p}: releasing the lease: {e}");
        }
    }

    /// Stops the owners whose lease has not been renewed for a whole
    /// term (the engine unreachable): another instance may hold it now.
    async fn stop_unrenewed(&mut self) {
        let stale: Vec<u32> = self
            .owned
            .iter()
            .filter(|(_, o)| o.renewed.elapsed() >= self.term)
            .map(|(p, _)| *p)
            .collect();
        for p in stale {
            tracing::warn!(partition = p, "lease not renewed for a term: stepping down");
            if let Some(owned) = self.owned.remove(&p) {
                let _ = owned.stop.send(true);
                self.ended(p, Some(owned), "lost").await;
            }
        }
    }

    /// Finishes every partition and releases its lease (a graceful stop).
    async fn release_all(&mut self) {
        for owned in self.owned.values() {
            let _ = owned.stop.send(true);
        }
        let all: Vec<u32> = self.owned.keys().copied().collect();
        for p in all {
            let owned = self.owned.remove(&p);
            self.ended(p, owned, "handed_off").await;
        }
    }
}
