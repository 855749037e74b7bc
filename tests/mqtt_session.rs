//! The MQTT session through real faults: a slow link, cut connections that
//! resume a kept session, and a broker restart that loses the session.
//! A proxy between geogate and mosquitto reads every packet, so acks are
//! judged on the wire: each one must answer an outstanding publish of its
//! own connection, once, and only after geogate finished that message.

mod support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::geogate::{
    GeogateProcess, crossing_fixes, enters_in_order, exclusive, publish_all, read_ndjson,
    read_ndjson_so_far, setup, wait_until,
};
use support::proxy::{Finished, Proxy, SubackTamper};

/// (vehicle, ts) of a native payload.
fn fix_key(payload: &[u8]) -> Option<(String, i64)> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    Some((v["vehicle"].as_str()?.to_owned(), v["ts"].as_i64()?))
}

/// No reorder window, for the tests that judge acks by the events file: a
/// fix waiting in a window is finished (committed, acked) before its
/// transition is written, by design.
const NO_WINDOW: &str = "reorder_window_ms = 0";

/// Whether geogate has finished a fix: its `enter` is in the events file
/// (each fix of [`crossing_fixes`] makes one). Reads only what is new.
/// Without a window (see [`NO_WINDOW`]).
fn finished_by_events_file(events: PathBuf) -> Finished {
    let seen = Mutex::new((0usize, HashSet::<(String, i64)>::new()));
    Box::new(move |payload| {
        let Some(key) = fix_key(payload) else {
            return false;
        };
        let mut seen = seen.lock().unwrap();
        if seen.1.contains(&key) {
            return true;
        }
        let text = std::fs::read(&events).unwrap_or_default();
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if complete > seen.0 {
            for line in text[seen.0..complete].split(|&b| b == b'\n') {
                if let Ok(e) = serde_json::from_slice::<serde_json::Value>(line)
                    && e["event"] == "enter"
                {
                    let k = (
                        e["vehicle"].as_str().unwrap_or("").to_owned(),
                        e["ts"].as_i64().unwrap_or(0),
                    );
                    seen.1.insert(k);
                }
            }
            seen.0 = complete;
        }
        seen.1.contains(&key)
    })
}

/// The enters of a stopped geogate's file: every line must parse.
fn enters_in(dir: &Path) -> Vec<(String, i64)> {
    enters_in_order(&read_ndjson(&dir.join("events.ndjson")))
}

/// The enters a running geogate has written so far (complete lines).
fn enters_so_far(dir: &Path) -> Vec<(String, i64)> {
    enters_in_order(&read_ndjson_so_far(&dir.join("events.ndjson")))
}

#[test]
fn connects_subscribes_and_evaluates_over_a_300_ms_round_trip() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let proxy = Proxy::start(broker.port, Duration::from_millis(150));
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let geogate = GeogateProcess::start(dir.path(), &setup(proxy.port, "slow-link", ""));
    // TCP, CONNECT/CONNACK and SUBSCRIBE/SUBACK each cross the link.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "the delay applied"
    );
    let stream = crossing_fixes("s", 4, 0, 40);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &stream, None));
    geogate.wait_processed(40.0, 30);
    assert_eq!(geogate.metric("geogate_mqtt_reconnects_total"), 0.0);
    assert_eq!(geogate.metric("geogate_mqtt_subscribed"), 1.0);
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");
    assert_eq!(enters_in(dir.path()).len(), 40);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert_eq!(log.matches("connected to broker").count(), 1, "{log}");
}

#[test]
fn a_connect_that_cannot_finish_is_logged_with_the_broker_and_retried() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    // 1.5 s each way: CONNECT/CONNACK alone needs 3 s, over the 1 s budget.
    let proxy = Proxy::start(broker.port, Duration::from_millis(1500));
    let dir = tempfile::tempdir().unwrap();
    let mut s = setup(proxy.port, "too-slow", "");
    s.extra_mqtt = "connect_timeout_s = 1";
    let geogate = GeogateProcess::launch(dir.path(), &s);
    let needle = format!("cannot connect to 127.0.0.1:{}", proxy.port);
    geogate.wait_for_log(&needle, 2);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(!log.contains("connected to broker"), "{log}");
    assert!(geogate.metric("geogate_mqtt_reconnects_total") >= 2.0);
    assert_eq!(geogate.metric("geogate_mqtt_connected"), 0.0);
    drop(geogate);

    // The same link with a budget that fits: connected and subscribed.
    let dir = tempfile::tempdir().unwrap();
    let mut s = setup(proxy.port, "slow-enough", "");
    s.extra_mqtt = "connect_timeout_s = 5";
    let geogate = GeogateProcess::start(dir.path(), &s);
    assert_eq!(geogate.metric("geogate_mqtt_subscribed"), 1.0);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(!log.contains("cannot connect"), "{log}");
}

