//! Time and order at the evaluator, on its injectable clock (the receive
//! times and watermarks are given, never read): the reorder window, late
//! fixes, duplicates as the same message, liveness on the receive clock
//! with expiry exits, and a restore that the store must hear about.

use geogate::geofence::{
    Cause, Evaluator, EvaluatorSettings, FenceIndex, Fix, FixOutcome, HeldChange, Transition,
    TransitionKind, parse_fences,
};
use geogate::model::VehicleId;
use proptest::prelude::*;
use std::sync::Arc;

/// A (10.00–10.01°E) and B (10.02–10.03°E), both 50.00–50.01°N, and C
/// around both.
const FENCES: &str = r#"{"type":"FeatureCollection","features":[
 {"type":"Feature","id":"A","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.00,50.00],[10.01,50.00],[10.01,50.01],[10.00,50.01],[10.00,50.00]]]}},
 {"type":"Feature","id":"B","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.02,50.00],[10.03,50.00],[10.03,50.01],[10.02,50.01],[10.02,50.00]]]}},
 {"type":"Feature","id":"C","properties":{"dwell_s":20},"geometry":{"type":"Polygon","coordinates":[[[9.99,49.99],[10.04,49.99],[10.04,50.02],[9.99,50.02],[9.99,49.99]]]}}]}"#;

const T0: i64 = 1_750_000_000_000;

fn index() -> Arc<FenceIndex> {
    Arc::new(FenceIndex::new(parse_fences(FENCES).expect("valid fences")))
}

fn settings(window_ms: i64) -> EvaluatorSettings {
    EvaluatorSettings {
        reorder_window_ms: window_ms,
        idle_expiry_ms: 600_000,
        ..EvaluatorSettings::default()
    }
}

/// Where fix `k` of a vehicle is: in A, between, in B, or outside C.
fn lon_of(place: u8) -> f64 {
    [10.005, 10.015, 10.025, 10.05][place as usize % 4]
}

/// One fix: (vehicle, seconds after T0, place).
type Spec = (u8, i64, u8);

fn fix<'a>(vehicle: &'a VehicleId, s: i64, place: u8, received_ms: i64) -> Fix<'a> {
    let (lat, lon) = (50.005, lon_of(place));
    Fix {
        vehicle,
        fix_ms: T0 + 1000 * s,
        lat,
        lon,
        redelivered: false,
        received_ms,
        digest: Fix::position_digest(T0 + 1000 * s, lat, lon),
    }
}

fn key(t: &Transition) -> (String, String, TransitionKind, i64) {
    (t.vehicle.to_string(), t.fence.to_string(), t.event, t.ts)
}

/// Per vehicle, in order: what the same fixes give applied in fix-time
/// order with no window (distinct times per vehicle).
fn in_order(vehicles: &[VehicleId], fixes: &[Spec]) -> Vec<(String, String, TransitionKind, i64)> {
    let mut sorted = fixes.to_vec();
    sorted.sort_by_key(|&(v, s, _)| (v, s));
    let mut ev = Evaluator::new(index(), settings(0));
    let mut out = Vec::new();
    for &(v, s, place) in &sorted {
        ev.evaluate_fix(fix(&vehicles[v as usize], s, place, T0), &mut out);
    }
    let mut keys: Vec<_> = out.iter().map(key).collect();
    keys.sort();
    keys
}

fn sorted(out: &[Transition]) -> Vec<(String, String, TransitionKind, i64)> {
    let mut keys: Vec<_> = out.iter().map(key).collect();
    keys.sort();
    keys
}

/// Fixes of up to 3 vehicles, distinct times per vehicle, in any order.
fn fleet() -> impl Strategy<Value = Vec<Spec>> {
    proptest::collection::btree_map((0u8..3, 0i64..120), 0u8..4, 1..40)
        .prop_map(|m| {
            m.into_iter()
                .map(|((v, s), p)| (v, s, p))
                .collect::<Vec<_>>()
        })
        .prop_shuffle()
}

