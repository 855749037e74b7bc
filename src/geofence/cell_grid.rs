//! A uniform grid over a shape's bounding box whose cells know, where they
//! can, whether every point in them is inside or outside: the question is
//! then one byte read, and only cells an edge may cross need the edges.
//!
//! Why it is exact: the point → cell map is monotone in x and in y (a
//! subtraction, a multiplication by a positive constant, a truncation that
//! saturates at 0 and a clamp at the last cell, each monotone under IEEE
//! rounding), so every point inside a box maps into the cell range of the
//! box's corners. Edges are marked piece by piece (see `reached_cells`), so
//! a cell left unmarked holds no boundary point. The points that map to it
//! form a convex set (a rectangle, unbounded for a cell on the rim, since
//! the map saturates) that the boundary never crosses, so they all answer
//! as the cell's centre does, computed once.
//!
//! That holds for every finite point, not only those in the bounding box:
//! an unmarked rim cell reaches out to infinity, where the winding number is
//! 0, so it is never "inside". The index relies on this to skip an exact box
//! test for points in the f32 rounding sliver around a part's box.
//!
//! The grid's origin and scale are f32 values (held in f64): the map needs
//! only to be the same at build and query, not precise, and the index keeps
//! a 24-byte copy of the header ([`GridRef`]) next to each candidate so a
//! query reaches the cell without loading the shape first.

use super::position::Position;
use geo::Coord;

/// What a grid cell knows about every point that maps to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cell {
    Outside = 0,
    Inside = 1,
    /// An edge may pass through: ask the edges.
    Edge = 2,
}

/// Gives up on the grid when marking edges would write more than this many
/// cells per cell (edges long for the grid, or cells too fine for the
/// marking margin); the edges still answer.
const MAX_MARKING_WORK: usize = 16;

/// Cells per axis at most, so the count fits a `u16` in [`GridRef`].
const MAX_SIDE: usize = 4096;

#[derive(Debug, Clone)]
pub struct CellGrid {
    pub(super) min: Coord<f64>,
    pub(super) scale: Coord<f64>,
    pub(super) nx: usize,
    pub(super) ny: usize,
    pub(super) cells: Vec<Cell>,
}

/// The cell map of a [`CellGrid`] whose cells live at `offset` in a shared
/// arena: what a candidate carries so the query goes straight to its cell.
#[derive(Debug, Clone, Copy)]
pub struct GridRef {
    min: [f32; 2],
    scale: [f32; 2],
    nx: u16,
    ny: u16,
    offset: u32,
}

impl GridRef {
    /// The arena index of the cell `p` maps to.
    #[inline]
    pub fn cell_index(&self, p: Coord<f64>) -> usize {
        let (cx, cy) = cell_of(
            p,
            f64::from(self.min[0]),
            f64::from(self.min[1]),
            f64::from(self.scale[0]),
            f64::from(self.scale[1]),
            usize::from(self.nx),
            usize::from(self.ny),
        );
        self.offset as usize + cy * usize::from(self.nx) + cx
    }
}

#[inline]
fn cell_of(
    p: Coord<f64>,
    x0: f64,
    y0: f64,
    sx: f64,
    sy: f64,
    nx: usize,
    ny: usize,
) -> (usize, usize) {
    (
        (((p.x - x0) * sx) as usize).min(nx - 1),
        (((p.y - y0) * sy) as usize).min(ny - 1),
    )
}

/// The largest f32 ≤ `v`.
pub fn f32_down(v: f64) -> f32 {
    let r = v as f32;
    if f64::from(r) > v { r.next_down() } else { r }
}

/// The smallest f32 ≥ `v`.
pub fn f32_up(v: f64) -> f32 {
    let r = v as f32;
    if f64::from(r) < v { r.next_up() } else { r }
}

impl CellGrid {
    pub fn cell_of(&self, p: Coord<f64>) -> (usize, usize) {
        cell_of(
            p,
            self.min.x,
            self.min.y,
            self.scale.x,
            self.scale.y,
            self.nx,
            self.ny,
        )
    }

    pub fn at(&self, p: Coord<f64>) -> Cell {
        let (cx, cy) = self.cell_of(p);
        self.cells[cy * self.nx + cx]
    }

