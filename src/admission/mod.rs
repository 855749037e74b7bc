//! Admission: which events may enter a shard's queue, and when.
//!
//! Four gates share one contract ([`Gate`]) and one unit system:
//!
//! * time is integer nanoseconds ([`Nanos`]);
//! * a configured rate `r` per second becomes an integer **interval** `T`
//!   nanoseconds per unit of cost ([`Rate`]), rounded *up*, so the real rate
//!   `1e9 / T` can never exceed the configured one;
//! * a level is kept in "nanoseconds of refill" (fixed point with `T`
//!   sub-units per token), so every update is an exact integer operation.
//!
//! | gate | state | admits when | output |
//! |---|---|---|---|
//! | [`TokenBucket`] (policer) | time the bucket is full again | `tokens ≥ c` | at once |
//! | [`LeakyMeter`] | level, last update | `level + c ≤ b` | at once |
//! | [`LeakyShaper`] | next release time | `backlog + c ≤ b` | paced, one per `T` |
//! | [`FixedWindow`] | window start, count | `count + c ≤ limit` | at once (lab only) |
//!
//! The token bucket starts full and the meter starts empty, so for the same
//! `b` and `r` the two make identical decisions (proved by a property test).
//! The shaper admits on the same condition but delays: its backlog counts the
//! event being released now, so depth `b` means one released at once and
//! `b − 1` waiting. The first release after an idle period is immediate.

pub mod config;
pub mod fixed_window;
pub mod leaky_bucket;
pub mod rule;
pub mod spec;
pub mod token_bucket;
pub mod watermark;

pub use fixed_window::FixedWindow;
pub use leaky_bucket::{LeakyMeter, LeakyShaper};
pub use rule::{Admission, ShedCause, Verdict};
pub use spec::{GateKind, GateSpec, GateSpecError};
pub use token_bucket::TokenBucket;
pub use watermark::{AdmissionPolicy, Route, WatermarkError};

use crate::clock::{NANOS_PER_SEC, Nanos};

/// Why a gate refused an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// Not enough allowance now; the same cost fits at `retry_after`.
    NotYet,
    /// The cost exceeds the gate's capacity: it will never be admitted.
    Never,
}

/// The outcome of one [`Gate::try_admit`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted; the event may proceed at `release_at` (equal to the arrival
    /// time except for the shaper, which paces its output).
    Admit { release_at: Nanos },
    /// Refused. `retry_after` is how long after the arrival the same cost
    /// would first be admitted, absent other traffic; it is a hint, not a
    /// reservation. `None` when the reason is [`RejectReason::Never`].
    Reject {
        retry_after: Option<Nanos>,
        reason: RejectReason,
    },
}

impl Decision {
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit { .. })
    }
}

/// A rate limiter deciding on one event at a time.
///
/// `now` must not decrease between calls; an earlier `now` is treated as the
/// latest one seen, so a misbehaving clock can delay but never over-admit.
pub trait Gate: Send {
    /// Decides on an event of `cost` units arriving at `now`.
    fn try_admit(&mut self, now: Nanos, cost: u32) -> Decision;
    /// The gate's level in cost units at `now`, for metrics: tokens available
    /// for a token bucket, fill for a meter, backlog for a shaper, count for
    /// a fixed window.
    fn level(&self, now: Nanos) -> f64;
    /// The gate's capacity `b` in cost units.
    fn capacity(&self) -> u32;
    /// The configuration name (`token`, `leaky_meter`, ...), used as the
    /// `gate` metric label and in dead-letter records.
    fn name(&self) -> &'static str;
}

/// A sustained rate as an exact integer interval between units of cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    interval: Nanos,
}

