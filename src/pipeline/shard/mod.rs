//! Shards: the router that decodes and admits, and the workers that
//! evaluate. [`shard_of`] picks the shard, so one vehicle's fixes are
//! evaluated in order by one worker that owns its membership state.
//!
//! * [`completion`]: a batch's messages counted and acked once durable;
//! * [`input`]: the router's view of one shard (queue, admission, bursts);
//! * [`queue`]: the bounded queue that carries those bursts to the worker;
//! * [`router`]: decode, dedup, route, admit, dead-letter every refusal;
//! * [`worker`]: drain one shard into its state.

pub mod completion;
pub mod input;
pub mod queue;
pub mod router;
pub mod vehicle_query;
pub mod worker;

pub use input::ShardInput;
pub use router::{DeadLetterMirror, RefusalCounters, Router};
pub use worker::{WorkerContext, worker};

use crate::geofence::Fix;
use crate::model::VehicleId;
use crate::source::AckToken;
use crate::stable_hash::VehicleHash;
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
    /// `received_at` on the receive clock (unix ms).
    pub received_ms: i64,
    /// See [`crate::source::Envelope::redelivered`].
    pub redelivered: bool,
    /// [`crate::codec::message_digest`] of the message.
    pub digest: u64,
    /// The message itself, for the dead letter should the fix prove late.
    pub topic: String,
    pub payload: bytes::Bytes,
}

impl Admitted {
    /// The event as the evaluator takes it.
    pub fn fix(&self) -> Fix<'_> {
        Fix {
            vehicle: &self.vehicle,
            fix_ms: self.fix_ms,
            lat: self.lat,
            lon: self.lon,
            redelivered: self.redelivered,
            received_ms: self.received_ms,
            digest: self.digest,
        }
    }
}

/// The vehicle's shard ([`VehicleHash::shard`]).
pub fn shard_of(vehicle: &str, shards: usize) -> usize {
    VehicleHash::of(vehicle).shard(shards)
}

/// Sorts vehicles into the shards that will own them.
pub fn split_by_shard<T>(vehicles: Vec<(VehicleId, T)>, shards: usize) -> Vec<Vec<(VehicleId, T)>> {
    let mut split: Vec<Vec<_>> = (0..shards.max(1)).map(|_| Vec::new()).collect();
    for (vehicle, value) in vehicles {
        split[shard_of(&vehicle, shards)].push((vehicle, value));
    }
    split
}
