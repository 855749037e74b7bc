//! Transitions as they leave geogate: one NDJSON line each, carrying a
//! sequence number (its place in the outbox, gap-free and increasing across
//! restarts) and a stable `id`.
//!
//! The id is a hash of what the transition is (vehicle, fence, kind, fix
//! time), not of when it was produced: a fix evaluated again after a crash
//! before its commit produces the same transition with the same id, so a
//! consumer that keeps the ids it has seen drops every repeat, whichever
//! path (MQTT redelivery, a replayed outbox) it came by.

use crate::geofence::Transition;
use crate::model::VehicleId;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One committed transition, ready for the file and MQTT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    pub seq: u64,
    /// For the MQTT topic `geogate/events/{vehicle}`.
    pub vehicle: VehicleId,
    /// The JSON line, without its newline.
    pub line: Vec<u8>,
    /// When it was committed, in Unix ms on the receive clock: an output's
    /// maximum age counts from here. 0 when unknown (a store from before
    /// it was kept, a line read back from the events file): the output
    /// then counts from when it first saw the entry.
    pub committed_ms: i64,
}

#[derive(Serialize)]
struct Line<'a> {
    id: &'a str,
    /// With partitioned state: the partition, whose own seqs these are.
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<u32>,
    seq: u64,
    #[serde(flatten)]
    transition: &'a Transition,
    #[serde(skip_serializing_if = "Option::is_none")]
    properties: Option<&'a serde_json::Map<String, Value>>,
    /// How many selected properties did not fit under the cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    properties_omitted: Option<usize>,
}

/// Most bytes a line's `properties` object takes, as JSON: a fence's
/// properties can be anything its author put there (Natural Earth's
/// countries carry 3 KB each), and every enter and exit carries them.
pub const PROPERTIES_MAX_BYTES: usize = 1024;

/// Which of a fence's GeoJSON properties its events carry
/// (`[events] fence_properties`): none by default, the keys listed, or
/// every one (`["*"]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FenceProperties {
    keys: Vec<String>,
}

impl FenceProperties {
    pub fn new(keys: Vec<String>) -> Self {
        Self { keys }
    }

    fn all(&self) -> bool {
        self.keys.iter().any(|k| k == "*")
    }

    /// The selected properties of `props` that fit in
    /// [`PROPERTIES_MAX_BYTES`], tried in the order listed (for `*`, key
    /// order),
    /// and how many did not fit; `None` when none is selected or present.
    fn select(&self, props: &serde_json::Map<String, Value>) -> Option<(Map, usize)> {
        if self.keys.is_empty() || props.is_empty() {
            return None;
        }
        let wanted: Vec<(&String, &Value)> = if self.all() {
            props.iter().collect()
        } else {
            self.keys
                .iter()
                .filter_map(|k| props.get_key_value(k.as_str()))
                .collect()
        };
        if wanted.is_empty() {
            return None;
        }
        let mut kept = Map::new();
        // `{}`, then each pair with its comma.
        let mut bytes: usize = 2;
        let mut omitted = 0;
        for (key, value) in wanted {
            // Serialising a string or a JSON value cannot fail.
            let size = |json: serde_json::Result<String>| json.map_or(usize::MAX, |j| j.len());
            let pair = size(serde_json::to_string(key))
                .saturating_add(size(serde_json::to_string(value)))
                .saturating_add(1 + usize::from(!kept.is_empty()));
            if bytes.saturating_add(pair) > PROPERTIES_MAX_BYTES {
                omitted += 1;
                continue;
            }
            bytes += pair;
            kept.insert(key.clone(), value.clone());
        }
        Some((kept, omitted))
    }
}

type Map = serde_json::Map<String, Value>;

/// The line of `t` (without its newline), carrying the selected
/// properties of its fence.
fn line_of(
    partition: Option<u32>,
    seq: u64,
    t: &Transition,
    properties: &FenceProperties,
) -> Vec<u8> {
    let id = transition_id(t);
    let selected = t
        .source
        .as_ref()
        .and_then(|source| properties.select(&source.properties));
    let line = Line {
        id: &id,
        partition,
        seq,
        transition: t,
        properties: selected.as_ref().map(|(kept, _)| kept),
        properties_omitted: selected.as_ref().map(|(_, n)| *n).filter(|&n| n > 0),
    };
    serde_json::to_vec(&line).expect("strings, integers and JSON values always serialise")
}

/// The NDJSON line of a partition's transition (without its newline):
/// `seq` counts within `partition`, so (partition, seq) places it.
pub fn partition_line(
    partition: u32,
    seq: u64,
    t: &Transition,
    properties: &FenceProperties,
) -> Vec<u8> {
    line_of(Some(partition), seq, t, properties)
}

