//! The running service: wires the live pipeline together and runs it until
//! shutdown:
//! intake (MQTT, split into lanes by topic) → decode lanes → router (dedup,
//! admission) → shard workers → state (geofences, durable commits) →
//! delivery (events file, MQTT), with every refusal in the dead letter and
//! every message counted (see [`crate::pipeline::accounting`]).
//!
//! Shutdown: stop taking new messages (later ones stay unacked for
//! redelivery), let the router finish what intake holds, let workers drain
//! until the queues are empty or the drain deadline passes, ack everything
//! finished, flush the sinks, and return the balance.

use crate::admission::{Admission, AdmissionPolicy, GateKind};
use crate::allowance::{GlobalAllowance, RedisTarget, SharedBucket};
use crate::clock::MonotonicClock;
use crate::codec::Dedup;
use crate::config::Config;
use crate::delivery::Outputs;
use crate::delivery::targets::Targets;
use crate::geofence::FenceErrors;
pub use crate::geofence::registry::FenceRegistry;
use crate::geofence::{parse_fences, read_fence_file};
use crate::pipeline::accounting::{Accounting, Balance};
use crate::pipeline::metrics::{EVENTS_IN_QUEUE, QUEUE_DEPTH, QUEUE_WATERMARK};
use crate::pipeline::{decode, shard};
use crate::redis_link::RedisSecurity;
use crate::shutdown::DrainControl;
use crate::sink::dead_letter::{DeadLetterSink, Recovery};
use crate::source::Completions;
use crate::source::intake::Intake;
use crate::source::mqtt::{self, Acker, IntakeControl, LiveConnection, poll::PollTask};
use crate::state::{FenceSupply, OpenContext, StateError};
use rumqttc::AsyncClient;
use shard::completion::ShardCounters;
use shard::input::shaper_lane;
use shard::queue::FillView;
use shard::vehicle_query::VehicleQueries;
use shard::{DeadLetterMirror, RefusalCounters, Router, ShardInput, WorkerContext};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("fences: {0}")]
    Fences(#[from] FenceErrors),
    #[error("dead letter {path}: {source}")]
    DeadLetter {
        path: String,
        source: std::io::Error,
    },
    #[error("events file {path}: {source}")]
    Events {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] StateError),
    #[error("config: {0}")]
    Config(String),
    #[error("mqtt: {0}")]
    Mqtt(std::io::Error),
    #[error("api: {0}")]
    Api(String),
}

/// A read-only view of a running pipeline, for progress displays.
pub struct PipelineView {
    pub accounting: Arc<Accounting>,
    /// Fill views: they must not keep the queues open at shutdown.
    queues: Vec<FillView>,
    pub queue_capacity: usize,
    pub watermark: f64,
    subscribed: watch::Receiver<bool>,
}

impl PipelineView {
    /// Resolves once every MQTT filter is confirmed (false if the pipeline
    /// ended first). A broker routes only to existing subscriptions, so a
    /// publisher in this process that started earlier would lose its first
    /// messages.
    pub async fn subscribed(&self) -> bool {
        self.subscribed.clone().wait_for(|s| *s).await.is_ok()
    }

    /// Each shard's queue fill as a fraction of its capacity.
    pub fn queue_fill(&self) -> Vec<f64> {
        self.queues
            .iter()
            .map(|q| q.depth().map_or(0.0, |d| d as f64 / q.capacity() as f64))
            .collect()
    }
}

/// Keeps the queue gauges current between admissions (an idle queue would
/// otherwise show its last busy depth forever).
async fn refresh_gauges(accounting: Arc<Accounting>, queues: Vec<FillView>) {
    let depth: Vec<metrics::Gauge> = (0..queues.len())
        .map(|s| metrics::gauge!(QUEUE_DEPTH, "shard" => s.to_string()))
        .collect();
    let in_queue = metrics::gauge!(EVENTS_IN_QUEUE);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        in_queue.set(accounting.balance().in_queue as f64);
        for (gauge, queue) in depth.iter().zip(&queues) {
            if let Some(d) = queue.depth() {
                gauge.set(d as f64);
            }
        }
    }
}

/// Binds the API's address (a taken one stops the start) and serves it
/// until told to stop.
async fn start_api(
    config: &crate::api::ApiConfig,
    registry: FenceRegistry,
    queries: VehicleQueries,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    ServiceError,
> {
    let token = config.load_token().map_err(ServiceError::Api)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| ServiceError::Api(format!("cannot listen on {}: {e}", config.listen)))?;
    let address = listener.local_addr().unwrap_or(config.listen);
    tracing::info!(%address, "api listening");
    let api = crate::api::Api::new(config, &token, registry, Some(queries));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let max_body = config.max_body_bytes;
    let task = tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        if let Err(e) = crate::api::serve(listener, api, max_body, stopped).await {
            tracing::error!("api: {e}");
        }
    });
    Ok((stop, task))
}

