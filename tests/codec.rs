//! Decoding: both formats, the priority rule, and one precise reason per
//! kind of bad input.

use geogate::codec::{CodecSettings, Dedup, Reason, decode};
use geogate::model::{Priority, Telemetry};
use geogate::stable_hash::VehicleHash;

fn settings() -> CodecSettings {
    CodecSettings::default()
}

#[test]
fn native_and_owntracks_decode_with_priority() {
    let s = settings();
    let t = decode(
        "fleet/v1/telemetry",
        br#"{"vehicle":"v1","ts":1700000000123,"lat":52.5,"lon":13.4,"speed_kmh":40,"kind":"move"}"#,
        &s,
    )
    .unwrap();
    assert_eq!(
        (&*t.vehicle, t.fix_time_ms, t.priority),
        ("v1", 1_700_000_000_123, Priority::High)
    );
    let ping = decode(
        "x",
        br#"{"vehicle":"v1","ts":1700000000000,"lat":1,"lon":2,"kind":"ping","speed_kmh":50}"#,
        &s,
    )
    .unwrap();
    assert_eq!(ping.priority, Priority::Low);
    let idle = decode(
        "x",
        br#"{"vehicle":"v1","ts":1700000000000,"lat":1,"lon":2,"speed_kmh":0.5}"#,
        &s,
    )
    .unwrap();
    assert_eq!(idle.priority, Priority::Low);

    let ot = decode(
        "owntracks/ann/phone",
        br#"{"_type":"location","lat":52.5,"lon":13.4,"tst":1700000000,"vel":30,"t":"u"}"#,
        &s,
    )
    .unwrap();
    assert_eq!(
        (&*ot.vehicle, ot.fix_time_ms, ot.priority),
        ("ann/phone", 1_700_000_000_000, Priority::High)
    );
    let ot_ping = decode(
        "owntracks/ann/phone",
        br#"{"_type":"location","lat":1,"lon":2,"tst":1700000000,"vel":30,"t":"p"}"#,
        &s,
    )
    .unwrap();
    assert_eq!(ot_ping.priority, Priority::Low);
}

#[test]
fn every_bad_input_gets_its_reason() {
    let s = CodecSettings {
        max_payload_bytes: 1024,
        ..settings()
    };
    let big = format!(r#"{{"vehicle":"v","pad":"{}"}}"#, "x".repeat(2000));
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let cases: Vec<(&str, Vec<u8>, Reason)> = vec![
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":1"#.to_vec(),
            Reason::MalformedJson,
        ),
        ("fleet/v/telemetry", b"".to_vec(), Reason::MalformedJson),
        (
            "fleet/v/telemetry",
            vec![0xff, 0xfe, b'{'],
            Reason::MalformedJson,
        ),
        (
            "fleet/v/telemetry",
            deep.into_bytes(),
            Reason::MalformedJson,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","vehicle":"w","ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::MalformedJson,
        ),
        ("fleet/v/telemetry", big.into_bytes(), Reason::Oversize),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","lat":1,"lon":1}"#.to_vec(),
            Reason::MissingField,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":"north","lon":1}"#.to_vec(),
            Reason::WrongType,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":7,"ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::WrongType,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000.5,"lat":1,"lon":1}"#.to_vec(),
            Reason::WrongType,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":"NaN","lon":1}"#.to_vec(),
            Reason::NonFinite,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":1,"lon":"-Infinity"}"#.to_vec(),
            Reason::NonFinite,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":91,"lon":1}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":1,"lon":181}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":1,"lon":1,"speed_kmh":-3}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1700000000000,"lat":1,"lon":1,"kind":"teleport"}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":99999999999999,"lat":1,"lon":1}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v","ts":1000,"lat":1,"lon":1}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"","ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::OutOfRange,
        ),
        (
            "fleet/v/telemetry",
            br#"{"lat":1,"lon":1}"#.to_vec(),
            Reason::MissingField,
        ),
        (
            "fleet//telemetry",
            br#"{"ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::MissingField,
        ),
        (
            "fleet/v/telemetry",
            br#"{"foo":1}"#.to_vec(),
            Reason::UnknownFormat,
        ),
        // An OwnTracks topic names a phone, not a fleet vehicle.
        (
            "owntracks/ann/phone",
            br#"{"ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::MissingField,
        ),
        (
            "fleet/v/telemetry",
            br#"{"_type":"waypoint","lat":1,"lon":1}"#.to_vec(),
            Reason::UnknownFormat,
        ),
        (
            "fleet/v/telemetry",
            b"[1,2,3]".to_vec(),
            Reason::UnknownFormat,
        ),
        ("fleet/v/telemetry", b"42".to_vec(), Reason::UnknownFormat),
        (
            "fleet/v/telemetry",
            b"\"hello\"".to_vec(),
            Reason::UnknownFormat,
        ),
        ("fleet/v/telemetry", b"null".to_vec(), Reason::UnknownFormat),
        (
            "fleet/v/telemetry",
            b"{\"lat\":1".to_vec(),
            Reason::MalformedJson,
        ),
        (
            "owntracks/onlyuser",
            br#"{"_type":"location","lat":1,"lon":1,"tst":1700000000}"#.to_vec(),
            Reason::MissingField,
        ),
    ];
    for (topic, payload, reason) in cases {
        let err = decode(topic, &payload, &s).expect_err(&String::from_utf8_lossy(&payload));
        if reason == Reason::MissingField
            && (topic.contains("//") || topic.starts_with("owntracks"))
        {
            assert!(
                err.detail.starts_with("vehicle:"),
                "names the vehicle: {}",
                err.detail
            );
        }
        assert_eq!(
            err.reason,
            reason,
            "{}: {}",
            String::from_utf8_lossy(&payload),
            err.detail
        );
        assert!(!err.detail.is_empty());
    }
}

