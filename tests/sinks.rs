//! Sinks that fail: a dead letter or events file on a full device, and a
//! dead-letter directory that stops and starts accepting files. geogate
//! says so (health gauge, failure counter, a log line with the file and the
//! OS error), acks nothing it could not write, and carries on by itself
//! once the sink works again.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use support::geogate::{
    GeogateProcess, Message, crossing_fixes, exclusive, publish_all, read_ndjson,
    read_ndjson_so_far, setup, wait_until,
};

/// `n` payloads that are not JSON, numbered so each record can be found.
fn malformed(n: usize, tag: &str) -> Vec<Message> {
    (0..n)
        .map(|i| {
            (
                "fleet/x/telemetry".to_owned(),
                format!("not json {tag}-{i}").into_bytes(),
            )
        })
        .collect()
}

fn point(link: &Path, target: &Path) {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
}

const DL_HEALTHY: &str = r#"geogate_sink_healthy{sink="dead_letter"}"#;
const DL_FAILURES: &str = r#"geogate_sink_write_failures_total{sink="dead_letter"}"#;
const EV_HEALTHY: &str = r#"geogate_sink_healthy{sink="events"}"#;
const EV_FAILURES: &str = r#"geogate_sink_write_failures_total{sink="events"}"#;

#[test]
fn a_dead_letter_on_a_full_device_acks_nothing_and_shuts_down_cleanly() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dead_letter = dir.path().join("dead-letter.ndjson");
    point(&dead_letter, Path::new("/dev/full"));
    let mut geogate = GeogateProcess::start(
        dir.path(),
        &setup(broker.port, "dl-full", "drain_deadline_s = 2"),
    );
    let bad = malformed(20, "a");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &bad, None));
    wait_until(20, "the dead letter to fail twice", || {
        geogate.series(DL_FAILURES) >= 2.0
    });
    assert_eq!(geogate.series(DL_HEALTHY), 0.0);
    assert!(
        geogate.metrics()["geogate_mqtt_unacked"] >= 1.0,
        "held unacked"
    );
    assert_eq!(
        geogate
            .metrics()
            .get("geogate_events_invalid_total")
            .copied()
            .unwrap_or(0.0),
        0.0,
        "nothing counted as written"
    );
    let expected = format!(
        "dead_letter {}: No space left on device",
        dead_letter.display()
    );
    assert!(log(dir.path()).contains(&expected), "{}", log(dir.path()));

    // SIGTERM with the sink still broken: the drain deadline ends the
    // retries, the message stays unacked, and the account still balances.
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(
        line.contains("invalid 0 (duplicate 0) +") && line.ends_with("(balanced)"),
        "{line}"
    );
    assert!(!line.contains("in_queue 0 "), "left in queue: {line}");

    // Fixed and restarted: the broker redelivers every one of them, so
    // none was acked while it could not be written.
    point(&dead_letter, &dir.path().join("dead-letter-real.ndjson"));
    geogate.restart();
    wait_until(30, "all 20 records", || {
        read_ndjson_so_far(&dead_letter).len() >= 20
    });
    let records = read_ndjson_so_far(&dead_letter);
    let payloads: BTreeSet<_> = records
        .iter()
        .map(|r| r["payload"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(payloads.len(), 20, "each once: {records:?}");
    assert_eq!(records.len(), 20, "each once: {records:?}");
    assert!(records.iter().all(|r| r["reason"] == "malformed_json"));
    assert_eq!(geogate.series(DL_HEALTHY), 1.0);
}

#[test]
fn an_events_file_that_fails_then_recovers_loses_and_repeats_nothing() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    point(&events, Path::new("/dev/full"));
    // No reorder window: every fix makes its transition in its own batch,
    // so a failing events file holds that batch's acks (with a window, the
    // fixes are committed and acked first, and their lines held later).
    let geogate = GeogateProcess::start(
        dir.path(),
        &setup(broker.port, "ev-full", "reorder_window_ms = 0"),
    );
    // Every fix crosses into the other fence: one enter each.
    let fixes = crossing_fixes("e", 3, 0, 30);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &fixes, None));
    wait_until(20, "the events file to fail twice", || {
        geogate.series(EV_FAILURES) >= 2.0
    });
    assert_eq!(geogate.series(EV_HEALTHY), 0.0);
    let m = geogate.metrics();
    assert!(m["geogate_mqtt_unacked"] >= 1.0, "held unacked: {m:?}");
    assert!(m["geogate_events_evaluated_total"] < 30.0, "{m:?}");
    let expected = format!("events {}: No space left on device", events.display());
    assert!(log(dir.path()).contains(&expected), "{}", log(dir.path()));

    // The path is fixed while geogate runs: it reopens it and goes on.
    point(&events, &dir.path().join("events-real.ndjson"));
    geogate.wait_processed(30.0, 40);
    assert_eq!(geogate.series(EV_HEALTHY), 1.0);
    assert_eq!(geogate.metrics()["geogate_mqtt_unacked"], 0.0);
    assert!(log(dir.path()).contains("is writable again"));
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");
    let enters: Vec<(String, i64)> = read_ndjson(&events)
        .iter()
        .filter(|e| e["event"] == "enter")
        .map(|e| {
            (
                e["vehicle"].as_str().unwrap_or("").to_owned(),
                e["ts"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let unique: BTreeSet<_> = enters.iter().cloned().collect();
    assert_eq!(enters.len(), 30, "{enters:?}");
    assert_eq!(unique.len(), 30, "no transition written twice");
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[test]
fn a_dead_letter_directory_that_becomes_writable_again() {
    let _serial = exclusive();
    // Permissions do not bind root: geogate runs as `nobody` here, which
    // only a root test runner can arrange.
    if support::require(
        "root, to run geogate as nobody",
        running_as_root().then_some(()),
    )
    .is_none()
    {
        return;
    }
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mode = |m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(0o777);
    const NOBODY: u32 = 65534;
    // Small files, so the burst needs a rotation: a rename in the directory.
    let geogate = GeogateProcess::launch_with(
        dir.path(),
        &setup(broker.port, "dl-dir", ""),
        |config| {
            config.replace(
                "dead-letter.ndjson\"",
                "dead-letter.ndjson\"\nrotate_bytes = 4096",
            )
        },
        Some(NOBODY),
    );
    geogate.wait_for_log("subscribed", 1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &malformed(5, "before"), None));
    geogate.wait_processed(5.0, 20);

    mode(0o555);
    runtime.block_on(publish_all(broker.port, &malformed(30, "during"), None));
    wait_until(20, "the rotation to fail", || {
        geogate.series(DL_FAILURES) >= 1.0
    });
    assert_eq!(geogate.series(DL_HEALTHY), 0.0);
    let invalid = geogate.metrics()["geogate_events_invalid_total"];
    assert!(invalid < 35.0, "stopped at the rotation: {invalid}");
    assert!(
        log(dir.path()).contains("Permission denied"),
        "{}",
        log(dir.path())
    );

    mode(0o777);
    geogate.wait_processed(35.0, 40);
    assert_eq!(geogate.series(DL_HEALTHY), 1.0);
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");
    let path = dir.path().join("dead-letter.ndjson");
    let mut records = read_ndjson(&path.with_extension("ndjson.1"));
    records.extend(read_ndjson(&path));
    let payloads: BTreeSet<_> = records
        .iter()
        .map(|r| r["payload"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(records.len(), 35, "{records:?}");
    assert_eq!(payloads.len(), 35, "each record once");
}

/// The vehicles of `want` whose enter reaches the events broker within
/// 60 s (all of them, or as many as came); `ready` is told once the
/// subscription stands.
async fn enters_published(
    port: u16,
    mut want: BTreeSet<String>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> BTreeSet<String> {
    use rumqttc::{Event, Packet};
    let (_client, mut events) = support::geogate::subscribe_to_events(port, "enter-watch").await;
    let mut ready = Some(ready);
    let mut seen = BTreeSet::new();
    let watch = async {
        while !want.is_empty() {
            match events.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let event: serde_json::Value =
                        serde_json::from_slice(&p.payload).unwrap_or_default();
                    if event["event"] == "enter"
                        && let Some(v) = event["vehicle"].as_str()
                        && want.remove(v)
                    {
                        seen.insert(v.to_owned());
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(60), watch).await;
    seen
}

/// A vehicle id with a control character or a noncharacter used to wedge
/// publishing: the broker drops the connection that publishes such a
/// topic, and the client sends that publish again after every reconnect.
/// Each class of bad id is now refused at decode, one `bad_vehicle_id`
/// record each; the events connection is never dropped, and the enters of
/// the good vehicles sent after them all reach the events broker.
#[test]
fn bad_vehicle_ids_are_refused_and_events_keep_flowing() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let good: BTreeSet<String> = (0..20).map(|i| format!("good{i}")).collect();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let watch = runtime.spawn(enters_published(broker.port, good.clone(), ready_tx));
    runtime.block_on(ready).expect("watcher subscribed");
    let setup = support::geogate::Setup {
        events_mqtt: true,
        ..setup(broker.port, "bad-ids", "")
    };
    let mut geogate = GeogateProcess::start(dir.path(), &setup);
    let long = "v".repeat(129);
    let bad = [
        "v\u{0}",
        "v\u{1}",
        "v\n",
        "v\u{7f}",
        "v\u{85}",
        "v\u{fdd0}",
        "v\u{fffe}",
        "v\u{ffff}",
        "v\u{1fffe}",
        "v+1",
        "v#1",
        "",
        &long,
    ];
    // Inside fence A: each would enter it, and its transition be published.
    let fix = |vehicle: &str| -> Message {
        let payload = serde_json::json!({
            "vehicle": vehicle, "ts": support::geogate::CROSSING_T0,
            "lat": 50.005, "lon": 10.005, "speed_kmh": 40.0, "kind": "move",
        });
        (
            "fleet/x/telemetry".to_owned(),
            serde_json::to_vec(&payload).unwrap(),
        )
    };
    let mut messages: Vec<Message> = bad.iter().map(|v| fix(v)).collect();
    messages.extend(good.iter().map(|v| fix(v)));
    runtime.block_on(publish_all(broker.port, &messages, None));
    let published = runtime.block_on(watch).unwrap();
    let missing: Vec<_> = good.difference(&published).collect();
    assert!(
        missing.is_empty(),
        "enters never published: {missing:?}\n{}",
        log(dir.path())
    );
    // Every bad id's fix came before the good ones: had any been
    // published, the broker would have dropped the connection by now.
    assert!(
        !log(dir.path()).contains("events connection:"),
        "the events connection was dropped: {}",
        log(dir.path())
    );
    let refused = || {
        read_ndjson_so_far(&dir.path().join("dead-letter.ndjson"))
            .into_iter()
            .filter(|r| r["reason"] == "bad_vehicle_id")
            .count()
    };
    wait_until(30, "every bad id dead-lettered", || refused() == bad.len());
    let events = read_ndjson(&dir.path().join("events.ndjson"));
    assert!(
        events
            .iter()
            .all(|e| e["vehicle"].as_str().is_some_and(|v| good.contains(v))),
        "only the good vehicles made transitions: {events:?}"
    );
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
}
