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
pub mod manager;
pub mod members;
pub mod output_cursor;
pub mod outputs;
pub mod owner;
pub mod status;

use crate::config::Config;
use crate::delivery::targets::Targets;
use crate::geofence::registry::FenceRegistry;
use crate::sink::dead_letter::DeadLetterSink;
use crate::state::StateError;
use crate::state::metrics::FENCE_SETS_LIVE;
use crate::state::partitioned::PartitionError;
use crate::state::partitioned::lease::Leases;
use crate::state::partitioned::metrics::{
    FENCED_WRITES_TOTAL, OWNERSHIP_CHANGES_TOTAL, PARTITION_COMMIT_SECONDS, PARTITION_OWNED,
    PARTITIONS, SNAPSHOTS_TOTAL,
};
use dead_letters::DeadLetters;
use manager::Manager;
use members::{Heartbeat, Members};
use outputs::OutputsContext;
use owner::OwnerContext;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ScaleOutError {
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error("fences: {0}")]
    Fences(#[from] crate::geofence::FenceErrors),
    #[error("{0}")]
    State(#[from] StateError),
    #[error("dead letter {path}: {source}")]
    DeadLetter {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Partition(#[from] PartitionError),
    #[error("{0}")]
    Outputs(#[from] crate::delivery::targets::TargetError),
}

/// Runs this instance's share of the partitions until `shutdown`
/// resolves. `on_ready` gets the fence reloader once the instance has
/// joined.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(FenceRegistry),
) -> Result<(), ScaleOutError> {
    let pc = &config.state.partitioned;
    let instance = config.mqtt.client_id.clone();
    let term = Duration::from_secs_f64(pc.lease_term_s);
    let settings = config.evaluator_settings();
    let path = config
        .fences
        .path
        .as_deref()
        .ok_or(StateError::NoFenceFile)?;
    let registry = FenceRegistry::from_file(path, settings, crate::clock::receive_now_ms())?;
    let (index, fingerprint) = (registry.subscribe(), registry.fingerprint());
    let dl = &config.dead_letter;
    let (sink, _) = DeadLetterSink::open(&dl.path, dl.rotate_bytes, dl.fsync)
        .map(|(sink, recovery)| (sink.keeping(dl.rotate_keep), recovery))
        .map_err(|source| ScaleOutError::DeadLetter {
            path: dl.path.display().to_string(),
            source,
        })?;
    let (dead_letters, dead_letter_task) = DeadLetters::start(sink);
    let targets = Targets::configured(&config.events, &config.mqtt)?;
    if let Some(mqtt) = &targets.mqtt {
        // The events broker's TLS files are read now: a bad one stops the
        // start instead of every partition's publisher.
        mqtt.connection(&instance)?;
    }

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
        fence_properties: config.events.fence_properties(),
        keep_input: pc.keep_input,
        events_max_age: Duration::from_secs(pc.events_max_age_s),
        per_fence_labels: config.metrics.per_fence_labels,
        dead_letters: dead_letters.clone(),
        sustained_rate: config.pipeline.sustained_rate,
        outputs: OutputsContext {
            targets,
            instance: instance.clone(),
            dead_letters,
            deadline: Duration::from_secs_f64(config.pipeline.drain_deadline_s),
        },
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
    on_ready(registry);

    let mut manager = Manager::new(instance.clone(), pc.partitions, term, leases, ctx);
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
                continue;
            }
        };
        let fence_sets: std::collections::HashSet<&str> =
            live.values().map(|h| h.fences.as_str()).collect();
        metrics::gauge!(FENCE_SETS_LIVE).set(fence_sets.len() as f64);
        manager.tick(&live).await;
    }
    tracing::info!(instance, "leaving: finishing and releasing every partition");
    manager
        .release_all(Duration::from_secs_f64(config.pipeline.drain_deadline_s))
        .await;
    if let Err(e) = members.beat(&heartbeat(true)).await {
        tracing::warn!("leaving heartbeat: {e}");
    }
    drop(manager);
    let _ = dead_letter_task.await;
    Ok(())
}
