//! Fence sets as live data, below the API: a set changed one fence at a
//! time answers as one built afresh, and the evaluator's lifecycle rules
//! for a fence deleted, changed or created under a vehicle.

use geo::Coord;
use geogate::geofence::generate::{SplitMix64, random_fences};
use geogate::geofence::{
    Cause, Coverings, Evaluator, EvaluatorSettings, Fence, FenceChange, FenceIndex, Fix,
    FixOutcome, Transition, TransitionKind, VehicleSnapshot, parse_fences,
};
use geogate::model::VehicleId;
use proptest::prelude::*;
use serde_json::json;
use std::sync::Arc;

fn square(id: &str, x0: f64, y0: f64, side: f64, props: serde_json::Value) -> serde_json::Value {
    let (x1, y1) = (x0 + side, y0 + side);
    json!({"type": "Feature", "id": id, "properties": props, "geometry": {"type": "Polygon",
        "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}})
}

fn fences(features: Vec<serde_json::Value>) -> Vec<Fence> {
    let doc = json!({"type": "FeatureCollection", "features": features});
    parse_fences(&doc.to_string()).expect("valid fences")
}

fn ids(index: &FenceIndex, found: &[u32]) -> Vec<String> {
    let mut ids: Vec<String> = found
        .iter()
        .map(|&f| index.fence(f).id.to_string())
        .collect();
    ids.sort();
    ids
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Changed fence by fence (upserts of new and existing ids, deletions,
    /// up to and past the point where a change builds the delta into a new
    /// base), a set answers every point as a set built afresh from its live
    /// fences, one point at a time and in batches, and so does it compacted.
    #[test]
    fn a_changed_set_answers_as_one_built_afresh(
        seed in any::<u64>(),
        changes in prop::collection::vec((any::<bool>(), 0usize..260), 1..300),
    ) {
        let (base, area) = random_fences(seed, 200, 1, 400);
        let (spare, _) = random_fences(seed ^ 0x5eed, 260, 0, 0);
        let mut set = FenceIndex::new(base);
        for (n, (delete, pick)) in changes.iter().enumerate() {
            let id = format!("f{}", pick % 240);
            let change = if *delete {
                FenceChange { deletes: vec![id.as_str().into()], ..FenceChange::default() }
            } else {
                let fence = Fence { id: id.as_str().into(), ..spare[*pick].clone() };
                FenceChange { upserts: vec![fence], ..FenceChange::default() }
            };
            set = set.apply(FenceChange { version: n as u64 + 2, at_ms: n as i64, ..change });
        }
        let fresh = FenceIndex::new(set.fences().cloned().collect());
        prop_assert_eq!(set.len(), fresh.len());
        let compacted = set.compacted();
        prop_assert!(!compacted.needs_compaction());
        prop_assert_eq!(compacted.version(), set.version());
        let mut rng = SplitMix64::new(seed);
        let points: Vec<Coord<f64>> = (0..400).map(|_| area.random_point(&mut rng)).collect();
        let mut batch = Coverings::default();
        set.containing_batch(&points, &mut batch);
        let (mut a, mut b, mut linear) = (Vec::new(), Vec::new(), Vec::new());
        for (i, p) in points.iter().enumerate() {
            set.containing(*p, &mut a);
            fresh.containing(*p, &mut b);
            set.containing_linear(*p, &mut linear);
            prop_assert_eq!(ids(&set, &a), ids(&fresh, &b), "at {:?}", p);
            compacted.containing(*p, &mut b);
            prop_assert_eq!(ids(&set, &a), ids(&compacted, &b));
            prop_assert_eq!(&a, &linear);
            prop_assert_eq!(batch.of(i), a.as_slice());
        }
    }
}

const T0: i64 = 1_800_000_000_000;

struct World {
    set: Arc<FenceIndex>,
    ev: Evaluator,
    out: Vec<Transition>,
    version: u64,
}

impl World {
    fn new(features: Vec<serde_json::Value>, settings: EvaluatorSettings) -> Self {
        let set = Arc::new(FenceIndex::new(fences(features)).apply(FenceChange {
            version: 1,
            at_ms: T0 - 1,
            ..FenceChange::default()
        }));
        Self {
            ev: Evaluator::new(set.clone(), settings).tracking_changes(1),
            set,
            out: Vec::new(),
            version: 1,
        }
    }

    fn fix(&mut self, vehicle: &str, at: i64, lat: f64, lon: f64) -> FixOutcome {
        let v = VehicleId::from(vehicle);
        self.ev.evaluate_fix(
            Fix {
                vehicle: &v,
                fix_ms: at,
                lat,
                lon,
                redelivered: false,
                received_ms: at,
                digest: Fix::position_digest(at, lat, lon),
            },
            &mut self.out,
        )
    }

    /// Makes a change at `at` and swaps it in, as a worker's next batch.
    fn change(&mut self, at: i64, upserts: Vec<serde_json::Value>, deletes: &[&str]) -> u64 {
        self.version += 1;
        let change = FenceChange {
            version: self.version,
            at_ms: at,
            upserts: if upserts.is_empty() {
                Vec::new()
            } else {
                fences(upserts)
            },
            deletes: deletes.iter().map(|d| (*d).into()).collect(),
        };
        self.set = Arc::new(self.set.apply(change));
        self.ev.swap_index(self.set.clone());
        self.version
    }

    /// Everything since the last call, as (vehicle, fence, event, ts, cause).
    fn take(&mut self) -> Vec<(String, String, TransitionKind, i64, Option<Cause>, u64)> {
        self.out
            .drain(..)
            .map(|t| {
                (
                    t.vehicle.to_string(),
                    t.fence.to_string(),
                    t.event,
                    t.ts,
                    t.cause,
                    t.fence_version,
                )
            })
            .collect()
    }
}

use TransitionKind::{Enter, Exit};

fn names(ids: Vec<geogate::model::FenceId>) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

fn t(
    v: &str,
    f: &str,
    e: TransitionKind,
    ts: i64,
    cause: Option<Cause>,
    version: u64,
) -> (String, String, TransitionKind, i64, Option<Cause>, u64) {
    (v.into(), f.into(), e, ts, cause, version)
}

fn yard() -> Vec<serde_json::Value> {
    vec![
        square("a", 0.0, 0.0, 1.0, json!({})),
        square("b", 0.0, 0.0, 1.0, json!({})),
        square("c", 0.0, 0.0, 1.0, json!({})),
    ]
}

#[test]
fn a_deleted_fence_exits_its_members_at_the_change_and_no_fix_is_needed() {
    let mut w = World::new(yard(), EvaluatorSettings::default());
    w.fix("v", T0, 0.5, 0.5);
    w.fix("u", T0, 5.0, 5.0);
    assert_eq!(w.take().len(), 3, "v entered a, b and c");
    let at = T0 + 10_000;
    let version = w.change(at, vec![], &["c", "a"]);
    assert_eq!(w.ev.reconcile(at - 1, &mut w.out), 0, "not before its time");
    assert_eq!(w.ev.reconcile(at, &mut w.out), 2);
    assert_eq!(
        w.take(),
        vec![
            t("v", "a", Exit, at, Some(Cause::FenceDeleted), version),
            t("v", "c", Exit, at, Some(Cause::FenceDeleted), version),
        ],
        "exits in fence id order, dated at the change, with its version"
    );
    assert_eq!(names(w.ev.memberships("v")), ["b"]);
    assert_eq!(w.ev.reconcile(at + 1, &mut w.out), 0, "once only");
    w.fix("v", at + 1, 0.5, 0.5);
    assert!(w.take().is_empty(), "still in b, and a and c are gone");
}

#[test]
fn a_changed_fence_exits_only_members_its_new_geometry_lets_go() {
    let settings = EvaluatorSettings {
        hysteresis_m: 50.0,
        ..EvaluatorSettings::default()
    };
    let mut w = World::new(yard(), settings);
    w.fix("v", T0, 0.5, 0.5);
    w.take();
    let at = T0 + 5_000;
    // a shrinks away from v; b moves so that v is outside but within 50 m
    // of its edge (hysteresis holds it); c grows.
    let edge = 0.5 - 20.0 / 111_195.0;
    let version = w.change(
        at,
        vec![
            square("a", 0.7, 0.7, 0.2, json!({})),
            square("b", 0.0, 0.0, edge, json!({})),
            square("c", -1.0, -1.0, 3.0, json!({})),
        ],
        &[],
    );
    w.ev.reconcile(at, &mut w.out);
    assert_eq!(
        w.take(),
        vec![t("v", "a", Exit, at, Some(Cause::FenceChanged), version)]
    );
    assert_eq!(names(w.ev.memberships("v")), ["b", "c"]);
    // The kept memberships are of the new definitions: leaving c's new
    // area exits it with the fix's own time.
    w.fix("v", at + 1_000, 2.5, 2.5);
    assert_eq!(
        w.take(),
        vec![
            t("v", "b", Exit, at + 1_000, None, version),
            t("v", "c", Exit, at + 1_000, None, version)
        ]
    );
}

#[test]
fn a_fence_created_or_widened_under_a_silent_vehicle_waits_for_its_next_fix() {
    let mut w = World::new(
        vec![square("a", 0.0, 0.0, 0.1, json!({}))],
        EvaluatorSettings::default(),
    );
    w.fix("v", T0, 0.5, 0.5);
    assert!(w.take().is_empty());
    let at = T0 + 1_000;
    let version = w.change(
        at,
        vec![
            square("a", 0.0, 0.0, 1.0, json!({})),
            square("new", 0.0, 0.0, 1.0, json!({"site": "north"})),
        ],
        &[],
    );
    w.ev.reconcile(at + 60_000, &mut w.out);
    assert!(w.take().is_empty(), "no enter is invented");
    w.fix("v", at + 2_000, 0.5, 0.5);
    assert_eq!(
        w.take(),
        vec![
            t("v", "a", Enter, at + 2_000, None, version),
            t("v", "new", Enter, at + 2_000, None, version)
        ]
    );
}

#[test]
fn a_dwell_in_progress_on_a_deleted_fence_is_dropped_and_counted() {
    let settings = EvaluatorSettings {
        dwell_s: 60.0,
        ..EvaluatorSettings::default()
    };
    let mut w = World::new(yard(), settings);
    w.fix("v", T0, 0.5, 0.5);
    assert!(w.take().is_empty(), "dwelling");
    w.change(T0 + 10_000, vec![], &["b"]);
    assert_eq!(w.ev.stats().dwells_dropped, 1);
    w.ev.reconcile(T0 + 10_000, &mut w.out);
    assert!(w.take().is_empty(), "no exit for a fence never entered");
    w.fix("v", T0 + 61_000, 0.5, 0.5);
    let entered: Vec<String> = w.take().into_iter().map(|e| e.1).collect();
    assert_eq!(entered, vec!["a", "c"], "the other dwells go on");
}

/// DESIGN.md's timer rule: a fix received before the change and still in
/// the vehicle's window leaves it first; the exit follows.
#[test]
fn a_change_exit_waits_for_the_fixes_received_before_it() {
    let settings = EvaluatorSettings {
        reorder_window_ms: 2_000,
        ..EvaluatorSettings::default()
    };
    let mut w = World::new(yard(), settings);
    w.fix("v", T0, 0.5, 0.5);
    w.ev.release_due(T0 + 2_000, &mut w.out);
    w.take();
    // Received at T0 + 3000: waits until T0 + 5000.
    assert_eq!(w.fix("v", T0 + 3_000, 0.5, 0.5 + 0.2), FixOutcome::Held);
    let at = T0 + 4_000;
    let version = w.change(at, vec![], &["a"]);
    w.ev.reconcile(at, &mut w.out);
    assert!(w.take().is_empty(), "a fix from before the change waits");
    w.ev.release_due(T0 + 5_000, &mut w.out);
    w.ev.reconcile(T0 + 5_000, &mut w.out);
    assert_eq!(
        w.take(),
        vec![t("v", "a", Exit, at, Some(Cause::FenceDeleted), version)]
    );
}

/// A crash between a change and its exits' commit: the vehicle's record
/// from before the change, restored under the changed set, gives the same
/// exits as the evaluator that saw the change live.
#[test]
fn a_restored_record_from_before_a_change_gives_the_same_exits() {
    let mut w = World::new(yard(), EvaluatorSettings::default());
    w.fix("v", T0, 0.5, 0.5);
    w.take();
    let mut changed = Vec::new();
    w.ev.take_changed(&mut changed);
    let (_, Some(before)) = changed.pop().expect("v changed") else {
        panic!("v is kept");
    };
    assert_eq!(before.fences_version, 1);
    assert_eq!(before.position, Some((0.5, 0.5)));
    let at = T0 + 7_000;
    w.change(
        at,
        vec![square("b", 3.0, 3.0, 1.0, json!({"site": "moved"}))],
        &["a"],
    );
    // The record written now keeps the question open.
    w.ev.take_changed(&mut changed);
    let (_, Some(open)) = changed.pop().expect("v changed") else {
        panic!("v is kept");
    };
    assert_eq!(open.fences_version, 1, "a restart asks again");
    w.ev.reconcile(at, &mut w.out);
    let live = w.take();
    assert_eq!(live.len(), 2, "{live:?}");
    w.ev.take_changed(&mut changed);
    let (_, Some(settled)) = changed.pop().expect("v changed") else {
        panic!("v is kept");
    };
    assert_eq!(settled.fences_version, 2);
    assert_eq!(names(settled.members.clone()), ["c"]);

    for record in [before, open] {
        let mut restored = Evaluator::new(w.set.clone(), EvaluatorSettings::default());
        restored.restore("v".into(), &record);
        let mut out = Vec::new();
        restored.reconcile(at, &mut out);
        let again: Vec<_> = out
            .iter()
            .map(|t| (t.fence.to_string(), t.event, t.ts, t.cause, t.fence_version))
            .collect();
        let live: Vec<_> = live
            .iter()
            .map(|t| (t.1.clone(), t.2, t.3, t.4, t.5))
            .collect();
        assert_eq!(again, live);
        assert_eq!(names(restored.memberships("v")), ["c"]);
    }
    // Settled, a restore asks nothing.
    let mut restored = Evaluator::new(w.set.clone(), EvaluatorSettings::default());
    restored.restore("v".into(), &settled);
    let mut out = Vec::new();
    restored.reconcile(at, &mut out);
    assert!(out.is_empty());
}

#[test]
fn a_deleted_fence_recreated_before_the_worker_looked_still_exits() {
    let mut w = World::new(yard(), EvaluatorSettings::default());
    w.fix("v", T0, 0.5, 0.5);
    w.take();
    let set = w.set.clone();
    let deleted = Arc::new(set.apply(FenceChange {
        version: 2,
        at_ms: T0 + 1_000,
        deletes: vec!["a".into()],
        ..FenceChange::default()
    }));
    let recreated = Arc::new(deleted.apply(FenceChange {
        version: 3,
        at_ms: T0 + 2_000,
        upserts: fences(vec![square("a", 0.0, 0.0, 1.0, json!({}))]),
        ..FenceChange::default()
    }));
    // The worker jumps from version 1 to 3.
    w.ev.swap_index(recreated);
    w.ev.reconcile(T0 + 2_000, &mut w.out);
    assert_eq!(
        w.take(),
        vec![t("v", "a", Exit, T0 + 1_000, Some(Cause::FenceDeleted), 2)]
    );
    w.fix("v", T0 + 3_000, 0.5, 0.5);
    assert_eq!(w.take(), vec![t("v", "a", Enter, T0 + 3_000, None, 3)]);
}

#[test]
fn a_snapshot_carries_what_the_state_query_needs() {
    let mut w = World::new(yard(), EvaluatorSettings::default());
    w.fix("v", T0, 0.25, 0.75);
    let mut changed = Vec::new();
    w.ev.take_changed(&mut changed);
    let expected = VehicleSnapshot {
        last_fix_ms: T0,
        last_digests: vec![Fix::position_digest(T0, 0.25, 0.75)],
        last_heard_ms: T0,
        members: vec!["a".into(), "b".into(), "c".into()],
        position: Some((0.25, 0.75)),
        fences_version: 1,
        ..VehicleSnapshot::default()
    };
    assert_eq!(changed, vec![("v".into(), Some(expected))]);
}

/// A vehicle forgotten while a deletion's exit is still owed (the
/// watermark behind the change, as in a backlog) leaves the fence once:
/// by expiry when it went idle first, else by the deletion.
#[test]
fn a_vehicle_forgotten_with_a_deletion_owed_leaves_once() {
    for (deleted_at, cause, ts) in [
        (T0 + 120_000, Cause::Expired, T0 + 60_000),
        (T0 + 30_000, Cause::FenceDeleted, T0 + 30_000),
    ] {
        let settings = EvaluatorSettings {
            idle_expiry_ms: 60_000,
            ..EvaluatorSettings::default()
        };
        let mut w = World::new(yard(), settings);
        w.fix("v", T0, 0.5, 0.5);
        w.take();
        let version = w.change(deleted_at, vec![], &["a"]);
        // Not caught up with the deletion when the first is after the
        // expiry; then the sweep forgets v.
        w.ev.reconcile(T0 + 20_000, &mut w.out);
        assert_eq!(w.ev.expire_now(T0 + 70_000, &mut w.out), 1);
        w.ev.reconcile(T0 + 200_000, &mut w.out);
        let out = w.take();
        let a: Vec<_> = out.iter().filter(|e| e.1 == "a").cloned().collect();
        assert_eq!(
            a,
            vec![t("v", "a", Exit, ts, Some(cause), version)],
            "{out:?}"
        );
        assert_eq!(out.len(), 3, "b and c by expiry too: {out:?}");
    }
}
