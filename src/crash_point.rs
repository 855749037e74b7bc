//! Named points where a test stops geogate so that it can SIGKILL it there.
//!
//! `GEOGATE_CRASH_POINT=<name>[:<n>]` makes the n-th arrival (default the
//! first) at `<name>` print `crash point <name> reached` to stderr and stop
//! that thread for good; the test sees the line and kills the process, so
//! the kill lands exactly inside a commit or between a write and its
//! cursor rather than wherever a timer happens to fall. Unset (the only
//! production setting) each check is one load of an initialised cell.
//!
//! Points: `commit.before` (a batch evaluated, nothing committed),
//! `commit.inside` (rows written, transaction open), `commit.after`
//! (committed, nothing acked or written out), `relay.mid_line` (half a
//! line in the events file), `relay.before_cursor` (lines written, the
//! cursor not yet moved), `relay.unsynced` (lines written and the cursor
//! moved, some of them not yet synced, so not let go of),
//! `relay.before_mqtt_cursor` (published, the MQTT cursor not yet moved),
//! `webhook.before_cursor` (a batch the receiver accepted, the webhook's
//! cursor not yet moved), `events.before_rotate` (the events file synced,
//! not yet renamed), `events.rotated` (renamed, no new file yet). With the
//! partitioned backend: `partition.committed` (a commit in the log, its
//! transitions not yet in the events stream), `partition.published` (in
//! the stream, the batches not yet completed) and `partition.snapshot` (a
//! snapshot's part in the log, the rest not), and `partition.output_store`
//! (an output delivered transitions past its cursor in the engine, which
//! is not yet written).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

fn target() -> &'static Option<(String, u64)> {
    TARGET.get_or_init(|| {
        let spec = std::env::var("GEOGATE_CRASH_POINT").ok()?;
        let (name, nth) = match spec.split_once(':') {
            Some((name, n)) => (name.to_owned(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        Some((name, nth.max(1)))
    })
}

/// True when `name` is the configured point (callers that must prepare
/// the state to stop in, such as a half-written line, ask first).
pub fn armed(name: &str) -> bool {
    target().as_ref().is_some_and(|(t, _)| t == name)
}

/// Stops here for good if this is the configured point's n-th arrival.
pub fn reached(name: &str) {
    let Some((target, nth)) = target() else {
        return;
    };
    if target != name || ARRIVALS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
        return;
    }
    eprintln!("crash point {name} reached");
    loop {
        std::thread::park();
    }
}