/// Polls a connection that only publishes (events, dead-letter mirror).
async fn drive_output(mut eventloop: rumqttc::EventLoop) {
    loop {
        if let Err(e) = eventloop.poll().await {
            tracing::warn!("output connection: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Runs the service until `shutdown` resolves; returns the final balance.
/// `on_ready` receives the fence registry and a view once everything runs.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(FenceRegistry, PipelineView),
) -> Result<Balance, ServiceError> {
    let settings = config.evaluator_settings();
    let fence_file = match &config.fences.path {
        Some(path) => {
            let fences = parse_fences(&read_fence_file(path)?)?;
            tracing::info!(fences = fences.len(), "fence file read");
            Some(fences)
        }
        None => None,
    };

    let dl = &config.dead_letter;
    let (dead_letter, recovery) = DeadLetterSink::open(&dl.path, dl.rotate_bytes, dl.fsync)
        .map(|(sink, recovery)| (sink.keeping(dl.rotate_keep), recovery))
        .map_err(|source| ServiceError::DeadLetter {
            path: dl.path.display().to_string(),
            source,
        })?;
    if let Recovery::TornTail { bytes } = recovery {
        tracing::warn!(
            "dead letter {}: last record was torn ({bytes} bytes) by an earlier crash; kept it and continued on a new line",
            dl.path.display()
        );
    }

    let accounting = Arc::new(Accounting::default());
    let control = IntakeControl::default();

    let (drain_control, drain) = DrainControl::new();

    // Output connection: the dead-letter mirror.
    let output = if let Some(topic) = &dl.mqtt_topic {
        let id = format!("{}-out", config.mqtt.client_id);
        let options = mqtt::connection(&config.mqtt, &id).map_err(ServiceError::Mqtt)?;
        let (client, mut eventloop) = AsyncClient::new(options, 10_000);
        eventloop.set_network_options(mqtt::network_options(&config.mqtt));
        tokio::spawn(drive_output(eventloop));
        Some(DeadLetterMirror {
            client,
            topic: topic.clone(),
        })
    } else {
        None
    };

    // State: a missing or held state file stops the start here, before
    // anything is taken from the broker.
    let targets = Targets::configured(&config.events, &config.mqtt)
        .map_err(|e| ServiceError::Config(e.to_string()))?;
    let events_mqtt = match &targets.mqtt {
        Some(target) => {
            let id = format!("{}-events", config.mqtt.client_id);
            let (options, network) = target
                .connection(&id)
                .map_err(|e| ServiceError::Config(e.to_string()))?;
            Some((options, network, target.limits))
        }
        None => None,
    };
    // What an output gives up on goes to the router, which owns the dead
    // letter.
    let (expired_tx, expired_rx) = mpsc::unbounded_channel();
    let mut backend = crate::state::backends::open(
        &config.state,
        OpenContext {
            events: config.events.path.clone(),
            outputs: Outputs {
                rotation: config.events.rotation(),
                mqtt: events_mqtt,
                webhook: targets.webhook,
                dead_letter: Some(expired_tx),
            },
            settings,
            fences: FenceSupply {
                source: config.fences.source,
                file: fence_file,
            },
            shards: config.pipeline.shard_count(),
            per_fence_labels: config.metrics.per_fence_labels,
            fence_properties: config.events.fence_properties(),
            drain: drain.clone(),
        },
    )
    .await?;
    let registry = FenceRegistry::new(
        backend.fences(),
        backend.fence_journal(),
        settings,
        config.fences.source,
        config.fences.path.clone(),
    );
    let fence_rx = registry.subscribe();
    tracing::info!(
        fences = registry.current().len(),
        version = registry.current().version(),
        source = ?config.fences.source,
        "fence set live"
    );

    // Intake connection.
    let max_unacked = config.mqtt.max_unacked;
    let intake_options =
        mqtt::options(&config.mqtt, &config.mqtt.client_id).map_err(ServiceError::Mqtt)?;
    let (client, mut eventloop) = AsyncClient::new(intake_options, max_unacked * 2 + 64);
    eventloop.set_network_options(mqtt::network_options(&config.mqtt));
    // The intake holds what it held before it had lanes, split among them.
    let lanes = config.pipeline.decode_lane_count();
    let (intake_tx, intake_lanes) = Intake::new(lanes, max_unacked.clamp(1, 1024).div_ceil(lanes));
    let (registrations_tx, registrations_rx) = mpsc::unbounded_channel();
    let (completions, finished_rx) = Completions::channel();
    let live = Arc::new(LiveConnection::default());
    let acker =
        tokio::spawn(Acker::new(client.clone(), live.clone()).run(registrations_rx, finished_rx));

    // Shards.
    let shard_count = config.pipeline.shard_count();
    let capacity = config.pipeline.queue_capacity;
    let policy = AdmissionPolicy::new(config.pipeline.watermark, capacity)
        .map_err(|e| ServiceError::Config(e.to_string()))?;
    let clock = MonotonicClock::new();
    // The global allowance's refiller runs beside the router, which never
    // waits on Redis: it spends from the reserve the refiller fills.
    let global = match config.gate.global.as_ref() {
        Some(g) => {
            let security = RedisSecurity::load(
                g.ca.as_deref(),
                g.user.as_deref(),
                g.password_file.as_deref(),
            )
            .map_err(|e| ServiceError::Config(format!("gate.global: {e}")))?;
            let allowance = Arc::new(GlobalAllowance::new(g.cost, g.reserve, g.fail_mode));
            let refiller = tokio::spawn(crate::allowance::refill(
                allowance.clone(),
                SharedBucket::new(&g.key, g.rate, g.burst, g.cost),
                RedisTarget {
                    urls: g.urls.clone(),
                    cluster: g.cluster,
                    timeout: Duration::from_millis(g.timeout_ms),
                    security,
                },
            ));
            Some((allowance, refiller))
        }
        None => None,
    };
    let mut restored = shard::split_by_shard(backend.take_restored(), shard_count).into_iter();
    let mut inputs = Vec::with_capacity(shard_count);
    let mut queues = Vec::with_capacity(shard_count);
    let mut workers = Vec::with_capacity(shard_count);
    let (unapplied_tx, unapplied_rx) = mpsc::unbounded_channel();
    let (queries, query_rx) = VehicleQueries::channels(shard_count);
    for (shard, shard_queries) in query_rx.into_iter().enumerate() {
        let (tx, rx) = shard::queue::queue(capacity);
        queues.push(tx.fill_view());
        let gate = config
            .gate
            .spec()
            .build()
            .map_err(|e| ServiceError::Config(e.to_string()))?;
        let mut admission = Admission::new(policy, gate);
        if let Some((allowance, _)) = &global {
            admission = admission.with_global(allowance.clone());
        }
        let lane = (config.gate.kind == GateKind::LeakyShaper).then(|| {
            let (lane_tx, lane_rx) = mpsc::unbounded_channel();
            tokio::spawn(shaper_lane(clock, lane_rx, tx.clone()));
            lane_tx
        });
        inputs.push(ShardInput::new(shard, tx, admission, lane));
        let mut fences = fence_rx.clone();
        let state = backend.shard(
            shard,
            fences.borrow_and_update().clone(),
            restored.next().unwrap_or_default(),
        );
        let ctx = WorkerContext {
            fences,
            counters: Arc::new(ShardCounters::new(
                shard,
                accounting.clone(),
                completions.clone(),
                unapplied_tx.clone(),
            )),
            sustained_rate: config.pipeline.sustained_rate,
            drain: drain.clone(),
            queries: shard_queries,
        };
        workers.push(tokio::spawn(shard::worker(rx, state, ctx)));
    }
    let router = Router {
        shards: inputs,
        codec: config.codec.clone(),
        dedup: Dedup::new(config.codec.dedup_window),
        dead_letter,
        mirror: output,
        completions,
        accounting: accounting.clone(),
        clock,
        drain,
        refused: Vec::new(),
        counters: RefusalCounters::new(),
        unapplied: unapplied_rx,
        expired: expired_rx,
    };
    drop(unapplied_tx);
    let decoded = decode::start(intake_lanes, config.codec.clone());
    let router = router.spawn(decoded);
    let (subscribed_tx, subscribed_rx) = watch::channel(false);
    let poll = tokio::spawn(mqtt::poll_loop(PollTask {
        client,
        eventloop,
        filters: mqtt::subscribe_filters(&config.mqtt),
        broker: mqtt::broker_address(&config.mqtt),
        intake: intake_tx,
        registrations: registrations_tx,
        live,
        phase: control.watch(),
        subscribed: subscribed_tx,
    }));
    let view = PipelineView {
        accounting: accounting.clone(),
        queues,
        queue_capacity: capacity,
        watermark: config.pipeline.watermark,
        subscribed: subscribed_rx,
    };
    crate::metrics::register_zero_series(shard_count, config.gate.kind.as_str());
    metrics::gauge!(QUEUE_WATERMARK).set(config.pipeline.watermark);
    let gauges = tokio::spawn(refresh_gauges(view.accounting.clone(), view.queues.clone()));
    let api = match &config.api {
        Some(api_config) => Some(start_api(api_config, registry.clone(), queries).await?),
        None => None,
    };
    on_ready(registry, view);

    shutdown.await;
    if let Some((stop, task)) = api {
        let _ = stop.send(());
        let _ = task.await;
    }
    tracing::info!("shutting down: intake closed, draining");
    control.close();
    let deadline = Instant::now() + Duration::from_secs_f64(config.pipeline.drain_deadline_s);
    drain_control.begin(deadline);
    let mut dead_letter = router.await.ok();
    for w in workers {
        let _ = w.await;
    }
    backend.finish().await;
    let _ = acker.await;
    control.acks_flushed();
    let _ = tokio::time::timeout(Duration::from_secs(5), poll).await;
    gauges.abort();
    if let Some((_, refiller)) = global {
        refiller.abort();
    }
    if let Some(dl) = dead_letter.as_mut()
        && let Err(e) = dl.sync()
    {
        tracing::error!("dead letter sync: {e}");
    }
    Ok(accounting.balance())
}
