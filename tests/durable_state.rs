//! Exactly-once transitions across crashes, deploys and reloads, with real
//! geogate processes and a real mosquitto.
//!
//! A deterministic fleet (native and OwnTracks payloads) crosses four
//! fences: plain A and B, C with a dwell, D with hysteresis. Every run is
//! compared with one uninterrupted run: the same multiset of transitions,
//! with the same ids, none twice and none missing, seqs gap-free.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};
use support::fleet::{
    FENCES, FIXES, Multiset, T0, VEHICLES, assert_seqs_gap_free, diff, fleet, multiset, transitions,
};
use support::geogate::{
    END_OF_TEST, GeogateProcess, Message, collect_events_until_end, exclusive, publish_all,
    read_ndjson_so_far, setup,
};

/// Between published fixes in the crash runs: slow enough that the stream
/// is spread over hundreds of commits, so a kill lands mid-stream, and
/// that it lasts well past the default reorder window (2 s), so fixes
/// leave their windows, and lines are written, while others still arrive.
const PACE: Duration = Duration::from_millis(10);

fn events_of(dir: &Path) -> Vec<serde_json::Value> {
    read_ndjson_so_far(&dir.join("events.ndjson"))
}

fn start(dir: &Path, port: u16, id: &str, crash_point: Option<&str>) -> GeogateProcess {
    std::fs::write(dir.join("fences.geojson"), FENCES).unwrap();
    let setup = setup(port, id, "");
    match crash_point {
        Some(point) => GeogateProcess::start_stopping_at(dir, &setup, point),
        None => GeogateProcess::start(dir, &setup),
    }
}

/// Waits (≤ 60 s) until the events file holds `n` lines, then stops
/// geogate gracefully (which drains whatever is still in flight) and
/// returns every line.
fn finish(geogate: &mut GeogateProcess, n: usize) -> Vec<serde_json::Value> {
    finish_with_line(geogate, n).0
}

/// [`finish`], also returning the accounting line.
fn finish_with_line(geogate: &mut GeogateProcess, n: usize) -> (Vec<serde_json::Value>, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while events_of(&geogate.dir).len() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout).to_owned();
    assert!(line.ends_with("(balanced)"), "{line}");
    (events_of(&geogate.dir), line)
}

/// A native High fix of `vehicle` at `s` seconds, on the street of the
/// fences (lat 50.005).
fn at(vehicle: &str, s: i64, lon: f64) -> Message {
    support::geogate::native(vehicle, T0 + 1000 * s, 50.005, lon, 40.0, "move")
}

/// One transition as [`transitions`] lists it.
fn t(vehicle: &str, fence: &str, event: &str, s: i64) -> (String, String, String, i64) {
    (vehicle.into(), fence.into(), event.into(), T0 + 1000 * s)
}

/// [`finish`], then the seqs checked; returns [`transitions`].
fn finish_checked(
    geogate: &mut GeogateProcess,
    n: usize,
    what: &str,
) -> Vec<(String, String, String, i64)> {
    let events = finish(geogate, n);
    assert_seqs_gap_free(&events, what);
    transitions(&events)
}

/// The uninterrupted run every other run is compared with.
fn reference(port: u16, runtime: &tokio::runtime::Runtime) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), port, "ref", None);
    runtime.block_on(publish_all(port, &fleet(0..FIXES), None));
    geogate.wait_processed((VEHICLES * FIXES) as f64, 60);
    let events = finish(&mut geogate, 0);
    assert_seqs_gap_free(&events, "reference");
    let set = multiset(&events);
    // The fleet exercises what it claims: dwell enters, hysteresis exits,
    // both formats, and each transition once.
    for fence in ["A", "B", "C", "D"] {
        for kind in ["enter", "exit"] {
            assert!(
                set.keys().any(|(_, f, e, _)| f == fence && e == kind),
                "reference has no {kind} of {fence}"
            );
        }
    }
    assert!(
        set.keys().any(|(v, ..)| v.contains('/')),
        "no OwnTracks vehicle"
    );
    assert!(set.values().all(|ids| ids.len() == 1));
    events
}

