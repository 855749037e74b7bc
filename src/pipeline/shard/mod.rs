//! Shards: the router that decodes and admits, and the workers that
//! evaluate. [`shard_of`] picks the shard, so one vehicle's fixes are
//! evaluated in order by one worker that owns its membership state.
//!
//! * [`input`]: the router's view of one shard (queue, admission, bursts);
//! * [`router`]: decode, dedup, route, admit, dead-letter every refusal;
//! * [`worker`]: drain one shard into its evaluator and the event sink.

pub mod input;
pub mod router;
pub mod worker;

pub use input::ShardInput;
pub use router::{DeadLetterMirror, Router};
pub use worker::{WorkerContext, worker};

use crate::model::VehicleId;
use crate::source::AckToken;
use std::hash::{Hash, Hasher};
use std::time::Instant;

/// An admitted fix on its way to a worker.
#[derive(Debug)]
pub struct Admitted {
    pub token: Option<AckToken>,
    pub vehicle: VehicleId,
    pub fix_ms: i64,
    pub lat: f64,
    pub lon: f64,
    pub received_at: Instant,
    /// See [`crate::source::Envelope::redelivered`].
    pub redelivered: bool,
}

/// Stable across runs and platforms (SipHash with fixed keys), so a vehicle
/// lands on the same shard after a restart.
pub fn shard_of(vehicle: &str, shards: usize) -> usize {
    shard_of_hash(vehicle_hash(vehicle), shards)
}

/// The vehicle's hash [`shard_of`] routes by. The router works it out once
/// per fix and hands it to the dedup window too ([`crate::codec::Dedup`]),
/// which keeps it in place of the vehicle's id.
pub fn vehicle_hash(vehicle: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    vehicle.hash(&mut h);
    h.finish()
}

/// The shard of a vehicle whose [`vehicle_hash`] is `hash`.
pub fn shard_of_hash(hash: u64, shards: usize) -> usize {
    (hash % shards.max(1) as u64) as usize
}
