//! The pipeline's stages, between a source and the state: decode lanes
//! ([`decode`]) split by topic, the shard router that dedups, admits and
//! dead-letters every refusal, and the shard workers that hand each batch
//! to its state ([`shard`]); every message is counted
//! ([`accounting`]). [`crate::service`] wires them to a source, the state
//! backend and the outputs.

pub mod accounting;
pub mod config;
pub mod decode;
pub mod metrics;
pub mod shard;