fn assert_same_as(got: &[serde_json::Value], want: &Multiset, what: &str) {
    assert_seqs_gap_free(got, what);
    let got = multiset(got);
    assert!(
        got == *want,
        "{what}: transitions differ from the uninterrupted run:\n{}",
        diff(&got, want)
    );
}

/// (a) SIGKILL at each crash point, then a restart: the events file ends
/// up exactly as in the uninterrupted run, though each kill lands while
/// fixes wait in their reorder windows, already acked.
#[test]
fn sigkill_at_every_crash_point_changes_no_transition() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = multiset(&reference(broker.port, &runtime));
    // Arrivals counted from the start. A fix every 10 ms makes a commit
    // every fix or two; lines are written from the moment the first fixes
    // leave their windows (2 s in), one write every commit or two. So the
    // commit points fall early in the stream, the relay's a little past
    // the window, all well before its end.
    for point in [
        "commit.before:30",
        "commit.inside:45",
        "commit.after:55",
        "relay.mid_line:30",
        "relay.before_cursor:45",
        "commit.inside:10",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let id = format!("kill-{}", point.replace([':', '.'], "-"));
        let mut geogate = start(dir.path(), broker.port, &id, Some(point));
        runtime.block_on(publish_all(broker.port, &fleet(0..FIXES), Some(PACE)));
        geogate.wait_for_crash_point();
        // The kill hits fixes waiting in their reorder windows (the
        // default window): acked, so only the committed state holds them.
        let held = geogate.metric("geogate_reorder_window_fixes");
        assert!(held > 0.0, "{point}: no fix was waiting in a window");
        geogate.kill();
        geogate.restart();
        let (got, line) = finish_with_line(&mut geogate, want.values().map(Vec::len).sum());
        assert_same_as(&got, &want, point);
        if point.starts_with("commit.after") {
            // Committed, never acked: the broker redelivered them, and the
            // state knew them.
            assert!(!line.contains("(duplicate 0)"), "{point}: {line}");
        }
    }
}

/// MQTT copies: at least once, with the file's ids, across a SIGKILL
/// between a publish and its cursor.
#[test]
fn mqtt_transitions_arrive_at_least_once_across_a_sigkill() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = multiset(&reference(broker.port, &runtime));
    let want_ids: BTreeSet<String> = want.values().flatten().cloned().collect();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let collector = runtime.spawn(collect_ids(broker.port, want_ids.clone(), ready_tx));
    runtime.block_on(ready).expect("collector subscribed");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fences.geojson"), FENCES).unwrap();
    let setup = support::geogate::Setup {
        events_mqtt: true,
        ..setup(broker.port, "kill-mqtt", "")
    };
    // Stopped as the MQTT cursor first moves (it may move only once in a
    // run whose acks never catch up with the publishes before the end),
    // the publisher leaves what it had not sent while the file takes
    // everything: the restart must publish the rest from the outbox, and
    // send again what was published but not recorded as confirmed.
    let mut geogate =
        GeogateProcess::start_stopping_at(dir.path(), &setup, "relay.before_mqtt_cursor:1");
    runtime.block_on(publish_all(broker.port, &fleet(0..FIXES), Some(PACE)));
    geogate.wait_for_crash_point();
    geogate.kill();
    geogate.restart();
    let got = finish(&mut geogate, want_ids.len());
    assert_same_as(&got, &want, "file, with MQTT on");
    runtime.block_on(publish_all(
        broker.port,
        &[(END_OF_TEST.to_owned(), b"{}".to_vec())],
        None,
    ));
    let (missing, copies) = runtime.block_on(collector).unwrap();
    assert!(missing.is_empty(), "never published: {missing:?}");
    // The kill left published-but-unconfirmed ones, sent again.
    assert!(
        copies > want_ids.len(),
        "{copies} copies of {} ids",
        want_ids.len()
    );
}

