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

/// The receive clock: when geogate received a message, in unix
/// milliseconds. Liveness (idle expiry), the reorder window and the check
/// of device clocks run on it, never on fix times. It is the wall clock
/// read once, at first use, and carried forward on the monotonic clock, so
/// an NTP step mid-run cannot move it backwards or jump it; the next start
/// reads the wall clock again.
pub fn receive_ms(at: Instant) -> i64 {
    static ANCHOR: std::sync::OnceLock<(Instant, i64)> = std::sync::OnceLock::new();
    let &(anchor, anchor_ms) = ANCHOR.get_or_init(|| {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        (Instant::now(), wall)
    });
    // Signed nanoseconds, floored to milliseconds, so that instants on
    // either side of the anchor are spaced exactly.
    let offset_ns = match at.checked_duration_since(anchor) {
        Some(after) => after.as_nanos() as i128,
        None => -(anchor.duration_since(at).as_nanos() as i128),
    };
    anchor_ms.saturating_add(offset_ns.div_euclid(1_000_000) as i64)
}

/// [`receive_ms`] now.
pub fn receive_now_ms() -> i64 {
    receive_ms(Instant::now())
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
    fn the_receive_clock_follows_instants() {
        let earlier = Instant::now();
        let now = receive_now_ms();
        let later = earlier + std::time::Duration::from_millis(1500);
        assert_eq!(receive_ms(later) - receive_ms(earlier), 1500);
        assert!(now >= receive_ms(earlier));
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
