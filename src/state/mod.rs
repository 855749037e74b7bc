//! Per-vehicle state behind one batch-level seam, and the backends that
//! implement it.
//!
//! A shard worker hands its [`ShardState`] one [`Batch`] at a time: the
//! fixes it admitted, a fence set that changed, the event-time watermark. The
//! backend applies the membership rules to it, keeps what changed, and,
//! once the batch's effects are durable and its transitions delivered as
//! promised, tells the batch's [`Completion`] what it came to. Only then
//! does the pipeline count and ack the batch's messages; a batch whose
//! completion is dropped stays unacked and comes back after a restart.
//!
//! Containment (the geometry) stays local and pure in [`crate::geofence`];
//! what differs between backends is where the memberships live and how a
//! batch becomes durable:
//!
//! * [`local`]: the memberships in this process; a committer thread writes
//!   each group of batches to a [`local::store::Store`] and hands the
//!   transitions
//!   to [`crate::delivery`]. Two stores fit it:
//!   * [`memory`]: keeps nothing (benchmarks, throwaway runs);
//!   * [`embedded`]: one SQLite file (`[state] backend = "embedded"`);
//! * [`partitioned`]: scale-out on ordered partitions, one owner each,
//!   committing to a log in NATS JetStream (decision 0025). Its shards
//!   come and go with ownership, so [`crate::scale_out`] runs it rather
//!   than [`backends::open`].
//!
//! [`backends::open`] is the one place that knows every backend.

pub mod backends;
pub mod config;
pub mod embedded;
mod error;
pub mod local;
pub mod memory;
pub mod metrics;
pub mod partitioned;

pub use config::{EmbeddedConfig, StateBackend, StateConfig};
pub use error::StateError;

use crate::delivery::Outputs;
use crate::delivery::outbox::FenceProperties;
use crate::geofence::config::FencesSource;
use crate::geofence::registry::FenceJournal;
use crate::geofence::{EvaluatorSettings, Fence, FenceIndex, Fix, VehicleSnapshot, VehicleView};
use crate::model::VehicleId;
use crate::shutdown::Drain;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

/// A future a backend returns through the seam's trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One shard's inputs since its last batch, applied in this order: the
/// fence set (live from this batch on), the fixes (in the order the shard
/// admitted them), then whatever falls due by the watermark.
pub struct Batch<'a> {
    /// A reloaded fence set.
    pub fences: Option<Arc<FenceIndex>>,
    pub fixes: &'a [Fix<'a>],
    /// The receive-clock time (unix ms) up to which every message has been
    /// handed to the state, this batch's included: outputs that no fix
    /// triggers (a reorder window's release, an idle expiry) fire once
    /// their due time is at or before it, so a backlog delays them but
    /// never orders them ahead of the vehicle's own fixes. An idle shard
    /// still gets a batch with only the watermark every 250 ms.
    /// `None`: nothing falls due.
    pub watermark: Option<i64>,
    /// The last batch of a graceful stop: every fix still waiting in a
    /// reorder window is applied now, in fix-time order, as a drain
    /// finishes the work in flight. (A crash leaves them in the committed
    /// state instead, and the restart releases them.)
    pub closing: bool,
    /// How far an ordered source (a partition's input) has been read with
    /// this batch: committed with the batch's state. `None` for a source
    /// that acks message by message (MQTT).
    pub position: Option<SourcePosition>,
}

/// An ordered source's progress, committed with the state it produced.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SourcePosition {
    /// The last position read, up to and including.
    pub through: u64,
    /// Messages read since the batch before.
    pub read: u64,
    /// Of them, refused before the state (undecodable, a wrong clock).
    pub refused: u64,
    /// Of them, not fixes and ignored (an OwnTracks status).
    pub ignored: u64,
}

/// A fix the state found late: older than its vehicle's last applied fix
/// once the reorder window had passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Late {
    /// Its position in the batch's fixes.
    pub index: usize,
    /// How far behind the last applied fix time it was.
    pub by_ms: i64,
}