proptest! {
    /// Any permutation of the fixes, all arriving within the window: once
    /// released, exactly the in-order transitions, none held back, and a
    /// watermark short of the window releases nothing.
    #[test]
    fn any_order_inside_the_window_gives_the_in_order_transitions(
        fixes in fleet(),
        gaps in proptest::collection::vec(0i64..50, 40),
    ) {
        let vehicles: Vec<VehicleId> = (0..3).map(|v| format!("v{v}").into()).collect();
        let window = 5_000;
        let mut ev = Evaluator::new(index(), settings(window));
        let mut out = Vec::new();
        let mut received = T0;
        for (i, &(v, s, place)) in fixes.iter().enumerate() {
            received += gaps[i % gaps.len()];
            let outcome = ev.evaluate_fix(fix(&vehicles[v as usize], s, place, received), &mut out);
            prop_assert_eq!(outcome, FixOutcome::Held);
            prop_assert_eq!(ev.release_due(received, &mut out), 0);
        }
        prop_assert!(out.is_empty());
        prop_assert_eq!(ev.held_now(), fixes.len());
        ev.release_due(received + window, &mut out);
        prop_assert_eq!(ev.held_now(), 0);
        prop_assert_eq!(sorted(&out), in_order(&vehicles, &fixes));
    }

    /// Fixes in epochs further apart than the window, each epoch in any
    /// order, with the watermark following arrivals: every release comes
    /// in time, and the result is the in-order one.
    #[test]
    fn epochs_released_as_the_watermark_moves_give_the_in_order_transitions(
        epochs in proptest::collection::vec(
            proptest::collection::btree_map((0u8..2, 0i64..10), 0u8..4, 1..8)
                .prop_map(|m| m.into_iter().collect::<Vec<_>>())
                .prop_shuffle(),
            1..6,
        ),
    ) {
        let vehicles: Vec<VehicleId> = (0..2).map(|v| format!("v{v}").into()).collect();
        let window = 2_000;
        let mut ev = Evaluator::new(index(), settings(window));
        let mut out = Vec::new();
        let mut all = Vec::new();
        for (e, epoch) in epochs.iter().enumerate() {
            // Epoch e's fixes are e·10 s to e·10 + 9 s and arrive within
            // 10 ms of each other, 3 windows after the last epoch's.
            let arrival = T0 + e as i64 * 3 * window;
            for (i, &((v, s), place)) in epoch.iter().enumerate() {
                let s = e as i64 * 10 + s;
                all.push((v, s, place));
                let f = fix(&vehicles[v as usize], s, place, arrival + i as i64);
                prop_assert_eq!(ev.evaluate_fix(f, &mut out), FixOutcome::Held);
            }
            ev.release_due(arrival + 10 + window, &mut out);
            prop_assert_eq!(ev.held_now(), 0);
        }
        prop_assert_eq!(sorted(&out), in_order(&vehicles, &all));
    }

    /// Without a window: the in-order evaluation of the arrival order with
    /// the late fixes removed, each late one reported with how late it was.
    #[test]
    fn without_a_window_late_fixes_are_dropped_and_counted(fixes in fleet()) {
        let vehicles: Vec<VehicleId> = (0..3).map(|v| format!("v{v}").into()).collect();
        let mut ev = Evaluator::new(index(), settings(0));
        let mut out = Vec::new();
        let mut newest = [i64::MIN; 3];
        let mut kept = Vec::new();
        let mut late = 0;
        for &(v, s, place) in &fixes {
            let outcome = ev.evaluate_fix(fix(&vehicles[v as usize], s, place, T0), &mut out);
            let last = newest[v as usize];
            if s < last {
                late += 1;
                prop_assert_eq!(outcome, FixOutcome::Late { by_ms: 1000 * (last - s) });
            } else {
                newest[v as usize] = s;
                kept.push((v, s, place));
                prop_assert_eq!(outcome, FixOutcome::Applied);
            }
        }
        prop_assert_eq!(ev.stats().late, late);
        prop_assert_eq!(sorted(&out), in_order(&vehicles, &kept));
    }
}

/// A device's buffer sent after its live fix, newest first: the window
/// gives the visit to A during the outage; without one it is lost and its
/// fixes are late.
#[test]
fn a_buffer_sent_after_the_live_fix_is_recovered_by_the_window() {
    let v: VehicleId = "van".into();
    // Outside (0 s), then an outage: A at 10 and 20 s, outside at 30 s;
    // live again at 40 s in B. Sent: 0 s; then 40 s, 30, 20, 10.
    let arrivals = [(0, 3), (40, 2), (30, 3), (20, 0), (10, 0)];
    let run = |window: i64| {
        let mut ev = Evaluator::new(index(), settings(window));
        let mut out = Vec::new();
        for (i, &(s, place)) in arrivals.iter().enumerate() {
            let received = T0 + 60_000 + i as i64 * 100;
            ev.evaluate_fix(fix(&v, s, place, received), &mut out);
            ev.release_due(received, &mut out);
        }
        ev.release_due(T0 + 60_000 + 10_000, &mut out);
        (
            out.iter()
                .filter(|t| &*t.fence != "C")
                .map(|t| (t.fence.to_string(), t.event, (t.ts - T0) / 1000))
                .collect::<Vec<_>>(),
            ev.stats().late,
        )
    };
    let (with, late) = run(2_000);
    assert_eq!(
        with,
        vec![
            ("A".into(), TransitionKind::Enter, 10),
            ("A".into(), TransitionKind::Exit, 30),
            ("B".into(), TransitionKind::Enter, 40),
        ]
    );
    assert_eq!(late, 0);
    let (without, late) = run(0);
    assert_eq!(without, vec![("B".into(), TransitionKind::Enter, 40)]);
    assert_eq!(late, 3);
}

