//! A partition's state exactly as its log replays to: the vehicle records
//! and held fixes as committed, the input position, the next transition
//! seq and the totals. A new owner builds it by reading the log from its
//! base; the owner keeps it current commit by commit, so a snapshot is
//! this mirror written out, and equals what replaying the log gives.

use super::commit_body::{CommitBody, Kind, Totals};
use crate::geofence::{HeldChange, HeldFix, VehicleSnapshot};
use crate::model::VehicleId;
use crate::state::local::held_batch::{self, HeldBatch};
use crate::state::local::record;
use crate::state::local::store::with_held;
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Mirror {
    pub records: HashMap<VehicleId, Vec<u8>>,
    /// Held fixes by their key.
    pub waiting: HashMap<u64, (VehicleId, HeldFix)>,
    pub input_through: u64,
    pub next_seq: u64,
    pub totals: Totals,
    /// The first part of the latest complete snapshot (0: none).
    pub base: u64,
    /// The last commit applied.
    pub last: u64,
    /// Batch commits with transitions, oldest first: (commit, lines). The
    /// owner drops them once the events stream holds them.
    pub unpublished: Vec<(u64, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("commit {seq}: held fixes: {detail}")]
    Held { seq: u64, detail: String },
    #[error("vehicle {vehicle}: {detail}")]
    Record { vehicle: VehicleId, detail: String },
}

impl Mirror {
    /// Takes in commit `seq`.
    pub fn apply(&mut self, seq: u64, body: &CommitBody) -> Result<(), MirrorError> {
        for (id, record) in &body.vehicles {
            match record {
                Some(record) => {
                    self.records.insert(id.clone(), record.clone());
                }
                None => {
                    self.records.remove(id);
                }
            }
        }
        held_batch::replay(&body.held, &mut self.waiting).map_err(|e| MirrorError::Held {
            seq,
            detail: e.to_string(),
        })?;
        // Every kind carries the position, seq and totals as of itself.
        self.input_through = body.input_through;
        self.next_seq = body.next_seq;
        self.totals = body.totals;
        // An owner writes a batch or a snapshot only once the events stream
        // holds every commit before it; a takeover comes before the new
        // owner publishes what the last one left.
        if body.kind != Kind::Takeover {
            self.unpublished.clear();
        }
        if !body.lines.is_empty() {
            self.unpublished.push((seq, body.lines.clone()));
        }
        self.base = body.base;
        self.last = seq;
        Ok(())
    }

    /// Every vehicle with its held fixes in its window.
    pub fn vehicles(&self) -> Result<Vec<(VehicleId, VehicleSnapshot)>, MirrorError> {
        let mut vehicles = Vec::with_capacity(self.records.len());
        for (id, bytes) in &self.records {
            let snapshot = record::decode(bytes).map_err(|e| MirrorError::Record {
                vehicle: id.clone(),
                detail: e.to_string(),
            })?;
            vehicles.push((id.clone(), snapshot));
        }
        let mut held: Vec<(u64, &(VehicleId, HeldFix))> =
            self.waiting.iter().map(|(k, v)| (*k, v)).collect();
        held.sort_unstable_by_key(|(k, _)| *k);
        Ok(with_held(
            vehicles,
            held.into_iter()
                .map(|(_, (v, h))| (v.clone(), *h))
                .collect(),
        ))
    }

    /// The key after every held fix's: where a new owner numbers from.
    pub fn next_held_key(&self) -> u64 {
        self.waiting.keys().max().map_or(1, |k| k + 1)
    }

