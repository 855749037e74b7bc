//! Where the local backends make a group of batches durable: a [`Store`]
//! commits vehicle records and outbox entries in one transaction, and
//! gives back everything committed at start.

use super::held_batch::HeldBatch;
use crate::delivery::events_file::{self, Tail};
use crate::delivery::outbox::OutboxEntry;
use crate::geofence::{
    Fence, FenceChange, FenceErrors, FenceIndex, FenceSource, HeldFix, Tombstone, VehicleSnapshot,
    parse_features,
};
use crate::model::{FenceId, VehicleId};
use crate::state::StateError;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One vehicle's new state, encoded by [`super::record::encode`]; `None`
/// deletes it (idle expiry).
pub type VehicleChange = (VehicleId, Option<Vec<u8>>);

/// A fence change as a store keeps it: each fence as its GeoJSON, so
/// that a restart validates and indexes it again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FenceRows {
    pub version: u64,
    pub at_ms: i64,
    /// (id, Feature JSON) of each fence put.
    pub put: Vec<(FenceId, String)>,
    /// (id, Feature JSON) of each fence deleted: its tombstone keeps it,
    /// for the properties of exits a restart still owes.
    pub deleted: Vec<(FenceId, String)>,
}

impl FenceRows {
    /// `change`, made to `before`, as rows.
    pub fn of(before: &FenceIndex, change: &FenceChange) -> Self {
        Self {
            version: change.version,
            at_ms: change.at_ms,
            put: change
                .upserts
                .iter()
                .map(|f| (f.id.clone(), f.source.feature.clone()))
                .collect(),
            deleted: change
                .deletes
                .iter()
                .filter_map(|id| {
                    let f = before.fence(before.find(id)?);
                    Some((f.id.clone(), f.source.feature.clone()))
                })
                .collect(),
        }
    }
}

/// One stored fence: (id, version, changed_ms, Feature JSON).
pub type StoredFence = (FenceId, u64, i64, String);

/// The fence set a store holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredFences {
    pub version: u64,
    pub changed_ms: i64,
    pub fences: Vec<StoredFence>,
    /// Each deleted id's last deletion, its Feature as it was.
    pub tombstones: Vec<StoredFence>,
}

impl StoredFences {
    /// The set as an index, each fence validated again (a store written by
    /// a geogate with looser rules fails here, naming the fences).
    pub fn into_index(self) -> Result<FenceIndex, FenceErrors> {
        let mut features = Vec::with_capacity(self.fences.len());
        let mut stamps = Vec::with_capacity(self.fences.len());
        for (id, version, changed_ms, feature) in self.fences {
            let value = serde_json::from_str(&feature).unwrap_or(serde_json::Value::Null);
            features.push(value);
            stamps.push((id, version, changed_ms));
        }
        let loaded = parse_features(&features)?;
        let fences = loaded
            .fences
            .into_iter()
            .zip(stamps)
            .map(|(fence, (_, version, changed_ms))| Fence {
                version,
                changed_ms,
                ..fence
            })
            .collect();
        let tombstones = self
            .tombstones
            .into_iter()
            .map(|(id, version, at_ms, feature)| {
                let source = Arc::new(FenceSource::from_json(&feature));
                (
                    id,
                    Tombstone {
                        version,
                        at_ms,
                        source,
                    },
                )
            })
            .collect();
        Ok(FenceIndex::with_tombstones(
            fences,
            tombstones,
            self.version,
            self.changed_ms,
        ))
    }
}

/// What one transaction writes.
#[derive(Debug, Default)]
pub struct CommitBatch {
    pub vehicles: Vec<VehicleChange>,
    /// The log of held fixes' changes, applied in order after the vehicle
    /// records.
    pub held: HeldBatch,
    pub outbox: Vec<OutboxEntry>,
    /// The seq the next transition will get.
    pub next_seq: u64,
    /// The outputs' progress: outbox entries at or below all of them are
    /// gone.
    pub file_cursor: u64,
    pub mqtt_cursor: u64,
    pub webhook_cursor: u64,
    /// Fence changes, in version order.
    pub fences: Vec<FenceRows>,
}

impl CommitBatch {
    /// Vehicle records only, before any transition (loading a store).
    pub fn vehicles_only(vehicles: Vec<VehicleChange>) -> Self {
        Self {
            vehicles,
            next_seq: 1,
            ..Self::default()
        }
    }
}

