//! The live fence set: every worker watches it, and a change (from the
//! API, or the fence file read again on SIGHUP) is made durable through a
//! [`FenceJournal`], then swapped in, in version order, one at a time.
//!
//! Where the set is kept is the state backend's business: the journal is
//! its handle, so this layer imports nothing above it.

use super::config::FencesSource;
use super::{
    EvaluatorSettings, Fence, FenceChange, FenceErrors, FenceIndex, fingerprint, parse_fences,
    read_fence_file,
};
use crate::model::FenceId;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{Mutex, watch};

/// A future a journal returns.
pub type JournalFuture = Pin<Box<dyn Future<Output = Result<(), JournalError>> + Send>>;

/// Where fence changes are made durable before they go live.
pub trait FenceJournal: Send + Sync {
    /// Makes `change`, made to `before`, durable; resolves once it is.
    fn record(&self, before: &FenceIndex, change: &FenceChange) -> JournalFuture;
}

/// A journal that keeps nothing (the fences live only in this process).
pub struct NoJournal;

impl FenceJournal for NoJournal {
    fn record(&self, _: &FenceIndex, _: &FenceChange) -> JournalFuture {
        Box::pin(async { Ok(()) })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("the state store takes no more changes: geogate is stopping")]
    Stopped,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The fences are the file's (`[fences] source = "file"`).
    #[error(
        "fences come from the fence file here (fences.source = \"file\"): edit the file and send SIGHUP"
    )]
    ReadOnly,
    #[error(transparent)]
    Invalid(#[from] FenceErrors),
    #[error("no fence {0:?}")]
    Unknown(FenceId),
    #[error("fence {0:?} appears twice in one change")]
    Repeated(FenceId),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// The live fence set and the one way to change it.
#[derive(Clone)]
pub struct FenceRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    tx: watch::Sender<Arc<FenceIndex>>,
    fingerprint: watch::Sender<String>,
    journal: Arc<dyn FenceJournal>,
    settings: EvaluatorSettings,
    source: FencesSource,
    /// The fence file (read again on SIGHUP with `source = "file"`).
    path: Option<PathBuf>,
    /// One change at a time: versions are given in the order changes are
    /// made durable and go live.
    writing: Mutex<()>,
    /// A compaction is running.
    compacting: AtomicBool,
    /// The changes made while a compaction runs, applied to its result.
    since_compaction: std::sync::Mutex<Vec<FenceChange>>,
}

