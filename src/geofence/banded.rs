//! The index's arena of banded rings: the exact test for polygon parts too
//! large for the flat walk (`FLAT_WALK_MAX`), laid out so the query reads
//! contiguous arrays from the candidate alone.
//!
//! Why: these parts used to answer through their own rings (fence, part,
//! ring, the ring's grid, its band, the band's edge numbers, then the
//! coordinates those name: each load waiting on the one before, and the
//! ring's grid, coarser than the part's, rarely deciding where the part's
//! could not). Here the arena is four arrays: ring headers (a part is a run
//! of them), band bounds, edge numbers and coordinates. A query reads a
//! header, a band's bounds, its edge numbers and their coordinates; the
//! batch prefetches the bounds.
//!
//! Edge numbers, not copies of the edges: an edge is listed in every band
//! its latitude range meets, and on the bench's border-like rings that is
//! 19 bands on average, so copying both end points (32 bytes) in place of a
//! number (4) took 20 MB for three 10k-vertex polygons.
//!
//! The bands are the rings' own slabs ([`Slabs`]) where they have them,
//! else built the same way, read with the same map and walked by the same
//! function, so the answer is the one [`PolygonShape::position`] gives,
//! boundary included.

use super::prefetch::prefetch;
use super::ring::{Position, PreparedRing, Slabs, band_index, in_box, listed_position};
use super::shape::{PolygonShape, polygon_position};
use geo::Coord;

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
    /// Index in `starts` of the band `y` falls in.
    #[inline]
    fn start_of(&self, y: f64) -> usize {
        self.first_start as usize + band_index(y, self.min_y, self.scale, self.bands as usize)
    }
}

/// A polygon part's rings: `rings[first_ring..first_ring + ring_count]`,
/// exterior first.
#[derive(Debug, Clone, Copy)]
pub struct BandedRef {
    first_ring: u32,
    ring_count: u32,
}

/// Every banded part's rings, bands and coordinates, one after another.
#[derive(Debug)]
pub struct BandedRings {
    rings: Vec<BandedRing>,
    starts: Vec<u32>,
    /// Each band's edges, by the index in `coords` of their first end.
    edges: Vec<u32>,
    coords: Vec<Coord<f64>>,
    /// The largest index or length the arena may store: what a `u32`
    /// addresses, and less in tests, so a full arena can be tried without
    /// 64 GB.
    limit: u32,
}

impl Default for BandedRings {
    fn default() -> Self {
        Self {
            rings: Vec::new(),
            starts: Vec::new(),
            edges: Vec::new(),
            coords: Vec::new(),
            limit: u32::MAX,
        }
    }
}

/// The arena's lengths before a part, to undo it.
struct Lengths {
    rings: usize,
    starts: usize,
    edges: usize,
    coords: usize,
}

impl BandedRings {
    /// Appends `polygon`'s rings; `None`, with nothing appended, when an
    /// index or length would pass `limit` (the part then answers through
    /// its rings).
    pub fn push(&mut self, polygon: &PolygonShape) -> Option<BandedRef> {
        let first_ring = self.index(self.rings.len())?;
        let ring_count = self.index(1 + polygon.holes.len())?;
        let before = self.lengths();
        for ring in std::iter::once(&polygon.exterior).chain(&polygon.holes) {
            if self.push_ring(ring).is_none() {
                self.truncate(&before);
                return None;
            }
        }
        Some(BandedRef {
            first_ring,
            ring_count,
        })
    }

    /// `len` as an index, if the arena may grow to it.
    fn index(&self, len: usize) -> Option<u32> {
        u32::try_from(len).ok().filter(|&i| i <= self.limit)
    }

    fn lengths(&self) -> Lengths {
        Lengths {
            rings: self.rings.len(),
            starts: self.starts.len(),
            edges: self.edges.len(),
            coords: self.coords.len(),
        }
    }

    fn truncate(&mut self, to: &Lengths) {
        self.rings.truncate(to.rings);
        self.starts.truncate(to.starts);
        self.edges.truncate(to.edges);
        self.coords.truncate(to.coords);
    }

    /// Appends one ring, reusing its slabs where it has them.
    fn push_ring(&mut self, ring: &PreparedRing) -> Option<()> {
        let coords = ring.coords();
        let (min, max) = ring.bounds();
        let built;
        let slabs = match ring.slabs() {
            Some(slabs) => slabs,
            None => {
                built = Slabs::build(coords, min.y, max.y);
                &built
            }
        };
        let first_start = self.index(self.starts.len())?;
        let bands = self.index(slabs.bands())?;
        let first_coord = self.index(self.coords.len())?;
        // Every coordinate of the ring must be addressable by an edge number.
        let _end = self.index(self.coords.len() + coords.len())?;
        for k in 0..slabs.bands() {
            self.starts.push(self.index(self.edges.len())?);
            self.edges
                .extend(slabs.band(k).iter().map(|&i| first_coord + i));
        }
        self.starts.push(self.index(self.edges.len())?);
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
        polygon_position(
            self.rings(part)
                .iter()
                .map(|ring| self.ring_position(ring, p)),
        )
    }

    fn ring_position(&self, ring: &BandedRing, p: Coord<f64>) -> Position {
        if !in_box(p, ring.min, ring.max) {
            return Position::Outside;
        }
        let k = ring.start_of(p.y);
        let band = &self.edges[self.starts[k] as usize..self.starts[k + 1] as usize];
        listed_position(&self.coords, band, p)
    }