    /// The header for cells copied to `offset` in an arena.
    pub fn header(&self, offset: u32) -> GridRef {
        GridRef {
            // Exact: both were rounded to f32 at build.
            min: [self.min.x as f32, self.min.y as f32],
            scale: [self.scale.x as f32, self.scale.y as f32],
            nx: self.nx as u16,
            ny: self.ny as u16,
            offset,
        }
    }

    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// Marks every cell a point of some edge can map to.
    ///
    /// Each edge is cut into pieces at most half a cell long on either
    /// axis, and each piece marks the cells of its bounding box, widened by
    /// a margin above the rounding of the cut points (`a + d·t` is off by
    /// at most ~4 ulps of the coordinates; the margin is 16 machine
    /// epsilons of them). By the monotone map, every point of the piece
    /// maps into that range. Marking the whole edge's box instead (the
    /// first version) left a diagonal edge covering a rectangle of cells it
    /// never crosses, and over a third of all lookups fell to the edge walk.
    fn reached_cells(&self, edges: &[(Coord<f64>, Coord<f64>)]) -> Option<Vec<bool>> {
        let budget = MAX_MARKING_WORK.saturating_mul(self.cells.len());
        let mut reached = vec![false; self.cells.len()];
        let mut work = 0usize;
        for &(a, b) in edges {
            let d = b - a;
            let spans = (d.x.abs() * self.scale.x).max(d.y.abs() * self.scale.y);
            let pieces = (spans * 2.0).ceil().max(1.0);
            // NaN (a non-finite edge) refuses the grid too.
            if pieces.is_nan() || pieces > budget as f64 {
                return None;
            }
            let margin = 16.0
                * f64::EPSILON
                * (1.0 + a.x.abs().max(a.y.abs()).max(b.x.abs()).max(b.y.abs()));
            let at = |i: f64| if i >= pieces { b } else { a + d * (i / pieces) };
            let mut from = a;
            for i in 1..=pieces as usize {
                let to = at(i as f64);
                let (x0, y0) = self.cell_of(Coord {
                    x: from.x.min(to.x) - margin,
                    y: from.y.min(to.y) - margin,
                });
                let (x1, y1) = self.cell_of(Coord {
                    x: from.x.max(to.x) + margin,
                    y: from.y.max(to.y) + margin,
                });
                work = work.saturating_add((x1 - x0 + 1) * (y1 - y0 + 1));
                if work > budget {
                    return None;
                }
                for cy in y0..=y1 {
                    reached[cy * self.nx + x0..=cy * self.nx + x1].fill(true);
                }
                from = to;
            }
        }
        Some(reached)
    }

