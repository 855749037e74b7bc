//! Bytes and topic → [`Telemetry`], or a [`DecodeError`] with a bounded
//! reason.
//!
//! Before any JSON is read, the payload must be UTF-8 and must open an
//! object. Then it is read into typed fields ([`typed`]), which is all an
//! ordinary payload needs; a payload that reading refuses is read again
//! as [`Loose`] values, whose "any value" per field is what lets a wrong
//! type or a non-finite number be named. Formats, told apart on whichever
//! reading succeeded:
//! 1. **native**: `{"vehicle", "ts" (unix ms), "lat", "lon", "speed_kmh"?, "kind"?}`;
//!    a native fix without `"vehicle"` takes it from the topic
//!    (`fleet/{vehicle}/telemetry`), and is `missing_field` when the topic
//!    names none;
//! 2. **OwnTracks** location: `{"_type": "location", "lat", "lon", "tst" (s),
//!    "vel"? (km/h), "t"? (trigger)}`, the vehicle named by the topic.
//!
//! Valid JSON that is not an object is `unknown_format` (it is not
//! malformed). The size cap is checked before any parsing. Priority is `Low` for an
//! OwnTracks `t = "p"`, a native kind in `ping_kinds`, or a speed below
//! `idle_speed_kmh`; everything else is `High`.

pub mod dedup;
pub mod error;
pub mod loose;
pub mod topic;
pub mod typed;

pub use dedup::Dedup;
pub use error::{DecodeError, Reason};
pub use topic::TopicPattern;

use crate::model::{Priority, Telemetry, VehicleId, check_vehicle_id};
use loose::Loose;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// Fix times outside [2000-01-01, 2100-01-01) are refused as out of range:
/// fixed bounds (not "now ± x") keep replays deterministic.
pub const MIN_FIX_MS: i64 = 946_684_800_000;
pub const MAX_FIX_MS: i64 = 4_102_444_800_000;

/// How payloads are read and prioritised; the `[codec]` config table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodecSettings {
    /// Payloads larger than this are refused before parsing.
    pub max_payload_bytes: usize,
    /// Below this speed a fix is an idle ping (Low priority).
    pub idle_speed_kmh: f64,
    /// Native `kind` values that mark an idle ping.
    pub ping_kinds: Vec<String>,
    /// Every native `kind` accepted; others are `out_of_range`.
    pub known_kinds: Vec<String>,
    /// Topic patterns naming the vehicle for formats that carry no id.
    pub topic_patterns: Vec<TopicPattern>,
    /// How many recent messages the dedup remembers.
    pub dedup_window: usize,
    /// A fix dated further than this ahead of its receive time is refused
    /// (`clock_ahead`). 600 s: well past the drift of a device without
    /// NTP (seconds to a few minutes) and below the smallest error of
    /// local time sent as UTC (30 min), a week-number rollover or a year.
    pub max_clock_ahead_s: f64,
}

impl Default for CodecSettings {
    fn default() -> Self {
        Self {
            max_payload_bytes: 16 * 1024,
            idle_speed_kmh: 2.0,
            ping_kinds: vec!["ping".into()],
            known_kinds: ["ping", "move", "stop", "start", "alarm", "ignition"]
                .map(String::from)
                .to_vec(),
            topic_patterns: ["owntracks/{user}/{device}", "fleet/{vehicle}/telemetry"]
                .map(|p| TopicPattern::try_from(p.to_owned()).expect("built-in pattern is valid"))
                .to_vec(),
            dedup_window: 65_536,
            max_clock_ahead_s: 600.0,
        }
    }
}

impl CodecSettings {
    pub fn check(&self, problems: &mut crate::problems::Problems) {
        if self.max_payload_bytes == 0 {
            problems.add("codec.max_payload_bytes", "must be ≥ 1");
        }
        if !(self.idle_speed_kmh.is_finite() && self.idle_speed_kmh >= 0.0) {
            problems.add("codec.idle_speed_kmh", "must be a finite number ≥ 0");
        }
        if !(self.max_clock_ahead_s.is_finite() && self.max_clock_ahead_s >= 0.0) {
            problems.add("codec.max_clock_ahead_s", "must be a finite number ≥ 0");
        }
    }

