//! A failing sink, made loud: a health gauge per sink, a failure counter,
//! and log lines that name the file and the OS error, followed through
//! the retry loop of [`crate::shutdown::Drain::retry`], which backs off
//! until the sink recovers or shutdown's drain deadline passes.

use crate::shutdown::RetryObserver;
use crate::sink::metrics::{SINK_HEALTHY, SINK_WRITE_FAILURES_TOTAL};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// One sink's health, shared by every caller that writes to it (the
/// workers share the events file): the gauge is 0 while any of them is
/// failing.
pub struct SinkHealth {
    sink: &'static str,
    path: String,
    /// What waits while the sink fails, for the log line.
    held: &'static str,
    healthy: metrics::Gauge,
    failures: metrics::Counter,
    /// Callers inside a retry loop right now.
    failing: AtomicUsize,
    /// Failed attempts since the sink last worked, for the log.
    attempts: AtomicU64,
}

impl SinkHealth {
    /// `sink` is the metric label: `dead_letter` or `events`; `held` says
    /// what waits while it fails.
    pub fn new(sink: &'static str, path: &Path, held: &'static str) -> Self {
        let healthy = metrics::gauge!(SINK_HEALTHY, "sink" => sink);
        healthy.set(1.0);
        Self {
            sink,
            path: path.display().to_string(),
            held,
            healthy,
            failures: metrics::counter!(SINK_WRITE_FAILURES_TOTAL, "sink" => sink),
            failing: AtomicUsize::new(0),
            attempts: AtomicU64::new(0),
        }
    }
}

impl RetryObserver for SinkHealth {
    fn entered(&self) {
        self.failing.fetch_add(1, Relaxed);
    }

    fn failed(&self, e: &io::Error, wait: Duration) {
        let attempt = self.attempts.fetch_add(1, Relaxed) + 1;
        self.failures.increment(1);
        self.healthy.set(0.0);
        // The first failure, then one line in ten: a sink that stays broken
        // is still visible without flooding the log.
        if attempt % 10 == 1 {
            tracing::error!(
                "{} {}: {e}; {}; attempt {attempt} failed, retrying in {wait:?}",
                self.sink,
                self.path,
                self.held,
            );
        }
    }

    /// A caller leaves its retry loop; the last one out of a working sink
    /// turns the gauge back to 1.
    fn left(&self, recovered: bool) {
        if self.failing.fetch_sub(1, Relaxed) == 1 && recovered {
            let attempts = self.attempts.swap(0, Relaxed);
            tracing::info!(
                "{} {} is writable again after {attempts} failed attempts",
                self.sink,
                self.path
            );
            self.healthy.set(1.0);
        }
    }
}
