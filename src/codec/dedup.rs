//! Redelivery filter: remembers the last `capacity` (vehicle, fix time)
//! pairs. After a reconnect or a crash the broker redelivers unacked QoS 1
//! messages; each one is recognised here and counted as `duplicate` instead
//! of being evaluated twice. Bounded: the oldest key is forgotten first.

use crate::model::VehicleId;
use std::collections::{HashSet, VecDeque};

#[derive(Debug)]
pub struct Dedup {
    /// foldhash, seeded per process (see `geofence::evaluator`).
    seen: HashSet<(VehicleId, i64), foldhash::fast::RandomState>,
    order: VecDeque<(VehicleId, i64)>,
    capacity: usize,
}

impl Dedup {
    pub fn new(capacity: usize) -> Self {
        Self {
            seen: HashSet::with_capacity_and_hasher(capacity.min(1 << 20), Default::default()),
            order: VecDeque::with_capacity(capacity.min(1 << 20)),
            capacity,
        }
    }

    /// True the first time a key is seen within the window.
    pub fn first_sighting(&mut self, vehicle: &VehicleId, fix_ms: i64) -> bool {
        if self.capacity == 0 {
            return true;
        }
        let key = (vehicle.clone(), fix_ms);
        // One probe: `insert` says whether the key was new.
        if !self.seen.insert(key.clone()) {
            return false;
        }
        if self.order.len() == self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.order.push_back(key);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_a_bounded_window() {
        let mut d = Dedup::new(2);
        let (a, b): (VehicleId, VehicleId) = ("a".into(), "b".into());
        assert!(d.first_sighting(&a, 1));
        assert!(!d.first_sighting(&a, 1));
        assert!(d.first_sighting(&b, 1));
        assert!(d.first_sighting(&a, 2)); // evicts (a, 1)
        assert!(d.first_sighting(&a, 1));
    }
}
