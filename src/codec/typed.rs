//! The common payload read straight into typed fields: every field a
//! string without escapes, an integer or a number, or absent or `null`.
//!
//! Why a second reading: [`Loose`] asks serde_json for "any value" at every
//! field, so that a wrong type can be named rather than refused; paying
//! that dispatch on every message cost 14% of a decode's instructions
//! (BENCHMARKS.md, "Instructions per message"). Here serde_json is told
//! each field's type instead. A payload this reading refuses for any
//! reason (bad JSON, a wrong type, an escaped string, a repeated key) is
//! read again through [`Loose`], so every refusal keeps the reason and
//! detail the loose reading gives it. What this reading accepts becomes
//! the same [`Wire`] the loose reading would have built, so the checks
//! after it are shared: `codec`'s tests and the `decode` fuzz target hold
//! the two readings to the same result on any input.

use super::Wire;
use super::loose::Loose;
use serde::Deserialize;
use std::borrow::Cow;

/// Every field either format may carry, each of the one type the common
/// payload gives it. Public so the JSON benchmark (`benches/json.rs`)
/// measures each parser on this very shape too.
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
    #[serde(borrow, rename = "_type")]
    owntracks_type: Option<&'a str>,
    tst: Option<i64>,
    vel: Option<f64>,
    #[serde(borrow)]
    t: Option<&'a str>,
}

/// The payload as [`Wire`], or `None` when only the loose reading can say
/// what it is. Valid UTF-8 is checked once for the whole payload, not per
/// string as a byte reader must.
pub(super) fn read(payload: &[u8]) -> Option<Wire<'_>> {
    let utf8 = std::str::from_utf8(payload).ok()?;
    let typed: Typed = serde_json::from_str(utf8).ok()?;
    Some(Wire {
        vehicle: string(typed.vehicle),
        ts: typed.ts.map(Loose::Int),
        lat: typed.lat.map(Loose::Float),
        lon: typed.lon.map(Loose::Float),
        speed_kmh: typed.speed_kmh.map(Loose::Float),
        kind: string(typed.kind),
        owntracks_type: string(typed.owntracks_type),
        tst: typed.tst.map(Loose::Int),
        vel: typed.vel.map(Loose::Float),
        t: string(typed.t),
    })
}

fn string(value: Option<&str>) -> Option<Loose<'_>> {
    value.map(|s| Loose::Str(Cow::Borrowed(s)))
}
