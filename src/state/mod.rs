//! Per-vehicle state that outlives the process, and the outbox that makes
//! each transition leave exactly once.
//!
//! * [`record`]: a vehicle's state as bytes;
//! * [`outbox`]: a transition as the line that leaves (stable id, seq);
//! * [`outbox_rows`]: a commit's outbox entries as one row of the store;
//! * [`embedded`]: the SQLite store (`[state] backend = "embedded"`);
//! * [`commit`]: the one thread that commits every shard's batches;
//! * [`relay`]: committed transitions out to the events file;
//! * [`publisher`]: and over MQTT, at least once;
//! * [`stage`]: all of it started (and finished) as the pipeline needs;
//! * [`events_file`]: where the events file's tail says the relay stopped;
//! * [`crash_point`]: where tests stop the process to SIGKILL it;
//! * [`shared`]: `[state] backend = "redis"`: the membership rules as a
//!   Redis script, and the outbox as streams every instance delivers from.
//!
//! The seam is [`Store`]: a batch of vehicle records and outbox entries
//! committed in one transaction, and everything committed read back at
//! start. The memory backend keeps nothing (benchmarks, throwaway runs).
//! ARCHITECTURE.md walks through the exactly-once argument.

pub mod commit;
pub mod crash_point;
pub mod embedded;
pub mod events_file;
pub mod log_writeback;
pub mod outbox;
pub mod outbox_rows;
pub mod publisher;
pub mod record;
pub mod relay;
pub mod shared;
pub mod stage;

use crate::config::{StateBackend, StateConfig};
use crate::geofence::VehicleSnapshot;
use crate::model::VehicleId;
use outbox::OutboxEntry;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "state file {path} is missing, but the events file {events} already holds transitions{}: starting without the state would repeat every enter. Restore the file, or pass --reset-state to start from no memberships",
        last_seq.map(|s| format!(" (last seq {s})")).unwrap_or_default()
    )]
    Missing {
        path: PathBuf,
        events: PathBuf,
        last_seq: Option<u64>,
    },
    #[error(
        "state file {path} is held open by another process (another geogate?); each geogate needs a state file of its own"
    )]
    Held { path: PathBuf },
    #[error(
        "state file {path} ends at seq {store_seq}, but the events file {events} already has seq {file_seq}: the state is older than the events it produced (restored from a backup, or cut short by a power loss with fsync = \"flush\"). Restore a newer state file, or pass --reset-state"
    )]
    Behind {
        path: PathBuf,
        store_seq: u64,
        events: PathBuf,
        file_seq: u64,
    },
    #[error(
        "events file {path} has lines but none with a seq near its end, while the state has written {store_seq} transitions: it is not the file this state wrote to. Point events.path at that file, or move this one aside"
    )]
    EventsWithoutSeq { path: PathBuf, store_seq: u64 },
    #[error("state file {path}: vehicle {vehicle:?}: {source}")]
    Corrupt {
        path: PathBuf,
        vehicle: String,
        source: record::RecordError,
    },
    #[error(
        "state file {path}: the outbox row ending at seq {last_seq}: {source}. Restore the file from a backup, or pass --reset-state to start from no memberships"
    )]
    CorruptOutbox {
        path: PathBuf,
        last_seq: u64,
        source: outbox_rows::OutboxRowError,
    },
    #[error(
        "state file {path} has schema version {version}, written by a newer geogate; this one reads up to version {readable}. Run the newer geogate, or move the file aside and pass --reset-state to start from no memberships"
    )]
    Newer {
        path: PathBuf,
        version: i64,
        readable: i64,
    },
    #[error("state file {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("state file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("events file {path}: {source}")]
    EventsFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The redis backend (see [`shared`]): unreachable at start, or
    /// configured unlike the instances already using it.
    #[error("shared state: {0}")]
    Shared(String),
    #[error("the redis backend has no local store to open")]
    NotLocal,
}

/// One vehicle's new state, encoded by [`record::encode`]; `None` deletes
/// it (idle expiry).
pub type VehicleChange = (VehicleId, Option<Vec<u8>>);

/// What one transaction writes.
#[derive(Debug, Default)]
pub struct CommitBatch {
    pub vehicles: Vec<VehicleChange>,
    pub outbox: Vec<OutboxEntry>,
    /// The seq the next transition will get.
    pub next_seq: u64,
    /// The relay's progress: outbox entries at or below both are gone.
    pub file_cursor: u64,
    pub mqtt_cursor: u64,
}

