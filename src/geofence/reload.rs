//! The loaded fence set as a live value: every worker watches it, and a
//! reload (SIGHUP) swaps in a new set, or keeps the old one when the file
//! is refused.

use super::{
    EvaluatorSettings, FenceErrors, FenceIndex, fingerprint, parse_fences, read_fence_file,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

/// Handle for reloading fences while the pipeline runs.
#[derive(Clone)]
pub struct FenceReloader {
    path: PathBuf,
    tx: Arc<watch::Sender<Arc<FenceIndex>>>,
    /// The loaded set's fingerprint, for instances that must agree on it.
    fingerprint: Arc<watch::Sender<String>>,
    settings: EvaluatorSettings,
}

/// What a loaded fence file gives the run.
pub struct LiveFences {
    pub reloader: FenceReloader,
    pub index: watch::Receiver<Arc<FenceIndex>>,
    pub fingerprint: watch::Receiver<String>,
}

impl FenceReloader {
    /// Loads the fence file at `path` for the first time.
    pub fn load(path: &Path, settings: EvaluatorSettings) -> Result<LiveFences, FenceErrors> {
        let text = read_fence_file(path)?;
        let fences = parse_fences(&text)?;
        tracing::info!(fences = fences.len(), "fences loaded");
        let (tx, index) = watch::channel(Arc::new(FenceIndex::new(fences)));
        let (fingerprint_tx, fingerprint) = watch::channel(fingerprint(&text, &settings));
        Ok(LiveFences {
            reloader: Self {
                path: path.to_owned(),
                tx: Arc::new(tx),
                fingerprint: Arc::new(fingerprint_tx),
                settings,
            },
            index,
            fingerprint,
        })
    }

    /// Loads the fence file again. On success every worker swaps to the new
    /// index before its next batch; on failure the old fences stay and the
    /// errors are returned (and logged by the caller).
    pub fn reload(&self) -> Result<usize, FenceErrors> {
        let text = read_fence_file(&self.path)?;
        let fences = parse_fences(&text)?;
        let count = fences.len();
        self.tx.send_replace(Arc::new(FenceIndex::new(fences)));
        self.fingerprint
            .send_replace(fingerprint(&text, &self.settings));
        Ok(count)
    }
}