/// Two different messages at the same fix time are two fixes, in arrival
/// order; the same message again is a duplicate, in the window or after
/// it; a redelivered older fix is taken as applied before.
#[test]
fn duplicates_are_the_same_message_not_the_same_time() {
    let v: VehicleId = "v".into();
    let mut ev = Evaluator::new(index(), settings(0));
    let mut out = Vec::new();
    let inside = fix(&v, 10, 0, T0);
    let outside = fix(&v, 10, 3, T0);
    assert_eq!(ev.evaluate_fix(inside, &mut out), FixOutcome::Applied);
    assert_eq!(ev.evaluate_fix(outside, &mut out), FixOutcome::Applied);
    assert_eq!(ev.evaluate_fix(inside, &mut out), FixOutcome::Duplicate);
    assert_eq!(
        out.iter().map(|t| (&*t.fence, t.event)).collect::<Vec<_>>(),
        vec![("A", TransitionKind::Enter), ("A", TransitionKind::Exit)]
    );
    let redelivered = Fix {
        redelivered: true,
        ..fix(&v, 5, 2, T0)
    };
    assert_eq!(
        ev.evaluate_fix(redelivered, &mut out),
        FixOutcome::Duplicate
    );

    let mut windowed = Evaluator::new(index(), settings(1_000));
    assert_eq!(windowed.evaluate_fix(inside, &mut out), FixOutcome::Held);
    assert_eq!(
        windowed.evaluate_fix(inside, &mut out),
        FixOutcome::Duplicate
    );
    assert_eq!(windowed.evaluate_fix(outside, &mut out), FixOutcome::Held);
    assert_eq!(windowed.stats().duplicates, 1);
}

/// Liveness on the receive clock: a parked fleet reporting every 10 s is
/// never expired, whatever one device's fix times say (a year ahead, or a
/// GPS week rollover 19.6 years back); a vehicle that goes quiet is
/// expired with an exit from each fence it was in, at the time it became
/// idle, and enters again when it returns.
#[test]
fn a_wrong_clock_moves_nobody_else_and_expiry_exits() {
    let vehicles: Vec<VehicleId> = (0..200).map(|v| format!("p{v}").into()).collect();
    let (wrong, quiet): (VehicleId, VehicleId) = ("wrong".into(), "quiet".into());
    let mut ev = Evaluator::new(index(), settings(0));
    let mut out = Vec::new();
    let year_ms = 365 * 86_400_000;
    let rollover_ms = 1024 * 7 * 86_400_000;
    ev.evaluate_fix(fix(&quiet, 0, 0, T0), &mut out);
    // An hour of reports, every 10 s, on a receive clock that tracks the
    // fix times; the wrong device's fixes are far off, its receive times
    // are not.
    for tick in 0..360i64 {
        let now = T0 + tick * 10_000;
        for v in &vehicles {
            ev.evaluate_fix(fix(v, tick * 10, 0, now), &mut out);
        }
        let off = if tick % 2 == 0 { year_ms } else { -rollover_ms };
        let mut odd = fix(&wrong, tick * 10, 0, now);
        odd.fix_ms += off;
        odd.digest = Fix::position_digest(odd.fix_ms, odd.lat, odd.lon);
        ev.evaluate_fix(odd, &mut out);
        ev.expire_idle(now, &mut out);
    }
    let parked_enters = out
        .iter()
        .filter(|t| t.vehicle.starts_with('p') && t.event == TransitionKind::Enter)
        .count();
    // One enter of A and one of C (after its 20 s dwell) per vehicle.
    assert_eq!(parked_enters, 2 * vehicles.len());
    assert!(
        out.iter()
            .all(|t| !(t.vehicle.starts_with('p') && t.event == TransitionKind::Exit)),
        "no parked vehicle left a fence"
    );
    // The quiet vehicle, in A since T0 (C's dwell never confirmed), is
    // expired 600 s after it was last heard from.
    let expired: Vec<&Transition> = out
        .iter()
        .filter(|t| t.vehicle == quiet && t.event == TransitionKind::Exit)
        .collect();
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert_eq!(
        (&*expired[0].fence, expired[0].ts, expired[0].cause),
        ("A", T0 + 600_000, Some(Cause::Expired))
    );
    out.clear();
    let back = T0 + 3_600_000;
    ev.evaluate_fix(fix(&quiet, 3_600, 0, back), &mut out);
    assert_eq!(
        out.iter().map(|t| (&*t.fence, t.event)).collect::<Vec<_>>(),
        vec![("A", TransitionKind::Enter)]
    );
}

