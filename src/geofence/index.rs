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
//! Each candidate carries its part's cell grid header ([`GridRef`]) and
//! where its exact test lies ([`Exact`]): the query reads the listing, then
//! the cell's two bits in a shared arena, and only where an edge may cross
//! that cell does it read edges, from arenas too: a small part's rings
//! walked flat, a larger part's latitude band of edges ([`BandedRings`]),
//! a circle's centre and radius. No query reads a fence or a part (unless
//! an arena outgrew what a `u32` addresses). Before this, every candidate
//! cost four dependent loads (fence, part, ring, cells), and the profile
//! was cache misses on them.
//!
//! Parts whose envelope is far larger than the typical one (country borders
//! among city blocks) go into a second layer, with its own grid and tree.
//! Packed among small neighbours they would inflate every ancestor node's
//! envelope, and each query would descend into those nodes for nothing;
//! measured, mixing three 10k-vertex polygons into 10k city blocks halved
//! the query rate. Their own grid spares each query a descent of their tree.

use super::banded::{BandedRef, BandedRings};
use super::cell_grid::{Cell, CellGrid, GridRef, f32_down, f32_up};
use super::fences::Fence;
use super::grid::{CandidateGrid, Candidates, Lookup, PointBox};
use super::packed_cells::PackedCells;
use super::prefetch::{prefetch, prefetch_lines};
use super::ring::Position;
use super::shape::{Circle, Part, PolygonShape, walk_flat};
use crate::model::FenceId;
use geo::Coord;
use rstar::primitives::{GeomWithData, Rectangle};
use rstar::{AABB, RTree, RTreeObject};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

mod batch;
mod overlay;

pub use batch::Coverings;
use batch::sort_dedup_from;
pub use overlay::{FenceChange, FenceIndex, Tombstone};

/// Index of a fence in [`FenceIndex::fences`].
pub type FenceIdx = u32;

/// Envelopes are stored in f32, rounded outward: half the bytes per node,
/// so more of the tree stays in cache, and the tree is only a pre-filter
/// (exact containment runs in f64 afterwards). An f32 step is at most
/// 1.5e-5° (under 2 m, at ±180°), so the extra candidates are negligible.
type Entry = GeomWithData<Rectangle<[f32; 2]>, Candidate>;

/// One part as the query meets it: its fence, its cell map if any, and
/// where its exact test lies.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    fence: FenceIdx,
    /// Polygons only; circles and grid-less parts go to the exact test.
    grid: Option<GridRef>,
    exact: Exact,
}

/// Where a candidate's exact test reads, when its cell cannot decide.
#[derive(Debug, Clone, Copy)]
enum Exact {
    /// A small polygon's rings: `flat[start..start + len]`.
    Flat { start: u32, len: u32 },
    /// A larger polygon's rings in [`FenceIndex::banded`].
    Banded(BandedRef),
    /// `circles[i]`.
    Circle(u32),
    /// Part `n` of the fence itself: only once an arena is as large as a
    /// `u32` can address.
    Part(u32),
}

/// Polygon parts with at most this many coordinates are copied to the flat
/// arena and walked edge by edge when their cell cannot decide; larger
/// ones walk one latitude band of their edges ([`BandedRings`]).
const FLAT_WALK_MAX: usize = 96;

/// Cells per edge of a part's grid: measured on the bench's 10k fences,
/// 4 left 48% of lookups to the edges, 16 took 1.6× fewer; 16's time
/// over 32's was 1.10× [0.89–1.14] over 4 rounds, not resolved, and 64
/// no faster than 32 (measured at one byte per cell, before the arena
/// held two bits). 32 stays for lack of evidence against it, and its
/// cells fit. At 32 the bench's 10k fences take
/// 12.7 M cells (3.2 MB at two bits each), next to 6.3 MB of coordinates.
const PART_CELLS_PER_EDGE: usize = 32;

/// How many times the median envelope area makes a part "large".
const LARGE_FACTOR: f64 = 64.0;

