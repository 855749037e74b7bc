//! Many points at once: [`FenceIndex::containing_batch`] and what it
//! fills, [`Coverings`].

use super::{Candidate, FenceIdx, LAYERS, Layer, Spatial};
use crate::geofence::cell_grid::Cell;
use crate::geofence::grid::PointBox;
use geo::Coord;

/// Points a batch carries through each stage together: enough loads in
/// flight to hide a miss behind the others, few enough that a point's lines
/// are still in cache when its next stage reads them. Measured at 10k
/// fences against 8 and 32: no difference resolved (0.99× [0.69–1.18] and
/// 0.99× [0.73–1.11], docs/decisions/0010-batched-containment-lookups.md).
const BATCH_WINDOW: usize = 16;

impl Spatial {
    /// Every point's covering fences, the same as [`Self::containing`]
    /// gives, into `into` (point `i`'s at [`Coverings::of`]`(i)`).
    ///
    /// Why a batch: one point's query is a chain of dependent loads (its
    /// grid cell, that cell's listings, each candidate's cell bits), each
    /// likely a cache miss at 10k fences, and its branches on what they
    /// hold keep the CPU from starting the next point's chain early. A
    /// batch walks a window of points through the chain a stage at a time,
    /// prefetching every point's next line before it reads any, so the
    /// misses of a window overlap instead of queueing.
    pub(crate) fn containing_batch(&self, points: &[Coord<f64>], into: &mut Coverings) {
        into.fences.clear();
        into.ends.clear();
        let mut windows = points.chunks(BATCH_WINDOW).peekable();
        let layers = self.layers();
        if let Some(first) = windows.peek() {
            prefetch_cells(&layers, first);
        }
        while let Some(window) = windows.next() {
            // Each point's listings in each layer (its grid cell prefetched
            // a window ago); `None` asks the layer's tree.
            let mut listed = [[None; BATCH_WINDOW]; LAYERS];
            for (layer, slots) in layers.iter().zip(&mut listed) {
                for (slot, p) in slots.iter_mut().zip(window) {
                    *slot = layer.listed(*p);
                    if let Some(candidates) = slot {
                        candidates.prefetch();
                    }
                }
            }
            // Each point's candidates, their cells on the way.
            into.pending.clear();
            for (i, p) in window.iter().enumerate() {
                let point = PointBox::new(p.x, p.y);
                for (layer, slots) in layers.iter().zip(&listed) {
                    layer.each(&point, slots[i], |candidate| {
                        if let Some(grid) = candidate.grid {
                            self.cells.prefetch(grid.cell_index(*p));
                        }
                        into.pending.push(Pending {
                            point: i,
                            candidate: *candidate,
                            cell: None,
                        });
                    });
                }
            }
            // The cells, and the exact tests of those that cannot decide;
            // the next window's grid cells meanwhile.
            if let Some(next) = windows.peek() {
                prefetch_cells(&layers, next);
            }
            for pending in &mut into.pending {
                let candidate = &pending.candidate;
                pending.cell = candidate
                    .grid
                    .map(|grid| self.cells.get(grid.cell_index(window[pending.point])));
                if pending.cell.is_none_or(|cell| cell == Cell::Edge) {
                    self.prefetch_exact(candidate, window[pending.point]);
                }
            }
            // The answers.
            let mut pending = into.pending.iter().peekable();
            for (i, p) in window.iter().enumerate() {
                let start = into.fences.len();
                while let Some(tested) = pending.next_if(|tested| tested.point == i) {
                    if self.covers_in(&tested.candidate, tested.cell, *p) {
                        into.fences.push(tested.candidate.fence);
                    }
                }
                sort_dedup_from(&mut into.fences, start);
                into.ends.push(into.fences.len());
            }
        }
    }
}

/// Every point's covering fences from [`FenceIndex::containing_batch`],
/// kept between batches so the hot path allocates only while it grows.
#[derive(Debug, Default)]
pub struct Coverings {
    fences: Vec<FenceIdx>,
    /// Point `i`'s fences end at `fences[ends[i]]`.
    ends: Vec<usize>,
    /// A window's candidates, by point, between the stages.
    pending: Vec<Pending>,
}

/// A candidate met by point `point` of a window, and its cell once read.
#[derive(Debug, Clone, Copy)]
struct Pending {
    point: usize,
    candidate: Candidate,
    cell: Option<Cell>,
}

impl Coverings {
    /// How many points the last batch held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Replaces each point's fences with what `f` makes of them (given the
    /// point's number and its fences, to edit in place); they must stay
    /// ascending and without duplicates.
    pub(super) fn rewrite(&mut self, mut f: impl FnMut(usize, &mut Vec<FenceIdx>)) {
        let mut fences = Vec::with_capacity(self.fences.len());
        let mut one = Vec::new();
        let mut start = 0;
        for i in 0..self.ends.len() {
            let end = self.ends[i];
            one.clear();
            one.extend_from_slice(&self.fences[start..end]);
            start = end;
            f(i, &mut one);
            fences.extend_from_slice(&one);
            self.ends[i] = fences.len();
        }
        self.fences = fences;
    }

    /// The fences covering point `i` of the last batch, ascending and
    /// without duplicates; panics past the batch, as a slice does.
    pub fn of(&self, i: usize) -> &[FenceIdx] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.fences[start..self.ends[i]]
    }
}

/// Starts loading each layer's grid cell for each point.
fn prefetch_cells(layers: &[&Layer], points: &[Coord<f64>]) {
    for layer in layers {
        for &p in points {
            layer.prefetch(p);
        }
    }
}

/// Sorts `fences[start..]` and drops its repeats.
pub(super) fn sort_dedup_from(fences: &mut Vec<FenceIdx>, start: usize) {
    if fences.len() - start > 1 {
        fences[start..].sort_unstable();
        let mut kept = start + 1;
        for i in start + 1..fences.len() {
            if fences[i] != fences[kept - 1] {
                fences[kept] = fences[i];
                kept += 1;
            }
        }
        fences.truncate(kept);
    }
}
