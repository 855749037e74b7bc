//! Decode cost per format, and the in-process pipeline (decode lanes → dedup →
//! admit → bounded channel → evaluate → commit → events file, with metrics
//! and the dead-letter file) with 1 and 2 shards, against the decode-only
//! rate on the same payloads: the ceiling for any JSON pipeline. The
//! pipeline runs with each state backend: memory, and the embedded store
//! with `fsync = "flush"` and `"always"` (a new store per iteration).
//!
//! Payloads are the bundled capture's (`replay/shift-change.ndjson.gz`),
//! evaluated against the demo fences.
//!
//! With `GEOGATE_STAGES=<rounds>` it times each stage alone instead
//! (`Pipeline::stages_alone`) and runs no benchmark of the pipeline:
//! `GEOGATE_STAGES=20 cargo bench --bench pipeline -- stages_alone` (the
//! filter matches no benchmark, so that the decode ones do not run either).

use bytes::Bytes;
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use geogate::admission::{Admission, AdmissionPolicy, GateSpec};
use geogate::clock::MonotonicClock;
use geogate::codec::{CodecSettings, Dedup, decode};
use geogate::config::{FsyncPolicy, PipelineConfig, StateBackend, StateConfig};
use geogate::geofence::{EvaluatorSettings, FenceIndex, load_fences};
use geogate::pipeline::accounting::{Accounting, Balance};
use geogate::pipeline::config::DEFAULT_REORDER_WINDOW_MS;
#[cfg(target_os = "linux")]
use geogate::pipeline::decode::Decoded;
use geogate::pipeline::shard::completion::ShardCounters;
use geogate::pipeline::shard::queue::{QueueReceiver, QueueSender, queue};
use geogate::pipeline::shard::router::Unapplied;
use geogate::pipeline::shard::{RefusalCounters, Router, ShardInput, WorkerContext, worker};
use geogate::replay::capture;
use geogate::shutdown::Drain;
use geogate::sink::dead_letter::DeadLetterSink;
use geogate::source::intake::Intake;
use geogate::source::{Completions, Envelope};
use geogate::state::{Backend, OpenContext};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// The allocator the `geogate` binary uses, so the pipeline is measured
/// as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn payloads() -> Vec<(String, Vec<u8>)> {
    capture::read(Path::new("replay/shift-change.ndjson.gz"))
        .expect("bundled capture")
        .into_iter()
        .map(|r| {
            let bytes = r.payload_bytes();
            (r.topic, bytes)
        })
        .collect()
}

fn decode_formats(c: &mut Criterion) {
    let settings = CodecSettings::default();
    let native = br#"{"vehicle":"van0042","ts":1772427600000,"lat":52.512345,"lon":13.398765,"speed_kmh":37.5,"kind":"move"}"#;
    let owntracks = br#"{"_type":"location","lat":52.512345,"lon":13.398765,"tst":1772427600,"vel":38,"t":"u"}"#;
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(1));
    group.bench_function("native", |b| {
        b.iter(|| {
            decode(
                black_box("fleet/van0042/telemetry"),
                black_box(native),
                &settings,
            )
        })
    });
    group.bench_function("owntracks", |b| {
        b.iter(|| {
            decode(
                black_box("owntracks/driver0042/van"),
                black_box(owntracks),
                &settings,
            )
        })
    });
    group.finish();
}

/// The production router and workers (`shard::Router`, `shard::worker`)
/// with the Prometheus recorder installed, so every counter, gauge and
/// histogram the live pipeline records is paid for here too. Only the MQTT
/// socket is missing: the intake channel is filled before the clock starts.
struct Pipeline {
    index: Arc<FenceIndex>,
    dir: tempfile::TempDir,
}

impl Pipeline {
    /// The capture in `lanes` intake lanes, as the poll task would leave it.
    fn intake(payloads: &[(String, Bytes)], lanes: usize) -> Vec<mpsc::Receiver<Envelope>> {
        let (tx, rx) = Intake::new(lanes, payloads.len());
        let now = Instant::now();
        for (topic, payload) in payloads {
            let item = Envelope {
                token: None,
                topic: topic.clone(),
                payload: payload.clone(),
                received_at: now,
                redelivered: false,
            };
            tx.try_send(item).expect("intake sized to the capture");
        }
        rx
    }

    fn events_path(&self) -> std::path::PathBuf {
        self.dir.path().join("events.ndjson")
    }

