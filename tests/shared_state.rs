//! The membership rules as a Redis script (`state::redis`) against the
//! in-process evaluator, on a real redis-server: the same fixes, in batches
//! grouped by partition as instances would send them, give the same
//! outcomes, the same transitions and the same vehicle state.

mod support;

use geo::Coord;
use geogate::geofence::probe::{ProbeScratch, probe, widest_band};
use geogate::geofence::{
    Evaluator, EvaluatorSettings, FenceIndex, Fix, FixOutcome, Transition, parse_fences,
};
use geogate::model::VehicleId;
use geogate::redis_link::RedisLink;
use geogate::state::redis::{FixFacts, SharedRules};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::redis::Redis;

/// Overlapping fences: A plain; B with a 150 m band overlapping A; C with
/// a 1.5 s dwell inside both; D a circle with a 60 m band and a 1 s dwell.
const FENCES: &str = r#"{"type":"FeatureCollection","features":[
 {"type":"Feature","id":"A","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.00,50.00],[10.02,50.00],[10.02,50.01],[10.00,50.01],[10.00,50.00]]]}},
 {"type":"Feature","id":"B","properties":{"hysteresis_m":150},"geometry":{"type":"Polygon","coordinates":[[[10.01,50.00],[10.03,50.00],[10.03,50.01],[10.01,50.01],[10.01,50.00]]]}},
 {"type":"Feature","id":"C","properties":{"dwell_s":1.5},"geometry":{"type":"Polygon","coordinates":[[[10.015,50.003],[10.025,50.003],[10.025,50.008],[10.015,50.008],[10.015,50.003]]]}},
 {"type":"Feature","id":"D","properties":{"radius_m":300,"hysteresis_m":60,"dwell_s":1},"geometry":{"type":"Point","coordinates":[10.02,50.005]}}]}"#;

/// One fix: vehicle 0..4, time step (ms, possibly 0 or negative, so
/// repeats and older fixes occur), broker DUP flag, grid position.
type Step = (u8, i64, bool, u8, u8);

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0u8..4,
            -500i64..1500,
            prop::bool::weighted(0.1),
            0u8..40,
            0u8..16,
        ),
        1..80,
    )
}

/// Grid cell → point: lon 9.995..10.035 by 0.001, lat 49.997..50.013 by 0.001.
fn point(x: u8, y: u8) -> Coord<f64> {
    Coord {
        x: 9.995 + f64::from(x) * 0.001,
        y: 49.997 + f64::from(y) * 0.001,
    }
}

struct Case {
    /// (vehicle, fix ms, redelivered, point), in arrival order.
    fixes: Vec<(VehicleId, i64, bool, Coord<f64>)>,
    /// Sizes of the batches the fixes arrive in.
    batches: Vec<usize>,
}

