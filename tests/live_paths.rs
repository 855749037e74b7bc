//! Live paths through a real mosquitto that no other test reaches: the
//! drain deadline, membership overflow, Low pings at a full queue, a
//! fence reload that keeps what a vehicle is in, and the process's
//! huge-page setting.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use support::geogate::{
    END_OF_TEST, FENCES_AB, GeogateProcess, accounting_term, collect_events_until_end,
    crossing_fixes, exclusive, native, publish_all, read_ndjson, read_ndjson_so_far, setup,
    wait_until,
};

const T0: i64 = 1_750_000_000_000;

/// (event, fence) of every transition, in file order.
fn transitions(dir: &Path) -> Vec<(String, String)> {
    pairs(&read_ndjson(&dir.join("events.ndjson")))
}

/// The same, of a file a running geogate is still appending to.
fn transitions_so_far(dir: &Path) -> Vec<(String, String)> {
    pairs(&read_ndjson_so_far(&dir.join("events.ndjson")))
}

fn pairs(events: &[serde_json::Value]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or("").to_owned(),
                e["fence"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Shutdown's drain deadline leaves work queued (and unacked); the broker
/// hands it back to the next run, and every fix is applied exactly once.
#[test]
fn the_drain_deadline_leaves_work_queued_and_it_comes_back_after_a_restart() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = GeogateProcess::start(
        dir.path(),
        &setup(
            broker.port,
            "drain",
            "sustained_rate = 20\ndrain_deadline_s = 1",
        ),
    );
    // One vehicle, so one shard evaluates in receive order and every
    // evaluated fix is acked before the process exits.
    let fixes = crossing_fixes("d", 1, 0, 100);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &fixes, None));
    wait_until(30, "a backlog", || {
        geogate.metric("geogate_events_received_total")
            - geogate.metric("geogate_events_evaluated_total")
            >= 20.0
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.ends_with("(balanced)"), "{line}");
    assert!(accounting_term(line, "in_queue") > 0, "left queued: {line}");

    geogate.restart();
    wait_until(60, "all 100 enters", || {
        transitions_so_far(dir.path())
            .iter()
            .filter(|(e, _)| e == "enter")
            .count()
            >= 100
    });
    let (ok, _) = geogate.stop();
    assert!(ok);
    let mut once: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for e in read_ndjson(&dir.path().join("events.ndjson")) {
        if e["event"] == "enter" {
            let key = (
                e["vehicle"].as_str().unwrap_or("").to_owned(),
                e["ts"].as_i64().unwrap_or(0),
            );
            *once.entry(key).or_default() += 1;
        }
    }
    assert_eq!(once.len(), 100, "every fix applied");
    assert!(
        once.values().all(|&n| n == 1),
        "none applied twice: {once:?}"
    );
}

/// Two overlapping fences and `max_memberships = 1`: the second enter is
/// not recorded, and it is counted.
#[test]
fn an_enter_past_max_memberships_is_counted() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // B widened west to 10.005°: it overlaps A.
    let overlapping = FENCES_AB.replace("10.02,", "10.005,");
    std::fs::write(dir.path().join("fences.geojson"), &overlapping).unwrap();
    let geogate = GeogateProcess::launch_with(
        dir.path(),
        &setup(broker.port, "overflow", ""),
        |c| c.replace("[fences]\n", "[fences]\nmax_memberships = 1\n"),
        None,
    );
    geogate.wait_for_log("subscribed", 1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Inside both A and B.
    runtime.block_on(publish_all(
        broker.port,
        &[native("m1", T0, 50.005, 10.007, 40.0, "move")],
        None,
    ));
    geogate.wait_processed(1.0, 20);
    // Counted when the fix leaves its reorder window.
    support::geogate::wait_until(20, "the overflow counted", || {
        geogate.metric("geogate_membership_overflow_total") >= 1.0
    });
    assert_eq!(geogate.metric("geogate_membership_overflow_total"), 1.0);
    let (ok, _) = geogate.terminate();
    assert!(ok);
    assert_eq!(transitions(dir.path()), [("enter".into(), "A".into())]);
}

