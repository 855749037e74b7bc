//! Files that records leave geogate through, and how they fail: the dead
//! letter (every refusal) here, the events file through
//! [`crate::delivery::writer`].
//!
//! A sink that cannot write never loses and never wedges: what it could
//! not write stays in memory ([`append_file::AppendFile`]), what depends on
//! it waits (a refused message stays unacked; committed transitions stay
//! in the outbox), and the caller retries with backoff
//! ([`crate::shutdown::Drain::retry`], followed by [`health::SinkHealth`])
//! until the sink recovers or shutdown's drain deadline passes.

pub mod append_file;
pub mod config;
pub mod dead_letter;
pub mod health;
pub mod metrics;
pub mod payload;
