//! Hashes with no per-process seed, for what must land in the same place
//! each time: FNV-1a for a vehicle's state partition and a topic's decode
//! lane, [`VehicleHash`] for a vehicle's shard.

pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A vehicle's routing hash: FNV-1a of its id, then the 64-bit finaliser
/// of MurmurHash3 (`fmix64`), so a vehicle lands on the same shard on every
/// run and with every toolchain. Why not std's `DefaultHasher`: its
/// algorithm is unspecified and may change between Rust releases, and its
/// SipHash-1-3 cost the router about 200 instructions per fix, this about
/// 80 (callgrind, over the bundled capture). Why the finaliser: FNV-1a's
/// low k bits depend only on the low k bits of each byte (its lowest bit
/// is fixed by how many odd bytes the id has), and the shard is the hash
/// modulo the shard count. Changing the function moves vehicles between
/// shards once, and loses none: the restored state is re-partitioned at
/// start (`pipeline::shard::split_by_shard`). The router works it out once per fix, for the
/// shard. A type of its own so that a shard is never picked from some
/// other hash by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VehicleHash(u64);

impl VehicleHash {
    pub fn of(vehicle: &str) -> Self {
        let mut h = fnv1a(vehicle.as_bytes());
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        Self(h)
    }

    /// The vehicle's shard of `shards` (0 counts as 1).
    pub fn shard(self, shards: usize) -> usize {
        (self.0 % shards.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards are stable across releases: a change to the function moves
    /// every vehicle's restored state and must be a decision, not an
    /// accident of a refactor.
    #[test]
    fn the_routing_hash_is_pinned() {
        assert_eq!(VehicleHash::of("").0, 0xefd0_1f60_ba99_2926);
        assert_eq!(VehicleHash::of("van0042").0, 0x242e_fcc0_3f7d_989b);
        assert_eq!(VehicleHash::of("van0042").shard(2), 1);
    }

    /// Ids that differ only in their last digits, as fleets number their
    /// vehicles, spread over every shard count up to 16 as a random
    /// assignment would: no shard further than 5 standard deviations of
    /// the binomial from an even share.
    #[test]
    fn numbered_fleets_spread_evenly_over_the_shards() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("van{i:05}")).collect();
        for shards in 2..=16 {
            let mut counts = vec![0usize; shards];
            for id in &ids {
                counts[VehicleHash::of(id).shard(shards)] += 1;
            }
            let n = ids.len() as f64;
            let p = 1.0 / shards as f64;
            let sd = (n * p * (1.0 - p)).sqrt();
            for (shard, &got) in counts.iter().enumerate() {
                assert!(
                    (got as f64 - n * p).abs() < 5.0 * sd,
                    "{shards} shards: shard {shard} got {got} of {n} (even: {})",
                    n * p
                );
            }
        }
    }

    /// FNV-1a alone keeps its low bits from the bytes' low bits only, so
    /// ids that differ only in letter case (bit 5 of each letter:
    /// `VAN0001`, `van0001`) always shared a shard for every power-of-two
    /// count up to 32; the finaliser spreads them as unrelated ids. (The
    /// spread test above passes with FNV-1a alone: numbered ids are its
    /// good case; this one is what the finaliser is for.)
    #[test]
    fn ids_differing_only_in_letter_case_are_not_tied_to_one_shard() {
        let pairs = 2_000;
        let same = (0..pairs)
            .filter(|i| {
                let lower = format!("van{i:05}");
                let upper = lower.to_uppercase();
                VehicleHash::of(&lower).shard(4) == VehicleHash::of(&upper).shard(4)
            })
            .count();
        // A random pairing shares a shard of 4 a quarter of the time.
        assert!(
            same * 3 < pairs,
            "{same} of {pairs} pairs shared their shard"
        );
        let fnv_only = (0..pairs)
            .filter(|i| {
                let lower = format!("van{i:05}");
                let upper = lower.to_uppercase();
                fnv1a(lower.as_bytes()) % 4 == fnv1a(upper.as_bytes()) % 4
            })
            .count();
        assert_eq!(fnv_only, pairs, "the weakness this guards against");
    }
}
