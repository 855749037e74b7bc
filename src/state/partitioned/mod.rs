//! State for scale-out on ordered partitions (decision 0025): each
//! partition of the fleet has one owner at a time, which keeps the
//! partition's state in memory and commits it, batch by batch, to the
//! partition's log in the engine (NATS JetStream). A new owner on another
//! machine reads the log; a deposed owner's commits are refused.
//!
//! * [`commit_body`]: a commit as bytes;
//! * [`commit_log`]: the partition's log, fenced by expected sequence;
//! * [`mirror`]: the state as the log replays to, and its snapshots;
//! * [`restore`]: reading the log from its base;
//! * [`events_stream`]: where the transitions go, once each;
//! * [`committer`]: an owner's commits, publishes and snapshots;
//! * [`lease`]: who should own a partition.

pub mod commit_body;
pub mod commit_log;
pub mod committer;
pub mod config;
mod error;
pub mod events_stream;
pub mod lease;
pub mod metrics;
pub mod mirror;
pub mod restore;

pub use error::PartitionError;
