//! A uniform grid in front of the R-tree that answers "which envelopes may
//! hold this point" with one cell lookup and a short contiguous list.
//!
//! Why, when there is an R-tree: a point query descends five or six levels
//! of rstar nodes, and on 10k overlapping city blocks it tested about seventy
//! node envelopes per point in branchy, pointer-chasing code, which the
//! profile put at over half of the query time. Where fences are spread
//! evenly, a grid with cells the size of a typical fence finds the same
//! candidates in one lookup. Where they are not (a cell crowded by more than
//! [`CROWDED`] envelopes), the cell says so and the caller asks the R-tree,
//! so the worst case is the R-tree's plus one lookup.
//!
//! Exactness does not depend on the grid: the point → cell map is monotone
//! in each axis (subtraction, multiplication by a positive constant and
//! truncation all preserve order under IEEE rounding), so every point of an
//! envelope maps into the cell range the envelope was listed in.

use super::cell_grid::{f32_down, f32_up};
use super::prefetch::{prefetch, prefetch_lines};

/// More candidates than this in one cell: leave that cell to the R-tree.
const CROWDED: usize = 48;

/// Cells per envelope at most; memory stays linear in the fence count.
const CELLS_PER_ENVELOPE: usize = 4;

/// Listings (envelope × cell) per envelope at most, before the grid is made
/// coarser.
const LISTINGS_PER_ENVELOPE: usize = 16;

/// Marks a crowded cell in [`CandidateGrid::starts`].
const CROWDED_BIT: u32 = 1 << 31;

/// One envelope as listed in a cell: f32 bounds rounded outward (a
/// pre-filter only).
#[derive(Debug, Clone, Copy)]
struct Envelope {
    lo: [f32; 2],
    hi: [f32; 2],
}

/// A cell's listings, each envelope beside its reference. A cell lists
/// about three or four envelopes at 10k fences, so a separate array of
/// dense boxes saved little scanning, and each box that held the point sent
/// the query to a second array, another line to fetch; side by side, the
/// reference is in the box's line or the next (a listing of a 44-byte
/// candidate is 60 bytes). Measured, not resolved: 1.20× [0.84–2.08].
#[derive(Clone, Copy)]
pub struct Candidates<'a, R> {
    listings: &'a [Listing<R>],
}

impl<'a, R> Candidates<'a, R> {
    /// The references whose envelope holds `point`.
    pub fn holding<'p>(&self, point: &'p PointBox) -> impl Iterator<Item = &'a R> + use<'a, 'p, R> {
        self.listings
            .iter()
            .filter(move |listing| listing.envelope.holds(point))
            .map(|listing| &listing.reference)
    }

    /// Starts loading every line of the listings, so that a batch can have
    /// every point's listings on their way before it reads any.
    #[inline]
    pub fn prefetch(&self) {
        prefetch_lines(self.listings);
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.listings.is_empty()
    }
}

/// One envelope and what it stands for.
#[derive(Debug, Clone, Copy)]
struct Listing<R> {
    envelope: Envelope,
    reference: R,
}

/// A point as the f32 box `[down, up]` around it: an f32 bound `lo` is
/// ≤ x exactly when it is ≤ the largest f32 ≤ x, and `hi` ≥ x exactly
/// when it is ≥ the smallest f32 ≥ x, so the test stays exact in f32.
pub struct PointBox {
    pub(super) down: [f32; 2],
    pub(super) up: [f32; 2],
}

impl PointBox {
    pub fn new(x: f64, y: f64) -> Self {
        Self {
            down: [f32_down(x), f32_down(y)],
            up: [f32_up(x), f32_up(y)],
        }
    }
}

/// What a cell lookup found.
pub enum Lookup<'a, R> {
    /// The envelopes that may hold the point (a superset; maybe empty).
    Candidates(Candidates<'a, R>),
    /// Too many envelopes meet this cell: ask the R-tree.
    Crowded,
}

#[derive(Debug, Clone)]
pub struct CandidateGrid<R> {
    min: [f64; 2],
    max: [f64; 2],
    scale: [f64; 2],
    nx: usize,
    ny: usize,
    /// Listings of cell `k` are `listings[starts[k]..starts[k + 1]]` (bits
    /// below [`CROWDED_BIT`]); `starts[k]` carries the bit when crowded.
    starts: Vec<u32>,
    listings: Vec<Listing<R>>,
}

