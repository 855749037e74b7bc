//! Why a state backend refuses to start, or a commit fails.

use super::embedded::EmbeddedError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The embedded store (see [`super::embedded`]).
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
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
    /// The redis backend (see [`super::redis`]): unreachable at start, or
    /// configured unlike the instances already using it.
    #[error("shared state: {0}")]
    Shared(String),
}
