//! The nouns every module shares.

use serde::Serialize;
use std::sync::Arc;

/// A vehicle's id as it appears on the wire. Inline up to 23 bytes (longer
/// ids are shared), because every fix decodes one, and an id allocated on
/// the decode lane and freed on another thread slowed the whole pipeline
/// (docs/decisions/0009-inline-vehicle-ids-borrowed-topic-ids.md).
pub type VehicleId = smol_str::SmolStr;

/// Longest vehicle id accepted, in bytes.
pub const MAX_VEHICLE_ID_BYTES: usize = 128;

/// Why a string is not a vehicle id.
///
/// The form: 1 to [`MAX_VEHICLE_ID_BYTES`] bytes of UTF-8 with no control
/// character (U+0000–U+001F, U+007F–U+009F), no Unicode noncharacter
/// (U+FDD0–U+FDEF, and the last two code points of every plane) and no
/// MQTT wildcard (`+`, `#`). Everything real devices send fits: OwnTracks
/// user and device names (`ann/phone`, an iPhone's `Ann’s iPhone`), IMEIs,
/// fleet ids. What it keeps out is what breaks a downstream publish: the
/// id is a level of `geogate/events/{vehicle}`, and MQTT forbids U+0000 in
/// a topic and says controls and noncharacters should not be there, so a
/// broker may drop the connection that sends them (and the client sends
/// that publish first again after every reconnect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VehicleIdError {
    #[error("vehicle id is empty")]
    Empty,
    #[error("vehicle id is {0} bytes, past the {MAX_VEHICLE_ID_BYTES} allowed")]
    TooLong(usize),
    #[error("vehicle id holds {what} U+{code:04X} at byte {at}")]
    Character {
        what: &'static str,
        code: u32,
        at: usize,
    },
}

/// Checks `id` against the form [`VehicleIdError`] states.
pub fn check_vehicle_id(id: &str) -> Result<(), VehicleIdError> {
    if id.is_empty() {
        return Err(VehicleIdError::Empty);
    }
    if id.len() > MAX_VEHICLE_ID_BYTES {
        return Err(VehicleIdError::TooLong(id.len()));
    }
    // Plain ASCII letters, digits and punctuation other than the
    // wildcards are most ids: one pass over the bytes settles them.
    if id
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'+' && b != b'#')
    {
        return Ok(());
    }
    for (at, c) in id.char_indices() {
        let code = u32::from(c);
        let what = if c.is_control() {
            "a control character"
        } else if (0xFDD0..=0xFDEF).contains(&code) || code & 0xFFFE == 0xFFFE {
            "a Unicode noncharacter"
        } else if c == '+' || c == '#' {
            "an MQTT wildcard"
        } else {
            continue;
        };
        return Err(VehicleIdError::Character { what, code, at });
    }
    Ok(())
}

/// A fence's stable id from its GeoJSON feature.
pub type FenceId = Arc<str>;

/// Whether an event may be shed above the watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// An idle ping: may be shed by the gate under load.
    Low,
    /// Anything else: never shed, waits for room instead.
    High,
}

impl Priority {
    pub fn as_str(&self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::High => "high",
        }
    }
}

/// One decoded position report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Telemetry {
    pub vehicle: VehicleId,
    /// Fix time from the device, unix milliseconds. Data, never a gate clock.
    pub fix_time_ms: i64,
    pub lat: f64,
    pub lon: f64,
    pub speed_kmh: Option<f64>,
    /// From `kind` (native) or the trigger `t` (OwnTracks) and the speed;
    /// the kind itself is checked but not kept: nothing downstream reads
    /// it, and copying it cost an allocation per message.
    pub priority: Priority,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_real_devices_send_are_accepted() {
        for id in [
            "van7",
            "ann/phone",
            "Ann\u{2019}s iPhone",
            "356938035643809",
            "fleet-7.van_3:A@depot",
            "Zo\u{eb}",
            "\u{8eca}\u{4e21}1",
            "\u{1f69a}42",
            &"x".repeat(MAX_VEHICLE_ID_BYTES),
        ] {
            assert_eq!(check_vehicle_id(id), Ok(()), "{id:?}");
        }
    }

    #[test]
    fn each_class_of_bad_id_is_refused_by_name() {
        let class = |id: &str| match check_vehicle_id(id) {
            Err(VehicleIdError::Character { what, .. }) => what,
            Err(VehicleIdError::Empty) => "empty",
            Err(VehicleIdError::TooLong(_)) => "too long",
            Ok(()) => "accepted",
        };
        assert_eq!(class(""), "empty");
        assert_eq!(class(&"x".repeat(MAX_VEHICLE_ID_BYTES + 1)), "too long");
        for c in ['\0', '\u{1}', '\n', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}'] {
            assert_eq!(class(&format!("v{c}1")), "a control character", "{c:?}");
        }
        for c in [
            '\u{fdd0}',
            '\u{fdef}',
            '\u{fffe}',
            '\u{ffff}',
            '\u{1fffe}',
            '\u{10ffff}',
        ] {
            assert_eq!(class(&format!("v{c}1")), "a Unicode noncharacter", "{c:?}");
        }
        for c in ['+', '#'] {
            assert_eq!(class(&format!("v{c}1")), "an MQTT wildcard");
        }
        assert_eq!(
            check_vehicle_id("van\u{0}7"),
            Err(VehicleIdError::Character {
                what: "a control character",
                code: 0,
                at: 3
            })
        );
    }

    proptest! {
        /// The ASCII shortcut decides as the character-by-character check
        /// does.
        #[test]
        fn the_ascii_shortcut_agrees(id in "[\\x00-\\x7f]{1,40}") {
            let slow = id.chars().all(|c| !c.is_control() && c != '+' && c != '#');
            prop_assert_eq!(check_vehicle_id(&id).is_ok(), slow);
        }
    }
}
