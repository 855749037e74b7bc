//! A batch's changes to a durable store's log of held fixes
//! ([`HeldChange`]), packed by the shard that made them: the bytes the
//! store appends as they are, and the keys they touch as runs, which is
//! all the store reads of them.
//!
//! Why packed in the shard: a window changes the log with every fix (it
//! enters, and a window later it leaves), and the committer, one thread
//! for every shard, is what limits a durable pipeline's rate. Packed there,
//! a fix cost the committer more than its vehicle's record did
//! (docs/decisions/0021-held-fixes-log.md).
//!
//! Layout: each change in order, as `1`, varint key, varint length +
//! vehicle id, and the fix as [`record::encode_held`] writes it (a fix
//! that entered a window); or `2`, varint first key, varint count (a run of
//! fixes with consecutive keys that left: a shard's fixes mostly leave in
//! the order they came, so a run is mostly a whole batch's).

use super::record::{self, Reader, RecordError, put_str, put_varint};
use crate::geofence::{HeldChange, HeldFix};
use crate::model::VehicleId;
use std::collections::HashMap;

const ENTERED: u8 = 1;
const LEFT: u8 = 2;

/// Consecutive keys that entered, or left, together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldRun {
    Entered { first: u64, count: u64 },
    Left { first: u64, count: u64 },
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct HeldBatch {
    /// The changes, packed.
    pub bytes: Vec<u8>,
    /// The keys they touch, in the same order.
    pub runs: Vec<HeldRun>,
}

impl HeldBatch {
    pub fn from_changes(changes: &[HeldChange]) -> Self {
        let mut batch = Self::default();
        batch.extend(changes);
        batch
    }

    /// Packs `changes` after what the batch holds.
    pub fn extend(&mut self, changes: &[HeldChange]) {
        // A run of keys that left is written once it ends.
        let mut left: Option<(u64, u64)> = None;
        for change in changes {
            match change {
                HeldChange::Held(vehicle, fix) => {
                    if let Some((first, count)) = left.take() {
                        self.put_left(first, count);
                    }
                    put_entered(&mut self.bytes, fix.key, vehicle, &record::encode_held(fix));
                    match self.runs.last_mut() {
                        Some(HeldRun::Entered { first, count })
                            if first.checked_add(*count) == Some(fix.key) =>
                        {
                            *count += 1
                        }
                        _ => self.runs.push(HeldRun::Entered {
                            first: fix.key,
                            count: 1,
                        }),
                    }
                }
                HeldChange::Left(key) => match &mut left {
                    Some((first, count)) if first.checked_add(*count) == Some(*key) => *count += 1,
                    _ => {
                        if let Some((first, count)) = left.replace((*key, 1)) {
                            self.put_left(first, count);
                        }
                    }
                },
            }
        }
        if let Some((first, count)) = left {
            self.put_left(first, count);
        }
    }

    fn put_left(&mut self, first: u64, count: u64) {
        self.bytes.push(LEFT);
        put_varint(&mut self.bytes, first);
        put_varint(&mut self.bytes, count);
        self.runs.push(HeldRun::Left { first, count });
    }

    /// Moves `other`'s changes after this batch's.
    pub fn append(&mut self, other: &mut HeldBatch) {
        self.bytes.append(&mut other.bytes);
        self.runs.append(&mut other.runs);
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.runs.clear();
    }
}

