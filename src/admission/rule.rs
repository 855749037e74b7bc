//! The one admission rule, shared by the live router (`shard::Router`) and
//! the virtual replay (`sim`), so a what-if replay sheds exactly where
//! production would, above all in the overload it exists to model.
//!
//! | fill | priority | verdict |
//! |---|---|---|
//! | below the watermark | any | enqueue |
//! | at or above it | High | enqueue, waiting for room if full (never shed) |
//! | at or above it, queue full, gate does not pace | Low | shed `queue_full`; the gate is not asked, so nothing is spent |
//! | at or above it, otherwise | Low | the gate decides: release at `release_at`, or shed with its retry hint |
//! | … with `[gate.global]` | Low | the global allowance must also have room, checked first and paid only once the gate admits |
//!
//! A pacing gate (the leaky shaper) is asked even at a full queue: what it
//! admits waits at the gate for its release time, and then for room, so it
//! never queues past capacity either.
//!
//! The global allowance (see `allowance`) is looked at before the gate and
//! paid after it, so a refusal by either spends nothing from the other;
//! when both would refuse, the shed names the global allowance.

use super::{AdmissionPolicy, AnyGate, Gate, RejectReason, Route};
use crate::allowance::{GlobalAllowance, Spend};
use crate::clock::Nanos;
use crate::model::Priority;
use std::sync::Arc;

/// Why a Low event was shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedCause {
    /// The queue was full and the gate does not pace: no allowance spent.
    QueueFull,
    /// The gate refused; `retry_after` is its hint.
    Gate {
        retry_after: Option<Nanos>,
        reason: RejectReason,
    },
    /// The global allowance refused: exhausted (with its hint), or Redis
    /// unreachable under `fail_mode = closed`.
    Global(Spend),
}

/// What happens to one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Into the queue now; a High event at a full queue waits for room.
    Enqueue,
    /// Admitted by the gate: into the queue at `at` (later than now only
    /// for a pacing gate). An unpaced release always finds room.
    Release {
        at: Nanos,
    },
    Shed(ShedCause),
}

/// One shard's admission: the watermark policy and the shard's gate.
#[derive(Debug, Clone)]
pub struct Admission {
    policy: AdmissionPolicy,
    gate: AnyGate,
    global: Option<Arc<GlobalAllowance>>,
}

impl Admission {
    pub fn new(policy: AdmissionPolicy, gate: AnyGate) -> Self {
        Self {
            policy,
            gate,
            global: None,
        }
    }

    /// Low events the gate admits must also be paid from `global`.
    pub fn with_global(mut self, global: Arc<GlobalAllowance>) -> Self {
        self.global = Some(global);
        self
    }

    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    pub fn gate(&self) -> &AnyGate {
        &self.gate
    }

    pub fn has_global(&self) -> bool {
        self.global.is_some()
    }

    /// Whether admitted events wait at the gate for a release time.
    pub fn paces(&self) -> bool {
        matches!(self.gate, AnyGate::LeakyShaper(_))
    }

    /// Decides on an event of `priority` arriving at `now()` when `fill` of
    /// the queue's `capacity` slots are taken. `now` is called only when
    /// the gate is asked: below the watermark (most events) the live
    /// router reads no clock.
    pub fn decide(
        &mut self,
        fill: usize,
        priority: Priority,
        now: impl FnOnce() -> Nanos,
    ) -> Verdict {
        match self.policy.route(fill, priority) {
            Route::Enqueue | Route::Backpressure => Verdict::Enqueue,
            Route::Gate => {
                if fill >= self.policy.capacity() && !self.paces() {
                    return Verdict::Shed(ShedCause::QueueFull);
                }
                let global = self.global.as_deref().map(GlobalAllowance::check);
                if let Some(refused @ (Spend::Exhausted { .. } | Spend::Unavailable)) = global {
                    return Verdict::Shed(ShedCause::Global(refused));
                }
                match self.gate.try_admit(now(), 1) {
                    super::Decision::Admit { release_at } => {
                        if let Some(allowance) = &self.global {
                            match global {
                                Some(Spend::Paid) => allowance.spend(),
                                Some(Spend::AdmittedFailOpen) => allowance.admitted_unpaid(),
                                _ => {}
                            }
                        }
                        Verdict::Release { at: release_at }
                    }
                    super::Decision::Reject {
                        retry_after,
                        reason,
                    } => Verdict::Shed(ShedCause::Gate {
                        retry_after,
                        reason,
                    }),
                }
            }
        }
    }

    /// The gate's level at `now` (tokens, fill or backlog), for metrics.
    pub fn level(&self, now: Nanos) -> f64 {
        self.gate.level(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::GateSpec;
    use proptest::prelude::*;

    fn admission(spec: &str, capacity: usize) -> Admission {
        let gate = spec.parse::<GateSpec>().unwrap().build().unwrap();
        Admission::new(AdmissionPolicy::new(0.6, capacity).unwrap(), gate)
    }

    proptest! {
        /// High is never shed; below the watermark the gate is never
        /// asked; at a full queue an unpaced gate is never asked, so the
        /// gate's next decision is the one it would have made anyway.
        #[test]
        fn the_rule_spends_allowance_only_on_low_events_it_can_queue(
            steps in prop::collection::vec((0usize..=12, any::<bool>(), 0u64..50_000_000), 1..200),
            kind in prop::sample::select(vec!["token", "leaky_meter", "leaky_shaper"]),
        ) {
            let capacity = 10;
            let spec = format!("{kind}:rate=20,burst=3");
            let mut rule = admission(&spec, capacity);
            let mut twin = admission(&spec, capacity);
            let mut now = 0;
            for (fill, high, dt) in steps {
                now += dt;
                let fill = fill.min(capacity);
                let priority = if high { Priority::High } else { Priority::Low };
                let verdict = rule.decide(fill, priority, || now);
                let below = fill < rule.policy().threshold();
                if high || below {
                    prop_assert_eq!(verdict, Verdict::Enqueue);
                    continue;
                }
                if fill == capacity && !rule.paces() {
                    prop_assert_eq!(verdict, Verdict::Shed(ShedCause::QueueFull));
                    continue;
                }
                // Only here is the gate asked: the twin gate, asked only
                // here too, must agree.
                let expected = match twin.gate.try_admit(now, 1) {
                    super::super::Decision::Admit { release_at } => Verdict::Release { at: release_at },
                    super::super::Decision::Reject { retry_after, reason } => {
                        Verdict::Shed(ShedCause::Gate { retry_after, reason })
                    }
                };
                prop_assert_eq!(verdict, expected);
            }
            prop_assert_eq!(rule.level(now), twin.level(now));
        }
    }
}
