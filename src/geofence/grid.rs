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

/// A cell's listings. Envelopes and references are kept in two parallel
/// arrays so the scan reads only the dense boxes (16 bytes each), and a
/// reference is loaded only for a box that holds the point.
pub struct Candidates<'a, R> {
    envelopes: &'a [Envelope],
    references: &'a [R],
}

impl<'a, R> Candidates<'a, R> {
    /// The references whose envelope holds `(x, y)`.
    pub fn holding(&self, x: f64, y: f64) -> impl Iterator<Item = &'a R> + use<'a, R> {
        self.envelopes
            .iter()
            .zip(self.references)
            .filter(move |(envelope, _)| envelope.holds(x, y))
            .map(|(_, reference)| reference)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
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
    /// Listings of cell `k` are `envelopes[starts[k]..starts[k + 1]]` and
    /// the same range of `references` (bits below [`CROWDED_BIT`]);
    /// `starts[k]` carries the bit when crowded.
    starts: Vec<u32>,
    envelopes: Vec<Envelope>,
    references: Vec<R>,
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
            envelopes: Vec::new(),
            references: Vec::new(),
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
        let mut listed: Vec<Option<(Envelope, R)>> = vec![None; total];
        for &(lo, hi, reference) in envelopes {
            let (x0, y0, x1, y1) = range(&lo, &hi);
            for cy in y0..=y1 {
                for k in cy * nx + x0..=cy * nx + x1 {
                    if !crowded[k] {
                        listed[fill[k] as usize] = Some((Envelope { lo, hi }, reference));
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
        (grid.envelopes, grid.references) = listed.into_iter().flatten().unzip();
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
        if !(x >= self.min[0] && x <= self.max[0] && y >= self.min[1] && y <= self.max[1]) {
            return Lookup::Candidates(Candidates {
                envelopes: &[],
                references: &[],
            });
        }
        let (cx, cy) = self.cell_of(x, y);
        let k = cy * self.nx + cx;
        let start = self.starts[k];
        if start & CROWDED_BIT != 0 {
            return Lookup::Crowded;
        }
        let range = start as usize..(self.starts[k + 1] & !CROWDED_BIT) as usize;
        Lookup::Candidates(Candidates {
            envelopes: &self.envelopes[range.clone()],
            references: &self.references[range],
        })
    }
}

impl Envelope {
    /// Whether `(x, y)` lies in the listed envelope (boundary included).
    #[inline]
    pub fn holds(&self, x: f64, y: f64) -> bool {
        f64::from(self.lo[0]) <= x
            && x <= f64::from(self.hi[0])
            && f64::from(self.lo[1]) <= y
            && y <= f64::from(self.hi[1])
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
                        c.holding(f64::from(x), f64::from(y)).any(|&r| r == id),
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
            matches!(grid.lookup(0.105, 0.005), Lookup::Candidates(c) if c.holding(0.105, 0.005).any(|&r| r == 101))
        );
    }
}
