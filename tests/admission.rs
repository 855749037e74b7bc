//! The gates' promises, checked deterministically in virtual time: the worked
//! examples from the reference texts, properties over random traces, and a
//! differential test against governor.

use geogate::admission::{
    AnyGate, Decision, Gate, GateSpec, LeakyMeter, LeakyShaper, Rate, RejectReason, TokenBucket,
};
use geogate::clock::{Clock, ManualClock, NANOS_PER_SEC, Nanos};
use proptest::prelude::*;

const MS: Nanos = 1_000_000;

fn bucket(rate: f64, burst: u32) -> TokenBucket {
    TokenBucket::new(Rate::per_second(rate).unwrap(), burst).unwrap()
}

fn admit_n(gate: &mut impl Gate, now: Nanos, n: usize) -> usize {
    (0..n).filter(|_| gate.try_admit(now, 1).is_admit()).count()
}

#[test]
fn shared_allowance_worked_example() {
    // capacity 20, refill 5/s, starting full at t = 0.
    let clock = ManualClock::default();
    let mut gate = bucket(5.0, 20);
    assert_eq!(admit_n(&mut gate, clock.now(), 20), 20);
    let refused = gate.try_admit(clock.now(), 1);
    assert_eq!(
        refused,
        Decision::Reject {
            retry_after: Some(200 * MS),
            reason: RejectReason::NotYet
        }
    );
    clock.advance(400 * MS);
    assert_eq!(admit_n(&mut gate, clock.now(), 5), 2, "0.4 s earns two");
    clock.advance(2 * NANOS_PER_SEC);
    assert_eq!(
        admit_n(&mut gate, clock.now(), 20),
        10,
        "2 s idle earns ten"
    );
    clock.advance(NANOS_PER_SEC);
    assert_eq!(gate.level(clock.now()), 5.0);
    assert!(
        gate.try_admit(clock.now(), 5).is_admit(),
        "an export costs 5"
    );
    assert_eq!(gate.level(clock.now()), 0.0);
    assert!(!gate.try_admit(clock.now(), 1).is_admit());
}

#[test]
fn idle_time_buys_only_the_burst() {
    // r = 1/s, b = 3: twenty idle seconds hold three tokens, not twenty.
    let clock = ManualClock::default();
    let mut gate = bucket(1.0, 3);
    assert_eq!(admit_n(&mut gate, clock.now(), 3), 3);
    clock.advance(20 * NANOS_PER_SEC);
    let admitted = admit_n(&mut gate, clock.now(), 7);
    assert_eq!((admitted, 7 - admitted), (3, 4));
}

#[test]
fn shaper_releases_twentieth_after_nineteen_gaps() {
    let mut shaper = LeakyShaper::new(Rate::per_second(5.0).unwrap(), 20).unwrap();
    let start = 7 * NANOS_PER_SEC;
    let releases: Vec<Nanos> = (0..20)
        .map(|_| match shaper.try_admit(start, 1) {
            Decision::Admit { release_at } => release_at,
            other => panic!("expected admit, got {other:?}"),
        })
        .collect();
    assert_eq!(releases[0], start, "first release is immediate");
    assert_eq!(releases[19] - releases[0], 3_800 * MS);
    assert_eq!(shaper.waiting(start), 19);
    assert!(
        !shaper.try_admit(start, 1).is_admit(),
        "queue of 20 is full"
    );
}

#[test]
fn cost_above_capacity_is_never_admitted() {
    for spec in [
        "token:rate=5,burst=4",
        "leaky_meter:rate=5,burst=4",
        "leaky_shaper:rate=5,burst=4",
        "fixed_window:rate=5,burst=4",
    ] {
        let mut gate = spec.parse::<GateSpec>().unwrap().build().unwrap();
        assert_eq!(
            gate.try_admit(10 * NANOS_PER_SEC, 5),
            Decision::Reject {
                retry_after: None,
                reason: RejectReason::Never
            },
            "{spec}"
        );
        assert!(gate.try_admit(10 * NANOS_PER_SEC, 4).is_admit(), "{spec}");
    }
}

#[test]
fn retry_after_is_exactly_when_the_cost_first_fits() {
    for spec in [
        "token:rate=7,burst=3",
        "leaky_meter:rate=7,burst=3",
        "leaky_shaper:rate=7,burst=3",
    ] {
        let mut gate = spec.parse::<GateSpec>().unwrap().build().unwrap();
        let now = NANOS_PER_SEC;
        assert_eq!(admit_n(&mut gate, now, 3), 3);
        let Decision::Reject {
            retry_after: Some(wait),
            ..
        } = gate.try_admit(now, 2)
        else {
            panic!("{spec}: expected a reject with a hint");
        };
        let mut probe = gate.clone();
        assert!(!probe.try_admit(now + wait - 1, 2).is_admit(), "{spec}");
        assert!(gate.try_admit(now + wait, 2).is_admit(), "{spec}");
    }
}

#[test]
fn exact_rate_for_a_million_arrivals_no_drift() {
    // (e) After the burst is spent, arrivals at exactly r are all admitted,
    // and arrivals at exactly 2r are admitted exactly half the time.
    for rate in [1u64, 8, 32_000, 1_000_000] {
        let interval = NANOS_PER_SEC / rate;
        let mut gate = bucket(rate as f64, 10);
        assert_eq!(admit_n(&mut gate, 0, 10), 10);
        let admitted = (1..=1_000_000u64)
            .filter(|i| gate.try_admit(i * interval, 1).is_admit())
            .count();
        assert_eq!(admitted, 1_000_000, "rate {rate}");

        let mut meter = LeakyMeter::new(Rate::per_second(rate as f64).unwrap(), 10).unwrap();
        assert_eq!(admit_n(&mut meter, 0, 10), 10);
        let admitted = (1..=1_000_000u64)
            .filter(|i| meter.try_admit(i * interval / 2, 1).is_admit())
            .count();
        assert_eq!(admitted, 500_000, "rate {rate} at double speed");
    }
}

