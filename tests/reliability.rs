//! Faults and bad input, through real brokers: nothing that matters is
//! lost, everything refused is counted with its reason, and the process
//! stays up.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::geogate::{
    GeogateProcess, Message, Setup, crossing_fix, entered_fixes, enters, exclusive, native,
    publish_all, read_ndjson,
};

const T0: i64 = 1_750_000_000_000;

fn msg(topic: &str, payload: impl Into<Vec<u8>>) -> Message {
    (topic.to_owned(), payload.into())
}

/// At least 50 distinct bad payloads, each with the reason it must get.
fn bad_corpus() -> Vec<(Message, &'static str)> {
    let t = "fleet/bad/telemetry";
    let good = r#"{"vehicle":"bad","ts":1750000000000,"lat":50.0,"lon":10.0,"speed_kmh":10,"kind":"move"}"#;
    let mut c: Vec<(Message, &str)> = Vec::new();
    for cut in [1, 5, 12, 20, 33, 47, 60, good.len() - 1] {
        c.push((msg(t, &good.as_bytes()[..cut]), "malformed_json"));
    }
    // A field given a value of the wrong type, or a non-finite "number".
    for (field, value, reason) in [
        ("lat", "\"abc\"", "wrong_type"),
        ("lon", "true", "wrong_type"),
        ("ts", "\"yesterday\"", "wrong_type"),
        ("vehicle", "42", "wrong_type"),
        ("speed_kmh", "\"fast\"", "wrong_type"),
        ("kind", "7", "wrong_type"),
        ("lat", "[1]", "wrong_type"),
        ("lon", "{}", "wrong_type"),
        ("lat", "\"NaN\"", "non_finite"),
        ("lon", "\"Infinity\"", "non_finite"),
        ("lat", "\"-Infinity\"", "non_finite"),
        ("speed_kmh", "\"NaN\"", "non_finite"),
        ("lon", "\"nan\"", "non_finite"),
    ] {
        let body = good.replacen(
            &format!("\"{field}\":"),
            &format!("\"{field}\":{value},\"was_{field}\":"),
            1,
        );
        c.push((msg(t, body), reason));
    }
    for (from, to) in [
        ("\"lat\":50.0", "\"lat\":91"),
        ("\"lat\":50.0", "\"lat\":-91"),
        ("\"lon\":10.0", "\"lon\":181"),
        ("\"lon\":10.0", "\"lon\":-181"),
        ("\"speed_kmh\":10", "\"speed_kmh\":-1"),
        ("\"kind\":\"move\"", "\"kind\":\"teleport\""),
        ("\"kind\":\"move\"", "\"kind\":\"\""),
        ("\"ts\":1750000000000", "\"ts\":7258118400000"),
        ("\"ts\":1750000000000", "\"ts\":0"),
        ("\"ts\":1750000000000", "\"ts\":-5"),
        ("\"ts\":1750000000000", "\"ts\":1e300"),
    ] {
        c.push((msg(t, good.replacen(from, to, 1)), "out_of_range"));
    }
    // Not bad input: a retained-message clear, ignored and counted.
    c.push((msg(t, ""), "retained_clear"));
    c.push((msg(t, vec![b'x'; 1 << 20]), "oversize"));
    c.push((msg(t, vec![0xff, 0xfe, 0xfd]), "malformed_json"));
    c.push((
        msg(
            t,
            [&b"{\"vehicle\":\"\xc3\x28\""[..], b",\"ts\":1}"].concat(),
        ),
        "malformed_json",
    ));
    c.push((
        msg(t, [good.as_bytes(), &[0x80]].concat()),
        "malformed_json",
    ));
    c.push((
        msg(t, format!("{}{}", "[".repeat(500), "]".repeat(500))),
        "malformed_json",
    ));
    // Valid JSON nested 300 deep carries no known field: unknown format.
    c.push((
        msg(t, format!("{}1{}", "{\"a\":".repeat(300), "}".repeat(300))),
        "unknown_format",
    ));
    c.push((
        msg(
            t,
            good.replacen("\"lat\":50.0", "\"lat\":50.0,\"lat\":51.0", 1),
        ),
        "malformed_json",
    ));
    c.push((
        msg(
            t,
            good.replacen(
                "\"vehicle\":\"bad\"",
                "\"vehicle\":\"bad\",\"vehicle\":\"worse\"",
                1,
            ),
        ),
        "malformed_json",
    ));
    // Valid JSON, but not an object: not malformed, just not telemetry.
    for v in ["[1,2]", "\"text\"", "42", "null", "true"] {
        c.push((msg(t, v), "unknown_format"));
    }
    for v in ["{}", "{\"foo\":1}"] {
        c.push((msg(t, v), "unknown_format"));
    }
    // An OwnTracks message that is not a location: ignored and counted.
    c.push((
        msg(t, "{\"_type\":\"waypoint\",\"lat\":1,\"lon\":1}"),
        "not_a_location",
    ));
    let ot = r#"{"_type":"location","lat":50.0,"lon":10.0,"tst":1750000000,"vel":20,"t":"u"}"#;
    // Topics geogate subscribes to, but with an empty vehicle segment.
    c.push((msg("owntracks//phone", ot), "missing_field"));
    c.push((msg("owntracks/ann/", ot), "missing_field"));
    c.push((msg("fleet//telemetry", ot), "missing_field"));
    // A native fix with no vehicle field on a topic that names none.
    c.push((
        msg(
            "fleet//telemetry",
            r#"{"ts":1750000000000,"lat":50.0,"lon":10.0}"#,
        ),
        "missing_field",
    ));
    for field in ["lat", "lon", "ts"] {
        let body = good.replacen(&format!("\"{field}\":"), &format!("\"gone_{field}\":"), 1);
        c.push((msg(t, body), "missing_field"));
    }
    c
}

