//! The ordinary payload read straight into typed fields: every field a
//! string without escapes, an integer (the fix times) or a number, or
//! absent or `null`.
//!
//! Why a second reading: [`Loose`] asks serde_json for "any value" at every
//! field, so that a wrong type can be named rather than refused; reading
//! an ordinary payload this way instead made a decode 1.36× (native) and
//! 1.44× (OwnTracks) faster
//! (docs/decisions/0004-typed-serde-json-reading-first.md). Here
//! serde_json is told each field's type. A payload
//! this reading refuses for any reason (bad JSON, a wrong type, an escaped
//! string, a repeated key) is read again through [`Loose`], so every
//! refusal keeps the reason and detail the loose reading gives it.
//!
//! Why what it accepts matches the loose reading: both derive from the
//! same field names over the same parser, so they skip unknown fields,
//! refuse repeats and end the input alike; a field absent or `null` is
//! `None` in both; an unescaped string is borrowed by both; an `i64` is
//! accepted only from the integers the loose reading keeps as
//! `Loose::Int` (serde_json hands `-0`, fractions, exponents and integers
//! past `u64` over as floats, and `i64` refuses those and anything past
//! `i64::MAX`); and an `f64` from an integer is `v as f64`, which is what
//! the codec makes of a `Loose::Int`. `decode_loose_only` is the
//! reference: `tests/codec.rs` and the `decode` fuzz target check the two
//! against each other.

use super::Wire;
use super::loose::Loose;
use serde::Deserialize;
use std::borrow::Cow;

/// Every field either format may carry, each of the one type an ordinary
/// payload gives it; public for the same reason as [`Wire`].
#[derive(Deserialize)]
pub struct Typed<'a> {
    #[serde(borrow)]
    vehicle: Option<&'a str>,
    ts: Option<i64>,
    lat: Option<f64>,
    lon: Option<f64>,
    speed_kmh: Option<f64>,
    #[serde(borrow)]
    kind: Option<&'a str>,
    /// `Some(None)` for `"_type": null`, which names an OwnTracks message
    /// (with a bad type), where an absent `_type` does not.
    #[serde(borrow, rename = "_type", default, deserialize_with = "present")]
    owntracks_type: Option<Option<&'a str>>,
    tst: Option<i64>,
    vel: Option<f64>,
    #[serde(borrow)]
    t: Option<&'a str>,
}

/// The payload as [`Wire`], or `None` when only the loose reading can say
/// what it is. Public so the codec's tests can tell that this reading,
/// not only the fallback, is what their payloads exercise.
pub fn read(text: &str) -> Option<Wire<'_>> {
    let typed: Typed = serde_json::from_str(text).ok()?;
    Some(Wire {
        vehicle: borrowed_str(typed.vehicle),
        ts: typed.ts.map(Loose::Int),
        lat: typed.lat.map(Loose::Float),
        lon: typed.lon.map(Loose::Float),
        speed_kmh: typed.speed_kmh.map(Loose::Float),
        kind: borrowed_str(typed.kind),
        owntracks_type: typed
            .owntracks_type
            .map(|t| borrowed_str(t).unwrap_or(Loose::Null)),
        tst: typed.tst.map(Loose::Int),
        vel: typed.vel.map(Loose::Float),
        t: borrowed_str(typed.t),
    })
}

/// A field that is there, `null` included.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

fn borrowed_str(value: Option<&str>) -> Option<Loose<'_>> {
    value.map(|s| Loose::Str(Cow::Borrowed(s)))
}
