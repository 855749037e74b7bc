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
}

/// The NDJSON line of a partition's transition (without its newline):
/// `seq` counts within `partition`, so (partition, seq) places it.
pub fn partition_line(partition: u32, seq: u64, t: &Transition) -> Vec<u8> {
    let id = transition_id(t);
    let line = Line {
        id: &id,
        partition: Some(partition),
        seq,
        transition: t,
    };
    serde_json::to_vec(&line).expect("strings and integers always serialise")
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
    pub fn new(seq: u64, t: &Transition) -> Self {
        let id = transition_id(t);
        let line = Line {
            id: &id,
            partition: None,
            seq,
            transition: t,
        };
        let line = serde_json::to_vec(&line).expect("strings and integers always serialise");
        Self {
            seq,
            vehicle: t.vehicle.clone(),
            line,
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
            received_ms: 0,
        }
    }

    #[test]
    fn the_id_names_the_transition_not_its_place() {
        let a = OutboxEntry::new(7, &enter(1000));
        let again = OutboxEntry::new(12, &enter(1000));
        let later = OutboxEntry::new(13, &enter(1001));
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
            r#"{"id":"a9d7f2db3af78924c3d55f2fa506feee","seq":7,"vehicle":"v1","fence":"A","event":"enter","ts":1000}"#
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
