//! Why a state backend refuses to start, or a commit fails.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A store's own error, which names its file and what the operator
    /// can do (the embedded store's: `super::embedded::EmbeddedError`).
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
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
    /// A backend [`super::backends::open`] does not start: retired, or
    /// run by [`crate::scale_out`] instead of one fixed set of shards.
    #[error("state: {0}")]
    Unsupported(&'static str),
    /// The store's fence set no longer passes validation.
    #[error("the fence set in the state store: {0}")]
    Fences(#[from] crate::geofence::FenceErrors),
    /// With `fences.source = "file"`, no fence file was given.
    #[error("fences.path is required with fences.source = \"file\"")]
    NoFenceFile,
    /// The webhook's HTTP client could not be built.
    #[error("events.webhook {0}")]
    Webhook(String),
}
