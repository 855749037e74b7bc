//! The live pipeline end to end, against a real mosquitto and against the
//! embedded broker: exact transitions, exact dead-letter counts, a balanced
//! account, no High event shed, no QoS 1 loss across SIGKILL, and fence
//! reload on SIGHUP.

mod support;

use geogate::codec::{CodecSettings, decode};
use geogate::model::Priority;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::geogate::{
    GeogateProcess, Message, Setup, entered_fixes, native, publish_all, read_ndjson, wait_until,
};

const T0: i64 = 1_750_000_000_000;

/// The known stream: two High vehicles crossing fences, bad payloads of
/// every kind, a duplicate, and a burst of 300 idle pings.
fn known_stream() -> (Vec<Message>, Vec<Message>) {
    let mut burst = Vec::new();
    for i in 0..300 {
        burst.push(native("idler", T0 + i, 50.5, 10.5, 0.0, "ping"));
    }
    let v1 = [
        (50.005, 10.015),
        (50.005, 10.005),
        (50.005, 10.025),
        (50.005, 10.04),
    ];
    let mut rest: Vec<Message> = v1
        .iter()
        .enumerate()
        .map(|(i, &(lat, lon))| native("v1", T0 + 1000 * i as i64, lat, lon, 40.0, "move"))
        .collect();
    for (i, lon) in [10.015, 10.005, 10.015].iter().enumerate() {
        let body = format!(
            r#"{{"_type":"location","lat":50.005,"lon":{lon},"tst":{},"vel":35,"t":"u"}}"#,
            T0 / 1000 + i as i64
        );
        rest.push(("owntracks/ann/phone".into(), body.into_bytes()));
    }
    let bad: [(&str, &str); 7] = [
        ("fleet/x/telemetry", "not json"),
        ("fleet/x/telemetry", "{\"vehicle\":"),
        ("fleet/x/telemetry", ""),
        (
            "fleet/x/telemetry",
            r#"{"vehicle":"x","ts":1750000000000,"lat":95,"lon":10}"#,
        ),
        (
            "fleet/x/telemetry",
            r#"{"vehicle":"x","ts":1750000000000,"lat":50,"lon":200}"#,
        ),
        ("fleet/x/telemetry", r#"{"vehicle":"x","lat":50,"lon":10}"#),
        ("fleet/x/telemetry", "[50, 10]"),
    ];
    rest.extend(
        bad.iter()
            .map(|(t, p)| (t.to_string(), p.as_bytes().to_vec())),
    );
    rest.push(rest[1].clone()); // a redelivered-looking duplicate of v1's second fix
    (burst, rest)
}

fn check_known_stream(broker_port: u16, embedded: bool, extra_mqtt: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let setup = Setup {
        broker_port,
        embedded,
        client_id: "geogate-known",
        // A small queue and a slow worker so the ping burst crosses the
        // watermark; a gate with 10 tokens and almost no refill.
        extra_pipeline: "queue_capacity = 40\nsustained_rate = 500",
        gate: "kind = \"token\"\nrate = 0.001\nburst = 10",
        events_mqtt: false,
        extra_mqtt,
    };
    let geogate = GeogateProcess::start(dir.path(), &setup);
    let (burst, rest) = known_stream();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(publish_all(broker_port, &burst, None));
    runtime.block_on(publish_all(broker_port, &rest, None));
    let total = (burst.len() + rest.len()) as f64;
    geogate.wait_processed(total, 60);
    // What the subscription QoS changes: QoS 1 acks every message (after
    // it is finished); QoS 0 has nothing to ack.
    let acked = || geogate.series(r#"geogate_mqtt_acks_total{outcome="acked"}"#);
    if extra_mqtt.contains("subscribe_qos = 0") {
        assert_eq!(acked(), 0.0, "QoS 0 acks nothing");
    } else {
        wait_until(20, "every message acked", || acked() == total);
    }
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "geogate exits 0 after SIGTERM: {stdout}");

    // Exact transitions, in order per vehicle.
    let mut by_vehicle: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for e in read_ndjson(&dir.path().join("events.ndjson")) {
        by_vehicle
            .entry(e["vehicle"].as_str().unwrap().into())
            .or_default()
            .push((
                e["event"].as_str().unwrap().into(),
                e["fence"].as_str().unwrap().into(),
            ));
    }
    let pairs = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(by_vehicle.len(), 2, "{by_vehicle:?}");
    assert_eq!(
        by_vehicle["v1"],
        pairs(&[("enter", "A"), ("exit", "A"), ("enter", "B"), ("exit", "B")])
    );
    assert_eq!(
        by_vehicle["ann/phone"],
        pairs(&[("enter", "A"), ("exit", "A")])
    );

    // Exact dead letters per reason; every shed one was a Low ping.
    let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for l in &letters {
        *reasons
            .entry(l["reason"].as_str().unwrap().into())
            .or_default() += 1;
        if l["reason"] == "shed" {
            let payload = l["payload"].as_str().unwrap().as_bytes();
            let fix = decode(
                l["topic"].as_str().unwrap(),
                payload,
                &CodecSettings::default(),
            )
            .unwrap();
            assert_eq!(fix.priority, Priority::Low, "High is never shed");
            assert_eq!(l["gate"], "token");
        }
    }
    let shed = reasons.remove("shed").unwrap_or(0);
    let expected: BTreeMap<String, usize> = [
        ("malformed_json", 2),
        ("out_of_range", 2),
        ("missing_field", 1),
        ("unknown_format", 1),
        ("duplicate", 1),
    ]
    .iter()
    .map(|(r, n)| (r.to_string(), *n))
    .collect();
    assert_eq!(reasons, expected);
    // Below the watermark (24 of 40) plus 10 tokens pass; how many more the
    // worker drains during the burst depends on scheduling.
    eprintln!("shed {shed} of 300 pings");
    assert!((150..=300 - 34).contains(&shed), "shed {shed}");

    // The account balances, and matches the files exactly.
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.ends_with("(balanced)"), "{line}");
    let expect = format!(
        "accounting: received {} = invalid 7 (duplicate 1) + ignored 1 + shed {shed} + evaluated 0 + held {} + late 0 + in_queue 0 (balanced)",
        total as usize,
        total as usize - 8 - shed
    );
    assert_eq!(line, expect);
}

