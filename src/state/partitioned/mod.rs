//! State for scale-out on ordered partitions (decision 0025): each
//! partition of the fleet has one owner at a time, which keeps the
//! partition's state in memory and commits it, batch by batch, to the
//! partition's log in the engine (NATS JetStream). A new owner on another
//! machine reads the log; a deposed owner's commits are refused.

pub mod commit_log;
mod error;
pub mod lease;

pub use error::PartitionError;
