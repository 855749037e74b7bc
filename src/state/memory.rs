//! `[state] backend = "memory"`: the local backend with a store that keeps
//! nothing, for benchmarks, `eval` and throwaway runs. Transitions still
//! go through the committer and out to the events file, numbered after
//! the file's last line.

use super::StateError;
use super::local::store::{CommitBatch, NO_FILE_CURSOR, Opened, Recovered, Store, read_tail};
use std::path::Path;

/// Keeps nothing.
pub struct MemoryStore;

impl Store for MemoryStore {
    fn commit(&mut self, _: &CommitBatch) -> Result<(), StateError> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        0
    }
    fn durable(&self) -> bool {
        false
    }
}

/// An empty store, numbering on from the events file's last seq.
pub fn open(events: Option<&Path>) -> Result<Opened, StateError> {
    let tail = read_tail(events)?;
    Ok(Opened {
        store: Box::new(MemoryStore),
        recovered: Recovered {
            next_seq: tail.last_seq.unwrap_or(0) + 1,
            file_cursor: NO_FILE_CURSOR,
            created: true,
            ..Recovered::default()
        },
        tail,
    })
}