#[test]
fn bad_input_corpus_through_mosquitto() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let corpus = bad_corpus();
    assert!(corpus.len() >= 50, "corpus has {}", corpus.len());
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        broker_port: broker.port,
        embedded: false,
        client_id: "geogate-corpus",
        extra_pipeline: "",
        gate: "kind = \"token\"\nrate = 1000\nburst = 1000",
        events_mqtt: false,
        extra_mqtt: "",
    };
    let geogate = GeogateProcess::start(dir.path(), &setup);
    // Good High events before, between and after the bad ones.
    let mut stream = Vec::new();
    let mut good = 0;
    for (i, (m, _)) in corpus.iter().enumerate() {
        if i % 10 == 0 {
            let lon = if good % 2 == 0 { 10.005 } else { 10.025 };
            stream.push(native(
                "steady",
                T0 + 1000 * good,
                50.005,
                lon,
                30.0,
                "move",
            ));
            good += 1;
        }
        stream.push(m.clone());
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &stream, None));
    geogate.wait_processed(stream.len() as f64, 60);
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "still up and exits cleanly: {stdout}");

    let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
    let is_ignored = |reason: &str| matches!(reason, "retained_clear" | "not_a_location");
    let ignored = corpus.iter().filter(|(_, r)| is_ignored(r)).count();
    assert_eq!(ignored, 2);
    assert_eq!(
        letters.len(),
        corpus.len() - ignored,
        "one dead letter per bad payload, none for routine messages"
    );
    let mut expected: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, reason) in corpus.iter().filter(|(_, r)| !is_ignored(r)) {
        *expected.entry(reason).or_default() += 1;
    }
    let mut got: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &letters {
        *got.entry(l["reason"].as_str().unwrap()).or_default() += 1;
        assert!(!l["detail"].as_str().unwrap().is_empty());
        assert!(
            l["payload"].is_string() || l["payload_base64"].is_string(),
            "payload kept: {l}"
        );
    }
    assert_eq!(got, expected);
    let events = read_ndjson(&dir.path().join("events.ndjson"));
    assert_eq!(
        events.iter().filter(|e| e["event"] == "enter").count() as i64,
        good,
        "every good fix evaluated"
    );
    let line = support::geogate::accounting_line(&stdout);
    assert_eq!(
        line,
        format!(
            "accounting: received {} = invalid {} (duplicate 0) + ignored {ignored} + shed 0 + evaluated 0 + held {good} + late 0 + in_queue 0 (balanced)",
            stream.len(),
            corpus.len() - ignored
        )
    );
}

