//! Per-vehicle state shared by several instances, in Redis (a node or a
//! Cluster): the membership rules run server-side, in one atomic script per
//! partition and batch, on facts each instance computes from its own fence
//! index ([`crate::geofence::probe`]). Whichever instance receives a fix,
//! the script sees the same state and applies the same rules, so the
//! result does not depend on how the broker spread the fixes.
//!
//! Vehicles fall into a fixed number of partitions by a stable hash of
//! their id. Each partition's keys share one hash tag, `{prefix:p}`, so a
//! vehicle's state and its partition's outbox stream live in one Cluster
//! slot and one script can touch both.

mod applier;
mod backend;
mod config;
mod consumer;
pub mod fence_sets;
mod output_cursor;
mod script;
mod stage;

pub use applier::{BatchCounts, SharedApplier};
pub use backend::RedisBackend;
pub use script::{Applied, SharedRules, SharedStateError};
pub use stage::SharedStage;

use crate::geofence::probe::FenceProbe;
use crate::model::VehicleId;
use serde::Serialize;

/// The partition of `vehicle` among `partitions`: FNV-1a of its bytes, the
/// same in every instance and every run (no per-process seed).
pub fn partition_of(vehicle: &str, partitions: u32) -> u32 {
    (crate::stable_hash::fnv1a(vehicle.as_bytes()) % u64::from(partitions.max(1))) as u32
}

/// Key names under one prefix.
#[derive(Debug, Clone)]
pub struct SharedKeys {
    prefix: String,
}

impl SharedKeys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The partition's outbox stream.
    pub fn outbox(&self, partition: u32) -> String {
        format!("{{{}:{partition}}}:outbox", self.prefix)
    }

    /// Settings every instance must share.
    pub fn meta(&self, name: &str) -> String {
        format!("{}:meta:{name}", self.prefix)
    }

    /// A vehicle's state, in its partition's slot.
    pub fn vehicle(&self, partition: u32, vehicle: &str) -> String {
        format!("{{{}:{partition}}}:v:{vehicle}", self.prefix)
    }
}

/// One fix as the script takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct FixFacts {
    /// Its position in the worker's batch (not sent to the script).
    pub index: usize,
    pub vehicle: VehicleId,
    pub fix_ms: i64,
    /// The broker's duplicate flag.
    pub redelivered: bool,
    /// The message's digest: what makes a second fix at the same time the
    /// same message.
    pub digest: u64,
    pub probe: FenceProbe,
}

impl Serialize for FixFacts {
    /// `[vehicle, fix ms, redelivered, [[fence, clear, dwell ms]...], [near...], digest]`:
    /// positional, to keep the script's argument small; the digest as hex
    /// text, since Lua's numbers are doubles.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let containing: Vec<(&str, u8, i64)> = self
            .probe
            .containing
            .iter()
            .map(|c| (c.id.as_ref(), u8::from(c.clear), c.dwell_ms))
            .collect();
        let near: Vec<&str> = self.probe.near.iter().map(|f| f.as_ref()).collect();
        (
            self.vehicle.as_str(),
            self.fix_ms,
            u8::from(self.redelivered),
            containing,
            near,
            format!("{:016x}", self.digest),
        )
            .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        // Fixed values: a change here would move every vehicle's state.
        assert_eq!(partition_of("v1", 16), partition_of("v1", 16));
        assert_eq!(partition_of("", 16), (0xcbf2_9ce4_8422_2325u64 % 16) as u32);
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            seen[partition_of(&format!("vehicle-{i}"), 16) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    #[test]
    fn keys_of_a_partition_share_one_hash_tag() {
        let keys = SharedKeys::new("geogate");
        assert_eq!(keys.outbox(7), "{geogate:7}:outbox");
        assert_eq!(keys.vehicle(7, "v{1}"), "{geogate:7}:v:v{1}");
    }
}