#[test]
fn known_stream_through_mosquitto() {
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    check_known_stream(broker.port, false, "");
}

/// At QoS 0 nothing is acked or redelivered, but on a healthy connection
/// the same stream gives exactly the same answer.
#[test]
fn known_stream_through_mosquitto_at_qos_0() {
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    check_known_stream(broker.port, false, "subscribe_qos = 0");
}

#[test]
fn known_stream_through_the_embedded_broker() {
    check_known_stream(support::free_port(), true, "");
}

#[test]
fn sigkill_mid_stream_loses_no_high_event() {
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Slow enough that the first half is still in flight at the kill.
    let setup = support::geogate::setup(broker.port, "geogate-kill", "sustained_rate = 200");
    let mut geogate = GeogateProcess::start(dir.path(), &setup);
    // 20 vehicles alternate between fences A and B: every fix is an enter,
    // so every evaluated fix leaves a trace in the events file.
    let mut stream = Vec::new();
    for i in 0..100i64 {
        for v in 0..20 {
            let lon = if i % 2 == 0 { 10.005 } else { 10.025 };
            stream.push(native(
                &format!("k{v}"),
                T0 + 1000 * i,
                50.005,
                lon,
                50.0,
                "move",
            ));
        }
    }
    let published: BTreeSet<(String, i64)> = (0..100i64)
        .flat_map(|i| (0..20).map(move |v| (format!("k{v}"), T0 + 1000 * i)))
        .collect();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (first, second) = stream.split_at(1000);
    runtime.block_on(publish_all(broker.port, first, None));
    // The kill must hit work in flight: messages taken and not yet acked.
    let unacked = geogate.metric("geogate_mqtt_unacked");
    assert!(unacked > 0.0, "nothing in flight at the kill");
    geogate.kill_and_restart();
    // The broker kept the session, and with it the unacked messages.
    geogate.wait_for_log("session_present=true", 1);
    runtime.block_on(publish_all(broker.port, second, None));
    geogate.wait_processed(1000.0, 60);
    // The restarted process received the second half and the redelivered
    // rest of the first.
    support::geogate::wait_until(60, "the redelivered messages", || {
        geogate.metric("geogate_events_received_total") > second.len() as f64
    });
    // Everything published before the kill is redelivered or was evaluated.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let entered = |dir: &std::path::Path| entered_fixes(&dir.join("events.ndjson"));
    while entered(dir.path()) != published {
        assert!(
            std::time::Instant::now() < deadline,
            "missing {:?}",
            published
                .difference(&entered(dir.path()))
                .take(5)
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");
}

#[test]
fn sighup_swaps_fences_from_that_point_on() {
    let port = support::free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let setup = Setup {
        broker_port: port,
        embedded: true,
        client_id: "geogate-hup",
        extra_pipeline: "",
        gate: "kind = \"token\"\nrate = 1000\nburst = 100",
        events_mqtt: true,
        extra_mqtt: "",
    };
    let geogate = GeogateProcess::start(dir.path(), &setup);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // Transitions are also published at QoS 1 to geogate/events/{vehicle}.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let over_mqtt = runtime.spawn(support::geogate::collect(
        port,
        "geogate/events/#",
        3,
        ready_tx,
    ));
    runtime.block_on(ready_rx).expect("collector subscribed");
    runtime.block_on(publish_all(
        port,
        &[native("h1", T0, 50.005, 10.005, 30.0, "move")],
        None,
    ));
    geogate.wait_processed(1.0, 20);
    // Out of its reorder window, so applied with the fences of now: a fix
    // still waiting would take those live when it leaves.
    wait_until(20, "the first enter", || {
        read_ndjson(&dir.path().join("events.ndjson")).len() == 1
    });

    // A bad file is refused and the old fences stay.
    std::fs::write(
        dir.path().join("fences.geojson"),
        "{\"type\":\"FeatureCollection\",\"features\":[{}]}",
    )
    .unwrap();
    geogate.sighup();
    geogate.wait_for_log("fence reload refused", 1);
    // Now replace A by C, which covers the same spot: A's deletion exits
    // h1 at once; C is entered at h1's next fix.
    let moved = support::geogate::FENCES_AB.replace("\"id\":\"A\"", "\"id\":\"C\"");
    std::fs::write(dir.path().join("fences.geojson"), moved).unwrap();
    geogate.sighup();
    geogate.wait_for_log("fences reloaded", 1);
    runtime.block_on(publish_all(
        port,
        &[native("h1", T0 + 1000, 50.005, 10.006, 30.0, "move")],
        None,
    ));
    geogate.wait_processed(2.0, 20);
    // The broker lives in the geogate process: take both copies before it
    // stops, or the collector's connection ends with the second in flight.
    let over_mqtt = runtime.block_on(over_mqtt).expect("collector");
    let (ok, _) = geogate.terminate();
    assert!(ok);
    let events: Vec<(String, String)> = read_ndjson(&dir.path().join("events.ndjson"))
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().into(),
                e["fence"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("enter".into(), "A".into()),
            ("exit".into(), "A".into()),
            ("enter".into(), "C".into())
        ]
    );
    assert_eq!(
        over_mqtt,
        read_ndjson(&dir.path().join("events.ndjson")),
        "MQTT carries the same transitions"
    );
}