    /// A fresh store and events file for the next iteration.
    fn state(&self, backend: StateBackend, fsync: FsyncPolicy) -> StateConfig {
        let _ = std::fs::remove_file(self.events_path());
        let mut config = StateConfig {
            backend,
            fsync,
            reset: true,
            ..StateConfig::default()
        };
        config.embedded.path = self.dir.path().join("state.sqlite");
        config
    }

    /// A shard's input as the bench builds it: the default watermark and a
    /// gate that admits everything this capture sends, or, for
    /// [`Gating::ShedIdle`], a watermark at one queued event and a gate of
    /// one event a second, so nearly every idle ping is shed.
    fn shard_input(shard: usize, tx: QueueSender, capacity: usize, gating: Gating) -> ShardInput {
        let (watermark, gate) = match gating {
            Gating::AdmitAll => (
                PipelineConfig::default().watermark,
                "token:rate=1000000,burst=100000",
            ),
            Gating::ShedIdle => (f64::MIN_POSITIVE, "token:rate=1,burst=1"),
        };
        let gate: GateSpec = gate.parse().expect("gate");
        ShardInput::new(
            shard,
            tx,
            Admission::new(
                AdmissionPolicy::new(watermark, capacity).expect("policy"),
                gate.build().expect("gate"),
            ),
            None,
        )
    }

    /// A worker's context. The fences never change during a run, so the
    /// watch's sender is let go at once (a closed watch reads as unchanged).
    fn worker_context(&self, shard: usize, run: &RunContext) -> WorkerContext {
        WorkerContext {
            fences: watch::channel(self.index.clone()).1,
            counters: Arc::new(ShardCounters::new(
                shard,
                run.accounting.clone(),
                run.completions.clone(),
                run.late_sender(),
            )),
            sustained_rate: 0.0,
            drain: run.drain.clone(),
            queries: tokio::sync::mpsc::channel(1).1,
        }
    }

    /// The router over `shards`, with the default codec (its dedup window
    /// on) and a dead-letter file.
    fn router(&self, shards: Vec<ShardInput>, run: &RunContext) -> Router<MonotonicClock> {
        let codec = CodecSettings::default();
        let (dead_letter, _) = DeadLetterSink::open(
            &self.dir.path().join("dead-letter.ndjson"),
            64 << 20,
            FsyncPolicy::Flush,
        )
        .expect("dead-letter file");
        Router {
            shards,
            dedup: Dedup::new(codec.dedup_window),
            codec,
            dead_letter,
            mirror: None,
            completions: run.completions.clone(),
            accounting: run.accounting.clone(),
            clock: MonotonicClock::new(),
            drain: run.drain.clone(),
            refused: Vec::new(),
            counters: RefusalCounters::new(),
            unapplied: run.late_receiver(),
            expired: tokio::sync::mpsc::unbounded_channel().1,
        }
    }

    /// The state backend `state` configures, as `service::run` opens it.
    async fn backend(
        &self,
        state: &StateConfig,
        shards: usize,
        settings: EvaluatorSettings,
        run: &RunContext,
    ) -> Box<dyn Backend> {
        geogate::state::backends::open(
            state,
            OpenContext {
                events: Some(self.events_path()),
                outputs: Default::default(),
                settings,
                fences: geogate::state::FenceSupply::of(&self.index),
                shards,
                per_fence_labels: false,
                fence_properties: Default::default(),
                drain: run.drain.clone(),
            },
        )
        .await
        .expect("state backend")
    }

    /// One shard worker on `backend`'s state for that shard.
    fn spawn_worker(
        &self,
        backend: &mut dyn Backend,
        shard: usize,
        queue: QueueReceiver,
        run: &RunContext,
    ) -> tokio::task::JoinHandle<()> {
        let state = backend.shard(shard, self.index.clone(), Vec::new());
        tokio::spawn(worker(queue, state, self.worker_context(shard, run)))
    }