/// A vehicle with fixes in its window is not expired, whatever the clock.
#[test]
fn a_vehicle_with_held_fixes_is_not_expired() {
    let v: VehicleId = "v".into();
    let mut ev = Evaluator::new(index(), settings(10_000));
    let mut out = Vec::new();
    ev.evaluate_fix(fix(&v, 0, 0, T0), &mut out);
    // The watermark passes the idle expiry but not the window's close.
    assert_eq!(ev.expire_now(T0 + 9_000, &mut out), 0);
    assert_eq!(ev.held_now(), 1);
}

/// restore() drops memberships of fences no longer in the set, and lists
/// the vehicle as changed so the store hears it: otherwise a reload that
/// brings the fence back, then a crash, would bring the membership back.
#[test]
fn what_restore_drops_is_written_back() {
    let v: VehicleId = "v".into();
    let mut ev = Evaluator::new(index(), settings(0)).tracking_changes(1);
    let mut out = Vec::new();
    ev.evaluate_fix(fix(&v, 0, 0, T0), &mut out);
    let mut changed = Vec::new();
    ev.take_changed(&mut changed);
    let (_, Some(stored)) = changed.pop().expect("v changed") else {
        panic!("v is not deleted");
    };
    assert_eq!(stored.members, vec![Arc::<str>::from("A")]);

    let without_a = FENCES.replace(r#""id":"A""#, r#""id":"Z""#);
    let reloaded = Arc::new(FenceIndex::new(parse_fences(&without_a).unwrap()));
    let mut restarted = Evaluator::new(reloaded, settings(0)).tracking_changes(1);
    restarted.restore(v.clone(), &stored);
    assert!(restarted.has_changes());
    restarted.take_changed(&mut changed);
    let (_, Some(written)) = changed.pop().expect("v written back") else {
        panic!("v is not deleted");
    };
    assert!(written.members.is_empty(), "{written:?}");

    // Restoring what was written back, with A present again, matches the
    // process that reloaded A: no membership, so the next fix enters.
    let mut again = Evaluator::new(index(), settings(0));
    again.restore(v.clone(), &written);
    out.clear();
    again.evaluate_fix(fix(&v, 10, 0, T0 + 10_000), &mut out);
    assert_eq!(
        out.iter().map(|t| (&*t.fence, t.event)).collect::<Vec<_>>(),
        vec![("A", TransitionKind::Enter)]
    );
}

/// What a durable store hears of the window: a held fix is logged under
/// its key and does not rewrite its vehicle's record; its duplicate logs
/// nothing; when it is applied it leaves the log and the record is
/// written (the two in one commit).
#[test]
fn a_held_fix_is_logged_not_recorded_until_it_is_applied() {
    let v: VehicleId = "v".into();
    let mut ev = Evaluator::new(index(), settings(2_000)).tracking_changes(100);
    let mut out = Vec::new();
    let (mut changed, mut held) = (Vec::new(), Vec::new());
    assert_eq!(
        ev.evaluate_fix(fix(&v, 0, 0, T0), &mut out),
        FixOutcome::Held
    );
    assert_eq!(
        ev.evaluate_fix(fix(&v, 0, 0, T0 + 10), &mut out),
        FixOutcome::Duplicate
    );
    ev.take_held(&mut held);
    ev.take_changed(&mut changed);
    assert!(
        matches!(held.as_slice(), [HeldChange::Held(id, h)] if *id == v && h.key == 100),
        "{held:?}"
    );
    // The duplicate changed the receive time: the record is written.
    assert_eq!(changed.len(), 1);
    assert!(changed[0].1.as_ref().is_some_and(|s| s.window.is_empty()));

    let mut ev = Evaluator::new(index(), settings(2_000)).tracking_changes(100);
    ev.evaluate_fix(fix(&v, 0, 0, T0), &mut out);
    ev.evaluate_fix(fix(&v, 1, 0, T0 + 1_000), &mut out);
    held.clear();
    changed.clear();
    ev.take_held(&mut held);
    ev.take_changed(&mut changed);
    assert_eq!(held.len(), 2);
    assert!(changed.is_empty(), "a hold rewrote a record: {changed:?}");
    held.clear();
    assert_eq!(ev.release_due(T0 + 2_000, &mut out), 1);
    ev.take_held(&mut held);
    ev.take_changed(&mut changed);
    assert_eq!(held, vec![HeldChange::Left(100)]);
    assert_eq!(changed.len(), 1, "the applied fix changed the record");
    assert!(!ev.has_changes(), "everything was taken");
}