#[test]
fn acks_answer_only_their_own_connection() {
    let _serial = exclusive();
    // A small inflight window, as Debian's mosquitto 2.0.11 is where a
    // stale ack frees a slot and lets newer messages overtake older ones.
    let Some(mut broker) =
        support::Mosquitto::start_with("persistence false\nmax_inflight_messages 10\n")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::observing(
        broker.port,
        finished_by_events_file(dir.path().join("events.ndjson")),
    );
    let geogate = GeogateProcess::start(
        dir.path(),
        &setup(
            proxy.port,
            "ack-tags",
            "sustained_rate = 100\nreorder_window_ms = 0",
        ),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut kept = Vec::new();

    // Two cuts with the broker up: the session is kept and mosquitto
    // redelivers what was unacked, on the new connection.
    for round in 0..2i64 {
        let batch = crossing_fixes("k", 10, round * 300, 300);
        kept.extend(batch.iter().filter_map(|(_, p)| fix_key(p)));
        runtime.block_on(publish_all(broker.port, &batch, None));
        wait_until(20, "a backlog held unacked", || {
            geogate.metric("geogate_mqtt_unacked") >= 5.0
                && geogate.metric("geogate_events_evaluated_total") > (round * 300 + 20) as f64
        });
        proxy.cut();
        geogate.wait_for_log("session_present=true", round as usize + 1);
        wait_until(40, "the batch to finish", || {
            let done: HashSet<_> = enters_so_far(dir.path()).into_iter().collect();
            kept.iter().all(|k| done.contains(k))
        });
    }
    const WITHHELD: &str = r#"geogate_mqtt_acks_total{outcome="withheld_old_connection"}"#;
    let withheld_kept = geogate.series(WITHHELD);
    assert!(
        withheld_kept > 0.0,
        "messages held at a cut were not acked on the next connection"
    );

    // A restart that loses the session: ids start again at 1 on a new
    // session, and nothing from the old one may be acked there.
    let batch = crossing_fixes("n", 10, 0, 300);
    runtime.block_on(publish_all(broker.port, &batch, None));
    wait_until(20, "a backlog held unacked", || {
        geogate.metric("geogate_mqtt_unacked") >= 5.0
    });
    broker.restart();
    // The first connect made a new session too.
    geogate.wait_for_log("session_present=false", 2);
    geogate.wait_for_log("subscribed", 4);
    let after = crossing_fixes("a", 10, 0, 100);
    runtime.block_on(publish_all(broker.port, &after, None));
    wait_until(40, "fixes after the new session", || {
        let done: HashSet<_> = enters_so_far(dir.path()).into_iter().collect();
        after
            .iter()
            .filter_map(|(_, p)| fix_key(p))
            .all(|k| done.contains(&k))
    });

    let report = proxy.report();
    let acked = geogate.series(r#"geogate_mqtt_acks_total{outcome="acked"}"#);
    let withheld = geogate.series(WITHHELD);
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "{stdout}");
    assert!(report.connections >= 4, "{report:?}");
    assert!(report.good_acks >= 700, "{report:?}");
    assert!(
        report.stale_or_double.is_empty(),
        "stale or double acks: {report:?}"
    );
    assert!(
        report.early.is_empty(),
        "acks before the message was finished: {:?}",
        report.early
    );
    assert!(
        report.out_of_order.is_empty(),
        "acks out of publish order: {:?}",
        report.out_of_order
    );
    // The faults hit: messages of dead connections were finished and not
    // acked (their redelivered copies were, for a kept session).
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(log.contains("session_present=false"));
    let redelivered = read_ndjson(&dir.path().join("dead-letter.ndjson"))
        .iter()
        .filter(|r| r["reason"] == "duplicate")
        .count();
    assert!(redelivered > 0, "a kept session redelivered held messages");
    assert!(
        withheld > withheld_kept,
        "the lost session's messages were not acked either"
    );
    // Acks the client had queued when a connection died never reach the
    // wire (rumqttc drops them), so the wire sees at most what was handed over.
    assert!(acked >= report.good_acks as f64, "{acked} {report:?}");
    // Every kept-session fix was applied exactly once, none out of order.
    let enters = enters_in(dir.path());
    let unique: HashSet<_> = enters.iter().cloned().collect();
    assert_eq!(unique.len(), enters.len(), "an enter repeated");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.contains("+ late 0 +"), "{line}");
}