/// Everything committed, read back at start.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Each with its held fixes in its window ([`with_held`]).
    pub vehicles: Vec<(VehicleId, VehicleSnapshot)>,
    /// The first seq the outbox still holds, and how many entries it
    /// holds: the entries themselves are read a page at a time
    /// ([`Store::outbox_after`]) once the outputs run, so a large outbox
    /// never has to fit in memory at start.
    pub outbox_first: Option<u64>,
    pub outbox_len: u64,
    pub next_seq: u64,
    pub mqtt_cursor: u64,
    pub webhook_cursor: u64,
    /// The seq up to which the events file held every transition when the
    /// store last committed: the outbox was pruned against it.
    /// [`NO_FILE_CURSOR`] when no events file was written (or the store
    /// predates the record).
    pub file_cursor: u64,
    /// The store was created by this start (first run or reset).
    pub created: bool,
    /// The fence set it holds; `None` when it never held one.
    pub fences: Option<StoredFences>,
}

/// [`Recovered::file_cursor`] when no events file's position is known.
pub const NO_FILE_CURSOR: u64 = i64::MAX as u64;

/// Puts each held fix from the log into its vehicle's window, in
/// fix-time order and arrival order among equals, which is key order
/// ([`super::held_keys`]; a record's own window, from before the log,
/// keeps its order). A vehicle with held fixes and
/// no record (its first fixes were still waiting) starts with none
/// applied. Its receive time is the newest of its record's and its held
/// fixes', since a held fix does not rewrite the record.
pub fn with_held(
    mut vehicles: Vec<(VehicleId, VehicleSnapshot)>,
    held: Vec<(VehicleId, HeldFix)>,
) -> Vec<(VehicleId, VehicleSnapshot)> {
    if held.is_empty() {
        return vehicles;
    }
    let mut at: HashMap<VehicleId, usize> = vehicles
        .iter()
        .enumerate()
        .map(|(i, (id, _))| (id.clone(), i))
        .collect();
    for (vehicle, fix) in held {
        let i = *at.entry(vehicle.clone()).or_insert_with(|| {
            vehicles.push((
                vehicle,
                VehicleSnapshot {
                    last_fix_ms: i64::MIN,
                    last_heard_ms: fix.received_ms,
                    ..VehicleSnapshot::default()
                },
            ));
            vehicles.len() - 1
        });
        let s = &mut vehicles[i].1;
        s.last_heard_ms = s.last_heard_ms.max(fix.received_ms);
        s.window.push(fix);
    }
    for (_, s) in &mut vehicles {
        s.window.sort_by_key(|h| (h.fix_ms, h.key));
    }
    vehicles
}

/// What the memory and embedded stores have in common.
pub trait Store: Send {
    /// Commits the batch atomically: all of it or none of it survives a
    /// crash.
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), StateError>;
    /// Bytes the store occupies now (file and log).
    fn size_bytes(&self) -> u64;
    /// Whether a commit survives a process crash (and so whether the
    /// shards need to track which vehicles changed).
    fn durable(&self) -> bool;
    /// Up to about `max` committed transitions with seqs after `after`, in
    /// seq order (whole rows: a row is never split). What a restart
    /// delivers, a page at a time. A store that keeps nothing across a
    /// restart has none.
    fn outbox_after(&mut self, _after: u64, _max: usize) -> Result<Vec<OutboxEntry>, StateError> {
        Ok(Vec::new())
    }
}

/// An opened store, what it held, and what the events file's tail says.
pub struct Opened {
    pub store: Box<dyn Store>,
    pub recovered: Recovered,
    pub tail: Tail,
}

impl Opened {
    /// Seq of the events file's last line (0: none).
    pub fn file_seq(&self) -> u64 {
        self.tail.last_seq.unwrap_or(0)
    }
}

/// Reads the events file's tail (an empty tail when there is no file).
pub fn read_tail(events: Option<&Path>) -> Result<Tail, StateError> {
    match events {
        Some(path) => events_file::read(path).map_err(|source| StateError::EventsFile {
            path: path.to_owned(),
            source,
        }),
        None => Ok(Tail::default()),
    }
}