#[test]
fn sigterm_mid_burst_drains_and_balances() {
    let _serial = exclusive();
    let port = support::free_port();
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        broker_port: port,
        embedded: true,
        client_id: "geogate-term",
        // Small queues (the embedded broker keeps ≤ 100 unacked per
        // subscriber) so the burst crosses the watermark and the gate sheds.
        extra_pipeline: "queue_capacity = 16\nsustained_rate = 300",
        gate: "kind = \"token\"\nrate = 50\nburst = 20",
        events_mqtt: false,
        extra_mqtt: "",
    };
    let geogate = GeogateProcess::start(dir.path(), &setup);
    let stream: Vec<Message> = (0..3000)
        .map(|i| {
            native(
                &format!("b{}", i % 50),
                T0 + i,
                50.5,
                10.5,
                if i % 3 == 0 { 30.0 } else { 0.0 },
                "move",
            )
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(port, &stream, None));
    // Everything sent has been taken in, and the slow workers still have
    // admitted events queued: the signal lands on in-flight work.
    let queued = || {
        let m = geogate.metrics();
        let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
        (
            get("geogate_events_received_total"),
            get("geogate_events_admitted_total") - get("geogate_events_evaluated_total"),
        )
    };
    support::geogate::wait_until(60, "all received", || queued().0 == 3000.0);
    let (_, in_flight) = queued();
    assert!(in_flight >= 1.0, "nothing was queued at the signal");
    let (ok, stdout) = geogate.terminate();
    assert!(ok, "exit 0 after SIGTERM: {stdout}");
    let line = support::geogate::accounting_line(&stdout);
    // The whole line, each number from an independent source: what was
    // sent, and the dead-letter file (every record a shed Low ping).
    let letters = read_ndjson(&dir.path().join("dead-letter.ndjson"));
    assert!(letters.iter().all(|l| l["reason"] == "shed"), "{letters:?}");
    let shed = letters.len();
    assert!(
        shed > 0,
        "the burst crossed the watermark and the gate shed"
    );
    assert_eq!(
        line,
        format!(
            "accounting: received 3000 = invalid 0 (duplicate 0) + ignored 0 + shed {shed} + evaluated 0 + held {} + late 0 + in_queue 0 (balanced)",
            3000 - shed
        )
    );
}