/// A random trace: sorted arrival times and costs.
fn trace() -> impl Strategy<Value = Vec<(Nanos, u32)>> {
    prop::collection::vec((0u64..3 * NANOS_PER_SEC, 1u32..4), 1..300).prop_map(|mut v| {
        v.sort_unstable();
        v
    })
}

fn run(gate: &mut impl Gate, trace: &[(Nanos, u32)]) -> Vec<Decision> {
    trace.iter().map(|&(t, c)| gate.try_admit(t, c)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// (a) Every window between two admitted events carries at most b + r·t.
    #[test]
    fn every_window_is_within_b_plus_rt(trace in trace(), rate in 1u64..2_000, burst in 1u32..40) {
        let mut gate = bucket(rate as f64, burst);
        let admitted: Vec<(Nanos, u32)> = trace
            .iter()
            .copied()
            .filter(|&(t, c)| gate.try_admit(t, c).is_admit())
            .collect();
        for i in 0..admitted.len() {
            let mut cost = 0u128;
            for j in i..admitted.len() {
                cost += u128::from(admitted[j].1);
                let t = u128::from(admitted[j].0 - admitted[i].0);
                // cost ≤ b + r·t, multiplied through by 1e9 to stay in integers.
                prop_assert!(
                    cost * u128::from(NANOS_PER_SEC)
                        <= u128::from(burst) * u128::from(NANOS_PER_SEC) + u128::from(rate) * t,
                    "window [{}, {}] admitted {} > b + r·t", admitted[i].0, admitted[j].0, cost
                );
            }
        }
    }

    /// (b) Token bucket and leaky meter decide identically, hints included.
    #[test]
    fn token_bucket_and_meter_agree(trace in trace(), rate in 0.5f64..5_000.0, burst in 1u32..40) {
        let rate = Rate::per_second(rate).unwrap();
        let mut token = TokenBucket::new(rate, burst).unwrap();
        let mut meter = LeakyMeter::new(rate, burst).unwrap();
        prop_assert_eq!(run(&mut token, &trace), run(&mut meter, &trace));
    }

    /// (c) Shaper releases are at least cost·T apart, never before arrival,
    /// and no more than b events wait; (d) every level stays in [0, b].
    #[test]
    fn shaper_paces_and_bounds_its_queue(trace in trace(), rate in 1u64..2_000, burst in 1u32..40) {
        let rate = Rate::per_second(rate as f64).unwrap();
        let mut shaper = LeakyShaper::new(rate, burst).unwrap();
        let mut token = TokenBucket::new(rate, burst).unwrap();
        let mut meter = LeakyMeter::new(rate, burst).unwrap();
        let mut last: Option<(Nanos, u32)> = None;
        for &(t, c) in &trace {
            if let Decision::Admit { release_at } = shaper.try_admit(t, c) {
                prop_assert!(release_at >= t);
                if let Some((prev, prev_cost)) = last {
                    prop_assert!(release_at - prev >= u64::from(prev_cost) * rate.interval());
                }
                last = Some((release_at, c));
            }
            prop_assert!(shaper.waiting(t) <= u64::from(burst));
            token.try_admit(t, c);
            meter.try_admit(t, c);
            for level in [shaper.level(t), token.level(t), meter.level(t)] {
                prop_assert!((0.0..=f64::from(burst)).contains(&level), "level {}", level);
            }
        }
    }

    /// Differential: governor's GCRA makes the same decisions as our token
    /// bucket for equal burst and equal replenish interval. Convention:
    /// governor truncates 1 s / r to whole nanoseconds where we round up, so
    /// both are built from the same interval (`Quota::with_period`).
    #[test]
    fn token_bucket_matches_governor(trace in trace(), interval in 1_000u64..50_000_000, burst in 1u32..40) {
        use governor::{Quota, RateLimiter, clock::FakeRelativeClock};
        use std::num::NonZeroU32;
        use std::time::Duration;

        let clock = FakeRelativeClock::default();
        let quota = Quota::with_period(Duration::from_nanos(interval))
            .unwrap()
            .allow_burst(NonZeroU32::new(burst).unwrap());
        let governor = RateLimiter::direct_with_clock(quota, clock.clone());
        let mut ours = TokenBucket::new(Rate::from_interval(interval), burst).unwrap();
        let mut elapsed = 0;
        for &(t, c) in &trace {
            clock.advance(Duration::from_nanos(t - elapsed));
            elapsed = t;
            let theirs = matches!(governor.check_n(NonZeroU32::new(c).unwrap()), Ok(Ok(())));
            prop_assert_eq!(ours.try_admit(t, c).is_admit(), theirs, "at {} cost {}", t, c);
        }
    }
}

#[test]
fn any_gate_dispatches_to_the_configured_kind() {
    let names: Vec<&str> = [
        "token:rate=1,burst=1",
        "leaky_meter:rate=1,burst=1",
        "leaky_shaper:rate=1,burst=1",
    ]
    .iter()
    .map(|s| s.parse::<GateSpec>().unwrap().build().unwrap())
    .map(|g: AnyGate| g.name())
    .collect();
    assert_eq!(names, ["token", "leaky_meter", "leaky_shaper"]);
}