impl Rate {
    /// Converts `per_second` to an interval of `ceil(1e9 / per_second)`
    /// nanoseconds, then nudges it up until `interval · per_second ≥ 1e9`
    /// holds in floating point too. Rounding up means the real rate is at most
    /// the configured one (r = 3/s runs at 2.999999997/s). Rates above 1e9/s
    /// cannot be represented and are refused.
    pub fn per_second(per_second: f64) -> Result<Self, GateSpecError> {
        if !per_second.is_finite() {
            return Err(GateSpecError::Rate(format!(
                "rate must be a finite number, got {per_second}"
            )));
        }
        if per_second <= 0.0 {
            return Err(GateSpecError::Rate(format!(
                "rate must be > 0, got {per_second}"
            )));
        }
        if per_second > NANOS_PER_SEC as f64 {
            return Err(GateSpecError::Rate(format!(
                "rate must be ≤ 1e9 per second, got {per_second}"
            )));
        }
        let mut interval = (NANOS_PER_SEC as f64 / per_second).ceil();
        if interval >= u64::MAX as f64 {
            return Err(GateSpecError::Rate(format!(
                "rate {per_second} is too small to represent"
            )));
        }
        while interval * per_second < NANOS_PER_SEC as f64 {
            interval += 1.0;
        }
        Ok(Self {
            interval: interval as Nanos,
        })
    }

    /// A rate given directly as nanoseconds per unit (at least 1).
    pub fn from_interval(interval: Nanos) -> Self {
        Self {
            interval: interval.max(1),
        }
    }

    /// Nanoseconds per unit of cost.
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// The effective rate in units per second (for display only).
    pub fn effective_per_second(&self) -> f64 {
        NANOS_PER_SEC as f64 / self.interval as f64
    }
}

/// `units × interval`, or an error naming the overflow. Checked once at
/// construction so that the hot path can use plain arithmetic.
pub(crate) fn scaled(units: u32, rate: Rate) -> Result<Nanos, GateSpecError> {
    u64::from(units).checked_mul(rate.interval).ok_or_else(|| {
        GateSpecError::Burst(format!(
            "burst {units} at this rate overflows u64 nanoseconds"
        ))
    })
}

/// Every gate behind one type, so a shard can hold "its gate" without a
/// virtual call on the hot path.
#[derive(Debug, Clone)]
pub enum AnyGate {
    Token(TokenBucket),
    LeakyMeter(LeakyMeter),
    LeakyShaper(LeakyShaper),
    FixedWindow(FixedWindow),
}

impl Gate for AnyGate {
    #[inline]
    fn try_admit(&mut self, now: Nanos, cost: u32) -> Decision {
        match self {
            AnyGate::Token(g) => g.try_admit(now, cost),
            AnyGate::LeakyMeter(g) => g.try_admit(now, cost),
            AnyGate::LeakyShaper(g) => g.try_admit(now, cost),
            AnyGate::FixedWindow(g) => g.try_admit(now, cost),
        }
    }

    fn level(&self, now: Nanos) -> f64 {
        match self {
            AnyGate::Token(g) => g.level(now),
            AnyGate::LeakyMeter(g) => g.level(now),
            AnyGate::LeakyShaper(g) => g.level(now),
            AnyGate::FixedWindow(g) => g.level(now),
        }
    }

    fn capacity(&self) -> u32 {
        match self {
            AnyGate::Token(g) => g.capacity(),
            AnyGate::LeakyMeter(g) => g.capacity(),
            AnyGate::LeakyShaper(g) => g.capacity(),
            AnyGate::FixedWindow(g) => g.capacity(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnyGate::Token(g) => g.name(),
            AnyGate::LeakyMeter(g) => g.name(),
            AnyGate::LeakyShaper(g) => g.name(),
            AnyGate::FixedWindow(g) => g.name(),
        }
    }
}

/// The rejection for a cost that can never fit.
pub(crate) const NEVER: Decision = Decision::Reject {
    retry_after: None,
    reason: RejectReason::Never,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_rounds_interval_up_so_real_rate_never_exceeds_configured() {
        for r in [1.0, 3.0, 7.0, 32_000.0, 0.3, 1e9, 123_456.789] {
            let rate = Rate::per_second(r).unwrap();
            assert!(rate.effective_per_second() <= r, "{r}");
            // ...and by at most one nanosecond of interval.
            let lower = Rate::from_interval(rate.interval() - 1);
            assert!(rate.interval() == 1 || lower.effective_per_second() > r * (1.0 - 1e-9));
        }
        assert_eq!(Rate::per_second(3.0).unwrap().interval(), 333_333_334);
        assert_eq!(Rate::per_second(5.0).unwrap().interval(), 200_000_000);
    }

    #[test]
    fn invalid_rates_name_the_problem() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 2e9] {
            let err = Rate::per_second(bad).unwrap_err().to_string();
            assert!(err.contains("rate"), "{err}");
        }
    }
}
