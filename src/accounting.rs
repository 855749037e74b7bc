//! The accounting invariant, kept by atomic counters every stage updates:
//!
//! `received = invalid + shed + evaluated + in_queue`
//!
//! `received` counts messages taken from the broker into the pipeline;
//! `invalid` those refused by the codec (duplicates included); `shed` those a
//! gate refused; `evaluated` those the geofence engine finished; `in_queue`
//! the rest (admitted, not yet evaluated). At shutdown `in_queue` is what the
//! drain deadline left behind, unacked and so redelivered on restart.
//! The same numbers feed the Prometheus counters.

use crate::codec::Reason;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct Accounting {
    received: AtomicU64,
    invalid: [AtomicU64; Reason::ALL.len()],
    shed: AtomicU64,
    admitted: AtomicU64,
    evaluated: AtomicU64,
    transitions: AtomicU64,
}

/// A consistent-enough snapshot (exact when the pipeline is quiescent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Balance {
    pub received: u64,
    pub invalid: u64,
    pub shed: u64,
    pub evaluated: u64,
    pub in_queue: u64,
}

impl Balance {
    pub fn balances(&self) -> bool {
        self.received == self.invalid + self.shed + self.evaluated + self.in_queue
    }

    /// The line geogate prints at shutdown.
    pub fn line(&self) -> String {
        format!(
            "accounting: received {} = invalid {} + shed {} + evaluated {} + in_queue {} ({})",
            self.received,
            self.invalid,
            self.shed,
            self.evaluated,
            self.in_queue,
            if self.balances() {
                "balanced"
            } else {
                "IMBALANCED"
            }
        )
    }
}

impl Accounting {
    pub fn received(&self) {
        self.received.fetch_add(1, Relaxed);
    }

    pub fn invalid(&self, reason: Reason) {
        self.invalid[reason as usize].fetch_add(1, Relaxed);
    }

    pub fn shed(&self) {
        self.shed.fetch_add(1, Relaxed);
    }

    pub fn admitted(&self) {
        self.admitted.fetch_add(1, Relaxed);
    }

    pub fn evaluated(&self) {
        self.evaluated.fetch_add(1, Relaxed);
    }

    /// Transitions emitted (not part of the balance; for progress displays).
    pub fn transitions(&self, n: u64) {
        self.transitions.fetch_add(n, Relaxed);
    }

    pub fn transitions_total(&self) -> u64 {
        self.transitions.load(Relaxed)
    }

    pub fn invalid_by_reason(&self) -> Vec<(Reason, u64)> {
        Reason::ALL
            .iter()
            .map(|&r| (r, self.invalid[r as usize].load(Relaxed)))
            .collect()
    }

    pub fn balance(&self) -> Balance {
        // Read downstream counters first so that a concurrent event is seen
        // as in flight rather than double counted.
        let evaluated = self.evaluated.load(Relaxed);
        let admitted = self.admitted.load(Relaxed);
        let shed = self.shed.load(Relaxed);
        let invalid = self.invalid.iter().map(|c| c.load(Relaxed)).sum();
        let received = self.received.load(Relaxed);
        Balance {
            received,
            invalid,
            shed,
            evaluated,
            in_queue: admitted.saturating_sub(evaluated),
        }
    }
}