/// A fast burst (3,000 fixes through a 1,000-message inflight window): on
/// the wire every message is acked once, after it was finished, in publish
/// order, and promptly (not left for a later packet to carry out).
#[test]
fn a_burst_is_acked_once_in_order_and_promptly() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::observing(
        broker.port,
        finished_by_events_file(dir.path().join("events.ndjson")),
    );
    let geogate = GeogateProcess::start(dir.path(), &setup(proxy.port, "ack-burst", NO_WINDOW));
    let fixes = crossing_fixes("d", 50, 0, 3000);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &fixes, None));
    wait_until(60, "every fix handed to be acked", || {
        geogate.series(r#"geogate_mqtt_acks_total{outcome="acked"}"#) >= 3000.0
    });
    // Well inside the 30 s keep-alive: an ack stranded in a queue would
    // only go out with the next PINGREQ.
    wait_until(10, "every ack on the wire", || {
        proxy.report().good_acks >= 3000
    });
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "{stdout}");
    let report = proxy.report();
    assert_eq!(report.connections, 1, "{report:?}");
    assert_eq!(report.publishes, 3000, "{report:?}");
    assert_eq!(report.good_acks, 3000, "{report:?}");
    assert!(report.stale_or_double.is_empty(), "{report:?}");
    assert!(report.early.is_empty(), "{report:?}");
    assert!(report.out_of_order.is_empty(), "{report:?}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.starts_with("accounting: received 3000 "), "{line}");
}

#[test]
fn a_subscription_is_asked_again_until_a_suback_confirms_it() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    // The first SUBACK never arrives; the second refuses every filter.
    let proxy = Proxy::tampering_subacks(broker.port, &[SubackTamper::Drop, SubackTamper::Refuse]);
    let dir = tempfile::tempdir().unwrap();
    let geogate = GeogateProcess::launch(dir.path(), &setup(proxy.port, "suback", ""));
    geogate.wait_for_log("connected to broker", 1);
    assert_eq!(geogate.metric("geogate_mqtt_connected"), 1.0);
    assert_eq!(
        geogate.metric("geogate_mqtt_subscribed"),
        0.0,
        "connected is not subscribed: {}",
        std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
    );
    geogate.wait_for_log("no SUBACK within", 1);
    geogate.wait_for_log(
        "refused the subscription to [\"fleet/+/telemetry\", \"owntracks/+/+\"]",
        1,
    );
    assert_eq!(geogate.metric("geogate_mqtt_subscribed"), 0.0);
    geogate.wait_for_log("subscribed to", 1);
    assert_eq!(geogate.metric("geogate_mqtt_subscribed"), 1.0);
    // And it hears what it subscribed to.
    let stream = crossing_fixes("q", 2, 0, 10);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &stream, None));
    geogate.wait_processed(10.0, 20);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert_eq!(
        log.matches("connected to broker").count(),
        1,
        "no reconnect needed: {log}"
    );
}

/// The reordering the old stale acks caused in mosquitto 2.0.11, made
/// deterministic: a proxy hands geogate each pair of fixes newest first.
/// With the reorder window off, the older fix of each pair changes nothing
/// and the accounting line shows every one of them as late instead of
/// hiding them among the evaluated. With the default window, every pair is
/// put back in fix-time order: all 20 apply, one transition pair per fix.
#[test]
fn reordered_deliveries_are_late_without_a_window_and_in_order_with_one() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    // One vehicle, 20 fixes alternating between A and B, published in order.
    let fixes = crossing_fixes("o", 1, 0, 20);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = |id: &str, pipeline: &str| {
        let proxy = Proxy::swapping_publishes(broker.port);
        let dir = tempfile::tempdir().unwrap();
        let geogate = GeogateProcess::start(dir.path(), &setup(proxy.port, id, pipeline));
        runtime.block_on(publish_all(broker.port, &fixes, None));
        geogate.wait_processed(20.0, 30);
        let (ok, stdout) = geogate.terminate();
        assert!(ok, "{stdout}");
        let line = support::geogate::accounting_line(&stdout).to_owned();
        (line, read_ndjson(&dir.path().join("events.ndjson")))
    };

    let (line, events) = run("swapped", "reorder_window_ms = 0");
    assert_eq!(
        line,
        "accounting: received 20 = invalid 0 (duplicate 0) + ignored 0 + shed 0 + evaluated 10 + held 0 + late 10 + in_queue 0 (balanced)"
    );
    // Only the newer fix of each pair was applied: the odd ones, all in B.
    // The even ones, in A, came late and moved the vehicle nowhere.
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (
            events[0]["event"].as_str(),
            events[0]["fence"].as_str(),
            events[0]["ts"].as_i64()
        ),
        (Some("enter"), Some("B"), Some(1_750_000_001_000))
    );

    let (line, events) = run("swapped-window", "");
    assert_eq!(
        line,
        "accounting: received 20 = invalid 0 (duplicate 0) + ignored 0 + shed 0 + evaluated 0 + held 20 + late 0 + in_queue 0 (balanced)"
    );
    // Fix k at k seconds, in A when k is even: an enter, then an exit and
    // an enter for every later fix, in fix-time order.
    assert_eq!(events.len(), 1 + 2 * 19, "{events:?}");
    let times: Vec<i64> = events.iter().filter_map(|e| e["ts"].as_i64()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(events[0]["fence"], "A");
}
