//! The tokio runtime the pipeline runs on, built in one place for the
//! binary, the demo and the pipeline bench, so that what the bench
//! measures is what runs.
//!
//! On Linux its threads ask for `SCHED_BATCH` (`pipeline.sched_batch`, on
//! by default). Why: the pipeline is a chain of hand-offs (decode lane,
//! router, shard worker, committer, relay), and on a busy machine each
//! hand-off woke a thread that at once preempted the one handing over:
//! `perf sched` showed a runtime worker (a shard worker's burst, about
//! 30 µs) and a blocking-pool thread (the router's or the committer's
//! 2–20 µs) swapping one core every 30–40 µs. A batch thread does not
//! preempt on wake-up; it runs when a core comes free or the running
//! thread's slice ends, and by then finds more work waiting. Measured in
//! docs/decisions/0006-sched-batch-pipeline-threads.md: 1.065×
//! [0.93–1.12] in-process (memory backend, 2 shards, 16 rounds, 14 of
//! them faster), a third as many context switches, and a drain 1.09×
//! faster.
//!
//! The cost: on a saturated machine a woken thread waits for a free core
//! or the end of a slice, at each hand-off a message passes, so its ack
//! comes later: in that record's live runs, about 1 ms more at the
//! median and a p99 up to 2–3× longer (tens of ms). CPU shares are
//! unchanged (the nice value is kept), and a woken thread with an idle core
//! beside it runs at once.
//!
//! Only a thread on the normal policy (`SCHED_OTHER`) is switched: one
//! that geogate was started with on another (`chrt`: real-time, idle,
//! batch) keeps it, as it does with `sched_batch = false`. Not switched
//! either: the thread that runs `main` (it only waits for the pipeline) and
//! the embedded broker's (a broker of its own in production).

use tokio::runtime::Builder;

/// A multi-threaded runtime with every driver on; with `sched_batch`,
/// every thread it starts (workers and the blocking pool, where the router
/// and the committer run) asks for `SCHED_BATCH`. The request is made in
/// `on_thread_start`: a caller that sets its own hook replaces it.
pub fn builder(sched_batch: bool) -> Builder {
    let mut builder = Builder::new_multi_thread();
    builder.enable_all();
    if sched_batch {
        builder.on_thread_start(prefer_batch);
    }
    builder
}

/// Moves the calling thread from `SCHED_OTHER` to `SCHED_BATCH`. Best
/// effort: refused (a seccomp profile can forbid the call), the thread
/// keeps its policy, and the first refusal is logged; so is the first
/// thread found on another policy, which is left alone. Through
/// `pthread_setschedparam` rather than `sched_setscheduler`, which musl
/// does not implement (it returns `ENOSYS` there).
fn prefer_batch() {
    #[cfg(target_os = "linux")]
    match batch::switch() {
        Ok(true) => {}
        Ok(false) => {
            static KEPT: std::sync::Once = std::sync::Once::new();
            KEPT.call_once(|| {
                tracing::info!(
                    "pipeline.sched_batch: geogate was started on a scheduling policy other than the normal one; its threads keep it"
                );
            });
        }
        Err(error) => {
            static REFUSED: std::sync::Once = std::sync::Once::new();
            REFUSED.call_once(|| {
                tracing::warn!(
                    "pipeline.sched_batch: SCHED_BATCH was refused ({error}); the runtime's threads keep the normal policy"
                );
            });
        }
    }
}

#[cfg(target_os = "linux")]
mod batch {
    use libc::{SCHED_BATCH, SCHED_OTHER, c_int, pthread_self, sched_param};

    /// The calling thread's policy.
    pub fn policy() -> std::io::Result<c_int> {
        let mut policy: c_int = 0;
        let mut param = sched_param { sched_priority: 0 };
        // SAFETY: both out-pointers are valid for writes for the call, and
        // pthread_self names the calling thread, which is alive.
        let error = unsafe { libc::pthread_getschedparam(pthread_self(), &mut policy, &mut param) };
        match error {
            0 => Ok(policy),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// Sets the calling thread's policy (priority 0, as the non-real-time
    /// policies require).
    pub fn set(policy: c_int) -> std::io::Result<()> {
        let param = sched_param { sched_priority: 0 };
        // SAFETY: `param` is valid for reads for the call, and pthread_self
        // names the calling thread; the call changes only how the kernel
        // schedules it.
        let error = unsafe { libc::pthread_setschedparam(pthread_self(), policy, &param) };
        match error {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// `SCHED_OTHER` → `SCHED_BATCH`; `Ok(false)` for a thread on any
    /// other policy, which is left as it is.
    pub fn switch() -> std::io::Result<bool> {
        if policy()? != SCHED_OTHER {
            return Ok(false);
        }
        set(SCHED_BATCH).map(|()| true)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{batch, builder};
    use libc::{SCHED_BATCH, SCHED_IDLE, SCHED_OTHER, c_int};

    /// The policies of both kinds of thread the pipeline runs on, a worker
    /// (decode lanes, shard workers) and the blocking pool (router,
    /// committer), for a runtime built on a thread of `started_with`.
    fn policies(started_with: c_int, sched_batch: bool) -> (c_int, c_int) {
        std::thread::spawn(move || {
            batch::set(started_with).expect("a non-real-time policy for this thread");
            let runtime = builder(sched_batch)
                .worker_threads(2)
                .build()
                .expect("runtime");
            let worker = runtime.block_on(runtime.spawn(async { batch::policy() }));
            let blocking = runtime.block_on(runtime.spawn_blocking(batch::policy));
            (
                worker.expect("worker task").expect("policy"),
                blocking.expect("blocking task").expect("policy"),
            )
        })
        .join()
        .expect("test thread")
    }

    #[test]
    fn asked_every_runtime_thread_moves_to_batch() {
        assert_eq!(policies(SCHED_OTHER, true), (SCHED_BATCH, SCHED_BATCH));
    }

    #[test]
    fn off_the_threads_keep_the_normal_policy() {
        assert_eq!(policies(SCHED_OTHER, false), (SCHED_OTHER, SCHED_OTHER));
    }

    /// Started on the idle policy (as by `chrt -i`), the threads keep it:
    /// asking for batch would raise them.
    #[test]
    fn a_thread_started_on_another_policy_keeps_it() {
        assert_eq!(policies(SCHED_IDLE, true), (SCHED_IDLE, SCHED_IDLE));
    }
}
