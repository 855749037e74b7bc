//! A fence set that changes one fence at a time without rebuilding its
//! index: the base's spatial index stays as it was, the fences changed
//! since sit in a small index of their own (the delta), and the base's
//! entries they replace or delete are marked dead. Once the delta grows
//! past [`compact_after`], the live fences are built into a new base
//! ([`FenceIndex::compacted`], which the registry runs off the writer's
//! path), and past four times that by the change itself.
//!
//! Positions ([`FenceIdx`]) stay valid while the base stays: the base's
//! come first, then the delta's, which only grows. A changed fence gets a
//! new position, so an evaluator holding positions tells a fence that
//! changed (its position is dead) from one that did not, with no lookup
//! by id (`Evaluator::swap_index`).

use super::{Coverings, FenceIdx, Spatial};
use crate::geofence::fences::{Fence, FenceSource};
use crate::model::FenceId;
use geo::Coord;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// When and at which version a fence id was last deleted: what an exit
/// the deletion causes carries, after a restart too.
#[derive(Debug, Clone, PartialEq)]
pub struct Tombstone {
    pub version: u64,
    pub at_ms: i64,
    /// The deleted fence's GeoJSON, which its exits name.
    pub source: Arc<FenceSource>,
}

/// One change to a fence set, applied whole: the fences put (new or
/// replacing the fence of their id) and the ids deleted.
#[derive(Debug, Clone, Default)]
pub struct FenceChange {
    /// The set's version once applied: greater than every version before.
    pub version: u64,
    /// When it was made, on the receive clock (unix ms): the time of the
    /// exits it causes.
    pub at_ms: i64,
    pub upserts: Vec<Fence>,
    pub deletes: Vec<FenceId>,
}

impl FenceChange {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

/// A versioned, immutable fence set with its spatial index; a change makes
/// a new one sharing the unchanged parts.
#[derive(Debug)]
pub struct FenceIndex {
    base: Arc<Spatial>,
    /// Fences put since the base was built, at positions after the base's.
    delta: Option<Arc<Spatial>>,
    /// Positions, in the base or the delta, of fences replaced or deleted.
    dead: Arc<HashSet<FenceIdx>>,
    tombstones: Arc<HashMap<FenceId, Tombstone>>,
    version: u64,
    changed_ms: i64,
}

/// How many fences the delta may hold (dead ones included) before the
/// next change builds a new base: a change rebuilds the delta's index, so
/// its cost grows with the delta, and every query also asks the delta.
pub fn compact_after(base_len: usize) -> usize {
    (base_len / 64).clamp(64, 4096)
}

impl FenceIndex {
    /// A set of these fences, at the highest version among them.
    pub fn new(fences: Vec<Fence>) -> Self {
        let version = fences.iter().map(|f| f.version).max().unwrap_or(0);
        let changed_ms = fences.iter().map(|f| f.changed_ms).max().unwrap_or(0);
        Self::from_parts(
            fences.into_iter().map(Arc::new).collect(),
            Arc::default(),
            version,
            changed_ms,
        )
    }

    /// A set whose first version puts these fences, at `at_ms`.
    pub fn first(fences: Vec<Fence>, at_ms: i64) -> Self {
        Self::new(Vec::new()).apply(FenceChange {
            version: 1,
            at_ms,
            upserts: fences,
            deletes: Vec::new(),
        })
    }

    /// A set of these fences with the deletions it remembers.
    pub fn with_tombstones(
        fences: Vec<Fence>,
        tombstones: HashMap<FenceId, Tombstone>,
        version: u64,
        changed_ms: i64,
    ) -> Self {
        Self::from_parts(
            fences.into_iter().map(Arc::new).collect(),
            Arc::new(tombstones),
            version,
            changed_ms,
        )
    }

    fn from_parts(
        mut fences: Vec<Arc<Fence>>,
        tombstones: Arc<HashMap<FenceId, Tombstone>>,
        version: u64,
        changed_ms: i64,
    ) -> Self {
        // Positions in id order: transitions are ordered by fence id
        // wherever several come at once, and the base needs no sort then.
        fences.sort_by(|a, b| a.id.cmp(&b.id));
        Self {
            base: Arc::new(Spatial::new(fences)),
            delta: None,
            dead: Arc::default(),
            tombstones,
            version,
            changed_ms,
        }
    }