    /// The mirror as snapshot commits of at most about `max_bytes` each
    /// (the first marked as such), written by `owner`. Replayed from
    /// anywhere before them, they change nothing: each puts back what the
    /// state already holds.
    pub fn snapshot(&self, owner: &str, max_bytes: usize) -> Vec<CommitBody> {
        let part = |kind| CommitBody {
            kind,
            base: self.base,
            input_through: self.input_through,
            next_seq: self.next_seq,
            totals: self.totals,
            vehicles: Vec::new(),
            held: Vec::new(),
            lines: Vec::new(),
            owner: owner.to_owned(),
        };
        let mut parts = vec![part(Kind::SnapshotFirst)];
        let mut size = 0;
        for (id, record) in &self.records {
            if size >= max_bytes {
                parts.push(part(Kind::SnapshotPart));
                size = 0;
            }
            size += id.len() + record.len() + 4;
            if let Some(last) = parts.last_mut() {
                last.vehicles.push((id.clone(), Some(record.clone())));
            }
        }
        let mut held = HeldBatch::default();
        let mut keys: Vec<&u64> = self.waiting.keys().collect();
        keys.sort_unstable();
        for key in keys {
            if size >= max_bytes {
                if let Some(last) = parts.last_mut() {
                    last.held = std::mem::take(&mut held.bytes);
                }
                held.clear();
                parts.push(part(Kind::SnapshotPart));
                size = 0;
            }
            let (vehicle, fix) = &self.waiting[key];
            size += vehicle.len() + 48;
            held.extend(&[HeldChange::Held(vehicle.clone(), *fix)]);
        }
        if let Some(last) = parts.last_mut() {
            last.held = held.bytes;
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(key: u64, fix_ms: i64) -> HeldFix {
        HeldFix {
            fix_ms,
            lat: 40.7,
            lon: -74.0,
            received_ms: fix_ms + 5,
            digest: key * 31,
            key,
        }
    }

    fn batch(vehicles: Vec<(VehicleId, Option<Vec<u8>>)>, held: &[HeldChange]) -> CommitBody {
        CommitBody {
            kind: Kind::Batch,
            base: 0,
            input_through: 9,
            next_seq: 3,
            totals: Totals::default(),
            vehicles,
            held: HeldBatch::from_changes(held).bytes,
            lines: b"{}\n".to_vec(),
            owner: "a".into(),
        }
    }

    fn record_of(last_fix_ms: i64) -> Vec<u8> {
        let mut bytes = Vec::new();
        record::encode(
            &VehicleSnapshot {
                last_fix_ms,
                last_heard_ms: last_fix_ms,
                ..VehicleSnapshot::default()
            },
            &mut bytes,
        );
        bytes
    }

    /// A snapshot replays to the mirror it was written from, alone or
    /// after the commits it summarises, in parts of any size.
    #[test]
    fn a_snapshot_replays_to_the_state_it_was_written_from() {
        let mut mirror = Mirror::default();
        let v = |n: u32| VehicleId::from(format!("v{n}"));
        let mut log = Vec::new();
        for n in 0..40u32 {
            let mut held = vec![HeldChange::Held(v(n), fix(u64::from(n) + 1, i64::from(n)))];
            if n % 3 == 0 && n > 0 {
                held.push(HeldChange::Left(u64::from(n)));
            }
            let gone = (n % 7 == 6).then(|| (v(n - 1), None));
            let mut vehicles = vec![(v(n), Some(record_of(i64::from(n))))];
            vehicles.extend(gone);
            log.push(batch(vehicles, &held));
        }
        for (seq, body) in log.iter().enumerate() {
            mirror.apply(seq as u64 + 1, body).unwrap();
        }
        for max_bytes in [0, 100, 1 << 20] {
            let parts = mirror.snapshot("b", max_bytes);
            assert_eq!(parts[0].kind, Kind::SnapshotFirst);
            let mut fresh = Mirror::default();
            let mut again = Mirror::default();
            for body in &log {
                again.apply(1, body).unwrap();
            }
            for part in &parts {
                fresh.apply(100, part).unwrap();
                again.apply(100, part).unwrap();
            }
            for m in [&fresh, &again] {
                assert_eq!(m.records, mirror.records, "parts of {max_bytes} bytes");
                assert_eq!(m.waiting, mirror.waiting, "parts of {max_bytes} bytes");
            }
            assert_eq!(fresh.next_held_key(), mirror.next_held_key());
        }
        let vehicles = mirror.vehicles().unwrap();
        let mut named: std::collections::HashSet<&VehicleId> = mirror.records.keys().collect();
        named.extend(mirror.waiting.values().map(|(v, _)| v));
        assert_eq!(vehicles.len(), named.len());
        assert_eq!(
            vehicles.iter().map(|(_, s)| s.window.len()).sum::<usize>(),
            mirror.waiting.len()
        );
    }
}
