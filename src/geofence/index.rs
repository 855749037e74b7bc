//! Which fences cover a point: an rstar R-tree over each part's cached
//! envelope narrows the candidates, then exact containment decides.
//!
//! Envelopes are computed once at load (recomputing them per query is the
//! classic R-tree slowdown) and bulk-loaded, so the tree is packed.
//!
//! Parts whose envelope is far larger than the typical one (country borders
//! among city blocks) go into a second tree. Packed among small neighbours
//! they would inflate every ancestor node's envelope, and each query would
//! descend into those nodes for nothing; measured, mixing three 10k-vertex
//! polygons into 10k city blocks halved the query rate.

use super::fences::Fence;
use super::shape::Part;
use crate::model::FenceId;
use geo::Coord;
use rstar::primitives::{GeomWithData, Rectangle};
use rstar::{AABB, RTree, RTreeObject};
use std::collections::HashMap;
use std::ops::ControlFlow;

/// Index of a fence in [`FenceIndex::fences`].
pub type FenceIdx = u32;

type Entry = GeomWithData<Rectangle<[f64; 2]>, (FenceIdx, u32)>;

/// How many times the median envelope area makes a part "large".
const LARGE_FACTOR: f64 = 64.0;

/// An immutable, shareable set of fences; a reload builds a new one and
/// swaps it in.
#[derive(Debug)]
pub struct FenceIndex {
    fences: Vec<Fence>,
    /// Parts of typical size.
    tree: RTree<Entry>,
    /// Parts with an envelope over [`LARGE_FACTOR`] × the median area.
    large: RTree<Entry>,
    by_id: HashMap<FenceId, FenceIdx>,
}

impl FenceIndex {
    pub fn new(fences: Vec<Fence>) -> Self {
        let mut entries = Vec::new();
        for (f, fence) in fences.iter().enumerate() {
            for (p, part) in fence.parts.iter().enumerate() {
                for (lo, hi) in part.envelopes() {
                    let rect = Rectangle::from_corners([lo.x, lo.y], [hi.x, hi.y]);
                    entries.push(GeomWithData::new(rect, (f as FenceIdx, p as u32)));
                }
            }
        }
        let area = |e: &Entry| {
            let env = e.geom().envelope();
            (env.upper()[0] - env.lower()[0]) * (env.upper()[1] - env.lower()[1])
        };
        let mut areas: Vec<f64> = entries.iter().map(area).collect();
        areas.sort_unstable_by(f64::total_cmp);
        let cutoff = areas.get(areas.len() / 2).copied().unwrap_or(0.0) * LARGE_FACTOR;
        let (large, small): (Vec<Entry>, Vec<Entry>) = entries
            .into_iter()
            .partition(|e| cutoff > 0.0 && area(e) > cutoff);
        let by_id = fences
            .iter()
            .enumerate()
            .map(|(i, f)| (f.id.clone(), i as FenceIdx))
            .collect();
        Self {
            fences,
            tree: RTree::bulk_load(small),
            large: RTree::bulk_load(large),
            by_id,
        }
    }

    pub fn fences(&self) -> &[Fence] {
        &self.fences
    }

    pub fn fence(&self, idx: FenceIdx) -> &Fence {
        &self.fences[idx as usize]
    }

    pub fn find(&self, id: &str) -> Option<FenceIdx> {
        self.by_id.get(id).copied()
    }

    pub fn len(&self) -> usize {
        self.fences.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fences.is_empty()
    }

    /// Replaces `out` with the fences covering `p` (lon, lat), ascending and
    /// without duplicates. Reusing `out` keeps the hot path allocation-free.
    pub fn containing(&self, p: Coord<f64>, out: &mut Vec<FenceIdx>) {
        out.clear();
        let probe = AABB::from_point([p.x, p.y]);
        // Internal iteration: no traversal stack to allocate per query.
        for tree in [&self.tree, &self.large] {
            let _ = tree.locate_in_envelope_intersecting_int(&probe, |entry| {
                let (f, part) = entry.data;
                if self.part(f, part).covers(p) {
                    out.push(f);
                }
                ControlFlow::<()>::Continue(())
            });
        }
        if out.len() > 1 {
            out.sort_unstable();
            out.dedup();
        }
    }

    /// The same answer as [`Self::containing`] by testing every fence: the
    /// reference the R-tree path is checked and benchmarked against.
    pub fn containing_linear(&self, p: Coord<f64>, out: &mut Vec<FenceIdx>) {
        out.clear();
        for (f, fence) in self.fences.iter().enumerate() {
            if fence.covers(p) {
                out.push(f as FenceIdx);
            }
        }
    }

    fn part(&self, fence: FenceIdx, part: u32) -> &Part {
        &self.fences[fence as usize].parts[part as usize]
    }
}