    /// The set with `change` applied; the change's fences take its version
    /// and time.
    pub fn apply(&self, change: FenceChange) -> Self {
        let mut dead = (*self.dead).clone();
        let mut tombstones = (*self.tombstones).clone();
        let mut delta: Vec<Arc<Fence>> = self
            .delta
            .as_ref()
            .map(|d| d.fences().to_vec())
            .unwrap_or_default();
        for id in &change.deletes {
            let Some(idx) = self.find(id) else {
                continue;
            };
            dead.insert(idx);
            tombstones.insert(
                id.clone(),
                Tombstone {
                    version: change.version,
                    at_ms: change.at_ms,
                    source: self.fence(idx).source.clone(),
                },
            );
        }
        for mut fence in change.upserts {
            if let Some(idx) = self.find(&fence.id) {
                dead.insert(idx);
            }
            fence.version = change.version;
            fence.changed_ms = change.at_ms;
            delta.push(Arc::new(fence));
        }
        let next = Self {
            base: self.base.clone(),
            delta: Some(Arc::new(Spatial::new(delta))),
            dead: Arc::new(dead),
            tombstones: Arc::new(tombstones),
            version: change.version,
            changed_ms: change.at_ms,
        };
        if next.delta_len() > 4 * compact_after(next.base.len()) {
            return next.compacted();
        }
        next
    }

    fn delta_len(&self) -> usize {
        self.delta.as_ref().map_or(0, |d| d.len())
    }

    /// Whether the delta has grown past [`compact_after`].
    pub fn needs_compaction(&self) -> bool {
        self.delta_len() > compact_after(self.base.len())
    }

    /// The same set, version and time, with its live fences built into a
    /// new base and no delta: new positions, the same answers.
    pub fn compacted(&self) -> Self {
        Self::from_parts(
            self.live().cloned().collect(),
            self.tombstones.clone(),
            self.version,
            self.changed_ms,
        )
    }

    /// The change that turns this set into one of `fences` (a fence file
    /// read again): the fences whose GeoJSON differs or is new, and the
    /// ids gone. `None` when nothing differs.
    pub fn diff(&self, fences: Vec<Fence>, version: u64, at_ms: i64) -> Option<FenceChange> {
        let wanted: HashSet<FenceId> = fences.iter().map(|f| f.id.clone()).collect();
        let deletes: Vec<FenceId> = self
            .fences()
            .filter(|f| !wanted.contains(&f.id))
            .map(|f| f.id.clone())
            .collect();
        let upserts: Vec<Fence> = fences
            .into_iter()
            .filter(|f| {
                self.find(&f.id)
                    .is_none_or(|idx| !self.fence(idx).same_definition(f))
            })
            .collect();
        let change = FenceChange {
            version,
            at_ms,
            upserts,
            deletes,
        };
        (!change.is_empty()).then_some(change)
    }

    /// The set's version: that of the last change applied.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// When the last change was made (receive clock, unix ms).
    pub fn changed_ms(&self) -> i64 {
        self.changed_ms
    }

    /// Identifies the positions' numbering: two sets with the same
    /// numbering give an unchanged fence the same position.
    pub fn numbering(&self) -> usize {
        Arc::as_ptr(&self.base) as usize
    }

    /// The fence at `idx`, live or dead (a dead one is still named by the
    /// memberships made before its change).
    pub fn fence(&self, idx: FenceIdx) -> &Fence {
        let base_len = self.base.len();
        if (idx as usize) < base_len {
            self.base.fence(idx)
        } else {
            let delta = self.delta.as_ref().expect("a position past the base");
            delta.fence(idx - base_len as FenceIdx)
        }
    }

    /// Whether the fence at `idx` is in the set now.
    pub fn is_live(&self, idx: FenceIdx) -> bool {
        (idx as usize) < self.positions() && !self.dead.contains(&idx)
    }

