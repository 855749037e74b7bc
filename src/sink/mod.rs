//! Where events leave geogate: transitions to their consumers, refusals to
//! the dead letter.
//!
//! A sink that cannot write never loses and never wedges: what it could
//! not write stays in memory ([`append_file::AppendFile`]), the message
//! behind it stays unacked, and the caller retries with backoff
//! ([`health::retry_until`]) until the sink recovers or shutdown's drain
//! deadline passes.

pub mod append_file;
pub mod dead_letter;
pub mod events;
pub mod health;
pub mod payload;
