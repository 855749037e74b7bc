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

/// A vehicle's routing hash: SipHash-1-3 with fixed keys, so a vehicle
/// lands on the same shard after a restart (the restored state is
/// re-partitioned at start, so a toolchain that changed std's hasher would
/// move vehicles, not lose them). The router works it out once per fix,
/// for the shard and for the dedup window ([`crate::codec::Dedup`]), which
/// keeps it in place of the vehicle's id. A type of its own so that the
/// window is never handed some other vehicle's hash by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VehicleHash(u64);

impl VehicleHash {
    pub fn of(vehicle: &str) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        vehicle.hash(&mut h);
        Self(h.finish())
    }

    /// The vehicle's shard of `shards` (0 counts as 1).
    pub fn shard(self, shards: usize) -> usize {
        (self.0 % shards.max(1) as u64) as usize
    }

    /// Any value, for tests that need two vehicles to share a hash.
    #[cfg(test)]
    pub(crate) fn from_raw(hash: u64) -> Self {
        Self(hash)
    }
}
