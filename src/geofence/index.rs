//! Which fences cover a point: an rstar R-tree over each part's cached
//! envelope narrows the candidates, then exact containment decides.
//!
//! Point queries first ask a [`CandidateGrid`] built from the same
//! envelopes; only where fences crowd a cell does the query descend the
//! tree (see `grid.rs` for why: the descent was half the query time).
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
use super::grid::{CandidateGrid, Lookup};
use super::shape::Part;
use crate::model::FenceId;
use geo::Coord;
use rstar::primitives::{GeomWithData, Rectangle};
use rstar::{AABB, RTree, RTreeObject};
use std::collections::HashMap;
use std::ops::ControlFlow;

/// Index of a fence in [`FenceIndex::fences`].
pub type FenceIdx = u32;

/// Envelopes are stored in f32, rounded outward: half the bytes per node,
/// so more of the tree stays in cache, and the tree is only a pre-filter
/// (exact containment runs in f64 afterwards). An f32 step is at most
/// 1.5e-5° (under 2 m, at ±180°), so the extra candidates are negligible.
type Entry = GeomWithData<Rectangle<[f32; 2]>, (FenceIdx, u32)>;

/// The largest f32 ≤ `v`.
fn f32_down(v: f64) -> f32 {
    let r = v as f32;
    if f64::from(r) > v { r.next_down() } else { r }
}

/// The smallest f32 ≥ `v`.
fn f32_up(v: f64) -> f32 {
    let r = v as f32;
    if f64::from(r) < v { r.next_up() } else { r }
}

/// How many times the median envelope area makes a part "large".
const LARGE_FACTOR: f64 = 64.0;

/// An immutable, shareable set of fences; a reload builds a new one and
/// swaps it in.
#[derive(Debug)]
pub struct FenceIndex {
    fences: Vec<Fence>,
    /// Parts of typical size.
    tree: RTree<Entry>,
    /// The same parts by grid cell; crowded cells fall back to `tree`.
    grid: Option<CandidateGrid<(FenceIdx, u32)>>,
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
                    let rect = Rectangle::from_corners(
                        [f32_down(lo.x), f32_down(lo.y)],
                        [f32_up(hi.x), f32_up(hi.y)],
                    );
                    entries.push(GeomWithData::new(rect, (f as FenceIdx, p as u32)));
                }
            }
        }
        let area = |e: &Entry| {
            let env = e.geom().envelope();
            f64::from(env.upper()[0] - env.lower()[0]) * f64::from(env.upper()[1] - env.lower()[1])
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
        let listed: Vec<_> = small
            .iter()
            .map(|e| {
                let env = e.geom().envelope();
                (env.lower(), env.upper(), e.data)
            })
            .collect();
        Self {
            fences,
            grid: CandidateGrid::build(&listed),
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
        let probe = AABB::from_corners([f32_down(p.x), f32_down(p.y)], [f32_up(p.x), f32_up(p.y)]);
        let mut test = |(f, part): (FenceIdx, u32)| {
            if self.part(f, part).covers(p) {
                out.push(f);
            }
            ControlFlow::<()>::Continue(())
        };
        match self.grid.as_ref().map(|grid| grid.lookup(p.x, p.y)) {
            Some(Lookup::Candidates(listed)) => {
                for entry in listed.iter().filter(|e| e.holds(p.x, p.y)) {
                    let _ = test(entry.reference);
                }
            }
            // Internal iteration: no traversal stack to allocate per query.
            Some(Lookup::Crowded) | None => {
                let _ = self
                    .tree
                    .locate_in_envelope_intersecting_int(&probe, |e| test(e.data));
            }
        }
        let _ = self
            .large
            .locate_in_envelope_intersecting_int(&probe, |e| test(e.data));
        if out.len() > 1 {
            out.sort_unstable();
            out.dedup();
        }
    }

    /// Appends to `out` (unsorted, possibly repeated) every fence with a
    /// part whose envelope comes within `metres` of `p`: a superset of the
    /// fences whose boundary is that close, for the caller to test exactly.
    /// Boxes across ±180° are looked up on both sides.
    pub fn near(&self, p: Coord<f64>, metres: f64, out: &mut Vec<FenceIdx>) {
        // Degrees per metre, rounded so the box only ever grows: a degree
        // of latitude is at least 110.5 km, of longitude that times cos φ.
        let dlat = metres / 110_000.0;
        let cos = p.y.to_radians().cos();
        let dlon = if cos > 1e-6 {
            (metres / (110_000.0 * cos)).min(360.0)
        } else {
            360.0
        };
        // The box itself, and its parts wrapped past ±180° (if any): an
        // array, not a Vec, since this runs for every fix.
        let wrapped_east = (p.x + dlon > 180.0).then_some((-180.0, p.x + dlon - 360.0));
        let wrapped_west = (p.x - dlon < -180.0).then_some((p.x - dlon + 360.0, 180.0));
        let boxes = [Some((p.x - dlon, p.x + dlon)), wrapped_east, wrapped_west];
        for (west, east) in boxes.into_iter().flatten() {
            let probe = AABB::from_corners(
                [f32_down(west), f32_down(p.y - dlat)],
                [f32_up(east), f32_up(p.y + dlat)],
            );
            for tree in [&self.tree, &self.large] {
                out.extend(
                    tree.locate_in_envelope_intersecting(&probe)
                        .map(|e| e.data.0),
                );
            }
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