/// From this many bytes (part-grid cells, flat rings, and one R-tree entry
/// per part envelope, standing in for the grid's listings of it; the
/// banded rings of parts over [`FLAT_WALK_MAX`] coordinates are not
/// counted, as their rings were not when this was measured), an index is
/// queried in batches: the batch hides cache misses, and an index that
/// stays in a core's cache has none to hide, only the batch's own
/// bookkeeping. Measured
/// (`evaluator/*` in `benches/geofence.rs`, the per-fix path always run
/// first): at 100 fences (0.09 MB by this count) the batch path ran at
/// 0.86× [0.78–0.90] the per-fix path's rate, at 10k (9.8 MB) at 1.22×
/// [0.84–1.37] and 1.10× [0.77–1.32] in two sets. The crossover between
/// was not measured; 1 MiB is twice this machine's L2 per core.
const BATCH_MIN_BYTES: usize = 1 << 20;

/// One immutable spatial index over a list of fences: a fence set's base,
/// or the few fences changed since ([`FenceIndex`] layers them).
#[derive(Debug)]
pub(crate) struct Spatial {
    fences: Vec<Arc<Fence>>,
    /// Parts of typical size.
    small: Layer,
    /// Parts with an envelope over [`LARGE_FACTOR`] × the median area.
    large: Layer,
    /// Every part grid's cells, one after another.
    cells: PackedCells,
    /// Small parts' rings, one after another (see [`PolygonShape::flat_rings`]).
    flat: Vec<Coord<f64>>,
    /// Larger polygon parts' rings, by latitude band.
    banded: BandedRings,
    circles: Vec<Circle>,
    by_id: HashMap<FenceId, FenceIdx>,
    /// See [`Self::prefers_batches`].
    prefers_batches: bool,
}

