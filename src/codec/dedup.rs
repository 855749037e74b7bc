//! Redelivery filter: remembers the last `capacity` messages by their
//! digest ([`super::message_digest`]: topic and payload bytes). After a
//! reconnect or a crash the broker redelivers unacked QoS 1 messages; each
//! one is recognised here and counted as `duplicate` instead of being
//! evaluated twice. Bounded: the oldest key is forgotten first.
//!
//! The key is the message, not (vehicle, fix time): two different fixes in
//! the same second (an event report and a periodic one, OwnTracks' 1 s
//! `tst`) are two fixes, and a message that was shed or refused never
//! makes a later, different one a duplicate.

use hashbrown::HashTable;

/// One remembered key: the message's 64-bit digest. Two messages are one
/// when their digests agree: for two different real messages a 2⁻⁶⁴
/// chance. xxh3 does not resist inputs chosen to collide, but a client
/// that can publish can forge messages outright; and a false duplicate is
/// dead-lettered, not lost.
#[derive(Debug)]
struct Key {
    digest: u64,
}

/// The window is a ring of keys in arrival order, and a hash table of ring
/// slots (4 bytes each) to find them. Why not a `HashSet` of keys beside a
/// queue: the router checks every message here, and the set's 24-byte keys
/// (a 65,536-key window is a 3 MB table) plus a second string hash to
/// forget each oldest key cost cache misses per message. Here the table is
/// 0.5–1 MB for the same window, a new key touches the table and its ring
/// slot, and the evicted key is found by its digest and slot number.
#[derive(Debug)]
pub struct Dedup {
    slots: HashTable<u32>,
    ring: Vec<Key>,
    /// The slot the next key goes to; once the ring is full, the oldest.
    next: usize,
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
            capacity,
        }
    }

    /// True the first time a message's digest is seen within the window.
    pub fn first_sighting(&mut self, digest: u64) -> bool {
        if self.capacity == 0 {
            return true;
        }
        let ring = &self.ring;
        let seen = self
            .slots
            .find(digest, |&slot| ring[slot as usize].digest == digest);
        if seen.is_some() {
            return false;
        }
        let key = Key { digest };
        let slot = self.next;
        if slot < self.ring.len() {
            // Full: the oldest key leaves the table, its slot takes the new.
            let oldest = self.ring[slot].digest;
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
            .insert_unique(digest, slot as u32, |&s| ring[s as usize].digest);
        self.next = (slot + 1) % self.capacity;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::message_digest;

    fn first(d: &mut Dedup, topic: &str, payload: &str) -> bool {
        d.first_sighting(message_digest(topic, payload.as_bytes()))
    }

    #[test]
    fn remembers_a_bounded_window() {
        let mut d = Dedup::new(2);
        assert!(first(&mut d, "t", "a1"));
        assert!(!first(&mut d, "t", "a1"));
        assert!(first(&mut d, "t", "b1"));
        assert!(first(&mut d, "t", "a2")); // evicts a1
        assert!(first(&mut d, "t", "a1"));
    }

    /// The same payload on another topic is another message (the topic
    /// may be what names the vehicle).
    #[test]
    fn the_topic_is_part_of_the_message() {
        let mut d = Dedup::new(8);
        assert!(first(&mut d, "owntracks/ann/phone", "{}"));
        assert!(first(&mut d, "owntracks/bob/phone", "{}"));
        assert!(!first(&mut d, "owntracks/bob/phone", "{}"));
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
            let mut model: std::collections::VecDeque<(u8, i64)> = Default::default();
            for key in keys {
                let expected = capacity == 0 || !model.contains(&key);
                if capacity > 0 && expected {
                    if model.len() == capacity {
                        model.pop_front();
                    }
                    model.push_back(key);
                }
                let payload = format!("{{\"v\":{},\"ts\":{}}}", key.0, key.1);
                proptest::prop_assert_eq!(first(&mut dedup, "t", &payload), expected);
            }
        }
    }
}