impl FenceRegistry {
    pub fn new(
        live: Arc<FenceIndex>,
        journal: Arc<dyn FenceJournal>,
        settings: EvaluatorSettings,
        source: FencesSource,
        path: Option<PathBuf>,
    ) -> Self {
        let (fingerprint_tx, _) = watch::channel(fingerprint(&live, &settings));
        let (tx, _) = watch::channel(live);
        Self {
            inner: Arc::new(Inner {
                tx,
                fingerprint: fingerprint_tx,
                journal,
                settings,
                source,
                path,
                writing: Mutex::new(()),
                compacting: AtomicBool::new(false),
                since_compaction: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// A set of the fence file's fences, kept in this process only (each
    /// start reads the file again), at version 1 from `at_ms`.
    pub fn from_file(
        path: &std::path::Path,
        settings: EvaluatorSettings,
        at_ms: i64,
    ) -> Result<Self, FenceErrors> {
        let fences = parse_fences(&read_fence_file(path)?)?;
        tracing::info!(fences = fences.len(), "fences loaded");
        Ok(Self::new(
            Arc::new(FenceIndex::first(fences, at_ms)),
            Arc::new(NoJournal),
            settings,
            FencesSource::File,
            Some(path.to_owned()),
        ))
    }

    /// The set live now.
    pub fn current(&self) -> Arc<FenceIndex> {
        self.inner.tx.borrow().clone()
    }

    /// Follows the live set; a worker swaps at its next batch.
    pub fn subscribe(&self) -> watch::Receiver<Arc<FenceIndex>> {
        self.inner.tx.subscribe()
    }

    /// Follows the live set's fingerprint.
    pub fn fingerprint(&self) -> watch::Receiver<String> {
        self.inner.fingerprint.subscribe()
    }

    pub fn source(&self) -> FencesSource {
        self.inner.source
    }

    /// Puts `upserts` and deletes `deletes` as one change, all or nothing:
    /// validated already, made durable, then live. Returns the set it
    /// made live. `at_ms` is the change's time on the receive clock.
    pub async fn change(
        &self,
        upserts: Vec<Fence>,
        deletes: Vec<FenceId>,
        at_ms: i64,
    ) -> Result<Arc<FenceIndex>, ChangeError> {
        if self.inner.source == FencesSource::File {
            return Err(ChangeError::ReadOnly);
        }
        let _one_at_a_time = self.inner.writing.lock().await;
        let before = self.current();
        let mut seen = std::collections::HashSet::new();
        for id in upserts.iter().map(|f| &f.id).chain(&deletes) {
            if !seen.insert(id.clone()) {
                return Err(ChangeError::Repeated(id.clone()));
            }
        }
        if let Some(id) = deletes.iter().find(|id| before.find(id).is_none()) {
            return Err(ChangeError::Unknown(id.clone()));
        }
        let change = FenceChange {
            version: before.version() + 1,
            at_ms: Self::time_after(&before, at_ms),
            upserts,
            deletes,
        };
        self.commit(&before, change).await
    }

    /// Never before the last change: versions and their times rise
    /// together.
    fn time_after(before: &FenceIndex, at_ms: i64) -> i64 {
        at_ms.max(before.changed_ms())
    }

    /// Makes `change` to `before` durable, then live. Called with
    /// `writing` held.
    async fn commit(
        &self,
        before: &FenceIndex,
        change: FenceChange,
    ) -> Result<Arc<FenceIndex>, ChangeError> {
        self.inner.journal.record(before, &change).await?;
        crate::crash_point::reached("fences.committed");
        if self.inner.compacting.load(Ordering::Acquire) {
            self.since_compaction().push(change.clone());
        }
        let after = Arc::new(before.apply(change));
        self.publish(after.clone());
        Ok(after)
    }

    fn publish(&self, set: Arc<FenceIndex>) {
        self.inner
            .fingerprint
            .send_replace(fingerprint(&set, &self.inner.settings));
        self.inner.tx.send_replace(set.clone());
        if set.needs_compaction() && !self.inner.compacting.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().compact(set));
        }
    }

    /// Builds `set`'s fences into a new base off the writer's path (at 10k
    /// fences a rebuild costs hundreds of changes), then, with the changes
    /// made meanwhile applied to it, swaps it in: the same fences at the
    /// same version, in new positions.
    async fn compact(self, set: Arc<FenceIndex>) {
        let built = tokio::task::spawn_blocking(move || set.compacted()).await;
        let _one_at_a_time = self.inner.writing.lock().await;
        let meanwhile = std::mem::take(&mut *self.since_compaction());
        if let Ok(compacted) = built {
            let caught_up = meanwhile
                .into_iter()
                .fold(compacted, |set, change| set.apply(change));
            if caught_up.version() == self.current().version() {
                self.inner.tx.send_replace(Arc::new(caught_up));
            }
        }
        self.inner.compacting.store(false, Ordering::Release);
    }

    fn since_compaction(&self) -> std::sync::MutexGuard<'_, Vec<FenceChange>> {
        self.inner
            .since_compaction
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reads the fence file again and makes what differs one change
    /// (`source = "file"`; with `"store"` the file only seeded the store).
    /// Returns the live fence count and the version, or the file's
    /// defects, the old set staying live.
    pub async fn reload(&self, at_ms: i64) -> Result<(usize, u64), ChangeError> {
        let path = match (&self.inner.source, &self.inner.path) {
            (FencesSource::File, Some(path)) => path,
            _ => return Err(ChangeError::ReadOnly),
        };
        let fences = parse_fences(&read_fence_file(path)?)?;
        let _one_at_a_time = self.inner.writing.lock().await;
        let before = self.current();
        let at_ms = Self::time_after(&before, at_ms);
        let Some(change) = before.diff(fences, before.version() + 1, at_ms) else {
            return Ok((before.len(), before.version()));
        };
        let after = self.commit(&before, change).await?;
        Ok((after.len(), after.version()))
    }
}