/// Packs one fix that entered a window, its bytes as
/// [`record::encode_held`] wrote them (a version 3 store's rows move over
/// as they are).
pub fn put_entered(out: &mut Vec<u8>, key: u64, vehicle: &str, fix: &[u8]) {
    out.push(ENTERED);
    put_varint(out, key);
    put_str(out, vehicle);
    out.extend_from_slice(fix);
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldBytesError {
    #[error("unknown change {tag} at byte {at}")]
    Tag { tag: u8, at: usize },
    #[error("vehicle id at byte {0} is not UTF-8")]
    VehicleNotUtf8(usize),
    #[error("cut short after {0} bytes")]
    Cut(usize),
    #[error("not bytes")]
    NotBytes,
}

/// Plays packed changes onto `waiting` (by key). Bytes that end early,
/// name an unknown change or are not UTF-8 where an id is expected are an
/// error, never a panic.
pub fn replay(
    bytes: &[u8],
    waiting: &mut HashMap<u64, (VehicleId, HeldFix)>,
) -> Result<(), HeldBytesError> {
    let cut = |_: RecordError| HeldBytesError::Cut(bytes.len());
    let mut r = Reader::new(bytes);
    while r.at() < bytes.len() {
        let at = r.at();
        let tag = r.take(1).map_err(cut)?[0];
        let key = r.varint().map_err(cut)?;
        match tag {
            ENTERED => {
                let at = r.at();
                let len = r.count().map_err(cut)?;
                let vehicle = std::str::from_utf8(r.take(len).map_err(cut)?)
                    .map(VehicleId::from)
                    .map_err(|_| HeldBytesError::VehicleNotUtf8(at))?;
                let fix = record::decode_held(r.take(40).map_err(cut)?, key).map_err(cut)?;
                waiting.insert(key, (vehicle, fix));
            }
            LEFT => {
                let count = r.varint().map_err(cut)?;
                let end = key.saturating_add(count);
                // A damaged count cannot make this loop long.
                if count <= waiting.len() as u64 {
                    for k in key..end {
                        waiting.remove(&k);
                    }
                } else {
                    waiting.retain(|k, _| !(key..end).contains(k));
                }
            }
            tag => return Err(HeldBytesError::Tag { tag, at }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn held(
        key: u64,
        (fix_ms, lat, lon, received_ms, digest): (i64, f64, f64, i64, u64),
        vehicle: &str,
    ) -> HeldChange {
        HeldChange::Held(
            vehicle.into(),
            HeldFix {
                fix_ms,
                lat,
                lon,
                received_ms,
                digest,
                key,
            },
        )
    }

    /// Changes as shards make them: keys mostly consecutive, fixes leaving
    /// mostly in the order they came, now and then out of it.
    fn changes() -> impl Strategy<Value = Vec<HeldChange>> {
        prop::collection::vec(
            (
                0u8..4,
                0u64..3,
                "\\PC{0,12}",
                any::<(i64, f64, f64, i64, u64)>(),
            ),
            0..60,
        )
        .prop_map(|raw| {
            let (mut next, mut waiting, mut out) = (100u64, Vec::new(), Vec::new());
            for (what, skip, vehicle, fix) in raw {
                if what < 2 || waiting.is_empty() {
                    next += skip;
                    waiting.push(next);
                    out.push(held(next, fix, &vehicle));
                    next += 1;
                } else {
                    let at = if what == 2 { 0 } else { waiting.len() - 1 };
                    out.push(HeldChange::Left(waiting.remove(at)));
                }
            }
            out
        })
    }

    /// What playing the changes one by one leaves waiting.
    fn played(changes: &[HeldChange]) -> HashMap<u64, (VehicleId, HeldFix)> {
        let mut waiting = HashMap::new();
        for change in changes {
            match change {
                HeldChange::Held(v, fix) => {
                    waiting.insert(fix.key, (v.clone(), *fix));
                }
                HeldChange::Left(key) => {
                    waiting.remove(key);
                }
            }
        }
        waiting
    }

    fn bits(w: &HashMap<u64, (VehicleId, HeldFix)>) -> Vec<(u64, VehicleId, [u8; 40])> {
        let mut v: Vec<_> = w
            .iter()
            .map(|(k, (id, fix))| (*k, id.clone(), record::encode_held(fix)))
            .collect();
        v.sort();
        v
    }

    /// The keys the runs name, in order, as (entered, key).
    fn run_keys(runs: &[HeldRun]) -> Vec<(bool, u64)> {
        runs.iter()
            .flat_map(|r| match *r {
                HeldRun::Entered { first, count } => (first..first + count)
                    .map(|k| (true, k))
                    .collect::<Vec<_>>(),
                HeldRun::Left { first, count } => {
                    (first..first + count).map(|k| (false, k)).collect()
                }
            })
            .collect()
    }

    proptest! {
        #[test]
        fn a_batch_replays_to_what_its_changes_leave(changes in changes()) {
            let batch = HeldBatch::from_changes(&changes);
            let mut waiting = HashMap::new();
            replay(&batch.bytes, &mut waiting).unwrap();
            prop_assert_eq!(bits(&waiting), bits(&played(&changes)));
        }

        /// The runs name every key the changes touch, in order, and a
        /// batch built in pieces is the batch built at once.
        #[test]
        fn runs_name_the_keys_in_order(changes in changes(), split in any::<prop::sample::Index>()) {
            let batch = HeldBatch::from_changes(&changes);
            let keys: Vec<(bool, u64)> = changes
                .iter()
                .map(|c| match c {
                    HeldChange::Held(_, fix) => (true, fix.key),
                    HeldChange::Left(key) => (false, *key),
                })
                .collect();
            prop_assert_eq!(run_keys(&batch.runs), keys);
            let split = split.index(changes.len() + 1);
            let mut pieces = HeldBatch::from_changes(&changes[..split]);
            pieces.append(&mut HeldBatch::from_changes(&changes[split..]));
            let mut a = HashMap::new();
            replay(&pieces.bytes, &mut a).unwrap();
            prop_assert_eq!(bits(&a), bits(&played(&changes)));
            prop_assert_eq!(run_keys(&pieces.runs), run_keys(&batch.runs));
        }

        #[test]
        fn every_cut_is_an_error_or_a_shorter_batch(changes in changes(), cut in any::<prop::sample::Index>()) {
            let batch = HeldBatch::from_changes(&changes);
            prop_assume!(!batch.bytes.is_empty());
            let cut = cut.index(batch.bytes.len());
            let _ = replay(&batch.bytes[..cut], &mut HashMap::new());
        }
    }

    #[test]
    fn an_unknown_change_is_named() {
        assert_eq!(
            replay(&[9, 1], &mut HashMap::new()),
            Err(HeldBytesError::Tag { tag: 9, at: 0 })
        );
    }

    #[test]
    fn a_damaged_count_is_quick() {
        let mut bytes = vec![LEFT];
        put_varint(&mut bytes, 1);
        put_varint(&mut bytes, u64::MAX);
        let mut waiting = played(&[held(5, (0, 0.0, 0.0, 0, 0), "v")]);
        replay(&bytes, &mut waiting).unwrap();
        assert!(waiting.is_empty());
    }
}