/// 128 bits of SHA-256 over the transition's identity, as hex.
pub fn transition_id(t: &Transition) -> String {
    let mut h = Sha256::new();
    for part in [
        t.vehicle.as_bytes(),
        t.fence.as_bytes(),
        t.event.as_str().as_bytes(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(t.ts.to_le_bytes());
    let digest = h.finalize();
    // One allocation for the id, not a `format!` per byte.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(32);
    for b in &digest[..16] {
        id.push(HEX[usize::from(b >> 4)].into());
        id.push(HEX[usize::from(b & 0xf)].into());
    }
    id
}

impl OutboxEntry {
    pub fn new(seq: u64, t: &Transition, properties: &FenceProperties) -> Self {
        Self {
            seq,
            vehicle: t.vehicle.clone(),
            line: line_of(None, seq, t, properties),
            committed_ms: 0,
        }
    }

    /// The same entry, committed at `ms`.
    pub fn committed_at(self, ms: i64) -> Self {
        Self {
            committed_ms: ms,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::TransitionKind;

    fn enter(ts: i64) -> Transition {
        Transition {
            vehicle: "v1".into(),
            fence: "A".into(),
            event: TransitionKind::Enter,
            ts,
            cause: None,
            fence_version: 3,
            received_ms: 0,
            source: None,
        }
    }

    fn none() -> FenceProperties {
        FenceProperties::default()
    }

    fn with_properties(props: Value) -> Transition {
        let source = crate::geofence::FenceSource {
            feature: String::new(),
            properties: props.as_object().cloned().unwrap_or_default(),
        };
        Transition {
            source: Some(std::sync::Arc::new(source)),
            ..enter(1000)
        }
    }

    fn line_json(t: &Transition, properties: &FenceProperties) -> Value {
        serde_json::from_slice(&OutboxEntry::new(1, t, properties).line).unwrap()
    }

    #[test]
    fn events_carry_the_properties_chosen() {
        let t = with_properties(serde_json::json!({"site": "Hub 4", "customer": "ACME", "n": 7}));
        let keys = |k: &[&str]| FenceProperties::new(k.iter().map(|s| s.to_string()).collect());
        assert_eq!(line_json(&t, &none()).get("properties"), None);
        let chosen = line_json(&t, &keys(&["site", "absent", "n"]));
        assert_eq!(
            chosen["properties"],
            serde_json::json!({"site": "Hub 4", "n": 7})
        );
        assert_eq!(chosen.get("properties_omitted"), None);
        assert_eq!(chosen["fence_version"], 3);
        let all = line_json(&t, &keys(&["*"]));
        assert_eq!(all["properties"].as_object().map(|m| m.len()), Some(3));
        assert_eq!(line_json(&t, &keys(&["absent"])).get("properties"), None);
    }

    proptest::proptest! {
        /// Whatever a fence's properties hold, an event's `properties`
        /// stays within the cap, and what it drops is counted.
        #[test]
        fn properties_stay_under_the_cap(
            props in proptest::collection::btree_map("[a-z]{1,12}", "\\PC{0,600}", 0..12),
        ) {
            let map: Map = props.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect();
            let t = with_properties(Value::Object(map));
            let line = line_json(&t, &FenceProperties::new(vec!["*".into()]));
            let kept = line.get("properties").map_or(0, |p| p.as_object().map_or(0, |m| m.len()));
            let omitted = line.get("properties_omitted").and_then(Value::as_u64).unwrap_or(0) as usize;
            proptest::prop_assert_eq!(kept + omitted, props.len());
            if let Some(p) = line.get("properties") {
                proptest::prop_assert!(p.to_string().len() <= PROPERTIES_MAX_BYTES);
            }
        }
    }

    #[test]
    fn the_id_names_the_transition_not_its_place() {
        let a = OutboxEntry::new(7, &enter(1000), &none());
        let again = OutboxEntry::new(12, &enter(1000), &none());
        let later = OutboxEntry::new(13, &enter(1001), &none());
        let line = |e: &OutboxEntry| serde_json::from_slice::<serde_json::Value>(&e.line).unwrap();
        assert_eq!(line(&a)["id"], line(&again)["id"]);
        assert_ne!(line(&a)["id"], line(&later)["id"]);
        assert_eq!(line(&a)["seq"], 7);
        assert_eq!(line(&a)["vehicle"], "v1");
        assert_eq!(line(&a)["event"], "enter");
        assert_eq!(line(&a)["id"].as_str().map(str::len), Some(32));
        // The line as consumers of the events file read it, byte for byte;
        // the id worked out independently (Python's hashlib over the same
        // length-prefixed fields).
        assert_eq!(
            String::from_utf8_lossy(&a.line),
            r#"{"id":"a9d7f2db3af78924c3d55f2fa506feee","seq":7,"vehicle":"v1","fence":"A","event":"enter","ts":1000,"fence_version":3}"#
        );
        // Field boundaries count: ("ab","c") is not ("a","bc").
        let split = |v: &str, f: &str| {
            transition_id(&Transition {
                vehicle: v.into(),
                fence: f.into(),
                ..enter(1)
            })
        };
        assert_ne!(split("ab", "c"), split("a", "bc"));
    }
}
