//! Decoding: both formats, the priority rule, and one precise reason per
//! kind of bad input.

use geogate::codec::{CodecSettings, Dedup, Reason, decode, message_digest};
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
        ("fleet/v/telemetry", b"".to_vec(), Reason::RetainedClear),
        ("fleet/v/telemetry", b" ".to_vec(), Reason::MalformedJson),
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
            Reason::BadVehicleId,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v\u0000","ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::BadVehicleId,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v\u0085","ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::BadVehicleId,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v\ufffe","ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::BadVehicleId,
        ),
        (
            "fleet/v/telemetry",
            br#"{"vehicle":"v#1","ts":1700000000000,"lat":1,"lon":1}"#.to_vec(),
            Reason::BadVehicleId,
        ),
        (
            "fleet/v/telemetry",
            format!(
                r#"{{"vehicle":"{}","ts":1700000000000,"lat":1,"lon":1}}"#,
                "v".repeat(129)
            )
            .into_bytes(),
            Reason::BadVehicleId,
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
            Reason::NotALocation,
        ),
        (
            "owntracks/ann/phone",
            br#"{"_type":null,"lat":1,"lon":1,"tst":1700000000}"#.to_vec(),
            Reason::WrongType,
        ),
        (
            "owntracks/ann/phone",
            br#"{"_type":7,"lat":1,"lon":1,"tst":1700000000}"#.to_vec(),
            Reason::WrongType,
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

/// As the router asks: by the message's digest.
fn first_sighting(dedup: &mut Dedup, topic: &str, payload: &[u8]) -> bool {
    dedup.first_sighting(message_digest(topic, payload))
}

/// A redelivery is the same message again; two different fixes of one
/// vehicle in the same second (an event report and a periodic one) are
/// not, and neither is a High event after a Low ping of the same time.
#[test]
fn redeliveries_are_recognised_and_same_time_fixes_are_not() {
    let mut dedup = Dedup::new(100);
    let topic = "fleet/v1/telemetry";
    let ping = br#"{"vehicle":"v1","ts":1700000000000,"lat":1,"lon":2,"kind":"ping"}"#;
    let moved = br#"{"vehicle":"v1","ts":1700000000000,"lat":1.001,"lon":2,"kind":"move"}"#;
    assert!(first_sighting(&mut dedup, topic, ping));
    assert!(!first_sighting(&mut dedup, topic, ping));
    assert!(first_sighting(&mut dedup, topic, moved));
    assert!(!first_sighting(&mut dedup, topic, moved));
    let (p, m) = (
        decode(topic, ping, &settings()).unwrap(),
        decode(topic, moved, &settings()).unwrap(),
    );
    assert_eq!((p.vehicle, p.fix_time_ms), (m.vehicle, m.fix_time_ms));
    assert_eq!((p.priority, m.priority), (Priority::Low, Priority::High));
}

/// A device clock too far ahead of the receive clock is refused with both
/// times named; a fix far in the past is not (it is late data).
#[test]
fn a_clock_ahead_is_refused_and_a_clock_behind_is_not() {
    let s = settings();
    let received = 1_765_000_000_000;
    let ahead = received + 365 * 86_400_000;
    let err = s.check_clock(ahead, received).unwrap_err();
    assert_eq!(err.reason, Reason::ClockAhead);
    assert!(
        err.detail.contains(&ahead.to_string()) && err.detail.contains(&received.to_string()),
        "{}",
        err.detail
    );
    let limit_ms = (s.max_clock_ahead_s * 1000.0) as i64;
    assert!(s.check_clock(received + limit_ms, received).is_ok());
    assert!(s.check_clock(received + limit_ms + 1, received).is_err());
    // A GPS week rollover: 1024 weeks (19.6 years) behind.
    let rollover = received - 1024 * 7 * 86_400_000;
    assert!(s.check_clock(rollover, received).is_ok());
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
            // Not the codec's: the gate's and the state's.
            "shed" | "late" => continue,
            "retained_clear" => {
                assert_eq!(
                    decode(&topic, b"", &s).unwrap_err().reason,
                    Reason::RetainedClear
                );
                continue;
            }
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
            decode(&topic, payload.as_bytes(), &s).expect("a valid fix");
            assert!(first_sighting(&mut dedup, &topic, payload.as_bytes()));
            assert!(!first_sighting(&mut dedup, &topic, payload.as_bytes()));
            continue;
        }
        if reason == "clock_ahead" {
            let fix = decode(&topic, payload.as_bytes(), &s).expect("a valid fix");
            let received = fix.fix_time_ms - 3_600_000;
            let err = s.check_clock(fix.fix_time_ms, received).unwrap_err();
            assert_eq!(err.reason, Reason::ClockAhead);
            continue;
        }
        let err = decode(&topic, payload.as_bytes(), &s).expect_err(payload);
        assert_eq!(err.reason.as_str(), reason, "{payload}: {}", err.detail);
    }
    let mut all: Vec<String> = Reason::ALL.iter().map(|r| r.as_str().to_owned()).collect();
    all.push("shed".into());
    all.push("late".into());
    all.sort();
    covered.sort();
    assert_eq!(covered, all, "one row per reason");
}