/// A flood of Low pings against tiny queues: once a queue is full, pings
/// are shed as "the queue was full" and the gate spends nothing on them,
/// so each shard's token level is exactly its burst less what it admitted.
#[test]
fn low_pings_at_a_full_queue_are_shed_without_spending_tokens() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut s = setup(
        broker.port,
        "full-queue",
        "queue_capacity = 4\nsustained_rate = 50",
    );
    // Plenty of tokens and (almost) no refill: the gate never refuses.
    s.gate = "kind = \"token\"\nrate = 0.001\nburst = 1000";
    let geogate = GeogateProcess::start(dir.path(), &s);
    let pings: Vec<_> = (0..400i64)
        .map(|i| native(&format!("p{}", i % 40), T0 + i, 50.5, 10.5, 0.0, "ping"))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &pings, None));
    geogate.wait_processed(400.0, 60);
    let mut gated_shards = 0;
    for shard in ["0", "1"] {
        let admitted = geogate.series(&format!(
            r#"geogate_gate_admitted_total{{shard="{shard}",gate="token"}}"#
        ));
        let level = geogate.series(&format!(r#"geogate_gate_level{{shard="{shard}"}}"#));
        if admitted > 0.0 {
            gated_shards += 1;
            assert!(
                (level - (1000.0 - admitted)).abs() < 0.5,
                "shard {shard}: level {level} after admitting {admitted}"
            );
        }
    }
    assert!(gated_shards > 0, "the gate was reached");
    let (ok, _) = geogate.terminate();
    assert!(ok);
    let full = read_ndjson(&dir.path().join("dead-letter.ndjson"))
        .iter()
        .filter(|r| {
            r["reason"] == "shed"
                && r["detail"]
                    .as_str()
                    .unwrap_or("")
                    .contains("the queue was full")
        })
        .count();
    assert!(full > 0, "some pings found their queue full");
}

/// A reload that keeps fence A keeps a vehicle inside A (no second enter);
/// a bad file afterwards changes nothing, shown by behaviour: the fence
/// the good reload added still works.
#[test]
fn sighup_keeps_memberships_and_a_bad_file_keeps_the_old_fences() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let geogate = GeogateProcess::start(dir.path(), &setup(broker.port, "reload", ""));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let send = |fix| runtime.block_on(publish_all(broker.port, &[fix], None));
    send(native("h2", T0, 50.005, 10.005, 30.0, "move"));
    geogate.wait_processed(1.0, 20);
    // Add C (north of A and B), keep A and B.
    let end = FENCES_AB.rfind("]}").expect("a FeatureCollection");
    let with_c = format!(
        "{},\n {{\"type\":\"Feature\",\"id\":\"C\",\"properties\":{{}},\"geometry\":{{\"type\":\"Polygon\",\"coordinates\":[[[10.00,50.02],[10.01,50.02],[10.01,50.03],[10.00,50.03],[10.00,50.02]]]}}}}]}}",
        &FENCES_AB[..end]
    );
    std::fs::write(dir.path().join("fences.geojson"), with_c).unwrap();
    geogate.sighup();
    geogate.wait_for_log("fences reloaded", 1);
    send(native("h2", T0 + 1000, 50.006, 10.006, 30.0, "move"));
    geogate.wait_processed(2.0, 20);
    std::fs::write(dir.path().join("fences.geojson"), "{\"type\":\"nope\"}").unwrap();
    geogate.sighup();
    geogate.wait_for_log("fence reload refused", 1);
    send(native("h2", T0 + 2000, 50.025, 10.005, 30.0, "move"));
    geogate.wait_processed(3.0, 20);
    let (ok, _) = geogate.terminate();
    assert!(ok);
    assert_eq!(
        transitions(dir.path()),
        [
            ("enter".into(), "A".into()),
            ("exit".into(), "A".into()),
            ("enter".into(), "C".into())
        ]
    );
}