    /// Each stage alone, one after another, beside decode-only and the
    /// whole pipeline, `rounds` times; prints what each costs per message,
    /// and what running them side by side adds. Why: a sampling profile of
    /// the running pipeline shares its CPU out by stage, but cannot say
    /// what a stage costs with nothing beside it. Memory backend, 2
    /// shards, the default decode lanes. Every second round (the second,
    /// the fourth, ...) runs the stages alone first, so neither side always
    /// runs first. Both sides must evaluate the same fixes (none shed, none
    /// left behind), or the comparison is off; it says so if not.
    #[cfg(target_os = "linux")]
    fn stages_alone(
        &self,
        payloads: &[(String, Vec<u8>)],
        shared: &[(String, Bytes)],
        runtime: &tokio::runtime::Runtime,
        scrape: &dyn Fn(),
        rounds: usize,
    ) {
        const SHARDS: usize = 2;
        let lanes = PipelineConfig::default().decode_lane_count();
        let together = || {
            let (_, decode_only) = timed(|| decode_all(payloads, &CodecSettings::default()));
            scrape();
            let (intake, state) = (
                Self::intake(shared, lanes),
                self.state(StateBackend::Memory, FsyncPolicy::Flush),
            );
            let (evaluated, pipeline) = timed(|| runtime.block_on(self.run(intake, SHARDS, state)));
            ([decode_only, pipeline], evaluated)
        };
        let alone = || {
            let run = RunContext::new();
            scrape();
            let intake = Self::intake(shared, lanes);
            let (batches, lane) = timed(|| Self::lanes_alone(runtime, intake));
            scrape();
            let (queues, router) = timed(|| self.router_alone(runtime, batches, SHARDS, &run));
            scrape();
            let state = self.state(StateBackend::Memory, FsyncPolicy::Flush);
            let (_, workers) = timed(|| self.workers_alone(runtime, &state, queues, &run));
            ([lane, router, workers], run.accounting.balance().evaluated)
        };
        let mut samples = Vec::with_capacity(rounds);
        let mut evaluated = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let ((t, by_pipeline), (a, by_stages)) = if round % 2 == 0 {
                (together(), alone())
            } else {
                let a = alone();
                (together(), a)
            };
            samples.push([t[0], t[1], a[0], a[1], a[2]]);
            evaluated.push((by_pipeline, by_stages));
        }
        let differ: Vec<_> = evaluated.iter().filter(|(p, a)| p != a).collect();
        if !differ.is_empty() {
            eprintln!(
                "the pipeline and the stages alone evaluated different counts in {} of {rounds} rounds (pipeline, alone): {differ:?}",
                differ.len()
            );
        }
        let us = 1e6 / shared.len() as f64;
        let line = |what: &str, value: &dyn Fn(&[Sample; 5]) -> f64| {
            let mut v: Vec<f64> = samples.iter().map(value).collect();
            v.sort_by(f64::total_cmp);
            let median = (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0;
            eprintln!("  {what}: {median:.2} [{:.2}–{:.2}]", v[0], v[v.len() - 1]);
        };
        eprintln!("stages alone: median [min–max] of {rounds} rounds, µs per message unless named");
        let names = [
            "decode-only (one thread)",
            "the pipeline",
            "the decode lanes alone",
            "the router alone",
            "workers, committer and relay alone",
        ];
        for (i, name) in names.iter().enumerate() {
            line(&format!("{name}, CPU"), &|s| s[i].cpu * us);
            line(&format!("{name}, wall"), &|s| s[i].wall * us);
        }
        let alone_cpu = |s: &[Sample; 5]| (s[2].cpu + s[3].cpu + s[4].cpu) * us;
        line("the three stages alone, CPU summed", &alone_cpu);
        line("side by side, more CPU than alone", &|s| {
            s[1].cpu * us - alone_cpu(s)
        });
        line("the lanes alone over decode-only, CPU", &|s| {
            (s[2].cpu - s[0].cpu) * us
        });
        line("the pipeline's wall over the lanes' alone (×)", &|s| {
            s[1].wall / s[2].wall
        });
        line("the pipeline's cores busy", &|s| s[1].cpu / s[1].wall);
        line("the pipeline's rate (M/s)", &|s| 1.0 / (s[1].wall * us));
        line("the pipeline's rate over decode-only's (×)", &|s| {
            s[0].wall / s[1].wall
        });
    }

    /// The decode lanes alone, into memory.
    #[cfg(target_os = "linux")]
    fn lanes_alone(
        runtime: &tokio::runtime::Runtime,
        intake: Vec<mpsc::Receiver<Envelope>>,
    ) -> Vec<Vec<Decoded>> {
        runtime.block_on(async {
            let mut decoded = geogate::pipeline::decode::start(intake, CodecSettings::default());
            let mut batches = Vec::new();
            while let Some(batch) = decoded.recv().await {
                batches.push(batch);
            }
            batches
        })
    }

