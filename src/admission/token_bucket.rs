//! The token bucket policer: a burst allowance on top of a sustained rate.
//!
//! State is one integer, `full_at`: the instant at which the bucket would be
//! full again if nothing else arrived (the GCRA "theoretical arrival time").
//! Tokens at `now` are `(b·T − max(full_at − now, 0)) / T`, exact in
//! nanoseconds. Starting at `full_at = 0` makes the bucket **start full**, so
//! a cold service survives the shift-change spike it was deployed for.

use super::{Decision, Gate, GateSpecError, NEVER, Rate, RejectReason, scaled};
use crate::clock::Nanos;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: Rate,
    capacity: u32,
    /// `b · T`: a full bucket, in nanoseconds of refill.
    capacity_ns: Nanos,
    /// When the bucket will be full again; at or before `now` means full.
    full_at: Nanos,
}

impl TokenBucket {
    /// A full bucket of `capacity` tokens refilling at `rate`.
    pub fn new(rate: Rate, capacity: u32) -> Result<Self, GateSpecError> {
        if capacity == 0 {
            return Err(GateSpecError::Burst("burst must be ≥ 1".into()));
        }
        Ok(Self {
            rate,
            capacity,
            capacity_ns: scaled(capacity, rate)?,
            full_at: 0,
        })
    }

    /// Tokens available at `now`, in nanoseconds of refill (fixed point).
    fn available_ns(&self, now: Nanos) -> Nanos {
        self.capacity_ns - self.full_at.saturating_sub(now).min(self.capacity_ns)
    }
}

impl Gate for TokenBucket {
    #[inline]
    fn try_admit(&mut self, now: Nanos, cost: u32) -> Decision {
        if cost > self.capacity {
            return NEVER;
        }
        // cost ≤ capacity, so this cannot overflow (checked in `new`).
        let cost_ns = u64::from(cost) * self.rate.interval();
        let start = self.full_at.max(now);
        let debt = start - now + cost_ns;
        if debt <= self.capacity_ns {
            self.full_at = start + cost_ns;
            Decision::Admit { release_at: now }
        } else {
            Decision::Reject {
                retry_after: Some(debt - self.capacity_ns),
                reason: RejectReason::NotYet,
            }
        }
    }

    fn level(&self, now: Nanos) -> f64 {
        self.available_ns(now) as f64 / self.rate.interval() as f64
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn name(&self) -> &'static str {
        "token"
    }
}