/// What a batch came to, for the pipeline's accounting and metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcomes {
    /// Fixes applied to their vehicle's state on arrival.
    pub evaluated: u64,
    /// Fixes taken into their vehicle's reorder window.
    pub held: u64,
    /// Fixes that left a window and were applied with this batch.
    pub released: u64,
    /// Fixes older than their vehicle's last applied fix: nothing changed.
    pub late: Vec<Late>,
    /// Fixes the state knew as already applied (the same message again,
    /// or an older one the broker marked redelivered), by their position
    /// in the batch's fixes.
    pub duplicates: Vec<usize>,
    /// Transitions the batch produced.
    pub enters: u64,
    pub exits: u64,
    /// Vehicles forgotten after the idle expiry.
    pub expired: u64,
}

/// The pipeline's side of one batch: its source positions (the messages'
/// acks) and its accounting. Told once, when the batch is durable and
/// delivered; dropped untold, the batch is left for redelivery.
pub trait Completion: Send {
    fn complete(self: Box<Self>, outcomes: Outcomes);
}

/// The backend takes no more batches: the drain deadline passed while it
/// could not make one durable, or it has shut down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// A question about one vehicle's state, answered once every batch its
/// shard took before it is durable and its transitions delivered: the
/// answer matches the events written so far.
pub struct VehicleQuery {
    pub vehicle: VehicleId,
    pub reply: tokio::sync::oneshot::Sender<Option<VehicleView>>,
}

/// One shard's state: every batch of that shard goes through it, in order.
pub trait ShardState: Send {
    /// Answers `query` in order with the batches.
    fn query(&mut self, query: VehicleQuery) -> BoxFuture<'_, Result<(), Stopped>>;

    /// Applies `batch`; `done` is completed once it is durable (possibly
    /// after this returns, when a later stage makes it so).
    fn apply<'a>(
        &'a mut self,
        batch: Batch<'a>,
        done: Box<dyn Completion>,
    ) -> BoxFuture<'a, Result<(), Stopped>>;
}

/// A started backend: one [`ShardState`] per shard, then a finish.
pub trait Backend: Send {
    /// The vehicles it holds from before this start, to be spread over
    /// the shards (taken once; empty for a backend that keeps them
    /// elsewhere).
    fn take_restored(&mut self) -> Vec<(VehicleId, VehicleSnapshot)>;

    /// The state of `shard`, holding `restored`, the vehicles of that
    /// shard from [`Self::take_restored`].
    fn shard(
        &mut self,
        shard: usize,
        index: Arc<FenceIndex>,
        restored: Vec<(VehicleId, VehicleSnapshot)>,
    ) -> Box<dyn ShardState>;

    /// The fence set to run with, settled at start from the store's and
    /// the file's.
    fn fences(&self) -> Arc<FenceIndex>;

    /// Where fence changes are made durable, in order with the batches.
    fn fence_journal(&self) -> Arc<dyn FenceJournal>;

    /// Resolves once everything the shards handed over is durable and
    /// delivered, or the drain deadline has passed. Called after every
    /// shard's worker has ended.
    fn finish(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// The fence file's part in the set a backend starts with.
#[derive(Debug, Clone, Default)]
pub struct FenceSupply {
    pub source: FencesSource,
    /// The fence file's fences, when there is a file.
    pub file: Option<Vec<Fence>>,
}

impl FenceSupply {
    /// The fences of `set`, as if read from a file.
    pub fn of(set: &FenceIndex) -> Self {
        Self {
            source: FencesSource::File,
            file: Some(set.fences().cloned().collect()),
        }
    }
}

/// What a backend needs from the run besides its own settings.
pub struct OpenContext {
    /// The events file; `None` keeps transitions only in the store.
    pub events: Option<PathBuf>,
    /// The outputs after the events file.
    pub outputs: Outputs,
    pub settings: EvaluatorSettings,
    /// Where the fence set comes from: with the stored set, the backend
    /// settles the set to run with ([`Backend::fences`]) before anything
    /// runs.
    pub fences: FenceSupply,
    /// Shards the pipeline runs.
    pub shards: usize,
    /// Label transition counts by fence (opt-in).
    pub per_fence_labels: bool,
    /// Which fence properties event lines carry.
    pub fence_properties: FenceProperties,
    pub drain: Drain,
}
