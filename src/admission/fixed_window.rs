//! The fixed-window counter, kept only for the lab as the classic wrong
//! answer: it counts per aligned window and resets at each boundary, so a
//! client straddling a boundary gets up to twice the limit in one window's
//! width. Never offered as a pipeline gate.

use super::{Decision, Gate, GateSpecError, NEVER, RejectReason};
use crate::clock::Nanos;

#[derive(Debug, Clone)]
pub struct FixedWindow {
    limit: u32,
    window: Nanos,
    window_index: u64,
    used: u32,
}

impl FixedWindow {
    /// `limit` cost units per aligned window of `window` nanoseconds.
    pub fn new(limit: u32, window: Nanos) -> Result<Self, GateSpecError> {
        if limit == 0 {
            return Err(GateSpecError::Burst("limit must be ≥ 1".into()));
        }
        if window == 0 {
            return Err(GateSpecError::Rate("window must be > 0 ns".into()));
        }
        Ok(Self {
            limit,
            window,
            window_index: 0,
            used: 0,
        })
    }

    fn roll(&mut self, now: Nanos) {
        let index = now / self.window;
        if index > self.window_index {
            self.window_index = index;
            self.used = 0;
        }
    }
}

impl Gate for FixedWindow {
    fn try_admit(&mut self, now: Nanos, cost: u32) -> Decision {
        if cost > self.limit {
            return NEVER;
        }
        self.roll(now);
        if self.used + cost <= self.limit {
            self.used += cost;
            Decision::Admit { release_at: now }
        } else {
            Decision::Reject {
                retry_after: Some(((self.window_index + 1) * self.window).saturating_sub(now)),
                reason: RejectReason::NotYet,
            }
        }
    }

    fn level(&self, now: Nanos) -> f64 {
        if now / self.window > self.window_index {
            0.0
        } else {
            f64::from(self.used)
        }
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    fn name(&self) -> &'static str {
        "fixed_window"
    }
}
