//! Redelivery filter: remembers the last `capacity` (vehicle, fix time)
//! pairs. After a reconnect or a crash the broker redelivers unacked QoS 1
//! messages; each one is recognised here and counted as `duplicate` instead
//! of being evaluated twice. Bounded: the oldest key is forgotten first.

use crate::stable_hash::VehicleHash;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// One remembered key: the fix time and two hashes of the vehicle, no
/// copy of its id. Why: when ids were shared allocations, a window holding
/// 65,536 of them kept that many alive and touched each one's cold
/// reference count again to forget it; an inline id (24 bytes) would still
/// make the key larger than these hashes.
///
/// Two keys are one when the fix times are equal and both hashes agree: a
/// foldhash of (vehicle, fix time) under a per-process random seed, and the
/// vehicle's routing hash ([`VehicleHash`]). For two real vehicles that
/// is a collision of two 64-bit hashes at once. Neither resists inputs
/// chosen to collide (foldhash says so; the routing hash is unkeyed), but a
/// client that can publish can forge fixes outright. A false duplicate is
/// dead-lettered, not evaluated: its transitions would come only from
/// replaying the dead letter.
#[derive(Debug)]
struct Key {
    fix_ms: i64,
    seeded_hash: u64,
    routing: VehicleHash,
}

/// The window is a ring of keys in arrival order, and a hash table of ring
/// slots (4 bytes each) to find them. Why not a `HashSet` of keys beside a
/// queue: the router checks every message here, and the set's 24-byte keys
/// (a 65,536-key window is a 3 MB table) plus a second string hash to
/// forget each oldest key cost cache misses per message. Here the table is
/// 0.5–1 MB for the same window, a new key touches the table and its ring
/// slot, and the evicted key is found by its seeded hash and slot number.
#[derive(Debug)]
pub struct Dedup {
    slots: HashTable<u32>,
    ring: Vec<Key>,
    /// The slot the next key goes to; once the ring is full, the oldest.
    next: usize,
    /// foldhash, seeded per process (see `geofence::evaluator`).
    hasher: foldhash::fast::RandomState,
    capacity: usize,
}

impl Dedup {
    /// A window of `capacity` keys (0: no dedup). Slots are 32-bit, so a
    /// window is held to 2³² keys (about 100 GB of keys, far past any
    /// configuration that fits in memory).
    pub fn new(capacity: usize) -> Self {
        Self::with_room(capacity, 1 << 20)
    }

    /// Preallocates room for at most `preallocated` keys; the table and the
    /// ring grow past it (tests use a small figure to make them grow).
    fn with_room(capacity: usize, preallocated: usize) -> Self {
        let capacity = capacity.min(u32::MAX as usize);
        let preallocated = capacity.min(preallocated);
        Self {
            slots: HashTable::with_capacity(preallocated),
            ring: Vec::with_capacity(preallocated),
            next: 0,
            hasher: Default::default(),
            capacity,
        }
    }

    /// True the first time a key is seen within the window; `routing` is
    /// `vehicle`'s own.
    pub fn first_sighting(&mut self, vehicle: &str, routing: VehicleHash, fix_ms: i64) -> bool {
        if self.capacity == 0 {
            return true;
        }
        let seeded_hash = self.hasher.hash_one((vehicle, fix_ms));
        let ring = &self.ring;
        let seen = self.slots.find(seeded_hash, |&slot| {
            let key = &ring[slot as usize];
            key.seeded_hash == seeded_hash && key.fix_ms == fix_ms && key.routing == routing
        });
        if seen.is_some() {
            return false;
        }
        let key = Key {
            fix_ms,
            seeded_hash,
            routing,
        };
        let slot = self.next;
        if slot < self.ring.len() {
            // Full: the oldest key leaves the table, its slot takes the new.
            let oldest = self.ring[slot].seeded_hash;
            match self.slots.find_entry(oldest, |&s| s as usize == slot) {
                Ok(entry) => {
                    entry.remove();
                }
                // Every ring slot is in the table; a miss is a bug here,
                // and in a release build it only leaves a stale entry.
                Err(_) => debug_assert!(false, "ring slot {slot} missing from the table"),
            }
            self.ring[slot] = key;
        } else {
            self.ring.push(key);
        }
        let ring = &self.ring;
        self.slots
            .insert_unique(seeded_hash, slot as u32, |&s| ring[s as usize].seeded_hash);
        self.next = (slot + 1) % self.capacity;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(d: &mut Dedup, vehicle: &str, fix_ms: i64) -> bool {
        d.first_sighting(vehicle, VehicleHash::of(vehicle), fix_ms)
    }

    #[test]
    fn remembers_a_bounded_window() {
        let mut d = Dedup::new(2);
        assert!(first(&mut d, "a", 1));
        assert!(!first(&mut d, "a", 1));
        assert!(first(&mut d, "b", 1));
        assert!(first(&mut d, "a", 2)); // evicts (a, 1)
        assert!(first(&mut d, "a", 1));
    }

    /// The routing hash alone does not make vehicles one: 10,000 of them
    /// sharing it and a fix time are each seen for the first time (a table
    /// probe compares only slots whose 7-bit tag matches, so a single pair
    /// would pass by luck 127 times in 128 if the seeded hash were ignored).
    #[test]
    fn a_shared_routing_hash_is_not_a_duplicate() {
        let mut d = Dedup::new(20_000);
        let shared = VehicleHash::from_raw(7);
        for v in 0..10_000 {
            assert!(d.first_sighting(&format!("v{v}"), shared, 1), "v{v}");
        }
        assert!(!d.first_sighting("v42", shared, 1));
    }

    /// Nor does the seeded hash alone: the same vehicle and fix time under
    /// another routing hash are a different key.
    #[test]
    fn a_different_routing_hash_is_not_a_duplicate() {
        let mut d = Dedup::new(8);
        assert!(d.first_sighting("a", VehicleHash::from_raw(1), 1));
        assert!(d.first_sighting("a", VehicleHash::from_raw(2), 1));
        assert!(!d.first_sighting("a", VehicleHash::from_raw(2), 1));
    }

    proptest::proptest! {
        /// The window against the plainest model of it: a queue of the
        /// last `capacity` new keys, searched from end to end.
        /// Small windows wrap often; larger ones, preallocated for 4 keys,
        /// make the table grow and rehash (the slot-to-hash closure).
        #[test]
        fn agrees_with_a_queue_of_the_last_keys(
            capacity in proptest::prop_oneof![0usize..9, 9usize..80],
            keys in proptest::collection::vec((0u8..12, 0i64..12), 0..600),
        ) {
            let mut dedup = Dedup::with_room(capacity, 4);
            let mut model: std::collections::VecDeque<(String, i64)> = Default::default();
            for (v, ts) in keys {
                let vehicle = format!("v{v}");
                let key = (vehicle.clone(), ts);
                let expected = capacity == 0 || !model.contains(&key);
                if capacity > 0 && expected {
                    if model.len() == capacity {
                        model.pop_front();
                    }
                    model.push_back(key);
                }
                proptest::prop_assert_eq!(first(&mut dedup, &vehicle, ts), expected);
            }
        }
    }
}
