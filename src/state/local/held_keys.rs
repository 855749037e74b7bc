//! Keys for a durable store's log of held fixes
//! ([`crate::geofence::HeldChange`]). Each shard numbers fixes in a range
//! of its own, so two shards never give the same key, and each appends at
//! the end of its range, which keeps the log's pages few and hot. A range
//! goes on from the highest key the store holds in it, across restarts
//! and changes of the shard count.

use crate::geofence::VehicleSnapshot;
use crate::model::VehicleId;
use std::collections::HashMap;

/// Bits of a key below its range: 2^47 fixes per range, and ranges up to
/// 2^16 keep every key a positive i64 (SQLite's integer key).
const RANGE_BITS: u32 = 47;

/// The range of fixes moved into the log at start from records written
/// before the log existed (their windows were in the record).
const MOVED_AT_START: u64 = 0;

/// The next key of each range.
#[derive(Debug, Default)]
pub struct HeldKeys {
    next: HashMap<u64, u64>,
}

impl HeldKeys {
    /// Goes on after every key the restored windows hold.
    pub fn after(vehicles: &[(VehicleId, VehicleSnapshot)]) -> Self {
        let mut next: HashMap<u64, u64> = HashMap::new();
        for h in vehicles.iter().flat_map(|(_, s)| &s.window) {
            if h.key != 0 {
                let after = next.entry(h.key >> RANGE_BITS).or_default();
                *after = (*after).max(h.key + 1);
            }
        }
        Self { next }
    }

    /// The first key shard `shard` gives.
    pub fn first_of_shard(&self, shard: usize) -> u64 {
        self.first_of(shard as u64 + 1)
    }

    fn first_of(&self, range: u64) -> u64 {
        self.next
            .get(&range)
            .copied()
            .unwrap_or((range << RANGE_BITS) | 1)
    }

    /// Gives a key to every restored held fix that has none (one read
    /// from a record's window), and returns the vehicles it gave keys in.
    pub fn key_unlogged(&mut self, vehicles: &mut [(VehicleId, VehicleSnapshot)]) -> Vec<usize> {
        let mut next = self.first_of(MOVED_AT_START);
        let mut moved = Vec::new();
        for (i, (_, s)) in vehicles.iter_mut().enumerate() {
            let mut any = false;
            for h in s.window.iter_mut().filter(|h| h.key == 0) {
                h.key = next;
                next += 1;
                any = true;
            }
            if any {
                moved.push(i);
            }
        }
        self.next.insert(MOVED_AT_START, next);
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::HeldFix;

    fn vehicle(keys: &[u64]) -> (VehicleId, VehicleSnapshot) {
        let window = keys
            .iter()
            .map(|&key| HeldFix {
                fix_ms: 0,
                lat: 0.0,
                lon: 0.0,
                received_ms: 0,
                digest: 0,
                key,
            })
            .collect();
        (
            "v".into(),
            VehicleSnapshot {
                window,
                ..VehicleSnapshot::default()
            },
        )
    }

    #[test]
    fn each_shard_goes_on_in_its_own_range() {
        let shard0 = 1 << RANGE_BITS;
        let shard1 = 2 << RANGE_BITS;
        let keys = HeldKeys::after(&[vehicle(&[shard0 | 7, shard0 | 3]), vehicle(&[shard1 | 1])]);
        assert_eq!(keys.first_of_shard(0), shard0 | 8);
        assert_eq!(keys.first_of_shard(1), shard1 | 2);
        assert_eq!(keys.first_of_shard(2), (3 << RANGE_BITS) | 1);
    }

    #[test]
    fn fixes_from_records_get_keys_no_shard_gives() {
        let shard0 = 1 << RANGE_BITS;
        let mut vehicles = vec![vehicle(&[0, 0]), vehicle(&[shard0 | 4]), vehicle(&[2, 0])];
        let mut keys = HeldKeys::after(&vehicles);
        assert_eq!(keys.key_unlogged(&mut vehicles), vec![0, 2]);
        let given: Vec<u64> = vehicles
            .iter()
            .flat_map(|(_, s)| s.window.iter().map(|h| h.key))
            .collect();
        assert_eq!(given, vec![3, 4, shard0 | 4, 2, 5]);
        assert_eq!(keys.first_of_shard(0), shard0 | 5);
    }
}
