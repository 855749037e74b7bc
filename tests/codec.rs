//! Decoding: both formats, the priority rule, and one precise reason per
//! kind of bad input.

use geogate::codec::{CodecSettings, Dedup, Reason, decode};
use geogate::model::Priority;

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
            Reason::UnknownFormat,
        ),
        (
            "fleet/v/telemetry",
            br#"{"_type":"waypoint","lat":1,"lon":1}"#.to_vec(),
            Reason::UnknownFormat,
        ),
        (
            "fleet/v/telemetry",
            b"[1,2,3]".to_vec(),
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

#[test]
fn redeliveries_are_recognised() {
    let mut dedup = Dedup::new(100);
    let t = decode(
        "x",
        br#"{"vehicle":"v1","ts":1700000000000,"lat":1,"lon":2}"#,
        &settings(),
    )
    .unwrap();
    assert!(dedup.first_sighting(&t.vehicle, t.fix_time_ms));
    assert!(!dedup.first_sighting(&t.vehicle, t.fix_time_ms));
}
