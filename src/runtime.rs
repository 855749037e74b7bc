//! The tokio runtime the pipeline runs on, built in one place for the
//! binary and the benches, so that what the benches measure is what runs.
//!
//! On Linux its threads ask for `SCHED_BATCH` (`pipeline.sched_batch`, on
//! by default). Why: the pipeline is a chain of hand-offs (decode lane,
//! router, shard worker, committer, relay), and on a busy machine each
//! hand-off woke a thread that at once preempted the one handing over:
//! `perf sched` showed a shard worker and the committer swapping one core
//! every 30 µs, two context switches per burst. A batch thread does not
//! preempt on wake-up; it runs when a core comes free or the running
//! thread's slice ends, and by then finds more work waiting. In-process
//! (BENCHMARKS.md, "Threads that do not preempt on wake-up"), per round of
//! 10: 1.08× [1.02–1.12] faster with the memory backend, 1.04×
//! [0.98–1.13] with the embedded one (2 shards each).
//!
//! The cost: on a saturated machine a woken thread waits for a free core
//! or the end of a slice (milliseconds at most), so a message's ack can be
//! that much later. CPU shares are unchanged (the nice value is kept), and
//! a woken thread with an idle core beside it runs at once. Off
//! (`sched_batch = false`), the threads keep the policy geogate was
//! started with.

use tokio::runtime::Builder;

/// A multi-threaded runtime with every driver on; with `sched_batch`,
/// every thread it starts (workers and the blocking pool, where the router
/// and the committer run) asks for `SCHED_BATCH`.
pub fn builder(sched_batch: bool) -> Builder {
    let mut builder = Builder::new_multi_thread();
    builder.enable_all();
    if sched_batch {
        builder.on_thread_start(prefer_batch);
    }
    builder
}

/// Asks for `SCHED_BATCH` for the calling thread. Best effort: refused (a
/// seccomp profile can forbid the call), the thread keeps its policy, and
/// the first refusal is logged.
fn prefer_batch() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param that outlives the call,
        // and pid 0 names the calling thread; the call changes only how the
        // kernel schedules it.
        let done = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if done != 0 {
            static REFUSED: std::sync::Once = std::sync::Once::new();
            let error = std::io::Error::last_os_error();
            REFUSED.call_once(|| {
                tracing::warn!(
                    "pipeline.sched_batch: the kernel refused SCHED_BATCH ({error}); the runtime's threads keep their scheduling policy"
                );
            });
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::builder;

    fn policy() -> libc::c_int {
        // SAFETY: reads the calling thread's policy; no memory is passed.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// Both kinds of thread the pipeline runs on: a worker (decode lanes,
    /// shard workers) and the blocking pool (router, committer).
    fn policies(sched_batch: bool) -> (libc::c_int, libc::c_int) {
        let runtime = builder(sched_batch)
            .worker_threads(2)
            .build()
            .expect("runtime");
        let worker = runtime.block_on(runtime.spawn(async { policy() }));
        let blocking = runtime.block_on(runtime.spawn_blocking(policy));
        (
            worker.expect("worker task"),
            blocking.expect("blocking task"),
        )
    }

    #[test]
    fn asked_every_runtime_thread_is_a_batch_thread() {
        assert_eq!(policies(true), (libc::SCHED_BATCH, libc::SCHED_BATCH));
    }

    /// Off, the threads keep the policy of the thread that built the
    /// runtime (whatever `chrt` started the process with).
    #[test]
    fn off_the_threads_keep_the_policy_they_were_started_with() {
        let started_with = policy();
        assert_eq!(policies(false), (started_with, started_with));
    }
}
