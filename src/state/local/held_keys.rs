//! Keys for a durable store's log of held fixes
//! ([`crate::geofence::HeldChange`]). Within a vehicle, key order is
//! arrival order, which decides among fixes of the same time: each shard
//! numbers its arrivals in a range of its own (so shards never give the
//! same key, and a batch's arrivals are one run of keys, which is how the
//! store finds the row a fix entered in), and at start every restored held fix is
//! numbered again, in its window's order, in range 0, below every shard's
//! range: it arrived before anything this process takes in. So a restart
//! with another shard count, whose shards number in other ranges, keeps
//! the order too.

use crate::geofence::{HeldChange, VehicleSnapshot};
use crate::model::VehicleId;

/// Bits of a key below its range: 2^47 fixes per range, and ranges up to
/// 2^16 keep every key a positive i64 (SQLite's integer key).
pub const RANGE_BITS: u32 = 47;

/// The first key shard `shard` gives.
pub fn first_of_shard(shard: usize) -> u64 {
    ((shard as u64 + 1) << RANGE_BITS) | 1
}

/// The range `key` is in: 0 for the restored, `shard + 1` for a shard's.
pub fn range_of(key: u64) -> u64 {
    key >> RANGE_BITS
}

/// Numbers every restored held fix again, in range 0 in window order.
/// Returns the log's changes (every old key deleted, then every fix put
/// under its new key: a new key may be an old one), and the vehicles whose
/// record held their window (written before the log existed): their record
/// must be written again without it.
pub fn renumber_restored(
    vehicles: &mut [(VehicleId, VehicleSnapshot)],
) -> (Vec<HeldChange>, Vec<usize>) {
    let mut deleted = Vec::new();
    let mut put = Vec::new();
    let mut from_records = Vec::new();
    let mut next = 1;
    for (i, (id, s)) in vehicles.iter_mut().enumerate() {
        if s.window.iter().any(|h| h.key == 0) {
            from_records.push(i);
        }
        for h in &mut s.window {
            if h.key != 0 {
                deleted.push(HeldChange::Left(h.key));
            }
            h.key = next;
            next += 1;
            put.push(HeldChange::Held(id.clone(), *h));
        }
    }
    deleted.append(&mut put);
    (deleted, from_records)
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
                digest: key,
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
    fn shards_number_in_ranges_above_the_restored() {
        assert!(first_of_shard(0) > 1 << 40);
        assert!(first_of_shard(1) - first_of_shard(0) >= 1 << 40);
        assert!(first_of_shard(65_534) < i64::MAX as u64);
    }

    #[test]
    fn restored_fixes_are_numbered_again_in_window_order() {
        let shard0 = first_of_shard(0);
        let mut vehicles = vec![
            vehicle(&[shard0 + 7, shard0 + 9]),
            vehicle(&[0, 0]),
            vehicle(&[2]),
        ];
        let (log, from_records) = renumber_restored(&mut vehicles);
        assert_eq!(from_records, vec![1]);
        let keys: Vec<Vec<u64>> = vehicles
            .iter()
            .map(|(_, s)| s.window.iter().map(|h| h.key).collect())
            .collect();
        assert_eq!(keys, vec![vec![1, 2], vec![3, 4], vec![5]]);
        // The old keys go first (key 2 is an old key and a new one), then
        // every fix under its new key, the digest still its own.
        let left: Vec<u64> = log
            .iter()
            .filter_map(|c| match c {
                HeldChange::Left(k) => Some(*k),
                HeldChange::Held(..) => None,
            })
            .collect();
        assert_eq!(left, vec![shard0 + 7, shard0 + 9, 2]);
        assert!(matches!(log[3], HeldChange::Held(_, h) if h.key == 1 && h.digest == shard0 + 7));
        assert_eq!(log.len(), 3 + 5);
    }
}
