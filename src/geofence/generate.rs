//! Seeded synthetic fences, shared by the differential tests, the GEOS
//! cross-check, the benchmarks and the memory harness so that all of them
//! measure the same shapes.
//!
//! "City blocks" are star-shaped polygons (vertices at increasing angles
//! around a centre), which are simple by construction; a share get a hole,
//! some fences are MultiPolygons, and a few "countries" have 10k+ vertices.

use super::fences::Fence;
use super::ring::PreparedRing;
use super::shape::{Circle, Part, PolygonShape};
use geo::Coord;
use serde_json::{Value, json};

/// SplitMix64: tiny, seedable, and identical on every platform.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The area synthetic fences and points fall in: lon, lat bounds.
#[derive(Debug, Clone, Copy)]
pub struct Area {
    pub min: Coord<f64>,
    pub max: Coord<f64>,
}

impl Area {
    /// Room for `n` city blocks of ~100–300 m at roughly 50% coverage.
    pub fn for_fences(n: usize) -> Self {
        let side = (n as f64).sqrt() * 0.004;
        Self {
            min: Coord { x: 13.0, y: 52.0 },
            max: Coord {
                x: 13.0 + side,
                y: 52.0 + side * 0.6,
            },
        }
    }

    pub fn random_point(&self, rng: &mut SplitMix64) -> Coord<f64> {
        Coord {
            x: rng.range(self.min.x, self.max.x),
            y: rng.range(self.min.y, self.max.y),
        }
    }
}

/// A star-shaped ring of `vertices` around `center`, radii in degrees.
pub fn star_ring(
    rng: &mut SplitMix64,
    center: Coord<f64>,
    vertices: usize,
    r_min: f64,
    r_max: f64,
) -> Vec<Coord<f64>> {
    let mut ring: Vec<Coord<f64>> = (0..vertices)
        .map(|i| {
            let angle = (i as f64 + rng.range(0.0, 0.8)) / vertices as f64 * std::f64::consts::TAU;
            let r = rng.range(r_min, r_max);
            Coord {
                x: center.x + r * angle.cos() / 0.61,
                y: center.y + r * angle.sin(),
            }
        })
        .collect();
    ring.push(ring[0]);
    ring
}

/// A ring like a coastline or border: many vertices, radius wandering
/// smoothly by ±10% with 1% noise, so each edge is short. (Spiky random
/// radii would make every edge span the whole ring, which no real border does.)
pub fn smooth_ring(
    rng: &mut SplitMix64,
    center: Coord<f64>,
    vertices: usize,
    radius: f64,
) -> Vec<Coord<f64>> {
    let phase = rng.range(0.0, std::f64::consts::TAU);
    let mut ring: Vec<Coord<f64>> = (0..vertices)
        .map(|i| {
            let angle = i as f64 / vertices as f64 * std::f64::consts::TAU;
            let r = radius * (1.0 + 0.1 * (7.0 * angle + phase).sin() + rng.range(-0.01, 0.01));
            Coord {
                x: center.x + r * angle.cos() / 0.61,
                y: center.y + r * angle.sin(),
            }
        })
        .collect();
    ring.push(ring[0]);
    ring
}

/// A polygon part from closed rings, exterior first.
pub fn polygon(exterior: Vec<Coord<f64>>, holes: Vec<Vec<Coord<f64>>>) -> Part {
    Part::Polygon(PolygonShape::from_rings(exterior, holes))
}

/// `n` fences: city blocks of 8–64 vertices (every 5th with a hole, every
/// 7th a two-part MultiPolygon), every 11th a circle, plus `big` polygons
/// of `big_vertices` vertices each spanning a large share of the area.
pub fn random_fences(seed: u64, n: usize, big: usize, big_vertices: usize) -> (Vec<Fence>, Area) {
    let area = Area::for_fences(n);
    let mut rng = SplitMix64::new(seed);
    let block = 0.0012;
    let mut fences = Vec::with_capacity(n + big);
    for i in 0..n {
        let center = area.random_point(&mut rng);
        let parts = if i % 11 == 10 {
            vec![Part::Circle(Circle {
                center,
                radius_m: rng.range(30.0, 150.0),
            })]
        } else {
            let vertices = 8 + rng.below(57) as usize;
            let exterior = star_ring(&mut rng, center, vertices, block * 0.6, block);
            let holes = if i % 5 == 0 {
                vec![star_ring(&mut rng, center, 8, block * 0.1, block * 0.3)]
            } else {
                vec![]
            };
            let mut parts = vec![polygon(exterior, holes)];
            if i % 7 == 0 {
                let other = Coord {
                    x: center.x + block * 4.0,
                    y: center.y,
                };
                parts.push(polygon(
                    star_ring(&mut rng, other, 12, block * 0.5, block),
                    vec![],
                ));
            }
            parts
        };
        fences.push(Fence {
            id: format!("f{i}").into(),
            name: None,
            parts,
            hysteresis_m: None,
            dwell_s: None,
            ..Fence::default()
        });
    }
    for j in 0..big {
        let center = area.random_point(&mut rng);
        let span = (area.max.y - area.min.y) * 0.3;
        let exterior = smooth_ring(&mut rng, center, big_vertices, span);
        let hole = smooth_ring(&mut rng, center, 1000, span * 0.3);
        fences.push(Fence {
            id: format!("big{j}").into(),
            name: None,
            parts: vec![polygon(exterior, vec![hole])],
            hysteresis_m: None,
            dwell_s: None,
            ..Fence::default()
        });
    }
    (fences, area)
}

/// The fences as a GeoJSON FeatureCollection (circles as Points with
/// `radius_m`), for peers and round-trip tests.
pub fn to_geojson<'a>(fences: impl IntoIterator<Item = &'a Fence>) -> Value {
    let ring =
        |r: &PreparedRing| -> Value { r.coords().iter().map(|c| json!([c.x, c.y])).collect() };
    let features: Vec<Value> = fences
        .into_iter()
        .map(|f| {
            let polys: Vec<Value> = f
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::Polygon(poly) => {
                        let mut rings = vec![ring(&poly.exterior)];
                        rings.extend(poly.holes.iter().map(ring));
                        Some(Value::Array(rings))
                    }
                    Part::Circle(_) => None,
                })
                .collect();
            let (geometry, radius) = match f.parts.first() {
                Some(Part::Circle(c)) => (json!({"type": "Point", "coordinates": [c.center.x, c.center.y]}), Some(c.radius_m)),
                _ if polys.len() == 1 => (json!({"type": "Polygon", "coordinates": polys[0]}), None),
                _ => (json!({"type": "MultiPolygon", "coordinates": polys}), None),
            };
            let mut props = json!({ "id": f.id.as_ref() });
            if let Some(r) = radius {
                props["radius_m"] = json!(r);
            }
            json!({ "type": "Feature", "id": f.id.as_ref(), "properties": props, "geometry": geometry })
        })
        .collect();
    json!({ "type": "FeatureCollection", "features": features })
}
