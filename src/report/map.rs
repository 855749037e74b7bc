//! A map of fences, vehicle tracks and transitions as a self-contained SVG.
//!
//! Projection: equirectangular around the middle latitude (x scaled by its
//! cosine), which keeps a city-sized area true to shape, so a circular
//! fence is drawn as a `<circle>` of its radius in metres.

use super::{PALETTE, escape};
use crate::geofence::Fence;
use crate::geofence::ring::METRES_PER_DEGREE;
use crate::geofence::shape::Part;
use std::fmt::Write as _;

/// One vehicle's fixes in fix-time order, as (lon, lat).
pub struct Track {
    pub vehicle: String,
    pub points: Vec<(f64, f64)>,
}

/// Where a vehicle entered or left a fence.
pub struct Marker {
    pub lon: f64,
    pub lat: f64,
    pub enter: bool,
}

const W: f64 = 760.0;
const H: f64 = 560.0;
const MARGIN: f64 = 24.0;
/// Room under the plot for the legend and the scale bar.
const FOOTER: f64 = 28.0;
/// Colours of their own (not in the charts' palette), so a screenshot can
/// tell the map from the charts.
pub const FENCE: &str = "#3a7d44";
pub const ENTER: &str = "#17becf";
pub const EXIT: &str = "#e377c2";

/// Fits a lon/lat box into the drawing area, keeping proportions.
struct Projection {
    /// Left edge: the drawing is centred horizontally.
    left: f64,
    lon0: f64,
    lat1: f64,
    kx: f64,
    scale: f64,
}

impl Projection {
    fn fit(points: impl Iterator<Item = (f64, f64)>) -> Self {
        let (mut x0, mut y0, mut x1, mut y1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
        for (x, y) in points {
            (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x), y1.max(y));
        }
        if x0 > x1 {
            (x0, y0, x1, y1) = (0.0, 0.0, 1.0, 1.0);
        }
        let kx = ((y0 + y1) / 2.0).to_radians().cos().max(0.01);
        let width = ((x1 - x0) * kx).max(1e-9);
        let height = (y1 - y0).max(1e-9);
        let scale = ((W - 2.0 * MARGIN) / width).min((H - 2.0 * MARGIN - 20.0 - FOOTER) / height);
        Self {
            left: (W - width * scale) / 2.0,
            lon0: x0,
            lat1: y1,
            kx,
            scale,
        }
    }

    fn xy(&self, lon: f64, lat: f64) -> (f64, f64) {
        (
            self.left + (lon - self.lon0) * self.kx * self.scale,
            MARGIN + 20.0 + (self.lat1 - lat) * self.scale,
        )
    }

    /// Metres on the ground to pixels.
    fn metres(&self, m: f64) -> f64 {
        m / METRES_PER_DEGREE * self.scale
    }
}

fn part_points(part: &Part) -> Vec<(f64, f64)> {
    match part {
        Part::Polygon(p) => p.exterior.coords().iter().map(|c| (c.x, c.y)).collect(),
        Part::Circle(c) => {
            let dlat = c.radius_m / METRES_PER_DEGREE;
            let dlon = dlat / c.center.y.to_radians().cos().max(0.01);
            vec![
                (c.center.x - dlon, c.center.y - dlat),
                (c.center.x + dlon, c.center.y + dlat),
            ]
        }
    }
}

