//! Any text as a fence file: loading must return fences or a list of
//! defects, never panic; loaded fences must answer containment queries.
#![no_main]

use geo::Coord;
use geogate::geofence::{FenceIndex, parse_fences};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(fences) = parse_fences(text) {
        let index = FenceIndex::new(fences);
        let mut out = Vec::new();
        for (x, y) in [(0.0, 0.0), (10.0, 50.0), (-179.9, -89.9), (180.0, 90.0)] {
            index.containing(Coord { x, y }, &mut out);
        }
    }
});
