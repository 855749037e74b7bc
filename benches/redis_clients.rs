//! The two Rust Redis clients the scale-out issue names, on the shared
//! state's real call: the rules script (`apply.lua`, by `EVALSHA`) on a
//! batch of 16 fixes of one partition, 32 calls in flight at once (a few
//! workers × their partitions), against one local redis-server.
//!
//! * `redis_rs`: the redis crate through `SharedRules::apply`, the
//!   production path (multiplexed connection manager);
//! * `fred`: fred's client, `evalsha` with the same keys and arguments.
//!
//! Each iteration's fixes are newer than the last, so every call applies
//! its fixes (no early duplicate exit). Skipped without redis-server.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fred::prelude::{ClientLike, Config, LuaInterface};
use geogate::geofence::probe::{Containing, FenceProbe};
use geogate::redis_link::RedisLink;
use geogate::state::redis::{FixFacts, SharedRules};
use local_redis::LocalRedis;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

#[path = "support/local_redis.rs"]
mod local_redis;

const FIXES_PER_CALL: usize = 16;
const CALLS_IN_FLIGHT: usize = 32;

/// Call `c`'s fixes at generation `g`: vehicles of partition-local ids,
/// inside fence A (no band, no dwell) on even generations, outside on odd,
/// so each fix also enters or exits.
fn facts(rules: &SharedRules, c: usize, g: u64) -> (u32, Vec<FixFacts>) {
    let mut fixes = Vec::with_capacity(FIXES_PER_CALL);
    let mut i = 0;
    let partition = (c % rules.partitions as usize) as u32;
    while fixes.len() < FIXES_PER_CALL {
        let vehicle = format!("c{c}v{i}");
        i += 1;
        if rules.partition_of(&vehicle) != partition {
            continue;
        }
        let containing = if g.is_multiple_of(2) {
            vec![Containing {
                id: "A".into(),
                clear: true,
                dwell_ms: 0,
            }]
        } else {
            Vec::new()
        };
        fixes.push(FixFacts {
            index: fixes.len(),
            vehicle: vehicle.into(),
            fix_ms: 1_750_000_000_000 + g as i64 * 1000,
            redelivered: false,
            digest: g,
            probe: FenceProbe {
                containing,
                near: Vec::new(),
            },
        });
    }
    (partition, fixes)
}

/// `iters` rounds of [`CALLS_IN_FLIGHT`] calls, each round's started by
/// `spawn_call(calls, call index, generation)` and awaited together.
fn rounds(
    runtime: &tokio::runtime::Runtime,
    iters: u64,
    generation: &mut u64,
    spawn_call: impl Fn(&mut JoinSet<()>, usize, u64),
) -> Duration {
    let started = Instant::now();
    for _ in 0..iters {
        *generation += 1;
        let g = *generation;
        runtime.block_on(async {
            let mut calls = JoinSet::new();
            for c in 0..CALLS_IN_FLIGHT {
                spawn_call(&mut calls, c, g);
            }
            while let Some(done) = calls.join_next().await {
                done.expect("call");
            }
        });
    }
    started.elapsed()
}

fn clients(c: &mut Criterion) {
    let Some(redis) = LocalRedis::start() else {
        eprintln!("redis-server not found: redis_clients skipped");
        return;
    };
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rules = Arc::new(SharedRules::new("bench", 16, 256, 3_600_000));
    let link = runtime
        .block_on(RedisLink::connect(
            std::slice::from_ref(&url),
            false,
            Duration::from_secs(5),
        ))
        .expect("redis-rs connection");
    let fred = runtime.block_on(async {
        let client = fred::prelude::Builder::from_config(Config::from_url(&url).expect("url"))
            .build()
            .expect("fred client");
        client.init().await.expect("fred connect");
        client
    });
    let sha: String = runtime
        .block_on(fred.script_load(include_str!("../src/state/redis/apply.lua")))
        .expect("script load");
    let mut generation = 0u64;
    let mut group = c.benchmark_group("redis_clients");
    group.throughput(Throughput::Elements(
        (FIXES_PER_CALL * CALLS_IN_FLIGHT) as u64,
    ));
    group.sample_size(30);
    // Redis's own count of script time, so the client overhead can be
    // told from the server's share.
    let report = |name: &str, (calls0, usec0): (f64, f64)| {
        let (calls, usec) = redis.script_stats();
        eprintln!(
            "{name}: {:.0} script calls, {:.1} µs of server time per call",
            calls - calls0,
            (usec - usec0) / (calls - calls0).max(1.0)
        );
    };
    let before = redis.script_stats();
    group.bench_function("redis_rs", |b| {
        b.iter_custom(|iters| {
            rounds(&runtime, iters, &mut generation, |calls, c, g| {
                let (partition, fixes) = facts(&rules, c, g);
                let (rules, mut link) = (rules.clone(), link.clone());
                calls.spawn(async move {
                    rules
                        .apply(&mut link, partition, &fixes)
                        .await
                        .expect("apply");
                });
            })
        })
    });
    report("redis_rs", before);
    let before = redis.script_stats();
    group.bench_function("fred", |b| {
        b.iter_custom(|iters| {
            rounds(&runtime, iters, &mut generation, |calls, c, g| {
                let (partition, fixes) = facts(&rules, c, g);
                let mut keys = vec![rules.keys.outbox(partition)];
                keys.extend(
                    fixes
                        .iter()
                        .map(|f| rules.keys.vehicle(partition, &f.vehicle)),
                );
                let args = vec![
                    "256".to_owned(),
                    "3600000".to_owned(),
                    serde_json::to_string(&fixes).expect("json"),
                ];
                let (client, sha) = (fred.clone(), sha.clone());
                calls.spawn(async move {
                    client
                        .evalsha::<fred::types::Value, _, _, _>(sha, keys, args)
                        .await
                        .expect("evalsha");
                });
            })
        })
    });
    report("fred", before);
    group.finish();
}

criterion_group!(benches, clients);
criterion_main!(benches);