    fn positions(&self) -> usize {
        self.base.len() + self.delta_len()
    }

    /// The live fence with this id.
    pub fn find(&self, id: &str) -> Option<FenceIdx> {
        let base_len = self.base.len() as FenceIdx;
        let in_delta = self
            .delta
            .as_ref()
            .and_then(|d| d.find(id))
            .map(|i| base_len + i);
        in_delta
            .or_else(|| self.base.find(id))
            .filter(|&idx| !self.dead.contains(&idx))
    }

    /// The last deletion of this id, if it was ever deleted.
    pub fn tombstone(&self, id: &str) -> Option<&Tombstone> {
        self.tombstones.get(id)
    }

    pub fn tombstones(&self) -> &HashMap<FenceId, Tombstone> {
        &self.tombstones
    }

    /// How many fences are live.
    pub fn len(&self) -> usize {
        self.positions() - self.dead.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live fences, in no particular order.
    pub fn fences(&self) -> impl Iterator<Item = &Fence> {
        self.live().map(|f| f.as_ref())
    }

    fn live(&self) -> impl Iterator<Item = &Arc<Fence>> {
        let base_len = self.base.len() as FenceIdx;
        let delta = self.delta.as_deref().map(Spatial::fences).unwrap_or(&[]);
        self.base
            .fences()
            .iter()
            .enumerate()
            .map(|(i, f)| (i as FenceIdx, f))
            .chain(
                delta
                    .iter()
                    .enumerate()
                    .map(move |(i, f)| (base_len + i as FenceIdx, f)),
            )
            .filter(|(i, _)| !self.dead.contains(i))
            .map(|(_, f)| f)
    }

    /// The live fences in id order.
    pub fn fences_by_id(&self) -> Vec<&Fence> {
        let mut fences: Vec<&Fence> = self.fences().collect();
        fences.sort_by(|a, b| a.id.cmp(&b.id));
        fences
    }

    /// See [`Spatial::prefers_batches`].
    pub fn prefers_batches(&self) -> bool {
        self.base.prefers_batches()
    }

    /// Replaces `out` with the live fences covering `p` (lon, lat),
    /// ascending by position and without duplicates.
    pub fn containing(&self, p: Coord<f64>, out: &mut Vec<FenceIdx>) {
        self.base.containing(p, out);
        if self.delta.is_none() && self.dead.is_empty() {
            return;
        }
        // No scratch per query: the delta's fences go straight after the
        // base's, renumbered, and the dead go from both.
        if let Some(delta) = &self.delta {
            let start = out.len();
            let base_len = self.base.len() as FenceIdx;
            delta.append_containing(p, out);
            for f in &mut out[start..] {
                *f += base_len;
            }
        }
        out.retain(|i| !self.dead.contains(i));
    }

    /// [`Self::containing`] for many points (see
    /// [`Spatial::containing_batch`]); the delta, small, is asked point by
    /// point.
    pub fn containing_batch(&self, points: &[Coord<f64>], into: &mut Coverings) {
        self.base.containing_batch(points, into);
        if self.delta.is_none() && self.dead.is_empty() {
            return;
        }
        let mut found = Vec::new();
        into.rewrite(|i, fences| {
            fences.retain(|f| !self.dead.contains(f));
            if let Some(delta) = &self.delta {
                let base_len = self.base.len() as FenceIdx;
                delta.containing(points[i], &mut found);
                fences.extend(
                    found
                        .iter()
                        .map(|&f| base_len + f)
                        .filter(|f| !self.dead.contains(f)),
                );
            }
        });
    }

    /// The same answer as [`Self::containing`] by testing every live
    /// fence: the reference the index is checked against.
    pub fn containing_linear(&self, p: Coord<f64>, out: &mut Vec<FenceIdx>) {
        out.clear();
        for idx in 0..self.positions() as FenceIdx {
            if self.is_live(idx) && self.fence(idx).covers(p) {
                out.push(idx);
            }
        }
    }
}