    /// Starts loading what [`Self::position`] reads first for `p`: the
    /// exterior's band bounds (its header is one of few, so likely cached).
    #[inline]
    pub fn prefetch(&self, part: BandedRef, p: Coord<f64>) {
        if let Some(ring) = self.rings(part).first() {
            prefetch(&self.starts[ring.start_of(p.y)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::generate::{SplitMix64, smooth_ring, star_ring};

    fn coords(points: &[(f64, f64)]) -> Vec<Coord<f64>> {
        points.iter().map(|&(x, y)| Coord { x, y }).collect()
    }

    /// Every vertex, points along and a hair off every edge, and random
    /// points around the box, through the arena and through the shape.
    fn assert_agrees(arena: &BandedRings, part: BandedRef, shape: &PolygonShape, seed: u64) {
        let mut probes = Vec::new();
        for ring in std::iter::once(&shape.exterior).chain(&shape.holes) {
            for e in ring.coords().windows(2) {
                for t in [0.0, 0.5] {
                    let on = e[0] + (e[1] - e[0]) * t;
                    probes.push(on);
                    for (dx, dy) in [(1e-9, 0.0), (-1e-9, 0.0), (0.0, 1e-9), (0.0, -1e-9)] {
                        probes.push(on + Coord { x: dx, y: dy });
                    }
                }
            }
        }
        let (lo, hi) = shape.exterior.bounds();
        let (w, h) = ((hi.x - lo.x).max(1e-3), (hi.y - lo.y).max(1e-3));
        let mut rng = SplitMix64::new(seed);
        probes.extend((0..400).map(|_| Coord {
            x: rng.range(lo.x - w * 0.1, hi.x + w * 0.1),
            y: rng.range(lo.y - h * 0.1, hi.y + h * 0.1),
        }));
        for p in probes {
            assert_eq!(arena.position(part, p), shape.position(p), "at {p:?}");
        }
    }

    /// Several parts in one arena, each answering as its shape: spiky and
    /// border-like rings either side of the slab threshold, holes of a
    /// few edges and of many, and degenerate rings (no height, no width,
    /// a spike folded back on itself).
    #[test]
    fn each_part_answers_as_its_shape() {
        let mut rng = SplitMix64::new(7);
        let c = Coord { x: 13.4, y: 52.5 };
        let shapes = [
            PolygonShape::from_rings(star_ring(&mut rng, c, 200, 0.005, 0.05), vec![]),
            PolygonShape::from_rings(
                smooth_ring(&mut rng, c, 3_000, 0.03),
                vec![
                    star_ring(&mut rng, c, 5, 0.001, 0.004),
                    smooth_ring(&mut rng, c, 150, 0.01),
                ],
            ),
            PolygonShape::from_rings(star_ring(&mut rng, c, 20, 0.005, 0.05), vec![]),
            PolygonShape::from_rings(
                coords(&[(0.0, 1.0), (2.0, 1.0), (5.0, 1.0), (0.0, 1.0)]),
                vec![],
            ),
            PolygonShape::from_rings(
                coords(&[(3.0, 0.0), (3.0, 2.0), (3.0, 7.0), (3.0, 0.0)]),
                vec![],
            ),
            PolygonShape::from_rings(
                coords(&[
                    (0.0, 0.0),
                    (4.0, 0.0),
                    (4.0, 4.0),
                    (2.0, 6.0),
                    (4.0, 4.0),
                    (0.0, 4.0),
                    (0.0, 0.0),
                ]),
                vec![coords(&[(1.0, 1.0), (2.0, 1.0), (2.0, 2.0), (1.0, 1.0)])],
            ),
        ];
        let mut arena = BandedRings::default();
        let parts: Vec<BandedRef> = shapes
            .iter()
            .map(|shape| arena.push(shape).expect("room in the arena"))
            .collect();
        for (i, (shape, part)) in shapes.iter().zip(parts).enumerate() {
            assert_agrees(&arena, part, shape, i as u64);
        }
    }

    /// A part that cannot be added leaves the arena as it was, and the
    /// parts before it still answer.
    #[test]
    fn a_part_that_does_not_fit_is_undone_whole() {
        let mut rng = SplitMix64::new(3);
        let c = Coord { x: 0.0, y: 0.0 };
        let first = PolygonShape::from_rings(star_ring(&mut rng, c, 100, 0.005, 0.05), vec![]);
        let exterior = star_ring(&mut rng, c, 100, 0.005, 0.05);
        let hole = star_ring(&mut rng, c, 100, 0.001, 0.004);
        let mut arena = BandedRings::default();
        let part = arena.push(&first).expect("room in the arena");
        let before = arena.lengths();
        // Room for the next part's exterior but not for its hole too: the
        // part fails after its exterior was appended.
        let mut sizing = BandedRings::default();
        sizing
            .push(&PolygonShape::from_rings(exterior.clone(), vec![]))
            .expect("room in the arena");
        let need = sizing.lengths();
        let longest = (before.rings + need.rings)
            .max(before.starts + need.starts)
            .max(before.edges + need.edges)
            .max(before.coords + need.coords);
        arena.limit = u32::try_from(longest).expect("small");
        assert!(
            arena
                .push(&PolygonShape::from_rings(exterior.clone(), vec![hole]))
                .is_none()
        );
        let after = arena.lengths();
        assert_eq!(
            (after.rings, after.starts, after.edges, after.coords),
            (before.rings, before.starts, before.edges, before.coords)
        );
        assert_agrees(&arena, part, &first, 1);
        assert!(
            arena
                .push(&PolygonShape::from_rings(exterior, vec![]))
                .is_some(),
            "the exterior alone fits"
        );
    }
}