fn case(steps: &[Step], batch_sizes: &[usize]) -> Case {
    let mut clock = [1_750_000_000_000i64; 4];
    let fixes = steps
        .iter()
        .map(|&(v, dt, dup, x, y)| {
            clock[v as usize] += dt;
            (
                VehicleId::from(format!("v{v}")),
                clock[v as usize],
                dup,
                point(x, y),
            )
        })
        .collect();
    Case {
        fixes,
        batches: batch_sizes.to_vec(),
    }
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

async fn stream_transitions(
    conn: &mut RedisLink,
    rules: &SharedRules,
) -> Vec<(String, String, String, i64)> {
    let mut out = Vec::new();
    for p in 0..rules.partitions {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(rules.keys.outbox(p))
            .arg("-")
            .arg("+")
            .query_async(conn)
            .await
            .unwrap();
        for (_, fields) in entries {
            let get = |k: &str| {
                fields
                    .iter()
                    .find(|(f, _)| f == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            out.push((get("v"), get("f"), get("e"), get("t").parse().unwrap_or(0)));
        }
    }
    out.sort();
    out
}

/// Runs `case` both ways; `Err` describes the first difference.
async fn compare(
    conn: &mut RedisLink,
    index: &Arc<FenceIndex>,
    settings: EvaluatorSettings,
    case: &Case,
) -> Result<(), String> {
    let _: () = redis::cmd("FLUSHDB").query_async(conn).await.unwrap();
    let rules = SharedRules::new("t", 4, settings.max_memberships, 3_600_000);
    let widest = widest_band(index, &settings);
    let mut scratch = ProbeScratch::default();
    let mut local = Evaluator::new(index.clone(), settings).tracking_changes(1);
    let mut local_out: Vec<Transition> = Vec::new();
    let mut local_outcomes = Vec::new();
    let mut shared_outcomes = vec![FixOutcome::Applied; case.fixes.len()];
    let mut shared_overflows = 0;
    let mut at = 0;
    for &size in case.batches.iter().chain(std::iter::repeat(&3)) {
        if at >= case.fixes.len() {
            break;
        }
        let batch = at..(at + size.max(1)).min(case.fixes.len());
        let mut by_partition: BTreeMap<u32, Vec<(usize, FixFacts)>> = BTreeMap::new();
        for i in batch.clone() {
            let (vehicle, ts, dup, p) = &case.fixes[i];
            local_outcomes.push(local.evaluate_delivery(
                vehicle,
                *ts,
                p.y,
                p.x,
                *dup,
                &mut local_out,
            ));
            by_partition
                .entry(rules.partition_of(vehicle))
                .or_default()
                .push((
                    i,
                    FixFacts {
                        index: i,
                        vehicle: vehicle.clone(),
                        fix_ms: *ts,
                        redelivered: *dup,
                        digest: Fix::position_digest(*ts, p.y, p.x),
                        probe: probe(index, &settings, widest, *p, &mut scratch),
                    },
                ));
        }
        for (partition, fixes) in by_partition {
            let facts: Vec<FixFacts> = fixes.iter().map(|(_, f)| f.clone()).collect();
            let applied = rules
                .apply(conn, partition, &facts)
                .await
                .map_err(|e| e.to_string())?;
            shared_overflows += applied.overflows;
            for ((i, _), outcome) in fixes.iter().zip(applied.outcomes) {
                shared_outcomes[*i] = outcome;
            }
        }
        at = batch.end;
    }
    if local_outcomes != shared_outcomes {
        return Err(format!(
            "outcomes differ:\n local  {local_outcomes:?}\n shared {shared_outcomes:?}"
        ));
    }
    if shared_overflows != local.stats().membership_overflow {
        return Err(format!(
            "overflows: local {}, shared {shared_overflows}",
            local.stats().membership_overflow
        ));
    }
    let mut want: Vec<(String, String, String, i64)> = local_out
        .iter()
        .map(|t| {
            (
                t.vehicle.to_string(),
                t.fence.to_string(),
                t.event.as_str().to_owned(),
                t.ts,
            )
        })
        .collect();
    want.sort();
    let got = stream_transitions(conn, &rules).await;
    if got != want {
        return Err(format!(
            "transitions differ:\n local  {want:?}\n shared {got:?}"
        ));
    }
    // Every vehicle's whole state: last applied fix, members, pending
    // dwells (lists compared as sets: their order carries no meaning).
    let mut changed = Vec::new();
    local.take_changed(&mut changed);
    for (vehicle, snapshot) in changed {
        let normalise = |s: Option<geogate::geofence::VehicleSnapshot>| {
            s.map(|s| (s.last_fix_ms, sorted(&s.members), sorted(&s.pending)))
        };
        let shared = rules
            .snapshot(conn, &vehicle)
            .await
            .map_err(|e| e.to_string())?;
        let (local, shared) = (normalise(snapshot), normalise(shared));
        if local != shared {
            return Err(format!("{vehicle}: local {local:?}, shared {shared:?}"));
        }
    }
    Ok(())
}

fn settings() -> EvaluatorSettings {
    EvaluatorSettings {
        hysteresis_m: 0.0,
        dwell_s: 0.0,
        // Small, so that overlapping fences overflow it.
        max_memberships: 2,
        idle_expiry_ms: 24 * 3600 * 1000,
        reorder_window_ms: 0,
    }
}

#[test]
fn the_redis_rules_agree_with_the_evaluator() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let index = Arc::new(FenceIndex::new(parse_fences(FENCES).unwrap()));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let conn = runtime.block_on(async {
        RedisLink::connect(&[redis.url()], false, Duration::from_secs(5))
            .await
            .unwrap()
    });
    let config = ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in steps(), batches in prop::collection::vec(1usize..8, 0..20))| {
        let case = case(&steps, &batches);
        // A clone shares the one multiplexed connection.
        let mut conn = conn.clone();
        let result = runtime.block_on(compare(&mut conn, &index, settings(), &case));
        prop_assert!(result.is_ok(), "{}", result.unwrap_err());
    });
}

/// A lap worked out by hand, so the agreement above is not an agreement
/// on nothing: a dwell confirmed exactly at its length, an overflow, a stay
/// inside a band and exits, each at the fix time written here.
#[test]
fn a_lap_exercises_every_rule() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let index = Arc::new(FenceIndex::new(parse_fences(FENCES).unwrap()));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut conn = RedisLink::connect(&[redis.url()], false, Duration::from_secs(5))
            .await
            .unwrap();
        // (dt ms, x, y):
        // 1. outside everything;
        // 2. (10.022, 50.005), in B, C and D: B entered, C and D pending;
        // 3. +1000 there: D's 1 s dwell is met exactly: D entered;
        // 4. +500 there: C's 1.5 s dwell is met, but two memberships is
        //    the limit: an overflow;
        // 5. (10.009, 50.005), in A, 71 m west of B (inside its 150 m band)
        //    and 490 m from D: D left, A entered, B kept;
        // 6. far east: A and B left.
        let lap: [(i64, u8, u8); 6] = [
            (0, 0, 0),
            (1000, 27, 8),
            (1000, 27, 8),
            (500, 27, 8),
            (1000, 14, 8),
            (1000, 39, 15),
        ];
        let steps: Vec<Step> = lap.iter().map(|&(dt, x, y)| (0, dt, false, x, y)).collect();
        compare(&mut conn, &index, settings(), &case(&steps, &[1]))
            .await
            .unwrap();
        let rules = SharedRules::new("t", 4, 2, 3_600_000);
        let t0 = 1_750_000_000_000i64;
        let mut want: Vec<(String, String, String, i64)> = [
            ("B", "enter", 1000),
            ("D", "enter", 2000),
            ("D", "exit", 3500),
            ("A", "enter", 3500),
            ("A", "exit", 4500),
            ("B", "exit", 4500),
        ]
        .iter()
        .map(|&(f, e, dt)| ("v0".to_owned(), f.to_owned(), e.to_owned(), t0 + dt))
        .collect();
        want.sort();
        assert_eq!(stream_transitions(&mut conn, &rules).await, want);
    });
}