/// A broker for transitions configured after a run without one: what is
/// committed from then on is published. (A run without one stores its
/// MQTT cursor as "all", which once made a later publisher skip every
/// transition it would ever have.)
#[test]
fn transitions_are_published_once_mqtt_is_configured_later() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = multiset(&reference(broker.port, &runtime));
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "mqtt-later", None);
    let first = fleet(0..FIXES / 2);
    runtime.block_on(publish_all(broker.port, &first, None));
    geogate.wait_processed(first.len() as f64, 60);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let before = events_of(dir.path());
    assert!(!before.is_empty(), "the first half makes transitions");
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let collector = runtime.spawn(async move {
        collect_events_until_end(broker.port, "later-collector", ready_tx).await
    });
    runtime.block_on(ready).expect("collector subscribed");
    let setup = support::geogate::Setup {
        events_mqtt: true,
        ..setup(broker.port, "mqtt-later", "")
    };
    let mut geogate = GeogateProcess::start(dir.path(), &setup);
    runtime.block_on(publish_all(broker.port, &fleet(FIXES / 2..FIXES), None));
    let got = finish(&mut geogate, want.values().map(Vec::len).sum());
    assert_same_as(&got, &want, "MQTT configured half-way");
    runtime.block_on(publish_all(
        broker.port,
        &[(END_OF_TEST.to_owned(), b"{}".to_vec())],
        None,
    ));
    let published: BTreeSet<String> = runtime
        .block_on(collector)
        .unwrap()
        .iter()
        .filter_map(|(_, v)| v["id"].as_str().map(str::to_owned))
        .collect();
    let after: BTreeSet<String> = got[before.len()..]
        .iter()
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect();
    assert!(!after.is_empty(), "the second half makes transitions");
    let missing: Vec<_> = after.difference(&published).collect();
    assert!(missing.is_empty(), "never published: {missing:?}");
}

/// Subscribes to every transition topic; returns the ids never seen and
/// how many copies arrived before [`END_OF_TEST`] (≤ 60 s).
async fn collect_ids(
    port: u16,
    mut want: BTreeSet<String>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> (BTreeSet<String>, usize) {
    let copies = collect_events_until_end(port, "event-collector", ready).await;
    for (_, v) in &copies {
        want.remove(v["id"].as_str().unwrap_or(""));
    }
    (want, copies.len())
}

/// (b) A deploy: SIGTERM part-way through, start again.
#[test]
fn sigterm_and_restart_changes_no_transition() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = multiset(&reference(broker.port, &runtime));
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "deploy", None);
    // SIGTERM while fixes are still arriving, committing and being written.
    let (port, stream) = (broker.port, fleet(0..FIXES));
    let publishing = runtime.spawn(async move { publish_all(port, &stream, Some(PACE)).await });
    let third = want.values().map(Vec::len).sum::<usize>() / 3;
    support::geogate::wait_until(60, "a third of the transitions", || {
        events_of(dir.path()).len() >= third
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.ends_with("(balanced)"), "{line}");
    geogate.restart();
    runtime.block_on(publishing).unwrap();
    let got = finish(&mut geogate, want.values().map(Vec::len).sum());
    assert_same_as(&got, &want, "SIGTERM and restart");
}

/// (c) A dwell in progress and a hysteresis band, each across a restart:
/// the dwell confirms at the time it would have without the restart, and
/// the vehicle in the band stays in until it is clear of it.
#[test]
fn a_pending_dwell_and_a_hysteresis_band_survive_a_restart() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "dwell", None);
    // Before: the dwell starts at 1 s; the other vehicle enters D.
    let before = [at("dw", 0, 9.995), at("dw", 1, 10.045), at("hy", 0, 10.065)];
    runtime.block_on(publish_all(broker.port, &before, None));
    geogate.wait_processed(3.0, 30);
    geogate.kill();
    geogate.restart();
    // After: at 3 s the dwell is 2 s old (< 2.5), at 4 s 3 s old: the
    // enter, stamped 4 s (without the saved start it would never come).
    // The other is just outside D, then just inside its edge (no change),
    // then clear of the band: one exit.
    let after = [
        at("dw", 3, 10.045),
        at("dw", 4, 10.045),
        at("dw", 5, 10.045),
        at("hy", 1, 10.0705),
        at("hy", 2, 10.0695),
        at("hy", 3, 10.08),
    ];
    runtime.block_on(publish_all(broker.port, &after, None));
    geogate.wait_processed(6.0, 30);
    assert_eq!(
        finish_checked(&mut geogate, 3, "dwell and hysteresis"),
        vec![
            t("dw", "C", "enter", 4),
            t("hy", "D", "enter", 0),
            t("hy", "D", "exit", 3),
        ]
    );
}

