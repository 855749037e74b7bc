//! Time as the gates see it.
//!
//! Gates never read the wall clock: a GPS `fix_time` is data, and an NTP step
//! must not be able to refill a bucket. Every gate decision takes a [`Nanos`]
//! read from a [`Clock`], so production uses [`MonotonicClock`] while tests,
//! labs and virtual replays drive a [`ManualClock`] and get byte-identical
//! results on every run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Integer nanoseconds since a clock's own epoch. Integers keep gate
/// arithmetic exact: a million decisions cannot drift.
pub type Nanos = u64;

/// Nanoseconds in one second, the unit rates are configured in.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Nanoseconds in one millisecond.
pub const NANOS_PER_MILLI: Nanos = 1_000_000;

/// A source of monotonic time.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's epoch; never decreases.
    fn now(&self) -> Nanos;
}

/// Production clock: nanoseconds since the process created it.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        // u64 nanoseconds last 584 years; saturate rather than wrap.
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Virtual time shared by clones: advancing one clone advances all of them,
/// which is how a test moves time under a running gate.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn starting_at(start: Nanos) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves time forward by `by` nanoseconds (saturating).
    pub fn advance(&self, by: Nanos) {
        let _ = self
            .now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Moves time to `to`; a value in the past is ignored, because a clock
    /// that goes backwards would break every gate's promise.
    pub fn set(&self, to: Nanos) {
        self.now.fetch_max(to, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time_and_never_go_back() {
        let a = ManualClock::starting_at(5);
        let b = a.clone();
        a.advance(10);
        assert_eq!(b.now(), 15);
        b.set(3);
        assert_eq!(a.now(), 15);
        b.set(40);
        assert_eq!(a.now(), 40);
    }

    #[test]
    fn monotonic_clock_never_decreases() {
        let c = MonotonicClock::new();
        let mut last = c.now();
        for _ in 0..1000 {
            let t = c.now();
            assert!(t >= last);
            last = t;
        }
    }
}