impl CommitBatch {
    /// Vehicle records only, before any transition (loading a store).
    pub fn vehicles_only(vehicles: Vec<VehicleChange>) -> Self {
        Self {
            vehicles,
            next_seq: 1,
            ..Self::default()
        }
    }
}

/// Everything committed, read back at start.
#[derive(Debug, Default)]
pub struct Recovered {
    pub vehicles: Vec<(VehicleId, VehicleSnapshot)>,
    /// Committed transitions, in seq order, from the first row the relay
    /// and the publisher had not both confirmed: a row may still hold
    /// entries at or below their cursors, which each skips.
    pub outbox: Vec<OutboxEntry>,
    pub next_seq: u64,
    pub mqtt_cursor: u64,
    /// The store was created by this start (first run or reset).
    pub created: bool,
}

/// The seam both backends (and a Redis one) fit.
pub trait Store: Send {
    /// Commits the batch atomically: all of it or none of it survives a
    /// crash.
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), StateError>;
    /// Bytes the store occupies now (file and log).
    fn size_bytes(&self) -> u64;
    /// Whether a commit survives a process crash (and so whether the
    /// workers need to track which vehicles changed).
    fn durable(&self) -> bool;
}

/// Keeps nothing: for benchmarks and throwaway runs.
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

/// An opened store, what it held, and where the events file stopped.
pub struct Opened {
    pub store: Box<dyn Store>,
    pub recovered: Recovered,
    /// Seq of the events file's last line (0: none).
    pub file_seq: u64,
}

/// Opens the configured backend, checked against the events file so that a
/// lost or stale state file is an error rather than a silent reset.
pub fn open(config: &StateConfig, events: Option<&Path>) -> Result<Opened, StateError> {
    let events_error = |path: &Path, source| StateError::EventsFile {
        path: path.to_owned(),
        source,
    };
    let tail = match events {
        Some(path) => events_file::read(path).map_err(|e| events_error(path, e))?,
        None => events_file::Tail::default(),
    };
    let file_seq = tail.last_seq.unwrap_or(0);
    let opened = match config.backend {
        StateBackend::Memory => Opened {
            store: Box::new(MemoryStore),
            recovered: Recovered {
                next_seq: file_seq + 1,
                created: true,
                ..Recovered::default()
            },
            file_seq,
        },
        StateBackend::Redis => return Err(StateError::NotLocal),
        StateBackend::Embedded => {
            let path = &config.path;
            if !config.reset
                && !path.exists()
                && tail.has_lines
                && let Some(events) = events
            {
                return Err(StateError::Missing {
                    path: path.clone(),
                    events: events.to_owned(),
                    last_seq: tail.last_seq,
                });
            }
            let (store, mut recovered) = embedded::EmbeddedStore::open(path, config)?;
            let store_seq = recovered.next_seq.saturating_sub(1);
            if tail.has_lines
                && tail.last_seq.is_none()
                && store_seq > 0
                && let Some(events) = events
            {
                // Transitions were written, yet no line says which: the
                // relay cannot tell where to go on without repeating.
                return Err(StateError::EventsWithoutSeq {
                    path: events.to_owned(),
                    store_seq,
                });
            }
            if file_seq > store_seq {
                if !recovered.created {
                    return Err(StateError::Behind {
                        path: path.clone(),
                        store_seq,
                        events: events.map(Path::to_owned).unwrap_or_default(),
                        file_seq,
                    });
                }
                // A reset: keep numbering after the file's last line.
                recovered.next_seq = file_seq + 1;
            }
            Opened {
                store: Box::new(store),
                recovered,
                file_seq,
            }
        }
    };
    // Only now, with the state file's lock held, is the events file ours.
    if tail.torn_bytes > 0
        && let Some(path) = events
    {
        events_file::cut_torn(path, &tail).map_err(|e| events_error(path, e))?;
        tracing::warn!(
            "events file {}: removed a torn last line ({} bytes) left by a crash mid-write; its transition is written again (from the outbox, or from its redelivered message)",
            path.display(),
            tail.torn_bytes
        );
    }
    Ok(opened)
}