/// (d) A missing state file, and one another geogate holds: each a clear
/// error naming the file; `--reset-state` makes the reset explicit.
#[test]
fn a_missing_or_held_state_file_refuses_to_start_and_says_why() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.sqlite");
    let mut geogate = start(dir.path(), broker.port, "missing", None);
    runtime.block_on(publish_all(broker.port, &fleet(0..4), None));
    geogate.wait_processed((VEHICLES * 4) as f64, 30);

    // Held: a second geogate on the same state file. The first's fixes
    // leave their reorder windows first, so that its lines stop changing.
    let other = tempfile::tempdir().unwrap();
    let mut lines_before = usize::MAX;
    while events_of(dir.path()).len() != lines_before {
        lines_before = events_of(dir.path()).len();
        std::thread::sleep(std::time::Duration::from_millis(2_500));
    }
    let mut second = GeogateProcess::launch_with(
        other.path(),
        &setup(broker.port, "missing-2", ""),
        |config| {
            config.replace(
                &other.path().join("state.sqlite").display().to_string(),
                &state.display().to_string(),
            )
        },
        None,
    );
    second.refused_saying(&format!(
        "state file {} is held open by another process",
        state.display()
    ));
    assert_eq!(events_of(dir.path()).len(), lines_before);
    // Nor does --reset-state take a held file: it is refused the same way.
    second.set_args(&["--reset-state"]);
    second.restart_refused();
    let (status, log) = second.wait_refused();
    assert!(!status.success());
    assert_eq!(
        log.matches("is held open by another process").count(),
        2,
        "{log}"
    );
    geogate.wait_processed((VEHICLES * 4) as f64, 10);

    // Missing: the events file has history, the state file is gone.
    let (ok, _) = geogate.stop();
    assert!(ok);
    let lines = events_of(dir.path()).len();
    assert!(lines > 0);
    std::fs::remove_file(&state).unwrap();
    let mut refused =
        GeogateProcess::launch_with(dir.path(), &setup(broker.port, "missing", ""), |c| c, None);
    let (status, log) = refused.wait_refused();
    assert!(!status.success());
    assert!(
        log.contains(&format!("state file {} is missing", state.display()))
            && log.contains(&format!("(last seq {lines})"))
            && log.contains("--reset-state"),
        "{log}"
    );
    assert!(
        !state.exists(),
        "a refused start must not create the state file"
    );

    // Explicit reset: starts, and numbering goes on after the file's end.
    geogate.set_args(&["--reset-state"]);
    geogate.restart();
    runtime.block_on(publish_all(broker.port, &fleet(4..6), None));
    let events = finish(&mut geogate, lines + 1);
    assert_seqs_gap_free(&events, "after --reset-state");
    assert!(events.len() > lines);
}

