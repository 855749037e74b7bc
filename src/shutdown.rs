//! Shutdown's drain deadline as one type every stage shares.
//!
//! At shutdown the pipeline stops taking messages and gives every stage
//! until one instant to finish what it holds; past it, whatever is left
//! stays unacked and comes back after the restart. [`DrainControl`] sets
//! that instant once; each task holds a [`Drain`] and asks it whether the
//! deadline has [`passed`](Drain::passed), how much time
//! [`remains`](Drain::remaining), or [`waits`](Drain::wait) for it in a
//! `select!`. The retry loops that give up at the deadline live here too,
//! so that a stage retrying a store, a file or Redis stops at the same
//! instant as the rest.

use crate::backoff::Backoff;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Sets the drain deadline (the pipeline's side).
pub struct DrainControl(watch::Sender<Option<Instant>>);

/// A stage's view of the drain deadline: none until shutdown begins.
#[derive(Debug, Clone)]
pub struct Drain(watch::Receiver<Option<Instant>>);

impl DrainControl {
    pub fn new() -> (Self, Drain) {
        let (tx, rx) = watch::channel(None);
        (Self(tx), Drain(rx))
    }

    /// Every stage must be done by `at`.
    pub fn begin(&self, at: Instant) {
        self.0.send_replace(Some(at));
    }
}

impl Drain {
    /// A deadline that never comes: for runs that end only when their
    /// input does (benchmarks, tests).
    pub fn never() -> Self {
        DrainControl::new().1
    }

    /// The deadline, once shutdown has set it.
    pub fn deadline(&self) -> Option<Instant> {
        *self.0.borrow()
    }

    /// Whether the deadline is set and `now` is past it.
    pub fn passed_at(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    /// Whether the deadline is set and has passed.
    pub fn passed(&self) -> bool {
        self.passed_at(Instant::now())
    }

    /// Time left before the deadline; `None` while no deadline is set.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether a wait of `wait` from now would end past the deadline.
    pub fn would_pass(&self, wait: Duration) -> bool {
        self.deadline().is_some_and(|d| Instant::now() + wait >= d)
    }

    /// Resolves once the deadline is set and has passed (never, if the
    /// pipeline went away without setting one).
    pub async fn wait(&mut self) {
        loop {
            let current = *self.0.borrow_and_update();
            match current {
                Some(at) => {
                    tokio::time::sleep_until(at.into()).await;
                    return;
                }
                None => {
                    if self.0.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

/// Told of each failed attempt and of the end of a retry loop, so the
/// caller's health gauge and log follow it.
pub trait RetryObserver {
    /// A retry loop begins (its first attempt has failed).
    fn entered(&self) {}
    fn failed(&self, error: &std::io::Error, wait: Duration);
    fn left(&self, recovered: bool);
}

impl Drain {
    /// Retries `attempt` after `first` failed, with backoff, until it
    /// succeeds (true) or the deadline passes (false: the caller leaves its
    /// messages unacked for redelivery).
    pub async fn retry(
        &mut self,
        observer: &impl RetryObserver,
        first: std::io::Error,
        mut attempt: impl FnMut() -> std::io::Result<()>,
    ) -> bool {
        observer.entered();
        let mut backoff = Backoff::new();
        let mut error = first;
        loop {
            let wait = backoff.step();
            observer.failed(&error, wait);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wait() => {
                    observer.left(false);
                    return false;
                }
            }
            match attempt() {
                Ok(()) => {
                    observer.left(true);
                    return true;
                }
                Err(e) => error = e,
            }
        }
    }

    /// The blocking form of [`Self::retry`], for a thread of its own (the
    /// committer): sleeps between attempts, and gives up when the next
    /// wait would end past the deadline.
    pub fn retry_blocking<E>(
        &self,
        mut attempt: impl FnMut() -> Result<(), E>,
        mut failed: impl FnMut(&E, u64, Duration),
    ) -> Result<u64, E> {
        let mut backoff = Backoff::new();
        let mut attempts = 0u64;
        loop {
            match attempt() {
                Ok(()) => return Ok(attempts),
                Err(e) => {
                    attempts += 1;
                    let wait = backoff.step();
                    failed(&e, attempts, wait);
                    if self.would_pass(wait) {
                        return Err(e);
                    }
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_passes_only_once_its_deadline_is_set_and_reached() {
        let (control, mut drain) = DrainControl::new();
        assert!(!drain.passed() && drain.remaining().is_none());
        assert!(!drain.would_pass(Duration::from_secs(3600)));
        let at = Instant::now() + Duration::from_millis(30);
        control.begin(at);
        assert_eq!(drain.deadline(), Some(at));
        assert!(!drain.passed_at(at - Duration::from_millis(1)));
        assert!(drain.passed_at(at));
        assert!(drain.would_pass(Duration::from_secs(1)));
        drain.wait().await;
        assert!(drain.passed());
        assert_eq!(drain.remaining(), Some(Duration::ZERO));
    }

    #[test]
    fn a_blocking_retry_gives_up_before_a_wait_past_the_deadline() {
        let (control, drain) = DrainControl::new();
        control.begin(Instant::now());
        let mut seen = Vec::new();
        let result = drain.retry_blocking(|| Err::<(), _>("down"), |e, n, _| seen.push((*e, n)));
        assert_eq!(result, Err("down"));
        assert_eq!(seen, vec![("down", 1)]);
        let mut left = 2;
        let ok = Drain::never().retry_blocking(
            || {
                left -= 1;
                if left == 0 { Ok(()) } else { Err("once") }
            },
            |_, _, _| {},
        );
        assert_eq!(ok, Ok(1));
    }
}