/// One vehicle's fixes published newest first. With the reorder window
/// off, the first is applied and the four older ones are late: no
/// transition, their own accounting term, and each in the dead letter with
/// reason `late` and how late it was. With the default window, all five
/// are applied in fix-time order and give the in-order transitions.
#[test]
fn late_fixes_have_their_own_term_and_the_window_puts_them_back_in_order() {
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    // Fix k at 5 − k seconds: in A when k is even, B when odd.
    let stream: Vec<Message> = (0..5i64)
        .map(|k| {
            let lon = if k % 2 == 0 { 10.005 } else { 10.025 };
            native("late", T0 + 1000 * (5 - k), 50.005, lon, 40.0, "move")
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let run = |id: &str, pipeline: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let setup = support::geogate::setup(broker.port, id, pipeline);
        let geogate = GeogateProcess::start(dir.path(), &setup);
        runtime.block_on(publish_all(broker.port, &stream, None));
        geogate.wait_processed(5.0, 20);
        let late = geogate.metrics()["geogate_fixes_late_total"];
        let (ok, stdout) = geogate.terminate();
        assert!(ok, "{stdout}");
        let line = support::geogate::accounting_line(&stdout).to_owned();
        let events = read_ndjson(&dir.path().join("events.ndjson"));
        let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
        (late, line, events, letters)
    };

    let (late, line, events, letters) = run("geogate-order", "reorder_window_ms = 0");
    assert_eq!(late, 4.0);
    assert_eq!(
        line,
        "accounting: received 5 = invalid 0 (duplicate 0) + ignored 0 + shed 0 + evaluated 1 + held 0 + late 4 + in_queue 0 (balanced)"
    );
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0]["event"].as_str(), events[0]["fence"].as_str()),
        (Some("enter"), Some("A"))
    );
    assert_eq!(letters.len(), 4, "{letters:?}");
    for (k, letter) in letters.iter().enumerate() {
        assert_eq!(letter["reason"], "late", "{letter}");
        let detail = letter["detail"].as_str().unwrap_or("");
        let by = format!("{}.000 s older", k + 1);
        assert!(detail.contains(&by), "{detail}");
        assert!(letter["payload"].is_string(), "reprocessable: {letter}");
    }

    let (late, line, events, letters) = run("geogate-window", "");
    assert_eq!(late, 0.0);
    assert_eq!(
        line,
        "accounting: received 5 = invalid 0 (duplicate 0) + ignored 0 + shed 0 + evaluated 0 + held 5 + late 0 + in_queue 0 (balanced)"
    );
    assert!(letters.is_empty(), "{letters:?}");
    let got: Vec<(String, String, i64)> = events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or("").to_owned(),
                e["fence"].as_str().unwrap_or("").to_owned(),
                (e["ts"].as_i64().unwrap_or(0) - T0) / 1000,
            )
        })
        .collect();
    let want: Vec<(String, String, i64)> = [
        ("enter", "A", 1),
        ("exit", "A", 2),
        ("enter", "B", 2),
        ("exit", "B", 3),
        ("enter", "A", 3),
        ("exit", "A", 4),
        ("enter", "B", 4),
        ("exit", "B", 5),
        ("enter", "A", 5),
    ]
    .iter()
    .map(|(e, f, s)| (e.to_string(), f.to_string(), *s))
    .collect();
    assert_eq!(got, want);
}

