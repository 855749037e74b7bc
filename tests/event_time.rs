//! Event time through a real mosquitto into `geogate run`: devices that
//! lose coverage and send their buffer late, device clocks that are wrong,
//! and liveness on the receive clock across a restart.

mod support;

use geogate::geofence::{Evaluator, EvaluatorSettings, FenceIndex, parse_fences};
use geogate::model::VehicleId;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::geogate::{
    FENCES_AB, GeogateProcess, Message, exclusive, native, publish_all, read_ndjson, setup,
    wait_until,
};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// (vehicle, fence, event, ts) of each transition, as a multiset.
type Key = (String, String, String, i64);

fn keys(events: &[serde_json::Value]) -> BTreeMap<Key, usize> {
    support::fleet::multiset(events)
        .into_iter()
        .map(|(key, ids)| (key, ids.len()))
        .collect()
}

/// One fix of the coverage fleet: (vehicle, fix time, lon).
type Fix = (String, i64, f64);

/// 12 vehicles drive west to east along lat 50.005, a fix every 5 s: 0.004°
/// apart, so each passes through A (10.00–10.01°E) and B (10.02–10.03°E)
/// with fixes inside both. Each loses coverage while crossing A (its fixes
/// 4 to 9) and sends the buffer after its first fix back in coverage:
/// even vehicles oldest first, odd ones newest first (as Teltonika
/// devices do). Returns the fixes in fix-time order, and in the order
/// they are published.
fn coverage_fleet(t0: i64) -> (Vec<Fix>, Vec<Fix>) {
    let mut in_order = Vec::new();
    let mut per_vehicle: Vec<Vec<Fix>> = Vec::new();
    for v in 0..12 {
        let vehicle = format!("cov{v}");
        let fixes: Vec<Fix> = (0..16)
            .map(|k| (vehicle.clone(), t0 + 5_000 * k, 9.99 + 0.0028 * k as f64))
            .collect();
        in_order.extend(fixes.iter().cloned());
        let (before, rest) = fixes.split_at(4);
        let (buffer, after) = rest.split_at(6);
        let mut sent: Vec<Fix> = before.to_vec();
        sent.push(after[0].clone());
        let mut buffered = buffer.to_vec();
        if v % 2 == 1 {
            buffered.reverse();
        }
        sent.extend(buffered);
        sent.extend(after[1..].iter().cloned());
        per_vehicle.push(sent);
    }
    // Interleave the vehicles, each in its own send order.
    let mut published = Vec::new();
    for k in 0..16 {
        for sent in &per_vehicle {
            published.push(sent[k].clone());
        }
    }
    (in_order, published)
}

/// What the evaluator gives applying `fixes` in the order given, dropping
/// each fix older than its vehicle's last (the in-order reference).
fn reference(fixes: &[Fix]) -> (BTreeMap<Key, usize>, usize) {
    let index = FenceIndex::new(parse_fences(FENCES_AB).expect("fences"));
    let mut ev = Evaluator::new(index.into(), EvaluatorSettings::default());
    let mut out = Vec::new();
    for (vehicle, ts, lon) in fixes {
        ev.evaluate(
            &VehicleId::from(vehicle.as_str()),
            *ts,
            50.005,
            *lon,
            &mut out,
        );
    }
    let mut set = BTreeMap::new();
    for t in &out {
        let key = (
            t.vehicle.to_string(),
            t.fence.to_string(),
            t.event.as_str().to_owned(),
            t.ts,
        );
        *set.entry(key).or_default() += 1;
    }
    (set, ev.stats().late as usize)
}

fn messages(fixes: &[Fix]) -> Vec<Message> {
    fixes
        .iter()
        .map(|(v, ts, lon)| native(v, *ts, 50.005, *lon, 40.0, "move"))
        .collect()
}

