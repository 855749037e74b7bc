//! Committed transitions out, written once for every state backend: the
//! events file ([`writer`], exactly once by seq) and MQTT ([`publisher`],
//! at least once by id). A backend hands committed [`outbox`] entries to
//! a [`relay`] (the local backends) or writes them itself through the same
//! writer and publisher (the redis backend's stream consumer).
//!
//! Each output keeps a cursor ([`Cursors`]): the last seq it holds. A
//! store prunes its outbox only up to the lower of the two, so an entry
//! leaves the store once every output has it.
//!
//! * [`outbox`]: a transition as the line that leaves (stable id, seq);
//! * [`events_file`]: what the events file's tail says at start;
//! * [`writer`]: lines appended by the fsync policy, retried while the
//!   file fails;
//! * [`publisher`]: the same entries over MQTT;
//! * [`relay`]: committed batches to the file, then their completions,
//!   then the publisher.

pub mod config;
pub mod events_file;
pub mod metrics;
pub mod outbox;
pub mod publisher;
pub mod relay;
pub mod writer;

use std::sync::atomic::AtomicU64;

/// How far each output has come: the last seq it holds (`u64::MAX` for an
/// output that is not configured, so it never holds the outbox back).
#[derive(Debug)]
pub struct Cursors {
    pub file: AtomicU64,
    pub mqtt: AtomicU64,
}