/// The leaky shaper in the live pipeline, judged downstream: every ping's
/// transition is received by an MQTT subscriber, and in every window of
/// those receive times at most `b + r·t` arrive (the shaper paces one per
/// `1/r`; `b` covers the pipeline's own batching after it). A moving
/// vehicle keeps the single queue at its capacity, so every ping meets the
/// gate, which the test checks rather than assumes.
#[test]
fn the_leaky_shaper_paces_pings_and_loses_none_in_its_lane() {
    const RATE: f64 = 10.0;
    const BURST: f64 = 10.0;
    const PINGS: i64 = 200;
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // One decode lane: the premise below is the publishing order across
    // topics (the movers reach the router before the pings), and lanes
    // keep only each topic's order.
    // No reorder window: it would hand the released pings' enters on in
    // groups (at each release, and all at the stop), which is its job but
    // not what this test judges.
    let mut s = setup(
        broker.port,
        "shaper",
        "queue_capacity = 8\nsustained_rate = 50\ndecode_lanes = 1\nreorder_window_ms = 0",
    );
    s.gate = "kind = \"leaky_shaper\"\nrate = 10\nburst = 10";
    s.events_mqtt = true;
    let geogate = GeogateProcess::launch_with(
        dir.path(),
        &s,
        |c| c.replace("shards = 2", "shards = 1"),
        None,
    );
    geogate.wait_for_log("subscribed", 1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (ready, subscribed) = tokio::sync::oneshot::channel();
    let collector =
        runtime.spawn(async move { collect_events_until_end(broker.port, "shaped", ready).await });
    runtime.block_on(subscribed).unwrap();

    // Moving fixes outside every fence fill the queue first, then one
    // follows each ping; each ping is a new vehicle inside A, so every ping
    // the shaper releases becomes exactly one `enter`.
    let moving = |i: i64| native("mover", T0 + i, 50.5, 10.5, 40.0, "move");
    let mut messages: Vec<_> = (0..10).map(moving).collect();
    for i in 0..PINGS {
        messages.push(native(
            &format!("p{i}"),
            T0 + i,
            50.005,
            10.005,
            0.0,
            "ping",
        ));
        messages.push(moving(10 + i));
    }
    runtime.block_on(publish_all(broker.port, &messages, None));
    geogate.wait_processed(messages.len() as f64, 120);
    let admitted = geogate.metric("geogate_gate_admitted_total");
    let shed = geogate.metric("geogate_events_shed_total");
    assert_eq!(
        admitted + shed,
        PINGS as f64,
        "every ping met the gate (none came in below the watermark)"
    );
    assert!(
        admitted > 0.0 && shed > 0.0,
        "the shaper admitted {admitted} and shed {shed}"
    );
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(
        line.ends_with("(balanced)") && line.contains("+ in_queue 0 "),
        "{line}"
    );
    runtime.block_on(publish_all(
        broker.port,
        &[(END_OF_TEST.to_owned(), b"{}".to_vec())],
        None,
    ));
    let received = runtime.block_on(collector).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let times: Vec<std::time::Instant> = received
        .iter()
        .filter(|(_, e)| e["event"] == "enter" && seen.insert(e["id"].to_string()))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(
        times.len() as f64,
        admitted,
        "one enter per released ping, none lost"
    );
    let mut worst = f64::NEG_INFINITY;
    for (i, first) in times.iter().enumerate() {
        for (j, last) in times.iter().enumerate().skip(i) {
            let t = last.duration_since(*first).as_secs_f64();
            let count = (j - i + 1) as f64;
            worst = worst.max(count - RATE * t);
            assert!(
                count <= BURST + RATE * t,
                "{count} enters arrived within {t:.3} s: more than b + r·t = {:.1}",
                BURST + RATE * t
            );
        }
    }
    eprintln!("shaper: {admitted} released, {shed} shed, worst window count − r·t = {worst:.1}");
    let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
    assert_eq!(letters.len() as f64, shed);
    assert!(
        letters.iter().all(|l| l["gate"] == "leaky_shaper"),
        "{letters:?}"
    );
}

/// `THP_enabled` of a process (`self` or a pid), from the kernel; `None`
/// where the kernel does not report it (before 5.0, some sandboxes).
fn thp_enabled(pid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim().to_owned())
}

