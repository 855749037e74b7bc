//! A fence's geometry and the two questions the evaluator asks of it:
//! does it cover this point (boundary included), and is its boundary within
//! h metres (hysteresis).
//!
//! Polygons are planar in lon/lat degrees, as GeoJSON (RFC 7946) defines
//! them. A polygon that crosses the antimeridian must be cut into a
//! MultiPolygon at ±180°, as RFC 7946 §3.1.9 asks; one drawn across it is
//! taken literally and spans the long way round. Circles are measured with
//! the haversine great-circle distance on a sphere of mean radius
//! 6,371,008.8 m, so a circle centred at 179.99° covers points at −179.99°.

use super::ring::{METRES_PER_DEGREE, Position, PreparedRing, walk_position};
use geo::{Coord, Distance, Haversine, Point};

/// A polygon with holes. A point on the exterior or on a hole's edge is on
/// the boundary, hence covered.
#[derive(Debug, Clone)]
pub struct PolygonShape {
    pub exterior: PreparedRing,
    pub holes: Vec<PreparedRing>,
}

impl PolygonShape {
    /// Prepares closed rings (coordinates checked by the caller), exterior
    /// first.
    pub fn from_rings(exterior: Vec<Coord<f64>>, holes: Vec<Vec<Coord<f64>>>) -> Self {
        Self {
            exterior: PreparedRing::new(exterior),
            holes: holes.into_iter().map(PreparedRing::new).collect(),
        }
    }

    fn covers(&self, p: Coord<f64>) -> bool {
        self.position(p) != Position::Outside
    }

    /// Where `p` lies relative to the polygon with its holes cut out.
    pub fn position(&self, p: Coord<f64>) -> Position {
        polygon_position(
            std::iter::once(&self.exterior)
                .chain(&self.holes)
                .map(|ring| ring.position(p)),
        )
    }

    /// Every ring's coordinates, exterior first, one after another with a
    /// NaN coordinate between rings: the layout [`walk_flat`] reads. NaN is
    /// free to mean "next ring": the loader refuses non-finite coordinates.
    pub fn flat_rings(&self) -> Vec<Coord<f64>> {
        let separator = Coord {
            x: f64::NAN,
            y: f64::NAN,
        };
        let mut flat = self.exterior.coords().to_vec();
        for hole in &self.holes {
            flat.push(separator);
            flat.extend_from_slice(hole.coords());
        }
        flat
    }

    /// Every edge of every ring, as (from, to).
    pub fn edges(&self) -> Vec<(Coord<f64>, Coord<f64>)> {
        std::iter::once(&self.exterior)
            .chain(&self.holes)
            .flat_map(|ring| ring.coords().windows(2).map(|e| (e[0], e[1])))
            .collect()
    }
}

/// The position in a polygon, from the positions in its rings, exterior
/// first; the holes' are asked for only while the point may be inside.
pub(super) fn polygon_position(mut rings: impl Iterator<Item = Position>) -> Position {
    let exterior = rings.next().unwrap_or(Position::Outside);
    if exterior != Position::Inside {
        return exterior;
    }
    let mut position = Position::Inside;
    for hole in rings {
        match hole {
            Position::Inside => return Position::Outside,
            Position::Boundary => position = Position::Boundary,
            Position::Outside => {}
        }
    }
    position
}

/// [`PolygonShape::position`] over [`PolygonShape::flat_rings`] by walking
/// every edge: one contiguous read, for small parts whose cell could not
/// decide.
pub fn walk_flat(flat: &[Coord<f64>], p: Coord<f64>) -> Position {
    polygon_position(
        flat.split(|c| c.x.is_nan())
            .map(|ring| walk_position(ring, p)),
    )
}

/// A circle given by centre and radius in metres.
#[derive(Debug, Clone, Copy)]
pub struct Circle {
    pub center: Coord<f64>,
    pub radius_m: f64,
}

impl Circle {
    /// Whether `p` is within the radius; the rim is covered.
    pub fn covers(&self, p: Coord<f64>) -> bool {
        self.distance_m(p) <= self.radius_m
    }

    fn distance_m(&self, p: Coord<f64>) -> f64 {
        Haversine.distance(Point::from(self.center), Point::from(p))
    }