mod typed_reading {
    //! The typed reading (`codec::typed`) against the loose one it stands
    //! in for (`decode_loose_only`): the same fix or the same refusal, word
    //! for word, checked on generated payloads. They are built from the
    //! fields both formats carry, each given a value of its own kind most
    //! of the time and anything else otherwise (escaped strings and keys,
    //! lone surrogates, floats for integers, integers past i64, non-finite
    //! strings, nesting, control characters, repeats, a top-level array),
    //! then sometimes cut short or given a byte that is not UTF-8.

    use geogate::codec::{CodecSettings, decode, decode_loose_only, typed};
    use proptest::prelude::*;

    const KEYS: [&str; 12] = [
        "vehicle",
        "ts",
        "lat",
        "lon",
        "speed_kmh",
        "kind",
        "_type",
        "tst",
        "vel",
        "t",
        "extra",
        r"veh\u0069cle",
    ];

    /// Any value, from the plain to the odd.
    fn any_value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|i| i.to_string()),
            (946_684_800_000i64..4_102_444_800_000).prop_map(|i| i.to_string()),
            (946_684_800i64..4_102_444_800).prop_map(|i| i.to_string()),
            (-200.0f64..200.0).prop_map(|f| format!("{f}")),
            (-200.0f64..200.0).prop_map(|f| format!("{f:e}")),
            prop::sample::select(vec![
                "null",
                "true",
                "false",
                "0",
                "-0",
                "-0.0",
                "2.0",
                "1e3",
                "1.5E-2",
                "1e400",
                "-1e400",
                "1e-400",
                "9.0e15",
                "9007199254740993",
                "1772427600000.0",
                "9223372036854775808",
                "-9223372036854775809",
                "18446744073709551616",
                "[]",
                "[1,2]",
                "{}",
                r#"{"a":[1,{"b":null}]}"#,
                r#""""#,
                r#""v1""#,
                r#""move""#,
                r#""ping""#,
                r#""stop""#,
                r#""p""#,
                r#""u""#,
                r#""location""#,
                r#""waypoint""#,
                r#""NaN""#,
                r#""-Infinity""#,
                r#""12""#,
                r#""\u0070""#,
                r#""v\"1""#,
                r#""ve\u0301""#,
                r#""\ud83d\ude9a""#,
                r#""\ud800""#,
                "\"a\u{1}b\"",
                r#""héllo""#,
            ])
            .prop_map(str::to_owned),
        ]
    }

    /// A value of the field's own kind, mostly valid for it.
    fn fitting(key: &'static str) -> BoxedStrategy<String> {
        match key {
            // Now and then in a form only the loose reading takes: an
            // escape in the id, a fix time written as a float.
            "vehicle" => prop_oneof![
                6 => "[a-z0-9]{1,12}".prop_map(|s| format!("\"{s}\"")),
                1 => "[a-z0-9]{1,12}".prop_map(|s| format!(r#""{s}\u0041""#)),
            ]
            .boxed(),
            "ts" => (1_700_000_000_000i64..1_800_000_000_000, 0..7)
                .prop_map(|(i, form)| {
                    if form == 0 {
                        format!("{i}.0")
                    } else {
                        i.to_string()
                    }
                })
                .boxed(),
            "tst" => (1_700_000_000i64..1_800_000_000)
                .prop_map(|i| i.to_string())
                .boxed(),
            "lat" | "lon" | "speed_kmh" | "vel" => prop_oneof![
                (-95.0f64..95.0).prop_map(|f| format!("{f}")),
                (-95i64..95).prop_map(|i| i.to_string()),
            ]
            .boxed(),
            "kind" => prop::sample::select(vec![r#""move""#, r#""ping""#, r#""fly""#])
                .prop_map(str::to_owned)
                .boxed(),
            "_type" => Just(r#""location""#.to_owned()).boxed(),
            "t" => prop::sample::select(vec![r#""p""#, r#""u""#, r#""c""#])
                .prop_map(str::to_owned)
                .boxed(),
            _ => any_value().boxed(),
        }
    }

    /// `"key": value`, the value mostly of the key's own kind.
    fn field(key: &'static str) -> impl Strategy<Value = String> {
        prop_oneof![9 => fitting(key), 1 => any_value()]
            .prop_map(move |value| format!("\"{key}\": {value}"))
    }

    /// [`field`], left out with odds `10 - keep` in 10.
    fn maybe(key: &'static str, keep: u32) -> impl Strategy<Value = Option<String>> {
        prop_oneof![keep => field(key).prop_map(Some), 10 - keep => Just(None)]
    }

    /// Up to `most - 1` fields of keys drawn at random.
    fn random_fields(most: usize) -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(
            prop::sample::select(KEYS.to_vec()).prop_flat_map(field),
            0..most,
        )
    }

    /// A format's fields: four it needs, kept 9 times in 10, and two
    /// optional ones, kept half the time.
    fn format(keys: [&'static str; 6]) -> impl Strategy<Value = Vec<String>> {
        (
            maybe(keys[0], 9),
            maybe(keys[1], 9),
            maybe(keys[2], 9),
            maybe(keys[3], 9),
            maybe(keys[4], 5),
            maybe(keys[5], 5),
        )
            .prop_map(|(a, b, c, d, e, f)| [a, b, c, d, e, f].into_iter().flatten().collect())
    }

    /// A native fix, an OwnTracks location, or keys drawn at random, in a
    /// shuffled order, sometimes with a key more (a repeat, at times).
    fn fields() -> impl Strategy<Value = Vec<String>> {
        let native = format(["vehicle", "ts", "lat", "lon", "speed_kmh", "kind"]);
        let owntracks = format(["_type", "tst", "lat", "lon", "vel", "t"]);
        (
            prop_oneof![native, owntracks, random_fields(8)],
            random_fields(2),
        )
            .prop_map(|(fields, extra)| fields.into_iter().chain(extra).collect::<Vec<_>>())
            .prop_shuffle()
    }

    fn payload() -> impl Strategy<Value = Vec<u8>> {
        (
            fields(),
            prop::sample::select(vec!["", " ", "\n"]),
            prop_oneof![9 => Just(false), 1 => Just(true)],
            prop_oneof![
                6 => Just(None),
                1 => any::<prop::sample::Index>().prop_map(|i| Some((i, None))),
                1 => (any::<prop::sample::Index>(), prop::sample::select(vec![0xffu8, 0xc3, b'"', b'}', b',']))
                    .prop_map(|(i, b)| Some((i, Some(b)))),
            ],
        )
            .prop_map(|(fields, gap, as_array, damage)| {
                let text = if as_array {
                    // The values alone, as serde reads a struct from a sequence.
                    let values: Vec<&str> = fields
                        .iter()
                        .map(|f| f.split_once(": ").map_or(f.as_str(), |(_, v)| v))
                        .collect();
                    format!("[{}]", values.join(","))
                } else {
                    format!("{{{gap}{}{gap}}}", fields.join(","))
                };
                let mut bytes = text.into_bytes();
                match damage {
                    None => {}
                    Some((at, None)) => bytes.truncate(at.index(bytes.len() + 1)),
                    Some((at, Some(b))) => bytes.insert(at.index(bytes.len() + 1), b),
                }
                bytes
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]
        #[test]
        fn agrees_with_the_loose_reading(
            payload in payload(),
            topic in prop::sample::select(vec![
                "fleet/v9/telemetry", "owntracks/ann/phone", "owntracks//x", "x", "",
            ]),
        ) {
            let settings = CodecSettings::default();
            // Debug, not ==: it tells -0.0 from 0.0.
            prop_assert_eq!(
                format!("{:?}", decode(topic, &payload, &settings)),
                format!("{:?}", decode_loose_only(topic, &payload, &settings)),
                "{}", String::from_utf8_lossy(&payload)
            );
        }
    }

    /// The generator reaches what the comparison needs often enough to
    /// mean something: fixes of both formats, payloads the typed reading
    /// takes (some of them then refused by the checks after it), and
    /// payloads it leaves to the fallback that still decode.
    #[test]
    fn the_payloads_cover_both_readings_and_both_outcomes() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let settings = CodecSettings::default();
        let mut runner = TestRunner::deterministic();
        let strategy = payload();
        let (mut native, mut owntracks, mut refused) = (0, 0, 0);
        let (mut typed_then_refused, mut fallback_fixes) = (0, 0);
        for _ in 0..4000 {
            let payload = strategy.new_tree(&mut runner).unwrap().current();
            // The OwnTracks topic names a vehicle only for OwnTracks.
            let decoded = decode("owntracks/ann/phone", &payload, &settings);
            match &decoded {
                Ok(_) if decode("x", &payload, &settings).is_ok() => native += 1,
                Ok(_) => owntracks += 1,
                Err(_) => refused += 1,
            }
            let typed = std::str::from_utf8(&payload).is_ok_and(|t| typed::read(t).is_some());
            match (typed, decoded.is_ok()) {
                (true, false) => typed_then_refused += 1,
                (false, true) => fallback_fixes += 1,
                _ => {}
            }
        }
        // 195, 219, 3,586, 1,029 and 48 when this was written.
        let counts = format!(
            "native {native}, owntracks {owntracks}, refused {refused}, typed then refused {typed_then_refused}, fixes by the fallback {fallback_fixes}"
        );
        assert!(
            native >= 100 && owntracks >= 100 && refused >= 1000,
            "{counts}"
        );
        assert!(
            typed_then_refused >= 100 && fallback_fixes >= 20,
            "{counts}"
        );
    }
}

/// Two inputs both readings once decoded as fixes: an array of the fields'
/// values in order (serde reads a struct from that too), and bad UTF-8
/// inside the string of a field the codec ignores (serde_json skips it
/// unchecked).
#[test]
fn an_array_and_bad_utf8_in_an_ignored_field_are_refused() {
    let s = settings();
    let array = decode(
        "x",
        br#"["v1",1772427600000,52.5,13.4,null,null,null,null,null,null]"#,
        &s,
    )
    .unwrap_err();
    assert_eq!(array.reason, Reason::UnknownFormat, "{}", array.detail);
    let owntracks_array = decode(
        "owntracks/ann/phone",
        br#"[null,null,52.5,13.4,null,null,"location",1772427600,null,null]"#,
        &s,
    )
    .unwrap_err();
    assert_eq!(owntracks_array.reason, Reason::UnknownFormat);
    let valid = br#"{"vehicle":"v1","ts":1772427600000,"lat":1,"lon":2,"x":""#;
    let mut payload = valid.to_vec();
    payload.extend_from_slice(b"\xff\"}");
    let bad = decode("x", &payload, &s).unwrap_err();
    assert_eq!(bad.reason, Reason::MalformedJson);
    assert_eq!(
        bad.detail,
        format!("not UTF-8: invalid byte at offset {}", valid.len())
    );
}

/// Real OwnTracks traffic, from the OwnTracks apps' and Recorder's own
/// fixtures and documentation (`tests/golden/owntracks_corpus.md` cites
/// each source): every message gets the outcome its line expects. A
/// location is a fix even with iOS's `vel: -1` and `cog: -1` (unknown);
/// every other message type is ignored as `not_a_location` with its type
/// named; an empty payload is a retained-message clear.
#[test]
fn the_owntracks_corpus_decodes_as_real_devices_mean_it() {
    let corpus = std::fs::read_to_string("tests/golden/owntracks_corpus.jsonl")
        .expect("tests/golden/owntracks_corpus.jsonl");
    let s = settings();
    let mut by_expectation = std::collections::BTreeMap::<String, usize>::new();
    for (n, line) in corpus.lines().enumerate() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("a corpus line");
        let field = |k: &str| {
            entry[k]
                .as_str()
                .unwrap_or_else(|| panic!("line {}: {k}", n + 1))
        };
        let (source, topic, payload, expect) = (
            field("source"),
            field("topic"),
            field("payload"),
            field("expect"),
        );
        let decoded = decode(topic, payload.as_bytes(), &s);
        let (kind, named) = expect.split_once(':').unwrap_or((expect, ""));
        *by_expectation.entry(kind.to_owned()).or_default() += 1;
        match (kind, &decoded) {
            ("fix", Ok(fix)) => {
                assert!(!fix.vehicle.is_empty(), "{source}");
                if let Some(vel) = fix.speed_kmh {
                    assert!(
                        vel >= 0.0,
                        "{source}: a negative speed is unknown, not {vel}"
                    );
                }
            }
            (reason, Err(e)) if e.reason.as_str() == reason => {
                if reason == "not_a_location" {
                    assert!(
                        e.detail.contains(named) && !e.detail.contains("Str("),
                        "{source}: {}",
                        e.detail
                    );
                }
            }
            _ => panic!("{source}: expected {expect}, got {decoded:?}"),
        }
    }
    for kind in ["fix", "not_a_location", "retained_clear"] {
        assert!(by_expectation.contains_key(kind), "{by_expectation:?}");
    }
    assert!(
        by_expectation.values().sum::<usize>() >= 100,
        "{by_expectation:?}"
    );
}

/// The iOS track the OwnTracks Recorder ships (`etc/demo-iphone.rec`):
/// every location in it is a fix, though most report `vel: -1`.
#[test]
fn ios_unknown_speed_and_course_are_not_errors() {
    let s = settings();
    let fix = decode(
        "owntracks/jane/phone",
        br#"{"_type":"location","tst":1440363922,"lat":46.0,"lon":7.0,"vel":-1,"cog":-1,"t":"u"}"#,
        &s,
    )
    .expect("a fix");
    assert_eq!(fix.speed_kmh, None);
    let encrypted = decode(
        "owntracks/jane/phone",
        br#"{"_type":"encrypted","data":"abc"}"#,
        &s,
    )
    .unwrap_err();
    assert_eq!(encrypted.reason, Reason::NotALocation);
    assert!(
        encrypted.detail.contains("cannot read encrypted"),
        "{}",
        encrypted.detail
    );
}