/// One live run of the whole fleet through `fences`, with `pipeline` added
/// to the config: its transitions, after asserting a clean stop and a
/// balanced account with no fix late.
fn fleet_run(
    broker_port: u16,
    runtime: &tokio::runtime::Runtime,
    fences: &str,
    name: &str,
    pipeline: &str,
) -> support::fleet::Multiset {
    use support::fleet::{FIXES, VEHICLES, fleet, multiset};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fences.geojson"), fences).unwrap();
    let mut geogate = GeogateProcess::start(
        dir.path(),
        &support::geogate::setup(broker_port, name, pipeline),
    );
    runtime.block_on(publish_all(broker_port, &fleet(0..FIXES), None));
    geogate.wait_processed((VEHICLES * FIXES) as f64, 60);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout).to_owned();
    assert!(line.ends_with("(balanced)"), "{name}: {line}");
    assert!(line.contains("late 0 "), "{name}: {line}");
    multiset(&read_ndjson(&dir.path().join("events.ndjson")))
}

/// The fleet published at full speed through 8 decode lanes and through 1:
/// each vehicle's fixes still apply in order (none `late`), both
/// accounts balance, and the transitions are the same, with the same ids.
#[test]
fn decode_lanes_keep_each_vehicles_order_and_change_no_transition() {
    let _serial = support::geogate::exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = |lanes: usize| {
        let pipeline = format!("decode_lanes = {lanes}");
        let name = format!("lanes-{lanes}");
        fleet_run(
            broker.port,
            &runtime,
            support::fleet::FENCES,
            &name,
            &pipeline,
        )
    };
    let one = run(1);
    assert!(one.len() > 100, "the fleet makes transitions");
    assert_eq!(run(8), one);
}