    /// Envelopes (min, max) covering the circle, two when it wraps the
    /// antimeridian. Conservative: widened by the latitude nearest a pole.
    fn envelopes(&self) -> Vec<(Coord<f64>, Coord<f64>)> {
        let dlat = self.radius_m / METRES_PER_DEGREE * 1.001 + 1e-9;
        let (lat_lo, lat_hi) = (self.center.y - dlat, self.center.y + dlat);
        let worst_lat = lat_lo.abs().max(lat_hi.abs());
        if worst_lat >= 89.999 {
            let lo = Coord {
                x: -180.0,
                y: lat_lo.max(-90.0),
            };
            let hi = Coord {
                x: 180.0,
                y: lat_hi.min(90.0),
            };
            return vec![(lo, hi)];
        }
        let dlon = dlat / worst_lat.to_radians().cos();
        let (lon_lo, lon_hi) = (self.center.x - dlon, self.center.x + dlon);
        let span = |x0: f64, x1: f64| (Coord { x: x0, y: lat_lo }, Coord { x: x1, y: lat_hi });
        if dlon >= 180.0 {
            vec![span(-180.0, 180.0)]
        } else if lon_lo < -180.0 {
            vec![span(lon_lo + 360.0, 180.0), span(-180.0, lon_hi)]
        } else if lon_hi > 180.0 {
            vec![span(lon_lo, 180.0), span(-180.0, lon_hi - 360.0)]
        } else {
            vec![span(lon_lo, lon_hi)]
        }
    }
}

/// One indexable piece of a fence: a polygon (a MultiPolygon contributes one
/// per member) or a circle.
#[derive(Debug, Clone)]
pub enum Part {
    Polygon(PolygonShape),
    Circle(Circle),
}

impl Part {
    /// Whether the part covers `p`; boundary points are covered.
    pub fn covers(&self, p: Coord<f64>) -> bool {
        match self {
            Part::Polygon(poly) => poly.covers(p),
            Part::Circle(circle) => circle.covers(p),
        }
    }

    /// Whether the part's boundary is strictly closer than `metres` to `p`.
    pub fn boundary_within(&self, p: Coord<f64>, metres: f64) -> bool {
        match self {
            Part::Polygon(poly) => {
                poly.exterior.boundary_within(p, metres)
                    || poly.holes.iter().any(|h| h.boundary_within(p, metres))
            }
            Part::Circle(circle) => (circle.distance_m(p) - circle.radius_m).abs() < metres,
        }
    }

    /// Bounding boxes for the R-tree.
    pub fn envelopes(&self) -> Vec<(Coord<f64>, Coord<f64>)> {
        match self {
            Part::Polygon(poly) => vec![poly.exterior.bounds()],
            Part::Circle(circle) => circle.envelopes(),
        }
    }

    pub fn vertex_count(&self) -> usize {
        match self {
            Part::Polygon(poly) => {
                poly.exterior.vertex_count()
                    + poly
                        .holes
                        .iter()
                        .map(PreparedRing::vertex_count)
                        .sum::<usize>()
            }
            Part::Circle(_) => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circle_across_the_antimeridian() {
        let circle = Circle {
            center: Coord {
                x: 179.999,
                y: 10.0,
            },
            radius_m: 1_000.0,
        };
        let part = Part::Circle(circle);
        assert!(part.covers(Coord {
            x: -179.997,
            y: 10.0
        })); // ~440 m away
        assert!(!part.covers(Coord {
            x: -179.98,
            y: 10.0
        }));
        let envs = part.envelopes();
        assert_eq!(envs.len(), 2);
        assert!(
            envs.iter()
                .any(|(lo, hi)| lo.x <= -179.997 && hi.x >= -179.997)
        );
    }

    #[test]
    fn circle_boundary_counts_as_inside() {
        let center = Coord { x: 13.4, y: 52.5 };
        let edge = Coord { x: 13.4, y: 52.501 };
        let exact = Circle {
            center,
            radius_m: 0.0,
        }
        .distance_m(edge);
        assert!(
            Part::Circle(Circle {
                center,
                radius_m: exact
            })
            .covers(edge)
        );
        assert!(
            !Part::Circle(Circle {
                center,
                radius_m: exact * (1.0 - 1e-12)
            })
            .covers(edge)
        );
    }
}