impl<R: Copy> CandidateGrid<R> {
    /// `envelopes` are `(min, max, reference)` in degrees, rounded outward
    /// to f32 by the caller. `None` when there is nothing to grid.
    pub fn build(envelopes: &[([f32; 2], [f32; 2], R)]) -> Option<Self> {
        if envelopes.is_empty() {
            return None;
        }
        let mut min = [f64::INFINITY; 2];
        let mut max = [f64::NEG_INFINITY; 2];
        let mut sides: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for (lo, hi, _) in envelopes {
            for axis in 0..2 {
                min[axis] = min[axis].min(f64::from(lo[axis]));
                max[axis] = max[axis].max(f64::from(hi[axis]));
                sides[axis].push(f64::from(hi[axis] - lo[axis]));
            }
        }
        let extent = [
            (max[0] - min[0]).max(f64::MIN_POSITIVE),
            (max[1] - min[1]).max(f64::MIN_POSITIVE),
        ];
        // Cells the size of the median envelope, capped in number.
        let median = |v: &mut Vec<f64>| {
            v.sort_unstable_by(f64::total_cmp);
            v[v.len() / 2].max(extent[0].min(extent[1]) * 1e-6)
        };
        let (mut nx, mut ny) = (
            (extent[0] / median(&mut sides[0])).ceil().clamp(1.0, 1e6) as usize,
            (extent[1] / median(&mut sides[1])).ceil().clamp(1.0, 1e6) as usize,
        );
        let max_cells = (envelopes.len() * CELLS_PER_ENVELOPE).max(64);
        loop {
            while nx * ny > max_cells {
                nx = nx.div_ceil(2);
                ny = ny.div_ceil(2);
            }
            let grid = Self::with_cells(min, max, extent, nx, ny, envelopes);
            if grid.is_some() || (nx == 1 && ny == 1) {
                return grid;
            }
            nx = nx.div_ceil(2);
            ny = ny.div_ceil(2);
        }
    }

    /// `None` when the listings would exceed their budget at this size.
    fn with_cells(
        min: [f64; 2],
        max: [f64; 2],
        extent: [f64; 2],
        nx: usize,
        ny: usize,
        envelopes: &[([f32; 2], [f32; 2], R)],
    ) -> Option<Self> {
        let mut grid = Self {
            min,
            max,
            scale: [nx as f64 / extent[0], ny as f64 / extent[1]],
            nx,
            ny,
            starts: Vec::new(),
            listings: Vec::new(),
        };
        let range = |lo: &[f32; 2], hi: &[f32; 2]| {
            let (x0, y0) = grid.cell_of(f64::from(lo[0]), f64::from(lo[1]));
            let (x1, y1) = grid.cell_of(f64::from(hi[0]), f64::from(hi[1]));
            (x0, y0, x1, y1)
        };
        let mut counts = vec![0u32; nx * ny + 1];
        let mut listings = 0usize;
        for (lo, hi, _) in envelopes {
            let (x0, y0, x1, y1) = range(lo, hi);
            listings += (x1 - x0 + 1) * (y1 - y0 + 1);
            if listings > envelopes.len() * LISTINGS_PER_ENVELOPE {
                return None;
            }
            for cy in y0..=y1 {
                for c in &mut counts[cy * nx + x0 + 1..=cy * nx + x1 + 1] {
                    *c += 1;
                }
            }
        }
        // Crowded cells list nothing; the caller goes to the R-tree.
        let crowded: Vec<bool> = counts[1..].iter().map(|&c| c as usize > CROWDED).collect();
        for (k, &is_crowded) in crowded.iter().enumerate() {
            if is_crowded {
                counts[k + 1] = 0;
            }
        }
        for k in 0..nx * ny {
            counts[k + 1] += counts[k];
        }
        let total = counts[nx * ny] as usize;
        if total >= CROWDED_BIT as usize {
            return None;
        }
        let mut fill = counts.clone();
        let mut listed: Vec<Option<Listing<R>>> = vec![None; total];
        for &(lo, hi, reference) in envelopes {
            let (x0, y0, x1, y1) = range(&lo, &hi);
            for cy in y0..=y1 {
                for k in cy * nx + x0..=cy * nx + x1 {
                    if !crowded[k] {
                        listed[fill[k] as usize] = Some(Listing {
                            envelope: Envelope { lo, hi },
                            reference,
                        });
                        fill[k] += 1;
                    }
                }
            }
        }
        for (k, &is_crowded) in crowded.iter().enumerate() {
            if is_crowded {
                counts[k] |= CROWDED_BIT;
            }
        }
        grid.starts = counts;
        grid.listings = listed.into_iter().flatten().collect();
        Some(grid)
    }