/// A fleet whose devices send their outage's buffer after the live fix,
/// oldest or newest first. With a window far longer than publishing takes,
/// the transitions are exactly the in-order ones, the visits to A during
/// the outage included. Without one, they are those of the arrival order
/// with the late fixes removed, and each late fix is counted and
/// dead-lettered.
#[test]
fn buffered_fixes_give_the_in_order_transitions_within_the_window() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (in_order, published) = coverage_fleet(now_ms() - 3_600_000);
    let run = |id: &str, pipeline: &str, transitions: usize| {
        let dir = tempfile::tempdir().unwrap();
        let mut geogate = GeogateProcess::start(dir.path(), &setup(broker.port, id, pipeline));
        runtime.block_on(publish_all(broker.port, &messages(&published), None));
        geogate.wait_processed(published.len() as f64, 60);
        // Released by the clock, not by the stop's drain.
        let events = dir.path().join("events.ndjson");
        wait_until(60, "every transition written", || {
            read_ndjson(&events).len() >= transitions
        });
        let late = geogate.metric("geogate_fixes_late_total");
        let (ok, stdout) = geogate.stop();
        assert!(ok, "{stdout}");
        let line = support::geogate::accounting_line(&stdout).to_owned();
        assert!(line.ends_with("(balanced)"), "{line}");
        let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
        (
            keys(&read_ndjson(&dir.path().join("events.ndjson"))),
            late,
            letters,
        )
    };

    let (want, _) = reference(&in_order);
    assert!(
        want.keys().any(|(_, f, e, _)| f == "A" && e == "enter"),
        "the outage covers a visit to A"
    );
    let (got, late, letters) = run("window", "reorder_window_ms = 3000", want.len());
    assert_eq!(late, 0.0);
    assert!(letters.is_empty(), "{letters:?}");
    assert_eq!(got, want, "with the window: the in-order transitions");

    let (want_late, late_fixes) = reference(&published);
    assert_eq!(late_fixes, 12 * 6, "every buffered fix arrives late");
    assert_ne!(
        want_late, want,
        "without a window the outage's visits are lost"
    );
    let (got, late, letters) = run("no-window", "reorder_window_ms = 0", want_late.len());
    assert_eq!(
        got, want_late,
        "without a window: arrival order, late removed"
    );
    assert_eq!(late, late_fixes as f64);
    assert_eq!(letters.len(), late_fixes);
    assert!(letters.iter().all(|l| l["reason"] == "late"), "{letters:?}");
}