/// (e) A fence reload (SIGHUP) with the embedded store, then a SIGKILL:
/// memberships of the kept fence survive both, the removed fence's end
/// with one exit (cause `fence_deleted`), and the added fence works.
#[test]
fn a_fence_reload_then_a_sigkill_keeps_what_the_kept_fences_hold() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "reload", None);
    runtime.block_on(publish_all(
        broker.port,
        &[at("a", 0, 10.005), at("b", 0, 10.025)],
        None,
    ));
    geogate.wait_processed(2.0, 30);
    // Both fixes out of their windows, in the fences they were in.
    support::geogate::wait_until(30, "the first enters", || events_of(dir.path()).len() >= 2);
    // B goes; E comes, where B was.
    let reloaded = FENCES.replace(r#""id":"B""#, r#""id":"E""#);
    std::fs::write(dir.path().join("fences.geojson"), reloaded).unwrap();
    geogate.sighup();
    geogate.wait_for_log("fences reloaded", 1);
    runtime.block_on(publish_all(broker.port, &[at("a", 1, 10.005)], None));
    geogate.wait_processed(3.0, 30);
    geogate.kill();
    geogate.restart();
    runtime.block_on(publish_all(
        broker.port,
        &[at("a", 2, 9.995), at("b", 1, 10.025), at("b", 2, 9.995)],
        None,
    ));
    geogate.wait_processed(3.0, 30);
    let (deleted, rest) = deletion_exits(finish(&mut geogate, 6), "reload");
    // B's deletion exited b at once, and only once across the kill.
    assert_eq!(deleted, vec![("b".to_owned(), "B".to_owned(), 2)]);
    assert_eq!(
        rest,
        vec![
            t("a", "A", "enter", 0),
            t("a", "A", "exit", 2),
            t("b", "B", "enter", 0),
            t("b", "E", "enter", 1),
            t("b", "E", "exit", 2),
        ]
    );
}

/// (vehicle, fence, event, ts).
type Transition = (String, String, String, i64);

/// The events checked for gaps, split into the exits fence deletions
/// caused, as (vehicle, fence, version), and the other transitions.
fn deletion_exits(
    events: Vec<serde_json::Value>,
    what: &str,
) -> (Vec<(String, String, u64)>, Vec<Transition>) {
    assert_seqs_gap_free(&events, what);
    let (deleted, rest): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|e| e["cause"] == "fence_deleted");
    let deleted = deleted
        .iter()
        .map(|e| {
            (
                e["vehicle"].as_str().unwrap_or("").to_owned(),
                e["fence"].as_str().unwrap_or("").to_owned(),
                e["fence_version"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    (deleted, transitions(&rest))
}

/// Restore is exact: a restart with fence A removed while vehicle a (in A)
/// is silent exits a from A (a deletion); a SIGHUP brings A back; a
/// SIGKILL, a restart with A in the file, and a's next fix in A enters A,
/// as in the process that was killed, with no second exit.
#[test]
fn a_restart_without_a_fence_then_its_reload_and_a_sigkill_keeps_the_membership_dropped() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "restore", None);
    runtime.block_on(publish_all(broker.port, &[at("a", 0, 10.005)], None));
    geogate.wait_processed(1.0, 30);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    // A removed (renamed, so the file keeps its other fences); a is silent.
    let without_a = FENCES.replace(r#""id":"A""#, r#""id":"A-retired""#);
    std::fs::write(dir.path().join("fences.geojson"), &without_a).unwrap();
    geogate.restart();
    std::fs::write(dir.path().join("fences.geojson"), FENCES).unwrap();
    geogate.sighup();
    geogate.wait_for_log("fences reloaded", 1);
    geogate.kill();
    geogate.restart();
    runtime.block_on(publish_all(broker.port, &[at("a", 1, 10.005)], None));
    geogate.wait_processed(1.0, 30);
    let (deleted, rest) = deletion_exits(finish(&mut geogate, 3), "restore");
    // A gone from the file at the restart is a deletion (version 2): a
    // leaves it then, once; A back is a new fence, entered at a's next fix.
    assert_eq!(deleted, vec![("a".to_owned(), "A".to_owned(), 2)]);
    assert_eq!(rest, vec![t("a", "A", "enter", 0), t("a", "A", "enter", 1)]);
}

/// What a power loss under `fsync = "flush"` can leave: the state (its
/// log written within milliseconds) kept, the events file's unsynced
/// tail gone, though the outbox was already pruned against it. geogate is
/// SIGKILLed and the file cut back to an earlier line, as a reset leaves
/// it. The restart refuses, naming the file and the seqs it lacks; with
/// `--accept-events-gap` it goes on, and numbers on without repeating a
/// seq.
#[test]
fn an_events_file_cut_behind_what_was_pruned_is_refused_not_a_silent_gap() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "events-gap", None);
    let first = fleet(0..FIXES / 2);
    runtime.block_on(publish_all(broker.port, &first, None));
    geogate.wait_processed(first.len() as f64, 60);
    let windows_empty = |g: &GeogateProcess| g.metric("geogate_reorder_window_fixes") == 0.0;
    support::geogate::wait_until(30, "the first half out of its windows", || {
        windows_empty(&geogate)
    });
    // A graceful stop syncs the file, and its last commit lets go of
    // everything the file holds.
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    geogate.restart();
    let second = fleet(FIXES / 2..FIXES);
    runtime.block_on(publish_all(broker.port, &second, None));
    geogate.wait_processed(second.len() as f64, 60);
    support::geogate::wait_until(30, "the second half out of its windows", || {
        windows_empty(&geogate)
    });
    let written = events_of(dir.path());
    assert!(
        written.len() > 40,
        "the fleet makes transitions: {}",
        written.len()
    );
    geogate.kill();

    // The tail a reset loses: the file ends after its tenth line.
    let path = dir.path().join("events.ndjson");
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: String = text.split_inclusive('\n').take(10).collect();
    std::fs::write(&path, &kept).unwrap();
    let kept_seq = written[9]["seq"].as_u64().expect("a seq");
    geogate.restart_refused();
    geogate.refused_saying(&format!(
        "events file {} ends at seq {kept_seq}, but transitions {}..=",
        path.display(),
        kept_seq + 1
    ));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        kept,
        "a refused start writes nothing"
    );

    geogate.set_args(&["--accept-events-gap"]);
    geogate.restart();
    let more = fleet(FIXES..FIXES + 4);
    runtime.block_on(publish_all(broker.port, &more, None));
    geogate.wait_processed(more.len() as f64, 60);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let seqs: Vec<u64> = events_of(dir.path())
        .iter()
        .map(|e| e["seq"].as_u64().expect("a seq"))
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs rise, none repeated: {seqs:?}"
    );
    assert!(seqs.len() > 10, "it went on: {seqs:?}");
    assert!(
        std::fs::read_to_string(dir.path().join("stderr.log"))
            .unwrap_or_default()
            .contains("going on without them (--accept-events-gap)")
    );
}

