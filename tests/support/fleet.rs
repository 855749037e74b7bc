//! A deterministic fleet (native and OwnTracks payloads) crossing four
//! fences (plain A and B, C with a dwell, D with hysteresis), and the ways
//! the crash and scale-out tests compare runs of it.

use super::geogate::Message;
use std::collections::{BTreeMap, BTreeSet};

pub const T0: i64 = 1_750_000_000_000;
pub const VEHICLES: i64 = 24;
pub const FIXES: i64 = 24;

/// A and B as in the other tests, C (dwell 2.5 s) and D (hysteresis 150 m)
/// further east along the same street (lat 50.005).
pub const FENCES: &str = r#"{"type":"FeatureCollection","features":[
 {"type":"Feature","id":"A","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.00,50.00],[10.01,50.00],[10.01,50.01],[10.00,50.01],[10.00,50.00]]]}},
 {"type":"Feature","id":"B","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.02,50.00],[10.03,50.00],[10.03,50.01],[10.02,50.01],[10.02,50.00]]]}},
 {"type":"Feature","id":"C","properties":{"dwell_s":2.5},"geometry":{"type":"Polygon","coordinates":[[[10.04,50.00],[10.05,50.00],[10.05,50.01],[10.04,50.01],[10.04,50.00]]]}},
 {"type":"Feature","id":"D","properties":{"hysteresis_m":150},"geometry":{"type":"Polygon","coordinates":[[[10.06,50.00],[10.07,50.00],[10.07,50.01],[10.06,50.01],[10.06,50.00]]]}}]}"#;

/// One lap, a fix a second: outside; A; between; B; four fixes in C (the
/// fourth confirms the dwell); D; just outside D and just inside its edge
/// (both within the hysteresis: no change); far outside D.
pub const LAP: [f64; 12] = [
    9.995, 10.005, 10.015, 10.025, 10.045, 10.045, 10.046, 10.045, 10.065, 10.0705, 10.0695, 10.08,
];

/// Fix `k` of vehicle `v`: each vehicle starts its lap at a different
/// point, so any instant finds some in a pending dwell or in D's band.
pub fn fix(v: i64, k: i64) -> Message {
    let ts = T0 + 1000 * k;
    let lon = LAP[((v + k) % LAP.len() as i64) as usize];
    if v % 2 == 0 {
        super::geogate::native(&format!("n{v}"), ts, 50.005, lon, 40.0, "move")
    } else {
        (
            format!("owntracks/o{v}/car"),
            format!(
                r#"{{"_type":"location","lat":50.005,"lon":{lon},"tst":{},"vel":40,"t":"u"}}"#,
                ts / 1000
            )
            .into_bytes(),
        )
    }
}

/// Rounds of fixes: fix k of every vehicle, then fix k + 1.
pub fn fleet(rounds: std::ops::Range<i64>) -> Vec<Message> {
    rounds
        .flat_map(|k| (0..VEHICLES).map(move |v| fix(v, k)))
        .collect()
}

/// (vehicle, fence, event, ts) → (count, ids seen).
pub type Multiset = BTreeMap<(String, String, String, i64), Vec<String>>;

pub fn multiset(events: &[serde_json::Value]) -> Multiset {
    let mut out = Multiset::new();
    for e in events {
        let key = (
            e["vehicle"].as_str().unwrap_or("").to_owned(),
            e["fence"].as_str().unwrap_or("").to_owned(),
            e["event"].as_str().unwrap_or("").to_owned(),
            e["ts"].as_i64().unwrap_or(0),
        );
        out.entry(key)
            .or_default()
            .push(e["id"].as_str().unwrap_or("").to_owned());
    }
    out
}

/// Every line has the next seq, starting at 1: nothing skipped or repeated.
pub fn assert_seqs_gap_free(events: &[serde_json::Value], what: &str) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e["seq"].as_u64(),
            Some(i as u64 + 1),
            "{what}: line {} has seq {}",
            i + 1,
            e["seq"]
        );
    }
}

/// Differences between `got` and `want`, for a failure message.
pub fn diff(got: &Multiset, want: &Multiset) -> String {
    let keys: BTreeSet<_> = got.keys().chain(want.keys()).collect();
    keys.into_iter()
        .filter(|k| got.get(*k).map(Vec::len) != want.get(*k).map(Vec::len))
        .take(20)
        .map(|k| {
            format!(
                "{k:?}: {} time(s), want {}",
                got.get(k).map_or(0, Vec::len),
                want.get(k).map_or(0, Vec::len)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every (vehicle, fence, event, ts), sorted, repeats kept.
pub fn transitions(events: &[serde_json::Value]) -> Vec<(String, String, String, i64)> {
    let mut out: Vec<_> = multiset(events)
        .into_iter()
        .flat_map(|(key, ids)| std::iter::repeat_n(key, ids.len()))
        .collect();
    out.sort();
    out
}