    /// Refuses a fix dated more than `max_clock_ahead_s` after it was
    /// received (both unix ms), naming both times.
    pub fn check_clock(&self, fix_time_ms: i64, received_ms: i64) -> Result<(), DecodeError> {
        let ahead_ms = fix_time_ms.saturating_sub(received_ms);
        if ahead_ms as f64 > self.max_clock_ahead_s * 1000.0 {
            return Err(DecodeError::new(
                Reason::ClockAhead,
                format!(
                    "fix time {fix_time_ms} ms is {:.1} s ahead of its receive time {received_ms} ms (codec.max_clock_ahead_s = {}): the device's clock is wrong",
                    ahead_ms as f64 / 1000.0,
                    self.max_clock_ahead_s
                ),
            ));
        }
        Ok(())
    }
}

/// Every field either format may carry, as the loose reading gives them
/// (and the typed reading converts to). Public so the JSON benchmark
/// (`benches/json.rs`) measures each parser on this very shape.
#[derive(Deserialize, Default)]
pub struct Wire<'a> {
    #[serde(borrow)]
    vehicle: Option<Loose<'a>>,
    #[serde(borrow)]
    ts: Option<Loose<'a>>,
    #[serde(borrow)]
    lat: Option<Loose<'a>>,
    #[serde(borrow)]
    lon: Option<Loose<'a>>,
    #[serde(borrow)]
    speed_kmh: Option<Loose<'a>>,
    #[serde(borrow)]
    kind: Option<Loose<'a>>,
    /// `Some(Loose::Null)` for `"_type": null` (see [`typed::Typed`]).
    #[serde(borrow, rename = "_type", default, deserialize_with = "present")]
    owntracks_type: Option<Loose<'a>>,
    #[serde(borrow)]
    tst: Option<Loose<'a>>,
    #[serde(borrow)]
    vel: Option<Loose<'a>>,
    #[serde(borrow)]
    t: Option<Loose<'a>>,
}

/// A field that is there, `null` included.
fn present<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Loose<'a>>, D::Error> {
    Loose::deserialize(d).map(Some)
}

/// The OwnTracks message types that are not locations
/// (<https://owntracks.org/booklet/tech/json/>): routine traffic, ignored
/// with their type named, never taken for an unknown format.
pub const OWNTRACKS_NOT_LOCATIONS: [&str; 14] = [
    "lwt",
    "transition",
    "waypoint",
    "waypoints",
    "card",
    "cmd",
    "configuration",
    "status",
    "steps",
    "request",
    "encrypted",
    "beacon",
    "dump",
    "clear",
];

/// A stable digest of one message (its topic and payload bytes): what
/// makes a message "the same message again" for the dedup window and the
/// vehicle state, which keeps it across restarts. xxh3: specified, so the
/// same on every build, and fast enough to digest every payload.
pub fn message_digest(topic: &str, payload: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    h.update(&(topic.len() as u64).to_le_bytes());
    h.update(topic.as_bytes());
    h.update(payload);
    h.digest()
}

/// Decodes one MQTT message.
pub fn decode(
    topic: &str,
    payload: &[u8],
    settings: &CodecSettings,
) -> Result<Telemetry, DecodeError> {
    decode_by(Reading::TypedFirst, topic, payload, settings)
}

/// [`decode`] through the loose reading alone, after the same UTF-8 and
/// object checks. Why it exists: it is the reference the typed reading is
/// checked against (the codec's property test and the `decode` fuzz
/// target); nothing else should call it.
#[doc(hidden)]
pub fn decode_loose_only(
    topic: &str,
    payload: &[u8],
    settings: &CodecSettings,
) -> Result<Telemetry, DecodeError> {
    decode_by(Reading::LooseOnly, topic, payload, settings)
}