    /// The router alone over `batches`, into queues that hold twice the
    /// capture, so it never waits and no shard reaches the watermark;
    /// returns the filled queues.
    #[cfg(target_os = "linux")]
    fn router_alone(
        &self,
        runtime: &tokio::runtime::Runtime,
        batches: Vec<Vec<Decoded>>,
        shards: usize,
        run: &RunContext,
    ) -> Vec<QueueReceiver> {
        let (decoded_tx, decoded) = mpsc::channel(batches.len().max(1));
        let total: usize = batches.iter().map(Vec::len).sum();
        for batch in batches {
            decoded_tx.try_send(batch).expect("sized to the batches");
        }
        drop(decoded_tx);
        let capacity = 2 * total.max(1);
        let (inputs, queues) = (0..shards)
            .map(|shard| {
                let (tx, rx) = queue(capacity);
                (Self::shard_input(shard, tx, capacity, Gating::AdmitAll), rx)
            })
            .unzip();
        runtime.block_on(self.router(inputs, run).run(decoded));
        queues
    }

    /// The shard workers, committer and relay alone, draining `queues`.
    #[cfg(target_os = "linux")]
    fn workers_alone(
        &self,
        runtime: &tokio::runtime::Runtime,
        state: &StateConfig,
        queues: Vec<QueueReceiver>,
        run: &RunContext,
    ) {
        runtime.block_on(async {
            let mut backend = self
                .backend(state, queues.len(), EvaluatorSettings::default(), run)
                .await;
            let workers: Vec<_> = queues
                .into_iter()
                .enumerate()
                .map(|(shard, queue)| self.spawn_worker(backend.as_mut(), shard, queue, run))
                .collect();
            for w in workers {
                let _ = w.await;
            }
            backend.finish().await;
        });
    }

    /// Routes, evaluates and commits every queued message on `shards`
    /// workers; returns how many were evaluated.
    async fn run(
        &self,
        intake: Vec<mpsc::Receiver<Envelope>>,
        shards: usize,
        state: StateConfig,
    ) -> u64 {
        self.run_timed(intake, shards, state, Gating::AdmitAll)
            .await
            .0
            .evaluated
    }

    /// [`Self::run`], and where its time went.
    async fn run_timed(
        &self,
        intake: Vec<mpsc::Receiver<Envelope>>,
        shards: usize,
        state: StateConfig,
        gating: Gating,
    ) -> (Balance, Phases) {
        // Checked after the run: a run that lost messages would only look
        // faster.
        let queued: usize = intake.iter().map(|lane| lane.len()).sum();
        let run = RunContext::new();
        let settings = EvaluatorSettings::default();
        let phases = self
            .route(intake, shards, state, gating, settings, &run)
            .await;
        let balance = run.accounting.balance();
        assert!(
            balance.balances() && balance.in_queue == 0 && balance.received == queued as u64,
            "a run did not finish all {queued} messages it was given: {}",
            balance.line()
        );
        (balance, phases)
    }