impl Spatial {
    pub(crate) fn new(fences: Vec<Arc<Fence>>) -> Self {
        let mut entries = Vec::new();
        let mut cells = PackedCells::default();
        let mut arenas = ExactArenas::default();
        for (f, fence) in fences.iter().enumerate() {
            for (p, part) in fence.parts.iter().enumerate() {
                let candidate = Candidate {
                    fence: f as FenceIdx,
                    grid: part_grid(part, &mut cells),
                    exact: arenas.push(part, p),
                };
                for (lo, hi) in part.envelopes() {
                    let rect = Rectangle::from_corners(
                        [f32_down(lo.x), f32_down(lo.y)],
                        [f32_up(hi.x), f32_up(hi.y)],
                    );
                    entries.push(GeomWithData::new(rect, candidate));
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
        let hot_bytes = cells.len().div_ceil(4)
            + std::mem::size_of_val(arenas.flat.as_slice())
            + (large.len() + small.len()) * std::mem::size_of::<Entry>();
        Self {
            prefers_batches: hot_bytes >= BATCH_MIN_BYTES,
            fences,
            small: Layer::new(small),
            large: Layer::new(large),
            cells,
            flat: arenas.flat,
            banded: arenas.banded,
            circles: arenas.circles,
            by_id,
        }
    }

    pub(crate) fn fences(&self) -> &[Arc<Fence>] {
        &self.fences
    }

    pub(crate) fn fence(&self, idx: FenceIdx) -> &Arc<Fence> {
        &self.fences[idx as usize]
    }

    /// The last fence listed with this id.
    pub(crate) fn find(&self, id: &str) -> Option<FenceIdx> {
        self.by_id.get(id).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.fences.len()
    }

    /// Whether [`Self::containing_batch`] should answer for many points at
    /// once, rather than [`Self::containing`] one by one: true once the
    /// index is too large to stay in cache (see [`BATCH_MIN_BYTES`]).
    pub(crate) fn prefers_batches(&self) -> bool {
        self.prefers_batches
    }

    /// Replaces `out` with the fences covering `p` (lon, lat), ascending and
    /// without duplicates. Reusing `out` keeps the hot path allocation-free.
    pub(crate) fn containing(&self, p: Coord<f64>, out: &mut Vec<FenceIdx>) {
        out.clear();
        self.append_containing(p, out);
    }

    /// [`Self::containing`], appended to what `out` holds (the fences a
    /// layered set's base found, before its delta's).
    pub(crate) fn append_containing(&self, p: Coord<f64>, out: &mut Vec<FenceIdx>) {
        let start = out.len();
        let point = PointBox::new(p.x, p.y);
        for layer in self.layers() {
            layer.each(&point, layer.listed(p), |candidate| {
                if self.covers(candidate, p) {
                    out.push(candidate.fence);
                }
            });
        }
        sort_dedup_from(out, start);
    }

    /// The small parts' layer, then the large parts'.
    fn layers(&self) -> [&Layer; LAYERS] {
        [&self.small, &self.large]
    }

    /// Whether the candidate's part covers `p`: its cell if that decides,
    /// else its exact test.
    #[inline]
    fn covers(&self, candidate: &Candidate, p: Coord<f64>) -> bool {
        let cell = candidate
            .grid
            .map(|grid| self.cells.get(grid.cell_index(p)));
        self.covers_in(candidate, cell, p)
    }

    /// [`Self::covers`] given the candidate's cell (`None`: no grid).
    #[inline]
    fn covers_in(&self, candidate: &Candidate, cell: Option<Cell>, p: Coord<f64>) -> bool {
        match cell {
            Some(Cell::Inside) => true,
            Some(Cell::Outside) => false,
            Some(Cell::Edge) | None => self.exact_covers(candidate, p),
        }
    }

    /// The candidate's exact test, read from the arenas.
    #[inline]
    fn exact_covers(&self, candidate: &Candidate, p: Coord<f64>) -> bool {
        match candidate.exact {
            Exact::Flat { start, len } => {
                walk_flat(self.flat_rings(start, len), p) != Position::Outside
            }
            Exact::Banded(part) => self.banded.position(part, p) != Position::Outside,
            Exact::Circle(i) => self.circles[i as usize].covers(p),
            Exact::Part(n) => self.fences[candidate.fence as usize].parts[n as usize].covers(p),
        }
    }

    /// A small part's rings in the flat arena.
    #[inline]
    fn flat_rings(&self, start: u32, len: u32) -> &[Coord<f64>] {
        let start = start as usize;
        &self.flat[start..start + len as usize]
    }

    /// Starts loading what [`Self::exact_covers`] will read first.
    #[inline]
    fn prefetch_exact(&self, candidate: &Candidate, p: Coord<f64>) {
        match candidate.exact {
            Exact::Flat { start, len } => prefetch_lines(self.flat_rings(start, len)),
            Exact::Banded(part) => self.banded.prefetch(part, p),
            Exact::Circle(i) => prefetch(&self.circles[i as usize]),
            Exact::Part(_) => {}
        }
    }
}

/// The arenas exact tests read, while an index is built.
#[derive(Default)]
struct ExactArenas {
    flat: Vec<Coord<f64>>,
    banded: BandedRings,
    circles: Vec<Circle>,
}

impl ExactArenas {
    /// Copies part `n` of its fence to the arena its exact test will read.
    fn push(&mut self, part: &Part, n: usize) -> Exact {
        let copied = match part {
            Part::Circle(circle) => u32::try_from(self.circles.len()).ok().map(|i| {
                self.circles.push(*circle);
                Exact::Circle(i)
            }),
            Part::Polygon(polygon) => flat_copy(polygon, &mut self.flat)
                .or_else(|| self.banded.push(polygon).map(Exact::Banded)),
        };
        copied.unwrap_or(Exact::Part(n as u32))
    }
}

/// How many layers an index has: small parts and large ones.
const LAYERS: usize = 2;

/// Parts in an R-tree, and by grid cell in front of it for point queries
/// (see `grid.rs`); crowded cells fall back to the tree.
#[derive(Debug)]
struct Layer {
    tree: RTree<Entry>,
    grid: Option<CandidateGrid<Candidate>>,
}

impl Layer {
    fn new(entries: Vec<Entry>) -> Self {
        let listed: Vec<_> = entries
            .iter()
            .map(|e| {
                let env = e.geom().envelope();
                (env.lower(), env.upper(), e.data)
            })
            .collect();
        Self {
            grid: CandidateGrid::build(&listed),
            tree: RTree::bulk_load(entries),
        }
    }

    /// Starts loading the grid cell [`Self::listed`] will read for `p`.
    fn prefetch(&self, p: Coord<f64>) {
        if let Some(grid) = &self.grid {
            grid.prefetch(p.x, p.y);
        }
    }

    /// The listings whose envelopes may hold `p`; `None` when the tree
    /// must answer (a crowded cell, or no grid).
    fn listed(&self, p: Coord<f64>) -> Option<Candidates<'_, Candidate>> {
        match self.grid.as_ref()?.lookup(p.x, p.y) {
            Lookup::Candidates(candidates) => Some(candidates),
            Lookup::Crowded => None,
        }
    }

    /// Calls `f` with each part whose envelope holds `point`, from
    /// `listed` if it is `Some`, else from the tree.
    #[inline]
    fn each(
        &self,
        point: &PointBox,
        listed: Option<Candidates<'_, Candidate>>,
        mut f: impl FnMut(&Candidate),
    ) {
        match listed {
            Some(candidates) => candidates.holding(point).for_each(f),
            // Internal iteration: no traversal stack to allocate per query.
            None => {
                let probe = AABB::from_corners(point.down, point.up);
                let _ = self.tree.locate_in_envelope_intersecting_int(&probe, |e| {
                    f(&e.data);
                    ControlFlow::<()>::Continue(())
                });
            }
        }
    }
}

/// Copies a small polygon part's rings to the flat arena; `None` when the
/// part is too large for the flat walk.
fn flat_copy(polygon: &PolygonShape, arena: &mut Vec<Coord<f64>>) -> Option<Exact> {
    // Coordinates, closing points and separators.
    let coords = polygon.exterior.coords().len()
        + polygon
            .holes
            .iter()
            .map(|h| h.coords().len() + 1)
            .sum::<usize>();
    if coords > FLAT_WALK_MAX {
        return None;
    }
    let rings = polygon.flat_rings();
    let start = u32::try_from(arena.len()).ok()?;
    let len = u32::try_from(rings.len()).ok()?;
    // The end must be addressable too.
    let _end = start.checked_add(len)?;
    arena.extend_from_slice(&rings);
    Some(Exact::Flat { start, len })
}

/// A cell grid over a polygon part (holes included), its cells appended to
/// `arena`. `None` for circles, for parts the grid would not pay for, and
/// once the arena is as large as a [`GridRef`] can address.
fn part_grid(part: &Part, arena: &mut PackedCells) -> Option<GridRef> {
    let Part::Polygon(polygon) = part else {
        return None;
    };
    let (min, max) = polygon.exterior.bounds();
    let grid = CellGrid::build(PART_CELLS_PER_EDGE, &polygon.edges(), min, max, |p| {
        polygon.position(p)
    })?;
    let offset = u32::try_from(arena.len()).ok()?;
    u32::try_from(arena.len() + grid.cells().len()).ok()?;
    arena.extend(grid.cells());
    Some(grid.header(offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::generate::random_fences;

    /// Each part's exact test is the one its kind and size call for, so
    /// the tests of the banded path (`tests/geofence.rs`) do reach it.
    #[test]
    fn each_part_gets_the_exact_test_its_size_calls_for() {
        let (fences, _) = random_fences(1, 60, 2, 500);
        let index = Spatial::new(fences.into_iter().map(Arc::new).collect());
        let mut seen = [0; 3];
        for layer in index.layers() {
            for entry in layer.tree.iter() {
                let fence = index.fence(entry.data.fence);
                let [part] = fence.parts.as_slice() else {
                    continue;
                };
                let kind = match (part, entry.data.exact) {
                    (Part::Circle(_), Exact::Circle(_)) => 0,
                    (Part::Polygon(p), Exact::Flat { len, .. })
                        if p.flat_rings().len() <= FLAT_WALK_MAX =>
                    {
                        assert_eq!(len as usize, p.flat_rings().len());
                        1
                    }
                    (Part::Polygon(p), Exact::Banded(_))
                        if p.flat_rings().len() > FLAT_WALK_MAX =>
                    {
                        2
                    }
                    (part, exact) => panic!("{} got {exact:?} for {part:?}", fence.id),
                };
                seen[kind] += 1;
            }
        }
        assert!(
            seen.iter().all(|&n| n > 0),
            "circles, flat, banded: {seen:?}"
        );
    }
}