/// Whether the typed reading is tried first: a switch only so that one
/// body serves both `decode` and its reference.
#[derive(Clone, Copy)]
enum Reading {
    TypedFirst,
    LooseOnly,
}

fn decode_by(
    reading: Reading,
    topic: &str,
    payload: &[u8],
    settings: &CodecSettings,
) -> Result<Telemetry, DecodeError> {
    if payload.is_empty() {
        return Err(DecodeError::new(
            Reason::RetainedClear,
            "empty payload: how MQTT clears a retained message (OwnTracks does so when a device is removed); nothing to evaluate",
        ));
    }
    if payload.len() > settings.max_payload_bytes {
        return Err(DecodeError::new(
            Reason::Oversize,
            format!(
                "{} bytes exceeds max_payload_bytes = {}",
                payload.len(),
                settings.max_payload_bytes
            ),
        ));
    }
    // Checked here, not left to serde_json: it checks the UTF-8 of the
    // strings it reads, but skips an unknown field's string unchecked.
    let json = std::str::from_utf8(payload).map_err(|e| {
        DecodeError::new(
            Reason::MalformedJson,
            format!("not UTF-8: invalid byte at offset {}", e.valid_up_to()),
        )
    })?;
    // Both readings derive `Deserialize` for a struct, which serde also
    // reads from an array of its fields in order: `[...]` of ten values
    // would decode as a fix.
    if !json
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(not_an_object(json));
    }
    let typed = match reading {
        Reading::TypedFirst => typed::read(json),
        Reading::LooseOnly => None,
    };
    let mut wire = match typed {
        Some(wire) => wire,
        // An object serde refused: a repeated key, or not JSON after all.
        None => serde_json::from_str(json)
            .map_err(|e| DecodeError::new(Reason::MalformedJson, e.to_string()))?,
    };
    if wire.vehicle.is_some() {
        let vehicle = vehicle_id(&text(wire.vehicle.take(), "vehicle")?)?;
        native(vehicle, wire, settings)
    } else if wire.owntracks_type.is_none()
        && (wire.ts.is_some() || wire.lat.is_some() || wire.lon.is_some())
    {
        // A native fix without its vehicle field (or with `null`, which the
        // codec reads as absent everywhere): a `{vehicle}` topic may name it.
        let vehicle = topic_vehicle(
            topic,
            settings.topic_patterns.iter().filter(|p| p.names_vehicle()),
            "not in the payload, and the topic",
        )?;
        native(vehicle, wire, settings)
    } else {
        match &wire.owntracks_type {
            Some(Loose::Str(t)) if t == "location" => owntracks(topic, wire, settings),
            Some(Loose::Str(t)) if t == "encrypted" => Err(DecodeError::new(
                Reason::NotALocation,
                "OwnTracks encrypted message: geogate cannot read encrypted payloads (it holds no key); turn encryption off for devices geogate follows",
            )),
            Some(Loose::Str(t)) => Err(DecodeError::new(
                Reason::NotALocation,
                if OWNTRACKS_NOT_LOCATIONS.contains(&t.as_ref()) {
                    format!("OwnTracks {t} message: not a location")
                } else {
                    format!("OwnTracks message of type {t}: not a location")
                },
            )),
            Some(other) => Err(DecodeError::new(
                Reason::WrongType,
                format!(
                    "_type: expected a string naming the OwnTracks message type, got {}",
                    other.type_name()
                ),
            )),
            None => Err(DecodeError::new(
                Reason::UnknownFormat,
                "neither native (has \"vehicle\") nor OwnTracks (has \"_type\": \"location\")",
            )),
        }
    }
}