/// geogate turns transparent huge pages off for itself (a fresh process
/// draining a backlog spent 15% of its samples zeroing 2 MiB pages), and
/// mimalloc's own `MIMALLOC_ALLOW_THP=1` keeps them on. Skipped where the
/// test runner itself has them off (no THP in the kernel, or a parent
/// that turned them off, which children inherit).
#[cfg(target_os = "linux")]
#[test]
fn huge_pages_are_off_unless_mimalloc_allow_thp_keeps_them() {
    let _serial = exclusive();
    if thp_enabled("self").as_deref() != Some("1") {
        eprintln!("skipped: transparent huge pages are not on for this test process");
        return;
    }
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = GeogateProcess::start(dir.path(), &setup(broker.port, "thp", ""));
    let thp_of = |geogate: &GeogateProcess| thp_enabled(&geogate.pid().to_string());
    assert_eq!(thp_of(&geogate).as_deref(), Some("0"));
    geogate.kill();
    geogate.set_env("MIMALLOC_ALLOW_THP", "1");
    // Subscribed, so well past main's first line.
    geogate.restart();
    assert_eq!(thp_of(&geogate).as_deref(), Some("1"));
    let (ok, _) = geogate.terminate();
    assert!(ok);
}

/// Each thread's scheduling policy (field 41 of its `stat`) of a process
/// (`self` or a pid), by thread id; `None` where /proc does not say.
fn thread_policies(pid: &str) -> Option<Vec<(u32, libc::c_int)>> {
    let mut policies = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let task = task.ok()?;
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // The name in parentheses may hold spaces: count from after it,
        // where field 3 starts.
        let (_, fields) = stat.rsplit_once(')')?;
        let policy = fields.split_whitespace().nth(41 - 3)?.parse().ok()?;
        policies.push((task.file_name().to_str()?.parse().ok()?, policy));
    }
    Some(policies)
}

/// `pipeline.sched_batch` (on by default) puts the runtime's threads on
/// `SCHED_BATCH`, and leaves the main thread, which only waits for the
/// pipeline, as it was; off, no thread is changed. Skipped where the test
/// runner is not on the normal policy itself (geogate keeps a policy it
/// was started with).
#[cfg(target_os = "linux")]
#[test]
fn runtime_threads_run_on_sched_batch_unless_the_config_turns_it_off() {
    use libc::{SCHED_BATCH, SCHED_OTHER};
    let _serial = exclusive();
    let started_with = thread_policies("self").and_then(|p| p.first().map(|&(_, policy)| policy));
    if started_with != Some(SCHED_OTHER) {
        eprintln!("skipped: this test process is not on SCHED_OTHER ({started_with:?})");
        return;
    }
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    for (pipeline, batch_expected) in [("", true), ("sched_batch = false", false)] {
        let dir = tempfile::tempdir().unwrap();
        let geogate = GeogateProcess::start(dir.path(), &setup(broker.port, "sched", pipeline));
        let pid = geogate.pid();
        let policies = thread_policies(&pid.to_string()).expect("/proc/PID/task");
        let on_batch = policies.iter().filter(|&&(_, p)| p == SCHED_BATCH).count();
        let main = policies
            .iter()
            .find(|&&(tid, _)| tid == pid)
            .map(|&(_, p)| p);
        assert_eq!(main, Some(SCHED_OTHER), "{pipeline:?}: {policies:?}");
        if batch_expected {
            // At least the runtime's workers (one per core, so at least
            // one) and the router's and the committer's threads.
            assert!(on_batch >= 3, "{pipeline:?}: {policies:?}");
        } else {
            assert_eq!(on_batch, 0, "{pipeline:?}: {policies:?}");
        }
        let (ok, _) = geogate.terminate();
        assert!(ok);
    }
}
