//! The accounting invariant, kept by atomic counters every stage updates:
//!
//! `received = invalid + ignored + shed + evaluated + held + late + in_queue`
//!
//! * `received`: messages the router has taken from the source (a message
//!   still in the intake channel is not yet received, and not yet acked:
//!   `geogate_mqtt_unacked` counts it);
//! * `invalid`: refused by the codec and dead-lettered, duplicates
//!   included (both those the codec's window caught and those the vehicle
//!   state recognised as already applied after a restart), and fixes whose
//!   device clock is too far ahead (`clock_ahead`);
//! * `ignored`: routine messages that are not fixes, acked without a
//!   dead letter: OwnTracks messages that are not locations, and empty
//!   payloads clearing a retained message;
//! * `shed`: refused by a gate;
//! * `evaluated`: applied to their vehicle's state on arrival;
//! * `held`: taken into their vehicle's reorder window (committed there,
//!   so acked), and applied from it in fix-time order when it closes;
//! * `late`: older than their vehicle's last applied fix once the window
//!   had passed: no transition, dead-lettered with how late they were;
//! * `in_queue`: the rest, taken and not finished. At shutdown it is what
//!   the drain deadline (or a sink that stayed broken until then) left
//!   behind, unacked and so redelivered on restart.
//!
//! The same numbers feed the Prometheus counters.

use crate::codec::Reason;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Each stage's counters on cache lines of their own (128 bytes: some CPUs
/// fetch lines in pairs). Packed together, the router's and the workers'
/// increments bounced one line between cores on every event.
#[derive(Debug, Default)]
#[repr(align(128))]
struct OwnLine<T>(T);

#[derive(Debug, Default)]
struct RouterCounts {
    invalid: [AtomicU64; Reason::ALL.len()],
    /// Of the ignored reasons only.
    ignored: AtomicU64,
    /// Written to the dead letter by the router, after the state found
    /// them late.
    late: AtomicU64,
    /// Of `invalid[duplicate]`: those the state found (admitted first).
    state_duplicates: AtomicU64,
    shed: AtomicU64,
    admitted: AtomicU64,
    /// Taken but never finished at shutdown: a refusal whose dead-letter
    /// record could not be written before the drain deadline. Left unacked,
    /// so still "in queue" for the balance.
    abandoned: AtomicU64,
}

#[derive(Debug, Default)]
struct WorkerCounts {
    evaluated: AtomicU64,
    held: AtomicU64,
    transitions: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Accounting {
    /// Written by the router as it takes each message from the source.
    received: OwnLine<AtomicU64>,
    router: OwnLine<RouterCounts>,
    workers: OwnLine<WorkerCounts>,
}

/// A consistent-enough snapshot (exact when the pipeline is quiescent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Balance {
    pub received: u64,
    pub invalid: u64,
    /// Of `invalid`: redeliveries recognised (by the dedup window or by the
    /// vehicle state), shown beside it so a restart's redeliveries are seen.
    pub duplicate: u64,
    pub ignored: u64,
    pub shed: u64,
    pub evaluated: u64,
    pub held: u64,
    pub late: u64,
    pub in_queue: u64,
}

impl Balance {
    pub fn balances(&self) -> bool {
        self.received
            == self.invalid
                + self.ignored
                + self.shed
                + self.evaluated
                + self.held
                + self.late
                + self.in_queue
    }

    /// The line geogate prints at shutdown.
    pub fn line(&self) -> String {
        format!(
            "accounting: received {} = invalid {} (duplicate {}) + ignored {} + shed {} + evaluated {} + held {} + late {} + in_queue {} ({})",
            self.received,
            self.invalid,
            self.duplicate,
            self.ignored,
            self.shed,
            self.evaluated,
            self.held,
            self.late,
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
    pub fn received(&self, count: u64) {
        self.received.0.fetch_add(count, Relaxed);
    }

    pub fn invalid(&self, reason: Reason) {
        self.router.0.invalid[reason.index()].fetch_add(1, Relaxed);
    }

    pub fn shed(&self) {
        self.router.0.shed.fetch_add(1, Relaxed);
    }

    pub fn admitted(&self) {
        self.router.0.admitted.fetch_add(1, Relaxed);
    }

    /// Routine traffic that is not a fix, acked without a dead letter.
    pub fn ignored(&self) {
        self.router.0.ignored.fetch_add(1, Relaxed);
    }

    /// A late fix's dead-letter record is written.
    pub fn late(&self) {
        self.router.0.late.fetch_add(1, Relaxed);
    }

    /// The dead-letter record of a duplicate the vehicle state found is
    /// written: counted under `invalid`, reason `duplicate`, beside the
    /// window's.
    pub fn state_duplicate(&self) {
        let r = &self.router.0;
        r.invalid[Reason::Duplicate.index()].fetch_add(1, Relaxed);
        r.state_duplicates.fetch_add(1, Relaxed);
    }

    /// A batch of admitted fixes finished: applied on arrival, or taken
    /// into the reorder window. (Its late fixes and duplicates finish once
    /// their dead letters are written: [`Self::late`],
    /// [`Self::state_duplicate`].)
    pub fn finished(&self, evaluated: u64, held: u64) {
        let w = &self.workers.0;
        w.evaluated.fetch_add(evaluated, Relaxed);
        w.held.fetch_add(held, Relaxed);
    }

    /// A message taken and never finished (see the field): it stays
    /// unacked and counts as in queue.
    pub fn abandoned(&self) {
        self.router.0.abandoned.fetch_add(1, Relaxed);
    }

    /// Transitions emitted (not part of the balance; for progress displays).
    pub fn transitions(&self, n: u64) {
        self.workers.0.transitions.fetch_add(n, Relaxed);
    }

    pub fn transitions_total(&self) -> u64 {
        self.workers.0.transitions.load(Relaxed)
    }

    pub fn invalid_by_reason(&self) -> Vec<(Reason, u64)> {
        Reason::ALL
            .iter()
            .map(|&r| (r, self.router.0.invalid[r.index()].load(Relaxed)))
            .collect()
    }

    pub fn balance(&self) -> Balance {
        // Read downstream counters first so that a concurrent event is seen
        // as in flight rather than double counted.
        let late = self.router.0.late.load(Relaxed);
        let evaluated = self.workers.0.evaluated.load(Relaxed);
        let held = self.workers.0.held.load(Relaxed);
        let state_duplicates = self.router.0.state_duplicates.load(Relaxed);
        let admitted = self.router.0.admitted.load(Relaxed);
        let abandoned = self.router.0.abandoned.load(Relaxed);
        let shed = self.router.0.shed.load(Relaxed);
        let ignored = self.router.0.ignored.load(Relaxed);
        let invalid = self
            .router
            .0
            .invalid
            .iter()
            .map(|c| c.load(Relaxed))
            .sum::<u64>();
        let received = self.received.0.load(Relaxed);
        let duplicate = self.router.0.invalid[Reason::Duplicate.index()].load(Relaxed);
        Balance {
            received,
            invalid,
            duplicate,
            ignored,
            shed,
            evaluated,
            held,
            late,
            in_queue: (admitted + abandoned)
                .saturating_sub(evaluated + held + late + state_duplicates),
        }
    }
}