/// What a payload that does not open an object is: valid JSON of another
/// kind is `unknown_format`, since `malformed_json` would send an operator
/// looking for a syntax error that is not there.
fn not_an_object(text: &str) -> DecodeError {
    let shape = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(_)) => "an array",
        Ok(serde_json::Value::String(_)) => "a string",
        Ok(serde_json::Value::Number(_)) => "a number",
        Ok(serde_json::Value::Bool(_)) => "a boolean",
        Ok(serde_json::Value::Null) => "null",
        // Not reached (the caller found no `{`), but named all the same.
        Ok(serde_json::Value::Object(_)) => "an object",
        Err(e) => return DecodeError::new(Reason::MalformedJson, e.to_string()),
    };
    DecodeError::new(
        Reason::UnknownFormat,
        format!("valid JSON, but {shape}: telemetry is a JSON object"),
    )
}

/// The vehicle a topic pattern names, or `missing_field` saying why not.
fn topic_vehicle<'p>(
    topic: &str,
    mut patterns: impl Iterator<Item = &'p TopicPattern>,
    context: &str,
) -> Result<VehicleId, DecodeError> {
    let vehicle = patterns
        .find_map(|p| p.vehicle(topic))
        .ok_or_else(|| {
            DecodeError::new(
                Reason::MissingField,
                format!(
                    "vehicle: {context} {topic:?} names none (no topic pattern matches, or its vehicle segment is empty)"
                ),
            )
        })?;
    vehicle_id(&vehicle)
}

fn native(
    vehicle: VehicleId,
    wire: Wire,
    settings: &CodecSettings,
) -> Result<Telemetry, DecodeError> {
    let fix_time_ms = fix_time(integer(wire.ts, "ts")?, "ts")?;
    let (lat, lon) = position(wire.lat, wire.lon)?;
    let speed_kmh = optional_number(wire.speed_kmh, "speed_kmh")?;
    let is_ping = match wire.kind {
        None | Some(Loose::Null) => false,
        some => {
            let kind = text(some, "kind")?;
            if !settings.known_kinds.iter().any(|k| *k == kind) {
                return Err(DecodeError::new(
                    Reason::OutOfRange,
                    format!("kind {kind:?} is not one of {:?}", settings.known_kinds),
                ));
            }
            settings.ping_kinds.iter().any(|k| *k == kind)
        }
    };
    let priority = priority(is_ping, speed_kmh, settings);
    Ok(Telemetry {
        vehicle,
        fix_time_ms,
        lat,
        lon,
        speed_kmh,
        priority,
    })
}

fn owntracks(topic: &str, wire: Wire, settings: &CodecSettings) -> Result<Telemetry, DecodeError> {
    let vehicle = topic_vehicle(
        topic,
        settings.topic_patterns.iter(),
        "OwnTracks names it by topic, and",
    )?;
    let tst = integer(wire.tst, "tst")?;
    let fix_time_ms = fix_time(tst.checked_mul(1000).unwrap_or(i64::MAX), "tst")?;
    let (lat, lon) = position(wire.lat, wire.lon)?;
    // iOS reports `vel: -1` (and `cog: -1`) when it does not know them.
    let speed_kmh = optional_number(wire.vel, "vel").or_else(|e| match e.reason {
        Reason::OutOfRange => Ok(None),
        _ => Err(e),
    })?;
    let trigger = match wire.t {
        None | Some(Loose::Null) => None,
        some => Some(text(some, "t")?),
    };
    let is_ping = trigger.as_deref() == Some("p");
    let priority = priority(is_ping, speed_kmh, settings);
    Ok(Telemetry {
        vehicle,
        fix_time_ms,
        lat,
        lon,
        speed_kmh,
        priority,
    })
}

fn priority(is_ping: bool, speed_kmh: Option<f64>, settings: &CodecSettings) -> Priority {
    if is_ping || speed_kmh.is_some_and(|s| s < settings.idle_speed_kmh) {
        Priority::Low
    } else {
        Priority::High
    }
}

fn missing(field: &str) -> DecodeError {
    DecodeError::new(Reason::MissingField, format!("{field} is required"))
}

