//! FNV-1a over bytes: the same value in every process and every run (no
//! per-process seed), for what must land in the same place each time: a
//! vehicle's state partition, a topic's decode lane.

pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