    /// A steady stream through the pipeline: `messages` native fixes from
    /// `vehicles` vehicles in turn, each dated when it is handed to the
    /// intake, pushed as fast as the pipeline takes them. Fix times then
    /// advance with the pipeline's clock, so a reorder window releases
    /// continuously (the bundled capture, queued before the clock starts,
    /// is a burst: a window holds all of it or none). Returns the stream's
    /// rate, whole and steady: messages over the time until the last was
    /// taken by its shard (applied or held), and the same past the first
    /// `warm_up.0` taken and `warm_up.1` (the first laps, while the vehicle
    /// map and a window's due queue grow to the sizes they keep, and the
    /// window's first span, in which nothing leaves it). The window's last
    /// release, after the stream has ended, is part of neither: a steady
    /// stream does not end, so the intake stays open until the last
    /// message is taken (its close would release every window).
    async fn run_steady(
        &self,
        shards: usize,
        state: StateConfig,
        window_ms: i64,
        messages: usize,
        vehicles: usize,
        warm_up: (usize, Duration),
    ) -> Rates {
        let lanes = PipelineConfig::default().decode_lane_count();
        let (intake, lanes) = Intake::new(lanes, 4096);
        let run = RunContext::new();
        let settings = EvaluatorSettings {
            reorder_window_ms: window_ms,
            ..EvaluatorSettings::default()
        };
        let started = Instant::now();
        let stream = SteadyStream::new(&self.index, vehicles);
        let (taken_all, until_taken) = tokio::sync::oneshot::channel::<()>();
        let producer = tokio::spawn(async move {
            for i in 0..messages {
                let (topic, payload) = stream.message(i, geogate::clock::receive_now_ms());
                let envelope = Envelope {
                    token: None,
                    topic,
                    payload,
                    received_at: Instant::now(),
                    redelivered: false,
                };
                if intake.send(envelope).await.is_err() {
                    return;
                }
            }
            let _ = until_taken.await;
        });
        let accounting = run.accounting.clone();
        let taken = tokio::spawn(async move {
            let mut warm = None;
            loop {
                let b = accounting.balance();
                let taken = b.received - b.in_queue;
                if warm.is_none() && taken >= warm_up.0 as u64 && started.elapsed() >= warm_up.1 {
                    warm = Some((Instant::now(), taken));
                }
                if b.received == messages as u64 && b.in_queue == 0 {
                    let _ = taken_all.send(());
                    return (warm, Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        self.route(lanes, shards, state, Gating::AdmitAll, settings, &run)
            .await;
        producer.await.expect("producer");
        let taken = taken.await.expect("taken");
        let balance = run.accounting.balance();
        assert!(
            balance.balances()
                && balance.in_queue == 0
                && balance.evaluated + balance.held == messages as u64,
            "a steady run did not take all {messages} messages: {}",
            balance.line()
        );
        let (warm, end) = taken;
        let (warm_at, warm_taken) = warm.unwrap_or((started, 0));
        Rates {
            whole: messages as f64 / (end - started).as_secs_f64(),
            steady: (messages as u64 - warm_taken) as f64 / (end - warm_at).as_secs_f64(),
        }
    }

    /// Opens the state, starts the workers, the decode lanes and the
    /// router on `intake`, and runs until every worker has stopped and the
    /// state is closed; returns where the time went.
    async fn route(
        &self,
        intake: Vec<mpsc::Receiver<Envelope>>,
        shards: usize,
        state: StateConfig,
        gating: Gating,
        settings: EvaluatorSettings,
        run: &RunContext,
    ) -> Phases {
        let started = Instant::now();
        let mut backend = self.backend(&state, shards, settings, run).await;
        let capacity = PipelineConfig::default().queue_capacity;
        let mut inputs = Vec::new();
        let mut workers = Vec::new();
        for shard in 0..shards {
            let (tx, rx) = queue(capacity);
            inputs.push(Self::shard_input(shard, tx, capacity, gating));
            workers.push(self.spawn_worker(backend.as_mut(), shard, rx, run));
        }
        // Built before the lanes start, as `service::run` builds it: built
        // after, the lanes got a head start, decoding while the dead letter
        // was opened, which the live pipeline never gets
        // (docs/decisions/0011-dead-letter-start-and-writes.md).
        let router = self.router(inputs, run);
        let decoded = geogate::pipeline::decode::start(intake, CodecSettings::default());
        // Started as `service::run` starts it, on its own thread.
        let routing = Instant::now();
        let _ = router.spawn(decoded).await;
        for w in workers {
            let _ = w.await;
        }
        let finishing = Instant::now();
        backend.finish().await;
        Phases {
            start: (routing - started).as_secs_f64(),
            route: (finishing - routing).as_secs_f64(),
            finish: finishing.elapsed().as_secs_f64(),
        }
    }
}

/// A steady run's rate (messages/s): over the whole run, and past its
/// warm-up.
struct Rates {
    whole: f64,
    steady: f64,
}

/// The steady stream's vehicles: `n` of them, spread north to south over
/// the fences' area, each driving east across it and around, one step
/// (a fortieth of the width) per lap of the fleet.
struct SteadyStream {
    ids: Vec<String>,
    topics: Vec<String>,
    lat: Vec<f64>,
    west: f64,
    width: f64,
}

impl SteadyStream {
    fn new(index: &FenceIndex, n: usize) -> Self {
        let (mut min, mut max) = ((f64::MAX, f64::MAX), (f64::MIN, f64::MIN));
        for (a, b) in index
            .fences()
            .flat_map(|f| f.parts.iter().flat_map(|p| p.envelopes()))
        {
            min = (min.0.min(a.x), min.1.min(a.y));
            max = (max.0.max(b.x), max.1.max(b.y));
        }
        let ids: Vec<String> = (0..n).map(|v| format!("s{v}")).collect();
        Self {
            topics: ids
                .iter()
                .map(|id| format!("fleet/{id}/telemetry"))
                .collect(),
            ids,
            lat: (0..n)
                .map(|v| min.1 + (max.1 - min.1) * (v as f64 / n as f64))
                .collect(),
            west: min.0,
            width: max.0 - min.0,
        }
    }

    /// Message `i` (vehicle i mod n, on its lap), dated `now_ms`.
    fn message(&self, i: usize, now_ms: i64) -> (String, Bytes) {
        let n = self.ids.len();
        let v = i % n;
        let lon = self.west + ((i / n) as f64 * self.width / 40.0) % self.width;
        let payload = format!(
            r#"{{"vehicle":"{}","ts":{now_ms},"lat":{:.6},"lon":{lon:.6},"speed_kmh":40.0,"kind":"move"}}"#,
            self.ids[v], self.lat[v]
        );
        (self.topics[v].clone(), Bytes::from(payload))
    }
}

/// The steady stream's rate with the reorder window at its default
/// against none, per local backend, 2 shards: `rounds` rounds, each
/// running both, the order swapped every other round. Prints each run and
/// the median ratio with its range, past the warm-up and over the whole
/// run.
fn steady(pipeline: &Pipeline, runtime: &tokio::runtime::Runtime, rounds: usize) {
    const MESSAGES: usize = 6_000_000;
    const VEHICLES: usize = 200_000;
    let window = DEFAULT_REORDER_WINDOW_MS as i64;
    // Five laps of the fleet, and the window's span and a second more, in
    // both runs: past them every vehicle is in the map, and the window
    // releases as many fixes as it takes in.
    let warm_up = (1_000_000, Duration::from_millis(window as u64 + 1_000));
    // `GEOGATE_STEADY_BACKEND=memory` (or `embedded_flush`): that one only.
    let only = std::env::var("GEOGATE_STEADY_BACKEND").ok();
    for (name, backend) in [
        ("memory", StateBackend::Memory),
        ("embedded_flush", StateBackend::Embedded),
    ] {
        if only.as_deref().is_some_and(|only| only != name) {
            continue;
        }
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let order = if round % 2 == 0 {
                [0, window]
            } else {
                [window, 0]
            };
            for w in order {
                let state = pipeline.state(backend, FsyncPolicy::Flush);
                let rates =
                    runtime.block_on(pipeline.run_steady(2, state, w, MESSAGES, VEHICLES, warm_up));
                println!(
                    "steady {name} round {round} window_ms {w}: {:.0} messages/s past the warm-up, {:.0} over the whole run",
                    rates.steady, rates.whole
                );
                if w == 0 {
                    off.push(rates)
                } else {
                    on.push(rates)
                }
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v[v.len() - 1])
        };
        for (what, rate) in [
            (
                "past the warm-up",
                (|r: &Rates| r.steady) as fn(&Rates) -> f64,
            ),
            ("over the whole run", |r: &Rates| r.whole),
        ] {
            let (m_off, ..) = median(off.iter().map(rate).collect());
            let (m_on, ..) = median(on.iter().map(rate).collect());
            let (ratio, lo, hi) = median(
                on.iter()
                    .zip(&off)
                    .map(|(a, b)| rate(a) / rate(b))
                    .collect(),
            );
            println!(
                "steady {name}, {what}: window 0 {m_off:.0}/s, window {window} ms {m_on:.0}/s; ratio per round: median {ratio:.3} [{lo:.3}–{hi:.3}]"
            );
        }
    }
}

/// How the shards admit: what the live default would with this capture (a
/// gate that never sheds it), or shedding nearly every idle ping, as a gate
/// does in a shift-change burst; then every shed message costs a
/// dead-letter record.
#[derive(Clone, Copy)]
enum Gating {
    AdmitAll,
    ShedIdle,
}

/// What every stage of one run reports to: its balance, the channel of
/// finished tokens (kept open for the run, as the acker would keep it), and
/// the drain deadline (never set in the bench).
struct RunContext {
    accounting: Arc<Accounting>,
    completions: Completions,
    _finished: mpsc::UnboundedReceiver<geogate::source::AckToken>,
    drain: Drain,
    /// The late fixes' channel from the workers to the router: the router
    /// takes the receiver and, with it, this sender (it waits for every
    /// sender to go), so workers are built first, as `service::run` does.
    late: std::sync::Mutex<(
        Option<LateSender>,
        Option<mpsc::UnboundedReceiver<Unapplied>>,
    )>,
}

type LateSender = mpsc::UnboundedSender<Unapplied>;

impl RunContext {
    fn new() -> Self {
        let (completions, finished) = Completions::channel();
        let (late_tx, late_rx) = mpsc::unbounded_channel();
        Self {
            accounting: Arc::new(Accounting::default()),
            completions,
            _finished: finished,
            drain: Drain::never(),
            late: std::sync::Mutex::new((Some(late_tx), Some(late_rx))),
        }
    }

    /// A sender for a worker (one to a closed channel once the router has
    /// taken the receiver: workers started alone).
    fn late_sender(&self) -> LateSender {
        let late = self.late.lock().expect("not poisoned");
        late.0
            .clone()
            .unwrap_or_else(|| mpsc::unbounded_channel().0)
    }

    fn late_receiver(&self) -> mpsc::UnboundedReceiver<Unapplied> {
        let mut late = self.late.lock().expect("not poisoned");
        late.0 = None;
        late.1.take().unwrap_or_else(|| mpsc::unbounded_channel().1)
    }
}

/// Where one run's wall time went: *start*, setting up the stages (state
/// store, events file, workers, the decode lanes, which begin decoding
/// here, the dead-letter file, the router); *route*, until every worker
/// has queued its last commit; *finish*, the queued commits, the relay and
/// the clean stop's syncs (the events file's `fdatasync`, and the embedded
/// store's checkpoint at close). Why: criterion's rate covers all three,
/// but only the route phase is the pipeline's throughput; start is a fixed
/// cost, and finish is the clean stop's, growing with what the run left
/// unsynced.
#[derive(Default)]
struct Phases {
    start: f64,
    route: f64,
    finish: f64,
}

impl std::ops::AddAssign for Phases {
    fn add_assign(&mut self, other: Self) {
        self.start += other.start;
        self.route += other.route;
        self.finish += other.finish;
    }
}

/// CPU seconds this process has used (every thread, user and system).
#[cfg(target_os = "linux")]
fn process_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid
    // rusage, so on the (documented-impossible) failure it reads as zero.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// How many payloads decode; what decode-only times. Never inlined, so
/// that `benches/decode_instructions.sh` can count what it runs by its
/// name.
#[inline(never)]
fn decode_all(payloads: &[(String, Vec<u8>)], settings: &CodecSettings) -> usize {
    payloads
        .iter()
        .filter(|(t, p)| decode(t, p, settings).is_ok())
        .count()
}

/// Wall and CPU seconds of one piece of work.
#[cfg(target_os = "linux")]
#[derive(Clone, Copy)]
struct Sample {
    wall: f64,
    cpu: f64,
}

#[cfg(target_os = "linux")]
fn timed<T>(work: impl FnOnce() -> T) -> (T, Sample) {
    let (cpu, wall) = (process_cpu_seconds(), Instant::now());
    let out = work();
    let sample = Sample {
        wall: wall.elapsed().as_secs_f64(),
        cpu: process_cpu_seconds() - cpu,
    };
    (out, sample)
}

fn pipeline(c: &mut Criterion) {
    let payloads = payloads();
    let index = Arc::new(FenceIndex::new(
        load_fences(Path::new("config/fences.geojson")).expect("demo fences"),
    ));
    let settings = CodecSettings {
        dedup_window: 0,
        ..CodecSettings::default()
    };
    let mut group = c.benchmark_group("in_process");
    group.throughput(Throughput::Elements(payloads.len() as u64));
    group.sample_size(20);
    group.bench_function("decode_only", |b| {
        b.iter(|| decode_all(&payloads, &settings))
    });
    // Built as geogate builds it (its threads on SCHED_BATCH).
    let runtime = geogate::runtime::builder(PipelineConfig::default().sched_batch)
        .worker_threads(2)
        .build()
        .expect("runtime");
    // Rendered before each iteration, as a scrape would: histogram samples
    // are kept until then, and a process nobody scrapes only grows.
    let scrape = PrometheusBuilder::new().install_recorder().ok();
    let scrape = || {
        if let Some(handle) = &scrape {
            black_box(handle.render());
        }
    };
    let stages_rounds = std::env::var("GEOGATE_STAGES").ok();
    let pipeline = Pipeline {
        index,
        dir: tempfile::tempdir().expect("temp dir"),
    };
    let shared: Vec<(String, Bytes)> = payloads
        .iter()
        .map(|(t, p)| (t.clone(), Bytes::from(p.clone())))
        .collect();
    if let Ok(rounds) = std::env::var("GEOGATE_STEADY") {
        let rounds = rounds
            .parse::<usize>()
            .ok()
            .filter(|&r| r > 0)
            .expect("GEOGATE_STEADY: a number of rounds, at least 1");
        steady(&pipeline, &runtime, rounds);
        return;
    }
    if let Some(rounds) = stages_rounds {
        let rounds = rounds
            .parse::<usize>()
            .ok()
            .filter(|&r| r > 0)
            .expect("GEOGATE_STAGES: a number of rounds, at least 1");
        #[cfg(target_os = "linux")]
        pipeline.stages_alone(&payloads, &shared, &runtime, &scrape, rounds);
        #[cfg(not(target_os = "linux"))]
        eprintln!("GEOGATE_STAGES={rounds}: Linux only (it reads the process's CPU time)");
        return;
    }
    let backends = [
        ("memory", StateBackend::Memory, FsyncPolicy::Flush),
        ("embedded_flush", StateBackend::Embedded, FsyncPolicy::Flush),
        (
            "embedded_always",
            StateBackend::Embedded,
            FsyncPolicy::Always,
        ),
    ];
    // Decode lanes: the pipeline's default (2 on this 2-core machine) for
    // every variant, and 1 and 4 beside it.
    let default_lanes = PipelineConfig::default().decode_lane_count();
    // A gate shedding nearly every idle ping: what each refusal costs.
    let shed = runtime.block_on(pipeline.run_timed(
        Pipeline::intake(&shared, default_lanes),
        2,
        pipeline.state(StateBackend::Memory, FsyncPolicy::Flush),
        Gating::ShedIdle,
    ));
    eprintln!("pipeline_shedding/2: {}", shed.0.line());
    group.bench_with_input(
        BenchmarkId::new("pipeline_shedding", 2),
        &2,
        |b, &shards| {
            b.iter_batched(
                || {
                    scrape();
                    (
                        Pipeline::intake(&shared, default_lanes),
                        pipeline.state(StateBackend::Memory, FsyncPolicy::Flush),
                    )
                },
                |(intake, state)| {
                    runtime.block_on(pipeline.run_timed(intake, shards, state, Gating::ShedIdle))
                },
                BatchSize::PerIteration,
            )
        },
    );
    for lanes in [1, 4] {
        group.bench_with_input(
            BenchmarkId::new("pipeline_memory_2_shards_lanes", lanes),
            &lanes,
            |b, &lanes| {
                b.iter_batched(
                    || {
                        scrape();
                        (
                            Pipeline::intake(&shared, lanes),
                            pipeline.state(StateBackend::Memory, FsyncPolicy::Flush),
                        )
                    },
                    |(intake, state)| runtime.block_on(pipeline.run(intake, 2, state)),
                    BatchSize::PerIteration,
                )
            },
        );
    }
    for shards in [1, 2] {
        for (name, backend, fsync) in backends {
            group.bench_with_input(
                BenchmarkId::new(format!("pipeline_{name}"), shards),
                &shards,
                |b, &shards| {
                    b.iter_batched(
                        || {
                            scrape();
                            (
                                Pipeline::intake(&shared, default_lanes),
                                pipeline.state(backend, fsync),
                            )
                        },
                        |(intake, state)| runtime.block_on(pipeline.run(intake, shards, state)),
                        BatchSize::PerIteration,
                    )
                },
            );
            #[cfg(target_os = "linux")]
            if std::env::var_os("GEOGATE_NO_DIAG").is_none() {
                // Where the rate goes on this machine: the CPU each message
                // costs (every message of the capture, as the rate counts
                // them), how much of the machine the stages keep busy
                // (they wait on each other's hand-offs), and the phases of
                // a run. Ten more runs per backend, prepared
                // and timed as criterion's are. They run whatever
                // criterion's filter selects, so a filtered run still pays
                // for them between its timed benchmarks.
                let (mut cpu, mut wall, mut phases) = (0.0, 0.0, Phases::default());
                let runs = 10;
                for _ in 0..runs {
                    scrape();
                    let intake = Pipeline::intake(&shared, default_lanes);
                    let state = pipeline.state(backend, fsync);
                    let ((_, run_phases), sample) = timed(|| {
                        runtime.block_on(pipeline.run_timed(
                            intake,
                            shards,
                            state,
                            Gating::AdmitAll,
                        ))
                    });
                    phases += run_phases;
                    cpu += sample.cpu;
                    wall += sample.wall;
                }
                let mean_ms = |s: f64| s * 1e3 / runs as f64;
                eprintln!(
                    "pipeline_{name}/{shards}: {:.2} µs of CPU per message, {:.2} cores busy on average; a run's mean: {:.1} ms, of which start {:.1} ms, route {:.1} ms ({:.2} M/s while routing), finish {:.1} ms",
                    cpu * 1e6 / (runs * shared.len()) as f64,
                    cpu / wall,
                    mean_ms(wall),
                    mean_ms(phases.start),
                    mean_ms(phases.route),
                    (runs * shared.len()) as f64 / phases.route / 1e6,
                    mean_ms(phases.finish),
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, decode_formats, pipeline);
criterion_main!(benches);
