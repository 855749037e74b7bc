//! A failing sink, made loud: a health gauge per sink, a failure counter,
//! log lines that name the file and the OS error, and one retry loop that
//! backs off until the sink recovers or shutdown's drain deadline passes.

use crate::backoff::Backoff;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One caller's view of one sink's health.
pub struct SinkHealth {
    sink: &'static str,
    path: String,
    healthy: metrics::Gauge,
    failures: metrics::Counter,
    failed_attempts: u64,
}

impl SinkHealth {
    /// `sink` is the metric label: `dead_letter` or `events`.
    pub fn new(sink: &'static str, path: &Path) -> Self {
        let healthy = metrics::gauge!("geogate_sink_healthy", "sink" => sink);
        healthy.set(1.0);
        Self {
            sink,
            path: path.display().to_string(),
            healthy,
            failures: metrics::counter!("geogate_sink_write_failures_total", "sink" => sink),
            failed_attempts: 0,
        }
    }

    fn failed(&mut self, e: &io::Error, wait: Duration) {
        self.failed_attempts += 1;
        self.failures.increment(1);
        self.healthy.set(0.0);
        // The first failure, then one line in ten: a sink that stays broken
        // is still visible without flooding the log.
        if self.failed_attempts % 10 == 1 {
            tracing::error!(
                "{} {}: {e}; its message stays unacked; attempt {} failed, retrying in {wait:?}",
                self.sink,
                self.path,
                self.failed_attempts
            );
        }
    }

    fn recovered(&mut self) {
        if self.failed_attempts > 0 {
            tracing::info!(
                "{} {} is writable again after {} failed attempts",
                self.sink,
                self.path,
                self.failed_attempts
            );
            self.failed_attempts = 0;
            self.healthy.set(1.0);
        }
    }
}

/// Retries `attempt` after `first` failed, with backoff, until it succeeds
/// (true) or the drain deadline passes (false: the caller leaves its
/// message unacked for redelivery).
pub async fn retry_until(
    health: &mut SinkHealth,
    deadline: &mut watch::Receiver<Option<Instant>>,
    first: io::Error,
    mut attempt: impl FnMut() -> io::Result<()>,
) -> bool {
    let mut backoff = Backoff::new();
    let mut error = first;
    loop {
        let wait = backoff.step();
        health.failed(&error, wait);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wait_deadline(deadline) => return false,
        }
        match attempt() {
            Ok(()) => {
                health.recovered();
                return true;
            }
            Err(e) => error = e,
        }
    }
}

/// Resolves once the drain deadline is set and has passed.
pub async fn wait_deadline(deadline: &mut watch::Receiver<Option<Instant>>) {
    loop {
        let current = *deadline.borrow_and_update();
        match current {
            Some(at) => {
                tokio::time::sleep_until(at.into()).await;
                return;
            }
            None => {
                if deadline.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}
