//! The admission policy in front of each shard queue.
//!
//! Below the watermark everything is enqueued: a gate that sheds while the
//! queue has room would drop work for nothing. At or above it, `High` events
//! wait for room (backpressure, never shed) and `Low` events must pass the
//! shard's gate. The threshold is precomputed as a whole number of slots,
//! `ceil(watermark · capacity)`, so the per-event check is one comparison.

use crate::model::Priority;

/// The default fill fraction at which the gate engages.
pub const DEFAULT_WATERMARK: f64 = 0.60;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WatermarkError {
    #[error("watermark must be in (0, 1], got {0}")]
    OutOfRange(f64),
    #[error("queue capacity must be ≥ 1")]
    ZeroCapacity,
}

/// Where one event goes, given the queue's fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Below the watermark: enqueue now.
    Enqueue,
    /// Above it, high priority: enqueue, waiting for room if needed.
    Backpressure,
    /// Above it, low priority: ask the gate.
    Gate,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionPolicy {
    watermark: f64,
    capacity: usize,
    threshold: usize,
}

impl AdmissionPolicy {
    pub fn new(watermark: f64, capacity: usize) -> Result<Self, WatermarkError> {
        if !(watermark > 0.0 && watermark <= 1.0) {
            return Err(WatermarkError::OutOfRange(watermark));
        }
        if capacity == 0 {
            return Err(WatermarkError::ZeroCapacity);
        }
        let threshold = ((watermark * capacity as f64).ceil() as usize).clamp(1, capacity);
        Ok(Self {
            watermark,
            capacity,
            threshold,
        })
    }

    /// Routes an event arriving when `len` of `capacity` slots are taken.
    #[inline]
    pub fn route(&self, len: usize, priority: Priority) -> Route {
        if len < self.threshold {
            Route::Enqueue
        } else if priority == Priority::High {
            Route::Backpressure
        } else {
            Route::Gate
        }
    }

    pub fn watermark(&self) -> f64 {
        self.watermark
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queue length at which the gate engages.
    pub fn threshold(&self) -> usize {
        self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_watermark_enqueues_everything_above_it_splits_by_priority() {
        let policy = AdmissionPolicy::new(DEFAULT_WATERMARK, 100).unwrap();
        assert_eq!(policy.threshold(), 60);
        for p in [Priority::Low, Priority::High] {
            assert_eq!(policy.route(0, p), Route::Enqueue);
            assert_eq!(policy.route(59, p), Route::Enqueue);
        }
        assert_eq!(policy.route(60, Priority::High), Route::Backpressure);
        assert_eq!(policy.route(60, Priority::Low), Route::Gate);
        assert_eq!(policy.route(100, Priority::High), Route::Backpressure);
    }

    #[test]
    fn watermark_one_gates_only_a_full_queue() {
        let policy = AdmissionPolicy::new(1.0, 10).unwrap();
        assert_eq!(policy.route(9, Priority::Low), Route::Enqueue);
        assert_eq!(policy.route(10, Priority::Low), Route::Gate);
    }

    #[test]
    fn out_of_range_watermarks_are_refused() {
        for bad in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY] {
            let err = AdmissionPolicy::new(bad, 10).unwrap_err();
            assert!(err.to_string().contains("watermark must be in (0, 1]"));
        }
        assert_eq!(
            AdmissionPolicy::new(0.5, 0).unwrap_err(),
            WatermarkError::ZeroCapacity
        );
    }
}