/// 200 vehicles parked in A report every 10 s of fix time. One device
/// sends a fix dated a year ahead (refused as `clock_ahead`, both times in
/// the record) and one a GPS week rollover (19.6 years back, late data for
/// that vehicle). Nobody else is moved: one enter per parked vehicle, and
/// once they all go quiet, one exit each, caused by expiry on the receive
/// clock. A vehicle that comes back enters again.
#[test]
fn one_wrong_clock_moves_nobody_else_and_quiet_vehicles_exit_on_expiry() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let geogate = GeogateProcess::launch_with(
        dir.path(),
        // No window: the rollover fix then meets its vehicle's applied
        // fixes, and is late whatever the publishing's pace.
        &setup(broker.port, "parked", "reorder_window_ms = 0"),
        |c| c.replace("[fences]\n", "[fences]\nidle_expiry_s = 4\n"),
        None,
    );
    geogate.wait_for_log("subscribed", 1);
    let t0 = now_ms() - 600_000;
    let year_ms = 365 * 86_400_000;
    let rollover_ms = 1024 * 7 * 86_400_000;
    let mut stream = Vec::new();
    for round in 0..6i64 {
        for v in 0..200 {
            stream.push(native(
                &format!("p{v}"),
                t0 + 10_000 * round,
                50.005,
                10.005,
                0.0,
                "stop",
            ));
        }
        if round == 2 {
            stream.push(native(
                "p7",
                t0 + 20_000 + year_ms,
                50.005,
                10.005,
                0.0,
                "stop",
            ));
            stream.push(native(
                "p8",
                t0 + 20_500 - rollover_ms,
                50.005,
                10.005,
                0.0,
                "stop",
            ));
        }
    }
    runtime.block_on(publish_all(broker.port, &stream, None));
    geogate.wait_processed(stream.len() as f64, 60);
    let events_path = dir.path().join("events.ndjson");
    // All quiet now: each vehicle is expired 4 s after it was last heard
    // from (bounded wait: the sweep runs at least once a second).
    wait_until(60, "every parked vehicle expired", || {
        read_ndjson(&events_path)
            .iter()
            .filter(|e| e["event"] == "exit")
            .count()
            >= 200
    });
    runtime.block_on(publish_all(
        broker.port,
        &[native("p0", t0 + 70_000, 50.005, 10.005, 0.0, "stop")],
        None,
    ));
    geogate.wait_processed(stream.len() as f64 + 1.0, 30);
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "{stdout}");

    let events = read_ndjson(&events_path);
    let mut per_vehicle: BTreeMap<String, Vec<(String, Option<String>)>> = BTreeMap::new();
    for e in &events {
        assert_eq!(e["fence"], "A", "{e}");
        per_vehicle
            .entry(e["vehicle"].as_str().unwrap_or("").to_owned())
            .or_default()
            .push((
                e["event"].as_str().unwrap_or("").to_owned(),
                e["cause"].as_str().map(str::to_owned),
            ));
    }
    assert_eq!(per_vehicle.len(), 200);
    let enter = || ("enter".to_owned(), None);
    let expired = || ("exit".to_owned(), Some("expired".to_owned()));
    for (vehicle, seen) in &per_vehicle {
        let want = if vehicle == "p0" {
            vec![enter(), expired(), enter()]
        } else {
            vec![enter(), expired()]
        };
        assert_eq!(seen, &want, "{vehicle}");
    }
    let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
    let ahead: Vec<_> = letters
        .iter()
        .filter(|l| l["reason"] == "clock_ahead")
        .collect();
    assert_eq!(ahead.len(), 1, "{letters:?}");
    let detail = ahead[0]["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains(&(t0 + 20_000 + year_ms).to_string()) && detail.contains("receive time"),
        "{detail}"
    );
    let late: Vec<_> = letters.iter().filter(|l| l["reason"] == "late").collect();
    assert_eq!(late.len(), 1, "the rollover fix is late data: {letters:?}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.ends_with("(balanced)"), "{line}");
}

/// Time while geogate was down is not idleness: a fleet parked in A, a
/// stop longer than the idle expiry, a restart, and a fix from half of
/// it; then the same again, so that the silent half's outages add up
/// across restarts: no exit and no second enter.
#[test]
fn an_outage_longer_than_the_idle_expiry_expires_nobody() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = GeogateProcess::launch_with(
        dir.path(),
        &setup(broker.port, "outage", ""),
        |c| c.replace("[fences]\n", "[fences]\nidle_expiry_s = 20\n"),
        None,
    );
    geogate.wait_for_log("subscribed", 1);
    let t0 = now_ms() - 600_000;
    let round = |k: i64| -> Vec<Message> {
        (0..50)
            .map(|v| {
                native(
                    &format!("o{v}"),
                    t0 + 10_000 * k,
                    50.005,
                    10.005,
                    0.0,
                    "stop",
                )
            })
            .collect()
    };
    runtime.block_on(publish_all(broker.port, &round(0), None));
    geogate.wait_processed(50.0, 30);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    // Down for longer than the idle expiry.
    std::thread::sleep(Duration::from_secs(22));
    geogate.restart();
    let half = |k: i64| -> Vec<Message> { round(k).into_iter().take(25).collect() };
    runtime.block_on(publish_all(broker.port, &half(1), None));
    geogate.wait_processed(25.0, 30);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    std::thread::sleep(Duration::from_secs(22));
    geogate.restart();
    runtime.block_on(publish_all(broker.port, &round(2), None));
    geogate.wait_processed(50.0, 30);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = read_ndjson(&dir.path().join("events.ndjson"));
    assert_eq!(events.len(), 50, "one enter each, no exit: {events:?}");
    assert!(events.iter().all(|e| e["event"] == "enter"), "{events:?}");
}