/// Three restarts of a persistent mosquitto while geogate holds unacked
/// messages. The broker's inflight window (50) is far below a batch (600),
/// so most of each batch waits at the broker: the setting where one stale
/// ack on the new connection (an old connection's packet id) lets mosquitto
/// 2.0.11 send newer fixes ahead of older ones, which then changed nothing
/// and showed up only as out_of_order. Every fix must make exactly one
/// enter, with nothing out of order.
#[test]
fn broker_restarts_lose_no_high_event() {
    let _serial = exclusive();
    let Some(mut broker) = support::Mosquitto::start_with(
        "persistence true\nautosave_interval 1\nmax_inflight_messages 50\n",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        broker_port: broker.port,
        embedded: false,
        client_id: "geogate-restarts",
        extra_pipeline: "sustained_rate = 500",
        gate: "kind = \"token\"\nrate = 1000\nburst = 100",
        events_mqtt: false,
        extra_mqtt: "",
    };
    let geogate = GeogateProcess::start(dir.path(), &setup);
    // 4 batches of High fixes alternating between fences A and B (every
    // fix is an enter), with a broker restart after each of the first three
    // while geogate still has a backlog.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut published = BTreeSet::new();
    for batch in 0..4i64 {
        let stream: Vec<Message> = (0..600i64)
            .map(|i| {
                let n = batch * 600 + i;
                published.insert((format!("r{}", n % 20), T0 + 1000 * (n / 20)));
                crossing_fix("r", 20, n)
            })
            .collect();
        runtime.block_on(publish_all(broker.port, &stream, None));
        if batch < 3 {
            // The fault must hit something: messages held unacked. (The
            // broker acks the publisher before it delivers, so the first
            // look can come before geogate holds anything: wait for it.)
            support::geogate::wait_until(10, "messages held unacked at the restart", || {
                geogate.metric("geogate_mqtt_unacked") > 0.0
            });
            broker.restart();
            // Resumed with its stored session (subscriptions and unacked
            // messages) before the next batch.
            geogate.wait_for_log("session_present=true", batch as usize + 1);
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let entered = || entered_fixes(&dir.path().join("events.ndjson"));
    while entered() != published {
        assert!(
            std::time::Instant::now() < deadline,
            "lost: {:?}",
            published.difference(&entered()).take(5).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let reconnects = geogate
        .metrics()
        .get("geogate_mqtt_reconnects_total")
        .copied()
        .unwrap_or(0.0);
    assert!(reconnects >= 3.0, "reconnects counted: {reconnects}");
    let withheld = geogate.series(r#"geogate_mqtt_acks_total{outcome="withheld_old_connection"}"#);
    assert!(
        withheld > 0.0,
        "messages of a dead connection were finished and not acked there"
    );
    geogate.wait_for_log("connected to broker", 4);
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.contains("+ late 0 +"), "{line}");
    // Exactly once: the redelivered copies were recognised, not re-applied.
    let all = enters(&read_ndjson(&dir.path().join("events.ndjson")));
    let count = read_ndjson(&dir.path().join("events.ndjson"))
        .iter()
        .filter(|e| e["event"] == "enter")
        .count();
    assert_eq!(count, all.len(), "an enter was written twice");
    assert_eq!(all, published);
}

/// Resident set size of a process, from /proc (Linux).
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[test]
fn a_backlog_of_forty_seconds_of_work_sheds_low_and_loses_no_high() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start_unlimited_inflight() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Workers sustain 2 × 250 = 500 fixes/s. The 20,000 fixes are queued at
    // the broker while geogate is away, then arrive at once when it comes
    // back: an overload by construction (40 s of work offered in one go),
    // not by how fast a publisher happens to run on this machine.
    let setup = Setup {
        broker_port: broker.port,
        embedded: false,
        client_id: "geogate-overload",
        extra_pipeline: "queue_capacity = 256\nsustained_rate = 250",
        gate: "kind = \"token\"\nrate = 100\nburst = 50",
        events_mqtt: false,
        extra_mqtt: "",
    };
    let mut geogate = GeogateProcess::start(dir.path(), &setup);
    // Subscribed with a persistent session; now away.
    let (ok, _) = geogate.stop();
    assert!(ok);
    let mut stream = Vec::new();
    let mut high = BTreeSet::new();
    for i in 0..20_000i64 {
        if i % 50 == 0 {
            // 2% High (100/s at 10× load, within the workers' 500/s),
            // alternating fences so each one leaves an enter.
            let (v, k) = (format!("h{}", (i / 50) % 20), i / 1000);
            high.insert((v.clone(), T0 + 1000 * k));
            stream.push(native(
                &v,
                T0 + 1000 * k,
                50.005,
                if k % 2 == 0 { 10.005 } else { 10.025 },
                40.0,
                "move",
            ));
        } else {
            stream.push(native(
                &format!("p{}", i % 500),
                T0 + i,
                50.5,
                10.5,
                0.0,
                "ping",
            ));
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker.port, &stream, None));
    let started = std::time::Instant::now();
    geogate.restart();
    let pid = geogate.pid();
    let watcher = std::thread::spawn({
        let port = geogate.metrics_port;
        move || {
            let mut peak_rss = 0u64;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while std::time::Instant::now() < deadline {
                peak_rss = peak_rss.max(rss_bytes(pid).unwrap_or(0));
                let m = support::geogate::scrape(port);
                let done = [
                    "geogate_events_invalid_total",
                    "geogate_events_shed_total",
                    "geogate_events_evaluated_total",
                ]
                .iter()
                .map(|k| m.get(*k).copied().unwrap_or(0.0))
                .sum::<f64>();
                if done >= 20_000.0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            peak_rss
        }
    });
    geogate.wait_processed(20_000.0, 120);
    let elapsed = started.elapsed().as_secs_f64();
    let peak_rss = watcher.join().unwrap();
    let m = geogate.metrics();
    let (ok, stdout) = geogate.terminate();
    assert!(ok && stdout.contains("(balanced)"), "{stdout}");

    // No High event lost (geogate has exited: every line must be whole).
    let entered = enters(&read_ndjson(&dir.path().join("events.ndjson")));
    assert!(
        high.is_subset(&entered),
        "lost High: {:?}",
        high.difference(&entered).take(3).collect::<Vec<_>>()
    );
    // Memory stays bounded (queues, intake and unacked window are bounded):
    // a resource bound, which a slow machine cannot make fail.
    assert!(
        peak_rss > 0 && peak_rss < 150 * 1024 * 1024,
        "peak RSS {peak_rss} bytes"
    );
    // High events met full queues and waited (backpressure, never shed).
    let waited = m
        .get("geogate_backpressure_waits_total")
        .copied()
        .unwrap_or(0.0);
    assert!(waited > 0.0, "no High event met a full queue");
    // The shed ratio follows the gate: above the watermark each shard's gate
    // admitted at most b + r·t (token bucket, b = 50, r = 100/s); t is
    // measured generously (a slower run only loosens the bound).
    let shed = m.get("geogate_events_shed_total").copied().unwrap_or(0.0);
    let gated = m.get("geogate_gate_admitted_total").copied().unwrap_or(0.0);
    let bound = 2.0 * (50.0 + 100.0 * elapsed);
    assert!(shed > 0.0, "overload sheds low priority");
    assert!(
        gated <= bound,
        "gate admitted {gated} > b + r·t = {bound} over {elapsed:.1} s"
    );
    eprintln!(
        "overload: {elapsed:.1} s, shed {shed}, gate admitted {gated} (bound {bound:.0}), High waits {waited}, peak RSS {} MiB",
        peak_rss >> 20
    );
}