    fn cell_of(&self, x: f64, y: f64) -> (usize, usize) {
        (
            (((x - self.min[0]) * self.scale[0]) as usize).min(self.nx - 1),
            (((y - self.min[1]) * self.scale[1]) as usize).min(self.ny - 1),
        )
    }

    /// The listings that may hold `(x, y)`.
    pub fn lookup(&self, x: f64, y: f64) -> Lookup<'_, R> {
        let Some(k) = self.cell_index(x, y) else {
            return Lookup::Candidates(Candidates { listings: &[] });
        };
        let start = self.starts[k];
        if start & CROWDED_BIT != 0 {
            return Lookup::Crowded;
        }
        let range = start as usize..(self.starts[k + 1] & !CROWDED_BIT) as usize;
        Lookup::Candidates(Candidates {
            listings: &self.listings[range],
        })
    }

    /// Starts loading the cell [`Self::lookup`] will read for `(x, y)`.
    #[inline]
    pub fn prefetch(&self, x: f64, y: f64) {
        if let Some(k) = self.cell_index(x, y) {
            prefetch(&self.starts[k]);
        }
    }

    /// The cell `(x, y)` falls in; `None` outside the grid (NaN included).
    #[inline]
    fn cell_index(&self, x: f64, y: f64) -> Option<usize> {
        if !(x >= self.min[0] && x <= self.max[0] && y >= self.min[1] && y <= self.max[1]) {
            return None;
        }
        let (cx, cy) = self.cell_of(x, y);
        Some(cy * self.nx + cx)
    }
}

impl Envelope {
    /// Whether the point lies in the listed envelope (boundary included).
    /// `&`, not `&&`: four compares and no branch per box, where the
    /// short-circuit form branched on each bound.
    #[inline]
    fn holds(&self, point: &PointBox) -> bool {
        (self.lo[0] <= point.down[0])
            & (self.lo[1] <= point.down[1])
            & (point.up[0] <= self.hi[0])
            & (point.up[1] <= self.hi[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn square(x: f32, y: f32, side: f32, id: u32) -> ([f32; 2], [f32; 2], u32) {
        ([x, y], [x + side, y + side], id)
    }

    #[test]
    fn every_point_of_an_envelope_finds_it() {
        let envelopes: Vec<_> = (0..400)
            .map(|i| square((i % 20) as f32 * 0.7, (i / 20) as f32 * 0.7, 1.0, i))
            .collect();
        let grid = CandidateGrid::build(&envelopes).expect("grid");
        for &(lo, hi, id) in &envelopes {
            for (x, y) in [
                (lo[0], lo[1]),
                (hi[0], hi[1]),
                (lo[0], hi[1]),
                ((lo[0] + hi[0]) / 2.0, (lo[1] + hi[1]) / 2.0),
            ] {
                match grid.lookup(f64::from(x), f64::from(y)) {
                    Lookup::Candidates(c) => assert!(
                        c.holding(&PointBox::new(f64::from(x), f64::from(y)))
                            .any(|&r| r == id),
                        "{id} at {x},{y}"
                    ),
                    Lookup::Crowded => panic!("no cell should be crowded"),
                }
            }
        }
        assert!(matches!(grid.lookup(-1.0, 0.5), Lookup::Candidates(c) if c.is_empty()));
        assert!(matches!(grid.lookup(f64::NAN, 0.5), Lookup::Candidates(c) if c.is_empty()));
    }

    #[test]
    fn a_crowded_cell_defers_to_the_tree() {
        let mut envelopes: Vec<_> = (0..100).map(|i| square(5.0, 5.0, 0.01, i)).collect();
        envelopes.extend((0..100).map(|i| square(i as f32 * 0.1, 0.0, 0.01, 100 + i)));
        let grid = CandidateGrid::build(&envelopes).expect("grid");
        assert!(matches!(grid.lookup(5.005, 5.005), Lookup::Crowded));
        assert!(
            matches!(grid.lookup(0.105, 0.005), Lookup::Candidates(c) if c.holding(&PointBox::new(0.105, 0.005)).any(|&r| r == 101))
        );
    }
}