/// One vehicle published under two topics that decode in different lanes
/// (a native payload names its vehicle in the body, whatever the topic):
/// the lanes may hand its fixes to the router out of order, and the
/// out-of-order rule must then keep the late ones from applying. Whatever
/// the race does, every fix is evaluated or counted out of order, and the
/// transitions written are in fix-time order, alternating per fence.
#[test]
fn one_vehicle_under_two_topics_applies_in_fix_time_order_across_lanes() {
    use support::geogate::{CROSSING_T0, accounting_term, crossing_fix};
    const LANES: usize = 8;
    const FIXES: u64 = 600;
    let topics = ["fleet/twin/telemetry", "fleet/twin-phone/telemetry"];
    let (intake, _) = geogate::source::intake::Intake::new(LANES, 1);
    assert_ne!(
        intake.lane_of(topics[0]),
        intake.lane_of(topics[1]),
        "the two topics must decode in different lanes"
    );
    let _serial = support::geogate::exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    // Fix k is in fence A when k is even and in B when odd (vehicle
    // "twin0"); the topic switches every third fix, so each topic carries
    // fixes of both fences.
    let stream: Vec<Message> = (0..FIXES as i64)
        .map(|k| {
            let (_, body) = crossing_fix("twin", 1, k);
            (topics[(k / 3 % 2) as usize].to_owned(), body)
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let lanes = format!("decode_lanes = {LANES}");
    let setup = support::geogate::setup(broker.port, "geogate-twin", &lanes);
    let geogate = GeogateProcess::start(dir.path(), &setup);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(publish_all(broker.port, &stream, None));
    geogate.wait_processed(FIXES as f64, 60);
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    // How often the race happened here: nothing a live broker can force
    // (src/pipeline/decode.rs forces it), so printed, not asserted.
    eprintln!("{line}");
    let held = accounting_term(line, "held");
    assert_eq!(
        line,
        format!(
            "accounting: received {FIXES} = invalid 0 (duplicate 0) + ignored 0 + shed 0 + evaluated 0 + held {held} + late {} + in_queue 0 (balanced)",
            FIXES.saturating_sub(held)
        )
    );
    let events = read_ndjson(&dir.path().join("events.ndjson"));
    assert!(!events.is_empty(), "the vehicle crosses fences");
    let mut last_ts = i64::MIN;
    let mut inside: BTreeMap<String, (bool, i64)> = BTreeMap::new();
    for e in &events {
        assert_eq!(e["vehicle"], "twin0", "{e}");
        let ts = e["ts"].as_i64().expect("ts");
        assert!(
            ts >= last_ts,
            "written out of fix-time order: {e} after {last_ts}"
        );
        last_ts = ts;
        let fence = e["fence"].as_str().expect("fence").to_owned();
        let enter = e["event"] == "enter";
        // The fence of the fix that caused it: entered, or the other left.
        let fence_of_fix = if (ts - CROSSING_T0) / 1000 % 2 == 0 {
            "A"
        } else {
            "B"
        };
        assert_eq!(fence == fence_of_fix, enter, "{e}: not what its fix does");
        let (was_inside, since) = inside.get(&fence).copied().unwrap_or((false, i64::MIN));
        assert_ne!(
            enter, was_inside,
            "{e}: not an alternation of enter and exit"
        );
        assert!(ts > since, "{e}: at or before the fence's last transition");
        inside.insert(fence, (enter, ts));
    }
}

/// The worker looks up a batch's fences together once the index outgrows
/// the cache (`FenceIndex::prefers_batches`), and fix by fix below that.
/// The fleet's four fences alone take the per-fix path; padded with 2,000
/// generated fences and three 12k-vertex polygons far from the fleet's
/// street, the batch path. Both must write the same transitions.
#[test]
fn a_large_fence_set_looked_up_in_batches_changes_no_transition() {
    use geogate::geofence::generate::{random_fences, to_geojson};
    use geogate::geofence::{FenceIndex, parse_fences};
    use support::fleet::FENCES;
    let _serial = support::geogate::exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let mut padded: serde_json::Value = serde_json::from_str(FENCES).unwrap();
    let (far, _) = random_fences(42, 2_000, 3, 12_000);
    let far = to_geojson(&far);
    let features = padded["features"].as_array_mut().unwrap();
    features.extend(far["features"].as_array().unwrap().iter().cloned());
    let padded = padded.to_string();
    let index = |text: &str| FenceIndex::new(parse_fences(text).unwrap());
    assert!(!index(FENCES).prefers_batches());
    assert!(index(&padded).prefers_batches());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let per_fix = fleet_run(broker.port, &runtime, FENCES, "per-fix", "");
    assert!(per_fix.len() > 100, "the fleet makes transitions");
    assert_eq!(
        fleet_run(broker.port, &runtime, &padded, "batched", ""),
        per_fix
    );
}
