//! Any topic and payload: decode must return Ok or a reasoned error, never
//! panic, and an Ok fix must hold in-range, finite coordinates. The typed
//! reading decode tries first must give what the loose reading alone
//! gives, fix or refusal, word for word.
#![no_main]

use geogate::codec::{CodecSettings, decode, decode_loose_only};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte picks a topic; the rest is the payload.
    let topics = ["fleet/v1/telemetry", "owntracks/ann/phone", "owntracks//x", "x", ""];
    let (topic, payload) = match data.split_first() {
        Some((b, rest)) => (topics[*b as usize % topics.len()], rest),
        None => ("x", data),
    };
    let settings = CodecSettings::default();
    let decoded = decode(topic, payload, &settings);
    // Debug, not ==: it tells -0.0 from 0.0.
    assert_eq!(
        format!("{decoded:?}"),
        format!("{:?}", decode_loose_only(topic, payload, &settings))
    );
    if let Ok(fix) = decoded {
        assert!(fix.lat.is_finite() && (-90.0..=90.0).contains(&fix.lat));
        assert!(fix.lon.is_finite() && (-180.0..=180.0).contains(&fix.lon));
        assert!(!fix.vehicle.is_empty());
    }
});