/// The map as an SVG document.
pub fn map_svg(title: &str, fences: &[Fence], tracks: &[Track], markers: &[Marker]) -> String {
    let projection = Projection::fit(
        fences
            .iter()
            .flat_map(|f| f.parts.iter().flat_map(part_points))
            .chain(tracks.iter().flat_map(|t| t.points.iter().copied())),
    );
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11"><rect width="{W}" height="{H}" fill="white"/><text x="{MARGIN}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    for fence in fences {
        for part in &fence.parts {
            let label_at = match part {
                Part::Polygon(p) => {
                    let mut d = String::new();
                    for ring in std::iter::once(&p.exterior).chain(&p.holes) {
                        for (i, c) in ring.coords().iter().enumerate() {
                            let (x, y) = projection.xy(c.x, c.y);
                            let _ = write!(d, "{}{x:.1},{y:.1} ", if i == 0 { "M" } else { "L" });
                        }
                        d.push('Z');
                    }
                    let _ = write!(
                        svg,
                        r#"<path d="{d}" fill="{FENCE}" fill-opacity="0.15" fill-rule="evenodd" stroke="{FENCE}" stroke-width="2"/>"#
                    );
                    p.exterior.coords().first().map(|c| projection.xy(c.x, c.y))
                }
                Part::Circle(c) => {
                    let (x, y) = projection.xy(c.center.x, c.center.y);
                    let r = projection.metres(c.radius_m).max(2.0);
                    let _ = write!(
                        svg,
                        r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r:.1}" fill="{FENCE}" fill-opacity="0.15" stroke="{FENCE}" stroke-width="2"/>"#
                    );
                    Some((x + r + 2.0, y))
                }
            };
            if let Some((x, y)) = label_at {
                let _ = write!(
                    svg,
                    r##"<text x="{x:.1}" y="{y:.1}" fill="#1a5e1a">{}</text>"##,
                    escape(&fence.id)
                );
            }
        }
    }
    for (i, track) in tracks.iter().enumerate() {
        let mut d = String::new();
        for (j, &(lon, lat)) in track.points.iter().enumerate() {
            let (x, y) = projection.xy(lon, lat);
            let _ = write!(d, "{}{x:.1},{y:.1} ", if j == 0 { "M" } else { "L" });
        }
        let _ = write!(
            svg,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.5" stroke-opacity="0.7"><title>{}</title></path>"#,
            PALETTE[(i + 3) % PALETTE.len()],
            escape(&track.vehicle)
        );
    }
    for m in markers {
        let (x, y) = projection.xy(m.lon, m.lat);
        let color = if m.enter { ENTER } else { EXIT };
        let _ = write!(
            svg,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{color}" stroke="white" stroke-width="1"/>"#
        );
    }
    // Legend and scale bar, under the plot. The legend's swatches are drawn
    // at 0.9 opacity, so their pixels never take the exact colours the
    // browser test counts to find markers and fences on screen.
    let ly = H - 12.0;
    let _ = write!(
        svg,
        r##"<g opacity="0.9"><circle cx="{MARGIN}" cy="{:.1}" r="4" fill="{ENTER}"/><text x="{:.1}" y="{ly:.1}">enter</text><circle cx="{:.1}" cy="{:.1}" r="4" fill="{EXIT}"/><text x="{:.1}" y="{ly:.1}">exit</text><rect x="{:.1}" y="{:.1}" width="14" height="8" fill="{FENCE}" fill-opacity="0.3" stroke="{FENCE}"/><text x="{:.1}" y="{ly:.1}">fence</text></g>"##,
        ly - 4.0,
        MARGIN + 8.0,
        MARGIN + 60.0,
        ly - 4.0,
        MARGIN + 68.0,
        MARGIN + 114.0,
        ly - 11.0,
        MARGIN + 132.0
    );
    let bar_m = super::nice_step_below(projection_span_m(&projection) / 4.0);
    let bar_px = projection.metres(bar_m);
    let x1 = W - MARGIN - bar_px;
    let _ = write!(
        svg,
        r##"<line x1="{x1:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333" stroke-width="2"/><text x="{:.1}" y="{ly:.1}" text-anchor="end">{}</text>"##,
        ly - 4.0,
        W - MARGIN,
        ly - 4.0,
        x1 - 6.0,
        if bar_m >= 1000.0 {
            format!("{} km", bar_m / 1000.0)
        } else {
            format!("{bar_m} m")
        }
    );
    svg.push_str("</svg>\n");
    svg
}

/// The drawing's width in metres on the ground.
fn projection_span_m(p: &Projection) -> f64 {
    (W - 2.0 * MARGIN) / p.scale * METRES_PER_DEGREE
}
