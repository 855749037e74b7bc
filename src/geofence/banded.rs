//! The index's arena of banded rings: the exact test for polygon parts too
//! large for the flat walk (`FLAT_WALK_MAX`), laid out so the query reads
//! contiguous arrays from the candidate alone.
//!
//! Why: these parts used to answer through their own rings (fence, part,
//! ring, the ring's grid, its band, the band's edge numbers, then the
//! coordinates those name: each load waiting on the one before, and the
//! ring's grid, coarser than the part's, never deciding where the part's
//! could not). Here a part is a run of ring headers in one array, each
//! ring's bands and coordinates in two more, so a query reads a header, a
//! band's bounds, its edge numbers and their coordinates; the batch
//! prefetches the bounds.
//!
//! Edge numbers, not copies of the edges: an edge is listed in every band
//! its latitude range meets, and on the bench's border-like rings that is
//! 19 bands on average, so copying both end points (32 bytes) in place of a
//! number (4) took 20 MB for three 10k-vertex polygons.
//!
//! The bands are the rings' own slabs ([`Slabs`], one band per edge), so
//! the answer is the one [`super::shape::PolygonShape::position`] gives,
//! boundary included: the same edges, the same winding rule, the same
//! robust orientation test.

use super::prefetch::prefetch;
use super::ring::{Position, PreparedRing, Slabs, edge_step};
use super::shape::{PolygonShape, cut_out};
use geo::Coord;
use std::ops::Range;

/// One ring's bands in the arena.
#[derive(Debug, Clone, Copy)]
struct BandedRing {
    min: Coord<f64>,
    max: Coord<f64>,
    /// Latitude of band 0's lower edge, and bands per degree.
    min_y: f64,
    scale: f64,
    bands: u32,
    /// Band `k`'s edges start at `edges[starts[first_start + k]]` and end
    /// where the next band's start.
    first_start: u32,
}

impl BandedRing {
    /// The band `y` falls in: the same map as [`Slabs::band_of`], so every
    /// edge spanning `y` is listed there.
    #[inline]
    fn band_of(&self, y: f64) -> usize {
        (((y - self.min_y) * self.scale) as usize).min(self.bands as usize - 1)
    }

    #[inline]
    fn holds(&self, p: Coord<f64>) -> bool {
        p.x >= self.min.x && p.x <= self.max.x && p.y >= self.min.y && p.y <= self.max.y
    }
}

/// A polygon part's rings: `rings[range]`, exterior first.
#[derive(Debug, Clone, Copy)]
pub struct BandedRef {
    first_ring: u32,
    ring_count: u32,
}

/// Every banded part's rings, bands and coordinates, one after another.
#[derive(Debug, Default)]
pub struct BandedRings {
    rings: Vec<BandedRing>,
    starts: Vec<u32>,
    /// Each band's edges, by the index in `coords` of their first end.
    edges: Vec<u32>,
    coords: Vec<Coord<f64>>,
}

impl BandedRings {
    /// Appends `polygon`'s rings; `None` once the arena is as large as a
    /// `u32` can address (the part then answers through its rings).
    pub fn push(&mut self, polygon: &PolygonShape) -> Option<BandedRef> {
        let first_ring = u32::try_from(self.rings.len()).ok()?;
        let ring_count = u32::try_from(1 + polygon.holes.len()).ok()?;
        let rollback = (
            self.rings.len(),
            self.starts.len(),
            self.edges.len(),
            self.coords.len(),
        );
        for ring in std::iter::once(&polygon.exterior).chain(&polygon.holes) {
            if self.push_ring(ring).is_none() {
                self.rings.truncate(rollback.0);
                self.starts.truncate(rollback.1);
                self.edges.truncate(rollback.2);
                self.coords.truncate(rollback.3);
                return None;
            }
        }
        Some(BandedRef {
            first_ring,
            ring_count,
        })
    }

    fn push_ring(&mut self, ring: &PreparedRing) -> Option<()> {
        let coords = ring.coords();
        let (min, max) = ring.bounds();
        let slabs = Slabs::build(coords, min.y, max.y);
        let first_start = u32::try_from(self.starts.len()).ok()?;
        let bands = u32::try_from(slabs.bands()).ok()?;
        let first_coord = u32::try_from(self.coords.len()).ok()?;
        u32::try_from(self.coords.len() + coords.len()).ok()?;
        for k in 0..slabs.bands() {
            self.starts.push(u32::try_from(self.edges.len()).ok()?);
            self.edges
                .extend(slabs.band(k).iter().map(|&i| first_coord + i));
        }
        self.starts.push(u32::try_from(self.edges.len()).ok()?);
        self.coords.extend_from_slice(coords);
        self.rings.push(BandedRing {
            min,
            max,
            min_y: slabs.min_y(),
            scale: slabs.scale(),
            bands,
            first_start,
        });
        Some(())
    }

    fn rings(&self, part: BandedRef) -> &[BandedRing] {
        let first = part.first_ring as usize;
        &self.rings[first..first + part.ring_count as usize]
    }

    /// Where `p` lies relative to the part, holes cut out.
    #[inline]
    pub fn position(&self, part: BandedRef, p: Coord<f64>) -> Position {
        let mut rings = self.rings(part).iter();
        let exterior = rings
            .next()
            .map_or(Position::Outside, |ring| self.ring_position(ring, p));
        cut_out(exterior, rings.map(|ring| self.ring_position(ring, p)))
    }

    fn ring_position(&self, ring: &BandedRing, p: Coord<f64>) -> Position {
        if !ring.holds(p) {
            return Position::Outside;
        }
        let mut winding = 0i32;
        for &i in &self.edges[self.band_edges(ring, p.y)] {
            let i = i as usize;
            if edge_step(self.coords[i], self.coords[i + 1], p, &mut winding) {
                return Position::Boundary;
            }
        }
        if winding != 0 {
            Position::Inside
        } else {
            Position::Outside
        }
    }

    #[inline]
    fn band_edges(&self, ring: &BandedRing, y: f64) -> Range<usize> {
        let k = ring.first_start as usize + ring.band_of(y);
        self.starts[k] as usize..self.starts[k + 1] as usize
    }

    /// Starts loading what [`Self::position`] reads first for `p`: the
    /// exterior's band bounds (its header is one of few, so likely cached).
    #[inline]
    pub fn prefetch(&self, part: BandedRef, p: Coord<f64>) {
        if let Some(ring) = self.rings(part).first() {
            prefetch(&self.starts[ring.first_start as usize + ring.band_of(p.y)]);
        }
    }
}
