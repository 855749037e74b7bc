//! The two leaky buckets. The name alone does not say whether callers wait,
//! so geogate has one type for each meaning:
//!
//! * [`LeakyMeter`] rejects at once: it tracks how much work an imaginary
//!   queue draining at `r` would still hold, and admits while that fits in
//!   `b`. It keeps its own level and timestamp (not the token bucket's single
//!   word) so that the equivalence with [`super::TokenBucket`] is a tested
//!   fact rather than a shared implementation.
//! * [`LeakyShaper`] queues: an admitted event gets a release time, paced one
//!   unit of cost per interval, and downstream never sees more than `r`.

use super::{Decision, Gate, GateSpecError, NEVER, Rate, RejectReason, scaled};
use crate::clock::Nanos;

/// Leaky bucket as a meter: starts empty, drains at `r`, admits if
/// `level + c ≤ b`.
#[derive(Debug, Clone)]
pub struct LeakyMeter {
    rate: Rate,
    capacity: u32,
    capacity_ns: Nanos,
    /// Fill at `last`, in nanoseconds of drain.
    level_ns: Nanos,
    last: Nanos,
}

impl LeakyMeter {
    pub fn new(rate: Rate, capacity: u32) -> Result<Self, GateSpecError> {
        if capacity == 0 {
            return Err(GateSpecError::Burst("burst must be ≥ 1".into()));
        }
        Ok(Self {
            rate,
            capacity,
            capacity_ns: scaled(capacity, rate)?,
            level_ns: 0,
            last: 0,
        })
    }

    fn drain_to(&mut self, now: Nanos) {
        if now > self.last {
            self.level_ns = self.level_ns.saturating_sub(now - self.last);
            self.last = now;
        }
    }
}

impl Gate for LeakyMeter {
    #[inline]
    fn try_admit(&mut self, now: Nanos, cost: u32) -> Decision {
        if cost > self.capacity {
            return NEVER;
        }
        self.drain_to(now);
        let cost_ns = u64::from(cost) * self.rate.interval();
        let after = self.level_ns + cost_ns;
        if after <= self.capacity_ns {
            self.level_ns = after;
            Decision::Admit { release_at: now }
        } else {
            Decision::Reject {
                // The level must drain until the cost fits; `last` may be
                // ahead of `now` only if the caller's clock went backwards.
                retry_after: Some(after - self.capacity_ns + self.last.saturating_sub(now)),
                reason: RejectReason::NotYet,
            }
        }
    }

    fn level(&self, now: Nanos) -> f64 {
        let level = self.level_ns.saturating_sub(now.saturating_sub(self.last));
        level as f64 / self.rate.interval() as f64
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn name(&self) -> &'static str {
        "leaky_meter"
    }
}

/// Leaky bucket as a queued shaper: a finite queue of depth `b` released one
/// unit of cost every `T`.
///
/// Conventions: the first release after an idle period is immediate (at the
/// arrival); an event's release time is `max(arrival, next_release)`; the
/// backlog counts the event released at this instant, so depth `b` admits
/// `b` simultaneous unit-cost arrivals, the last released `(b − 1)·T` later.
/// A full queue rejects, with `retry_after` the time until the cost fits.
#[derive(Debug, Clone)]
pub struct LeakyShaper {
    rate: Rate,
    capacity: u32,
    capacity_ns: Nanos,
    /// The earliest time the next admitted event may be released.
    next_release: Nanos,
}

impl LeakyShaper {
    pub fn new(rate: Rate, capacity: u32) -> Result<Self, GateSpecError> {
        if capacity == 0 {
            return Err(GateSpecError::Burst("queue depth must be ≥ 1".into()));
        }
        Ok(Self {
            rate,
            capacity,
            capacity_ns: scaled(capacity, rate)?,
            next_release: 0,
        })
    }

    /// Events admitted but not yet released at `now` (release time > now),
    /// for unit cost. Used by tests and the lab's queue accounting.
    pub fn waiting(&self, now: Nanos) -> u64 {
        let backlog = self.next_release.saturating_sub(now);
        backlog.div_ceil(self.rate.interval()).saturating_sub(1)
    }
}

impl Gate for LeakyShaper {
    #[inline]
    fn try_admit(&mut self, now: Nanos, cost: u32) -> Decision {
        if cost > self.capacity {
            return NEVER;
        }
        let cost_ns = u64::from(cost) * self.rate.interval();
        let release_at = self.next_release.max(now);
        let backlog = release_at - now + cost_ns;
        if backlog <= self.capacity_ns {
            self.next_release = release_at + cost_ns;
            Decision::Admit { release_at }
        } else {
            Decision::Reject {
                retry_after: Some(backlog - self.capacity_ns),
                reason: RejectReason::NotYet,
            }
        }
    }

    fn level(&self, now: Nanos) -> f64 {
        self.next_release.saturating_sub(now) as f64 / self.rate.interval() as f64
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn name(&self) -> &'static str {
        "leaky_shaper"
    }
}
