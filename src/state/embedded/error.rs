//! Why the embedded store refuses to open, or a commit fails: each error
//! names the file and says what the operator can do.

use super::outbox_rows::OutboxRowError;
use crate::state::StateError;
use crate::state::local::held_batch::HeldBytesError;
use crate::state::local::record::RecordError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
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
        "events file {path} ends at seq {file_seq}, but transitions {first}..={last} were in it, synced: the file was moved, truncated, replaced or restored from an older copy. Put it back (or restore it from its copy downstream) and start again; to go on without it, start once with --accept-events-gap (what the outbox still holds of those transitions is written again)"
    )]
    EventsGap {
        path: PathBuf,
        file_seq: u64,
        first: u64,
        last: u64,
    },
    #[error(
        "events file {path} has lines but none with a seq near its end, while the state has written {store_seq} transitions: it is not the file this state wrote to. Point events.path at that file; or move this one aside and start once with --accept-events-gap, which names the transitions the new file will lack"
    )]
    EventsWithoutSeq { path: PathBuf, store_seq: u64 },
    #[error("state file {path}: vehicle {vehicle:?}: {source}")]
    Corrupt {
        path: PathBuf,
        vehicle: String,
        source: RecordError,
    },
    #[error(
        "state file {path}: the outbox row ending at seq {last_seq}: {source}. Restore the file from a backup, or pass --reset-state to start from no memberships"
    )]
    CorruptOutbox {
        path: PathBuf,
        last_seq: u64,
        source: OutboxRowError,
    },
    #[error(
        "state file {path}: the held-fix log's row {id}: {source}. Restore the file from a backup, or pass --reset-state to start from no memberships"
    )]
    CorruptHeld {
        path: PathBuf,
        id: i64,
        source: HeldBytesError,
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
}

impl From<EmbeddedError> for StateError {
    fn from(e: EmbeddedError) -> Self {
        StateError::Store(Box::new(e))
    }
}