    /// A grid over `[min, max]` for the boundary made of `edges`;
    /// `classify` answers for a cell centre and is only asked about points
    /// no edge's range covers. `None` when the grid would not pay.
    pub fn build(
        cells_per_edge: usize,
        edges: &[(Coord<f64>, Coord<f64>)],
        min: Coord<f64>,
        max: Coord<f64>,
        classify: impl Fn(Coord<f64>) -> Position,
    ) -> Option<Self> {
        let target = (edges.len() * cells_per_edge).clamp(16, 1 << 20) as f64;
        let origin = Coord {
            x: f64::from(f32_down(min.x)),
            y: f64::from(f32_down(min.y)),
        };
        let (w, h) = (
            (max.x - origin.x).max(f64::MIN_POSITIVE),
            (max.y - origin.y).max(f64::MIN_POSITIVE),
        );
        let nx = ((target * w / h).sqrt().ceil() as usize).clamp(1, MAX_SIDE);
        let ny = ((target / nx as f64).ceil() as usize).clamp(1, MAX_SIDE);
        let scale = |n: usize, span: f64| {
            let s = f64::from((n as f64 / span) as f32);
            (s.is_finite() && s > 0.0).then_some(s)
        };
        let mut grid = CellGrid {
            min: origin,
            scale: Coord {
                x: scale(nx, w)?,
                y: scale(ny, h)?,
            },
            nx,
            ny,
            cells: vec![Cell::Outside; nx * ny],
        };
        let reached = grid.reached_cells(edges)?;
        for cy in 0..ny {
            for cx in 0..nx {
                let k = cy * nx + cx;
                let centre = Coord {
                    x: origin.x + (cx as f64 + 0.5) / grid.scale.x,
                    y: origin.y + (cy as f64 + 0.5) / grid.scale.y,
                };
                // A centre that rounds into a neighbouring cell cannot speak
                // for this one.
                grid.cells[k] = if reached[k] || grid.cell_of(centre) != (cx, cy) {
                    Cell::Edge
                } else {
                    match classify(centre) {
                        Position::Inside => Cell::Inside,
                        Position::Outside => Cell::Outside,
                        Position::Boundary => Cell::Edge,
                    }
                };
            }
        }
        Some(grid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::generate::{SplitMix64, star_ring};
    use geo::coordinate_position::{CoordPos, CoordinatePosition};
    use geo::{LineString, Polygon};

    fn oracle(polygon: &Polygon<f64>, p: Coord<f64>) -> Position {
        match polygon.coordinate_position(&p) {
            CoordPos::Inside => Position::Inside,
            CoordPos::OnBoundary => Position::Boundary,
            CoordPos::Outside => Position::Outside,
        }
    }

    fn edges_of(rings: &[Vec<Coord<f64>>]) -> Vec<(Coord<f64>, Coord<f64>)> {
        rings
            .iter()
            .flat_map(|r| r.windows(2).map(|e| (e[0], e[1])))
            .collect()
    }

    /// Every decided cell agrees with geo's robust answer on random points,
    /// points on the edges (where a marking slip would show), the cell
    /// corners, and points just outside the box that clamp into rim cells.
    fn decided_cells_agree(rings: Vec<Vec<Coord<f64>>>, cells_per_edge: usize, seed: u64) {
        let polygon = Polygon::new(
            LineString::from(rings[0].clone()),
            rings[1..].iter().cloned().map(LineString::from).collect(),
        );
        let edges = edges_of(&rings);
        let (mut min, mut max) = (rings[0][0], rings[0][0]);
        for c in &rings[0] {
            (min.x, min.y, max.x, max.y) = (
                min.x.min(c.x),
                min.y.min(c.y),
                max.x.max(c.x),
                max.y.max(c.y),
            );
        }
        let grid = CellGrid::build(cells_per_edge, &edges, min, max, |p| oracle(&polygon, p))
            .expect("grid");
        let mut rng = SplitMix64::new(seed);
        let (w, h) = (max.x - min.x, max.y - min.y);
        let mut probes: Vec<Coord<f64>> = (0..20_000)
            .map(|_| Coord {
                x: rng.range(min.x - w * 0.01, max.x + w * 0.01),
                y: rng.range(min.y - h * 0.01, max.y + h * 0.01),
            })
            .collect();
        // Far outside: the map saturates into rim cells.
        probes.extend((0..2_000).map(|_| Coord {
            x: rng.range(min.x - w, max.x + w),
            y: rng.range(min.y - h, max.y + h),
        }));
        for &(a, b) in &edges {
            probes.extend((0..=16).map(|i| a + (b - a) * (f64::from(i) / 16.0)));
        }
        for cy in 0..=grid.ny {
            for cx in 0..=grid.nx {
                probes.push(Coord {
                    x: grid.min.x + cx as f64 / grid.scale.x,
                    y: grid.min.y + cy as f64 / grid.scale.y,
                });
            }
        }
        let mut decided = 0;
        for p in probes {
            let expected = match grid.at(p) {
                Cell::Edge => continue,
                Cell::Inside => Position::Inside,
                Cell::Outside => Position::Outside,
            };
            decided += 1;
            assert_eq!(oracle(&polygon, p), expected, "at {p:?}");
        }
        assert!(decided > 5_000, "the grid decides most probes: {decided}");
        for cy in 0..grid.ny {
            for cx in 0..grid.nx {
                if cx == 0 || cy == 0 || cx == grid.nx - 1 || cy == grid.ny - 1 {
                    assert_ne!(
                        grid.cells[cy * grid.nx + cx],
                        Cell::Inside,
                        "rim cell {cx},{cy}"
                    );
                }
            }
        }
    }

    #[test]
    fn long_diagonal_edges_mark_only_the_cells_they_cross() {
        // A thin sliver along the diagonal: its edges' boxes cover the whole
        // grid, so box marking would decide nothing.
        let sliver = vec![
            Coord { x: 0.0, y: 0.0 },
            Coord { x: 1.0, y: 0.98 },
            Coord { x: 1.0, y: 1.0 },
            Coord { x: 0.0, y: 0.02 },
            Coord { x: 0.0, y: 0.0 },
        ];
        decided_cells_agree(vec![sliver], 400, 1);
    }

    #[test]
    fn polygons_with_holes_are_decided_exactly() {
        let mut rng = SplitMix64::new(5);
        for seed in 0..20 {
            let centre = Coord {
                x: rng.range(-170.0, 170.0),
                y: rng.range(-80.0, 80.0),
            };
            let exterior = star_ring(&mut rng, centre, 8 + seed * 3, 0.002, 0.004);
            let mut hole = star_ring(&mut rng, centre, 8, 0.0003, 0.0008);
            hole.reverse();
            decided_cells_agree(vec![exterior, hole], 16, seed as u64);
        }
    }

    /// A fence of a couple of metres at 179.99°: the f32 origin lies up to
    /// 1.5e-5° left of the box, several cells wide, so the left columns hold
    /// no point of the box at all.
    #[test]
    fn a_tiny_polygon_far_from_zero_is_decided_exactly() {
        let mut rng = SplitMix64::new(9);
        for (seed, lat) in [(1u64, 0.0), (2, 45.0), (3, -89.0)] {
            let centre = Coord { x: 179.99, y: lat };
            let ring = star_ring(&mut rng, centre, 40, 0.00001, 0.00002);
            decided_cells_agree(vec![ring], 32, seed);
        }
    }
}
