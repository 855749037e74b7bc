//! The global allowance: one token bucket in Redis shared by every geogate
//! instance, so N instances together admit at most `b + r·t` low-priority
//! events above the watermark, not N times that.
//!
//! Deciding must never wait on the network (the router also carries High
//! events, which Redis trouble must not block), so each instance spends
//! from a local reserve and a background [`refiller`] tops it up from the
//! shared bucket, in chunks, one round trip per chunk. The price is slack:
//! tokens an instance took earlier may be spent later, so in any window the
//! instances together admit at most `b + r·t + N·reserve`.
//!
//! When Redis cannot be reached the reserve is spent first; after that
//! `fail_mode` decides: `open` admits without shared accounting (counted),
//! `closed` sheds (counted). The shard's own gate applies either way.

mod config;
pub mod metrics;
mod refiller;
mod script;

pub use config::GlobalAllowanceConfig;

pub use refiller::{RedisTarget, refill};
pub use script::{Grant, SharedBucket};

use crate::allowance::metrics::{
    GLOBAL_ALLOWANCE_FAIL_OPEN_ADMITTED_TOTAL, GLOBAL_ALLOWANCE_SPENT_TOKENS_TOTAL,
};
use crate::clock::Nanos;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What to do once Redis is unreachable and the local reserve is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// Admit: the shard gates still bound each instance, the shared bound
    /// is suspended until Redis answers again.
    Open,
    /// Shed: a strict cap cannot become unlimited during an outage.
    Closed,
}

impl FailMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
        }
    }
}

/// The allowance's answer for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Paid from the local reserve.
    Paid,
    /// Redis is unreachable, the reserve is empty, and `fail_mode = open`.
    AdmittedFailOpen,
    /// The shared bucket is empty; it had room for one cost again
    /// `retry_after` after its last answer (a hint, not a reservation).
    Exhausted { retry_after: Option<Nanos> },
    /// Redis is unreachable, the reserve is empty, and `fail_mode = closed`.
    Unavailable,
}

/// One instance's share of the global allowance: the local reserve and
/// what the refiller last learnt from Redis. Shared by the router (which
/// spends) and the refiller (which adds).
#[derive(Debug)]
pub struct GlobalAllowance {
    cost: u64,
    reserve: u64,
    fail_mode: FailMode,
    held: AtomicU64,
    reachable: AtomicBool,
    retry_after_us: AtomicU64,
    wake: tokio::sync::Notify,
    spent: ::metrics::Counter,
    unpaid: ::metrics::Counter,
}

impl GlobalAllowance {
    /// Starts with nothing held and Redis presumed reachable: the first
    /// events above the watermark wait for the first chunk (they are shed
    /// as exhausted) rather than being admitted on no evidence.
    pub fn new(cost: u32, reserve: u32, fail_mode: FailMode) -> Self {
        Self {
            cost: u64::from(cost),
            reserve: u64::from(reserve),
            fail_mode,
            held: AtomicU64::new(0),
            reachable: AtomicBool::new(true),
            retry_after_us: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
            spent: ::metrics::counter!(GLOBAL_ALLOWANCE_SPENT_TOKENS_TOTAL),
            unpaid: ::metrics::counter!(GLOBAL_ALLOWANCE_FAIL_OPEN_ADMITTED_TOTAL),
        }
    }

    /// Whether one event's cost can be settled now: paid, or admitted or
    /// refused by the outage rule. Spends nothing; [`Self::spend`] does.
    pub fn check(&self) -> Spend {
        if self.held.load(Ordering::Acquire) >= self.cost {
            return Spend::Paid;
        }
        self.wake.notify_one();
        if self.reachable.load(Ordering::Acquire) {
            let us = self.retry_after_us.load(Ordering::Acquire);
            return Spend::Exhausted {
                retry_after: (us > 0).then_some(us * 1000),
            };
        }
        match self.fail_mode {
            FailMode::Open => Spend::AdmittedFailOpen,
            FailMode::Closed => Spend::Unavailable,
        }
    }

    /// Pays one cost from the reserve after [`Self::check`] said
    /// [`Spend::Paid`]. Only the router spends, so the tokens checked are
    /// still there (the refiller only adds).
    pub fn spend(&self) {
        let before = self.held.fetch_sub(self.cost, Ordering::AcqRel);
        debug_assert!(before >= self.cost);
        self.spent.increment(self.cost);
        if before - self.cost <= self.reserve / 2 {
            self.wake.notify_one();
        }
    }

    /// Counts an event admitted under `fail_mode = open` without payment.
    pub fn admitted_unpaid(&self) {
        self.unpaid.increment(1);
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    pub fn fail_mode(&self) -> FailMode {
        self.fail_mode
    }

    fn add(&self, tokens: u64) {
        self.held.fetch_add(tokens, Ordering::AcqRel);
    }

    fn set_reachable(&self, reachable: bool) {
        self.reachable.store(reachable, Ordering::Release);
    }

    fn set_retry_after_us(&self, us: u64) {
        self.retry_after_us.store(us, Ordering::Release);
    }

    /// What to ask Redis for: the room left in the reserve, in whole costs.
    fn shortfall(&self) -> u64 {
        let room = self.reserve.saturating_sub(self.held());
        room - room % self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_pays_whole_costs_then_the_outage_rule_decides() {
        let allowance = GlobalAllowance::new(2, 10, FailMode::Closed);
        assert_eq!(allowance.check(), Spend::Exhausted { retry_after: None });
        allowance.add(5);
        allowance.spend();
        allowance.spend();
        assert_eq!(allowance.held(), 1);
        assert_eq!(allowance.shortfall(), 8);
        allowance.set_retry_after_us(400);
        assert_eq!(
            allowance.check(),
            Spend::Exhausted {
                retry_after: Some(400_000)
            }
        );
        allowance.set_reachable(false);
        assert_eq!(allowance.check(), Spend::Unavailable);
        let open = GlobalAllowance::new(1, 4, FailMode::Open);
        open.set_reachable(false);
        assert_eq!(open.check(), Spend::AdmittedFailOpen);
        open.add(1);
        assert_eq!(open.check(), Spend::Paid, "the reserve is spent first");
    }
}