fn wrong_type(field: &str, expected: &str, got: &Loose) -> DecodeError {
    DecodeError::new(
        Reason::WrongType,
        format!("{field}: expected {expected}, got {}", got.type_name()),
    )
}

/// A string field, borrowed from the payload when it has no escapes.
fn text<'a>(value: Option<Loose<'a>>, field: &str) -> Result<Cow<'a, str>, DecodeError> {
    match value {
        None | Some(Loose::Null) => Err(missing(field)),
        Some(Loose::Str(s)) => Ok(s),
        Some(other) => Err(wrong_type(field, "a string", &other)),
    }
}

/// Checked, then copied once into the id (inline up to 23 bytes).
fn vehicle_id(id: &str) -> Result<VehicleId, DecodeError> {
    check_vehicle_id(id).map_err(|e| DecodeError::new(Reason::BadVehicleId, e.to_string()))?;
    Ok(VehicleId::from(id))
}

/// A number, where the strings "NaN" and "±Infinity" (how some encoders
/// smuggle non-finite floats into JSON) are reported as non-finite.
fn number(value: Option<Loose>, field: &str) -> Result<f64, DecodeError> {
    match value {
        None | Some(Loose::Null) => Err(missing(field)),
        Some(Loose::Int(i)) => Ok(i as f64),
        Some(Loose::Float(f)) if f.is_finite() => Ok(f),
        Some(Loose::Float(_)) => Err(DecodeError::new(
            Reason::NonFinite,
            format!("{field} is not finite"),
        )),
        Some(Loose::Str(s)) if s.parse::<f64>().is_ok_and(|f| !f.is_finite()) => Err(
            DecodeError::new(Reason::NonFinite, format!("{field} is {s:?}")),
        ),
        Some(other) => Err(wrong_type(field, "a number", &other)),
    }
}

fn optional_number(value: Option<Loose>, field: &str) -> Result<Option<f64>, DecodeError> {
    match value {
        None | Some(Loose::Null) => Ok(None),
        some => {
            let v = number(some, field)?;
            if v < 0.0 {
                return Err(DecodeError::new(
                    Reason::OutOfRange,
                    format!("{field} = {v} is negative"),
                ));
            }
            Ok(Some(v))
        }
    }
}

fn integer(value: Option<Loose>, field: &str) -> Result<i64, DecodeError> {
    match value {
        Some(Loose::Int(i)) => Ok(i),
        Some(Loose::Float(f)) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
            Ok(f as i64)
        }
        Some(Loose::Float(f)) if f.is_finite() && f.abs() >= 9.0e15 => Err(DecodeError::new(
            Reason::OutOfRange,
            format!("{field} = {f} is out of range"),
        )),
        Some(Loose::Float(f)) if f.is_finite() => Err(DecodeError::new(
            Reason::WrongType,
            format!("{field}: expected an integer, got {f}"),
        )),
        other => number(other, field).and_then(|_| Err(missing(field))),
    }
}

fn fix_time(ms: i64, field: &str) -> Result<i64, DecodeError> {
    if (MIN_FIX_MS..MAX_FIX_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(DecodeError::new(
            Reason::OutOfRange,
            format!("{field} = {ms} ms is outside 2000-01-01..2100-01-01"),
        ))
    }
}

fn position(lat: Option<Loose>, lon: Option<Loose>) -> Result<(f64, f64), DecodeError> {
    let (lat, lon) = (number(lat, "lat")?, number(lon, "lon")?);
    if !(-90.0..=90.0).contains(&lat) {
        return Err(DecodeError::new(
            Reason::OutOfRange,
            format!("lat = {lat} is outside [-90, 90]"),
        ));
    }
    if !(-180.0..=180.0).contains(&lon) {
        return Err(DecodeError::new(
            Reason::OutOfRange,
            format!("lon = {lon} is outside [-180, 180]"),
        ));
    }
    Ok((lat, lon))
}