/// The last seq the events file held on disk when the state last
/// committed, as the state recorded it (read once geogate is gone).
fn recorded_file_cursor(dir: &Path) -> u64 {
    let conn = rusqlite::Connection::open(dir.join("state.sqlite")).unwrap();
    conn.query_row(
        "SELECT value FROM meta WHERE key = 'file_cursor'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as u64
}

/// Under `fsync = "flush"` the events file is synced about once a second,
/// and the outbox is let go only up to the last sync, so a power loss that
/// takes the file back to it loses nothing. geogate is stopped with lines
/// written but not yet synced (`relay.unsynced`), SIGKILLed, and the file
/// cut back to the last seq the state recorded as synced, the most a
/// reset can take; the restart writes the rest again, and the file ends
/// exactly as in the uninterrupted run.
#[test]
fn an_events_file_cut_back_to_its_last_sync_is_written_again() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = multiset(&reference(broker.port, &runtime));
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(
        dir.path(),
        broker.port,
        "cut-to-sync",
        Some("relay.unsynced:3"),
    );
    runtime.block_on(publish_all(broker.port, &fleet(0..FIXES), Some(PACE)));
    geogate.wait_for_crash_point();
    geogate.kill();
    let synced = recorded_file_cursor(dir.path());
    let path = dir.path().join("events.ndjson");
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: String = text
        .split_inclusive('\n')
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["seq"].as_u64())
                .is_some_and(|seq| seq <= synced)
        })
        .collect();
    assert!(
        kept.len() < text.len(),
        "lines past the last sync (seq {synced}) were cut"
    );
    std::fs::write(&path, &kept).unwrap();
    geogate.restart();
    let got = finish(&mut geogate, want.values().map(Vec::len).sum());
    assert_same_as(&got, &want, "cut back to the last sync");
}