/// As the router asks: with the vehicle's routing hash.
fn first_sighting(dedup: &mut Dedup, fix: &Telemetry) -> bool {
    dedup.first_sighting(&fix.vehicle, VehicleHash::of(&fix.vehicle), fix.fix_time_ms)
}

#[test]
fn redeliveries_are_recognised() {
    let mut dedup = Dedup::new(100);
    let t = decode(
        "x",
        br#"{"vehicle":"v1","ts":1700000000000,"lat":1,"lon":2}"#,
        &settings(),
    )
    .unwrap();
    assert!(first_sighting(&mut dedup, &t));
    assert!(!first_sighting(&mut dedup, &t));
}

/// README's table of reasons, row by row: each example payload gets the
/// reason the table gives it.
#[test]
fn readme_reason_table_matches_the_codec() {
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let section = readme
        .split("## Why a message was refused")
        .nth(1)
        .expect("README has the reason table");
    let s = settings();
    let mut covered = Vec::new();
    for row in section.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        if !row.starts_with("| `") || cells.len() < 4 {
            continue;
        }
        let code = |c: &str| {
            c.trim_matches(|ch| ch == '|' || ch == ' ')
                .trim_matches('`')
                .to_owned()
        };
        let reason = code(cells[0]);
        let topic = code(cells[1]);
        let payload = cells[2].trim();
        covered.push(reason.clone());
        match reason.as_str() {
            "shed" => continue,
            "oversize" => {
                let big = vec![b' '; s.max_payload_bytes + 1];
                assert_eq!(
                    decode(&topic, &big, &s).unwrap_err().reason,
                    Reason::Oversize
                );
                continue;
            }
            _ => {}
        }
        let payload = payload
            .split('`')
            .nth(1)
            .unwrap_or_else(|| panic!("row {reason} has a payload in backticks"));
        if reason == "duplicate" {
            let mut dedup = Dedup::new(16);
            let fix = decode(&topic, payload.as_bytes(), &s).expect("a valid fix");
            assert!(first_sighting(&mut dedup, &fix));
            assert!(!first_sighting(&mut dedup, &fix));
            continue;
        }
        let err = decode(&topic, payload.as_bytes(), &s).expect_err(payload);
        assert_eq!(err.reason.as_str(), reason, "{payload}: {}", err.detail);
    }
    let mut all: Vec<String> = Reason::ALL.iter().map(|r| r.as_str().to_owned()).collect();
    all.push("shed".into());
    all.sort();
    covered.sort();
    assert_eq!(covered, all, "one row per reason");
}
