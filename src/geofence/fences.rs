//! Loading fences from GeoJSON, with every defect reported at once.
//!
//! Accepted: a FeatureCollection whose features are Polygons and
//! MultiPolygons (holes respected) or Points with a positive `radius_m`
//! property (circles). Each feature needs a stable id, from `id` or
//! `properties.id`; `properties.name` is optional, and
//! `properties.hysteresis_m` / `properties.dwell_s` override the global
//! jitter settings for that fence.

use super::ring::PreparedRing;
use super::shape::{Circle, Part, PolygonShape};
use crate::model::FenceId;
use geo::line_intersection::line_intersection;
use geo::{Coord, Line, LineIntersection};
use geojson::{Feature, GeometryValue, Position};
use rstar::RTree;
use rstar::primitives::{GeomWithData, Rectangle};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

/// One geofence, ready to query.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    pub id: FenceId,
    pub name: Option<String>,
    pub parts: Vec<Part>,
    /// Per-fence override of the global hysteresis, metres.
    pub hysteresis_m: Option<f64>,
    /// Per-fence override of the global dwell, seconds.
    pub dwell_s: Option<f64>,
    /// The GeoJSON it was read from: what the API serves back and the
    /// store keeps, and whose properties events carry.
    pub source: Arc<FenceSource>,
    /// The fence set version that put it (0 until a set numbers it).
    pub version: u64,
    /// When that version was made (receive clock, unix ms).
    pub changed_ms: i64,
}

/// A fence's GeoJSON Feature, as given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FenceSource {
    /// The Feature as compact JSON.
    pub feature: String,
    pub properties: serde_json::Map<String, Value>,
}

impl FenceSource {
    /// The source of a Feature kept as JSON text (a deleted fence's, in a
    /// store): its properties as far as the text gives them.
    pub fn from_json(feature: &str) -> Self {
        serde_json::from_str::<Value>(feature)
            .map(|raw| Self::of(&raw))
            .unwrap_or_else(|_| Self {
                feature: feature.to_owned(),
                properties: serde_json::Map::new(),
            })
    }

    fn of(raw: &Value) -> Self {
        Self {
            feature: raw.to_string(),
            properties: raw
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        }
    }
}

impl Fence {
    /// Whether `other` was read from the same GeoJSON: a reload keeps a
    /// fence whose definition did not change at its version.
    pub fn same_definition(&self, other: &Fence) -> bool {
        self.id == other.id && self.source.feature == other.source.feature
    }

    pub fn covers(&self, p: Coord<f64>) -> bool {
        self.parts.iter().any(|part| part.covers(p))
    }

    pub fn boundary_within(&self, p: Coord<f64>, metres: f64) -> bool {
        self.parts
            .iter()
            .any(|part| part.boundary_within(p, metres))
    }

    pub fn vertex_count(&self) -> usize {
        self.parts.iter().map(Part::vertex_count).sum()
    }
}

/// One defect in one feature.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FenceDefect {
    /// Position in the FeatureCollection's `features` array; `None` for a
    /// defect of the document itself.
    pub index: Option<usize>,
    pub id: Option<String>,
    pub defect: String,
}

impl fmt::Display for FenceDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.index, &self.id) {
            (Some(i), Some(id)) => write!(f, "feature {i} (id {id:?}): {}", self.defect),
            (Some(i), None) => write!(f, "feature {i} (no id): {}", self.defect),
            _ => write!(f, "document: {}", self.defect),
        }
    }
}

/// How far past ±180° / ±90° a coordinate may stray and still be taken
/// (clamped, with a warning). Producers' projections leave float noise
/// there: Natural Earth's 1:110m countries carry `180.00000000000006`.
/// A billionth of a degree is 0.1 mm; anything further is refused.
pub const COORDINATE_NOISE_DEG: f64 = 1e-9;

/// What validating one feature found: defects refuse the file, warnings
/// (clamped float noise) do not.
#[derive(Debug, Default)]
struct Findings {
    problems: Vec<String>,
    warnings: Vec<String>,
}

impl Findings {
    fn push(&mut self, problem: String) {
        self.problems.push(problem);
    }

    fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    fn len(&self) -> usize {
        self.problems.len()
    }
}

/// A valid fence file, and what was tolerated in it.
#[derive(Debug, Clone)]
pub struct LoadedFences {
    pub fences: Vec<Fence>,
    /// One per clamped coordinate, naming the feature and the position.
    pub warnings: Vec<FenceDefect>,
}

/// Every defect found in a fence file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{} invalid fence definition(s):\n{}", .0.len(), .0.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n"))]
pub struct FenceErrors(pub Vec<FenceDefect>);

/// What `fences check` prints for a good file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FenceSummary {
    pub fences: usize,
    pub polygons: usize,
    pub circles: usize,
    pub vertices: usize,
    /// `[min_lon, min_lat, max_lon, max_lat]`, or `None` for an empty set.
    pub bbox: Option<[f64; 4]>,
}

pub fn summarize(fences: &[Fence]) -> FenceSummary {
    let mut bbox: Option<[f64; 4]> = None;
    let (mut polygons, mut circles) = (0, 0);
    for part in fences.iter().flat_map(|f| &f.parts) {
        match part {
            Part::Polygon(_) => polygons += 1,
            Part::Circle(_) => circles += 1,
        }
        for (lo, hi) in part.envelopes() {
            let b = bbox.get_or_insert([lo.x, lo.y, hi.x, hi.y]);
            *b = [
                b[0].min(lo.x),
                b[1].min(lo.y),
                b[2].max(hi.x),
                b[3].max(hi.y),
            ];
        }
    }
    FenceSummary {
        fences: fences.len(),
        polygons,
        circles,
        vertices: fences.iter().map(Fence::vertex_count).sum(),
        bbox,
    }
}

/// Parses and validates a GeoJSON FeatureCollection; warnings are logged.
pub fn parse_fences(text: &str) -> Result<Vec<Fence>, FenceErrors> {
    let loaded = parse_fences_with_warnings(text)?;
    for w in &loaded.warnings {
        tracing::warn!("fences: {w}");
    }
    Ok(loaded.fences)
}

/// Parses and validates a GeoJSON FeatureCollection, returning what was
/// tolerated beside the fences.
pub fn parse_fences_with_warnings(text: &str) -> Result<LoadedFences, FenceErrors> {
    let doc_error = |defect: String| {
        FenceErrors(vec![FenceDefect {
            index: None,
            id: None,
            defect,
        }])
    };
    let doc: Value = serde_json::from_str(text).map_err(|e| doc_error(format!("not JSON: {e}")))?;
    if doc.get("type").and_then(Value::as_str) != Some("FeatureCollection") {
        return Err(doc_error("expected a GeoJSON FeatureCollection".into()));
    }
    let features = doc
        .get("features")
        .and_then(Value::as_array)
        .ok_or_else(|| doc_error("FeatureCollection has no \"features\" array".into()))?;
    parse_features(features)
}

/// Validates GeoJSON Features as a FeatureCollection's (`fences check`'s
/// rules and messages), each defect naming the feature's place in
/// `features` and its id.
pub fn parse_features(features: &[Value]) -> Result<LoadedFences, FenceErrors> {
    let mut fences = Vec::with_capacity(features.len());
    let mut defects = Vec::new();
    let mut warnings = Vec::new();
    let mut seen = HashSet::new();
    for (index, raw) in features.iter().enumerate() {
        let id = feature_id(raw);
        let mut report = |defect: String| {
            defects.push(FenceDefect {
                index: Some(index),
                id: id.clone(),
                defect,
            })
        };
        match &id {
            None => report("missing id: set \"id\" or properties.id".into()),
            Some(id) if !seen.insert(id.clone()) => report(format!("duplicate id {id:?}")),
            _ => {}
        }
        let feature: Feature = match serde_json::from_value(raw.clone()) {
            Ok(f) => f,
            Err(e) => {
                report(format!("not a valid GeoJSON Feature: {e}"));
                continue;
            }
        };
        let mut findings = Findings::default();
        let fence = build_fence(&feature, &mut findings);
        for p in findings.problems {
            report(p);
        }
        warnings.extend(findings.warnings.into_iter().map(|defect| FenceDefect {
            index: Some(index),
            id: id.clone(),
            defect,
        }));
        if let (Some(fence), Some(id)) = (fence, &id) {
            fences.push(Fence {
                id: id.as_str().into(),
                source: Arc::new(FenceSource::of(raw)),
                ..fence
            });
        }
    }
    if defects.is_empty() {
        Ok(LoadedFences { fences, warnings })
    } else {
        Err(FenceErrors(defects))
    }
}

/// Reads and validates a fence file; warnings are logged.
pub fn load_fences(path: &std::path::Path) -> Result<Vec<Fence>, FenceErrors> {
    parse_fences(&read_fence_file(path)?)
}

/// Reads and validates a fence file, returning its warnings too.
pub fn load_fences_with_warnings(path: &std::path::Path) -> Result<LoadedFences, FenceErrors> {
    parse_fences_with_warnings(&read_fence_file(path)?)
}

/// The fence file's text, or why it cannot be read.
pub fn read_fence_file(path: &std::path::Path) -> Result<String, FenceErrors> {
    std::fs::read_to_string(path).map_err(|e| {
        FenceErrors(vec![FenceDefect {
            index: None,
            id: None,
            defect: format!("cannot read {}: {e}", path.display()),
        }])
    })
}

fn feature_id(raw: &Value) -> Option<String> {
    let from = |v: &Value| match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    raw.get("id")
        .and_then(from)
        .or_else(|| raw.get("properties")?.get("id").and_then(from))
}

/// Builds the fence (id filled in by the caller), pushing every defect.
fn build_fence(feature: &Feature, problems: &mut Findings) -> Option<Fence> {
    let props = feature.properties.as_ref();
    let prop = |key: &str| props.and_then(|p| p.get(key));
    let name = prop("name").and_then(Value::as_str).map(str::to_owned);
    let hysteresis_m = non_negative(prop("hysteresis_m"), "properties.hysteresis_m", problems);
    let dwell_s = non_negative(prop("dwell_s"), "properties.dwell_s", problems);

    let Some(geometry) = &feature.geometry else {
        problems.push("missing geometry".into());
        return None;
    };
    let parts = match &geometry.value {
        GeometryValue::Polygon { coordinates } => vec![polygon(coordinates, "", problems)],
        GeometryValue::MultiPolygon { coordinates } => coordinates
            .iter()
            .enumerate()
            .map(|(i, poly)| polygon(poly, &format!("polygon {i}: "), problems))
            .collect(),
        GeometryValue::Point { coordinates } => {
            vec![circle(coordinates, prop("radius_m"), problems)]
        }
        other => {
            problems.push(format!(
                "unsupported geometry type {}; expected Polygon, MultiPolygon, or Point with radius_m",
                other.type_name()
            ));
            return None;
        }
    };
    let parts: Option<Vec<Part>> = parts.into_iter().collect();
    let parts = parts?;
    if parts.is_empty() {
        problems.push("MultiPolygon has no polygons".into());
        return None;
    }
    Some(Fence {
        name,
        parts,
        hysteresis_m,
        dwell_s,
        ..Fence::default()
    })
}

fn non_negative(value: Option<&Value>, field: &str, problems: &mut Findings) -> Option<f64> {
    let value = value?;
    match value.as_f64() {
        Some(v) if v.is_finite() && v >= 0.0 => Some(v),
        _ => {
            problems.push(format!("{field} must be a finite number ≥ 0, got {value}"));
            None
        }
    }
}

fn circle(center: &Position, radius: Option<&Value>, problems: &mut Findings) -> Option<Part> {
    let center = coordinate(center, "circle centre", problems)?;
    let radius_m = match radius.map(|r| (r, r.as_f64())) {
        None => {
            problems.push("a Point fence needs properties.radius_m (metres)".into());
            return None;
        }
        Some((_, Some(r))) if r.is_finite() && r > 0.0 => r,
        Some((raw, _)) => {
            problems.push(format!("radius_m must be a positive number, got {raw}"));
            return None;
        }
    };
    Some(Part::Circle(Circle { center, radius_m }))
}

fn polygon(rings: &[Vec<Position>], prefix: &str, problems: &mut Findings) -> Option<Part> {
    if rings.is_empty() {
        problems.push(format!("{prefix}polygon has no rings"));
        return None;
    }
    let mut prepared = Vec::with_capacity(rings.len());
    for (r, ring) in rings.iter().enumerate() {
        let label = if r == 0 {
            format!("{prefix}exterior ring")
        } else {
            format!("{prefix}hole {}", r - 1)
        };
        prepared.push(validate_ring(ring, &label, problems).map(PreparedRing::new));
    }
    let prepared: Option<Vec<PreparedRing>> = prepared.into_iter().collect();
    let mut prepared = prepared?;
    let exterior = prepared.remove(0);
    for (h, hole) in prepared.iter().enumerate() {
        if hole
            .coords()
            .iter()
            .any(|&c| exterior.position(c) == super::ring::Position::Outside)
        {
            problems.push(format!(
                "{prefix}hole {h} lies partly outside the exterior ring"
            ));
        }
    }
    Some(Part::Polygon(PolygonShape {
        exterior,
        holes: prepared,
    }))
}

fn coordinate(pos: &Position, label: &str, problems: &mut Findings) -> Option<Coord<f64>> {
    let v = pos.as_slice();
    if v.len() < 2 {
        problems.push(format!(
            "{label}: a position needs [lon, lat], got {} value(s)",
            v.len()
        ));
        return None;
    }
    let (x, y) = (v[0], v[1]);
    if !x.is_finite() || !y.is_finite() {
        problems.push(format!("{label}: non-finite coordinate [{x}, {y}]"));
        return None;
    }
    let within = |v: f64, limit: f64| v.abs() <= limit + COORDINATE_NOISE_DEG;
    if !within(x, 180.0) || !within(y, 90.0) {
        let hint = if within(y, 90.0) && x.abs() <= 360.0 {
            "; a polygon that crosses the antimeridian is cut at ±180° into a MultiPolygon, not continued past it"
        } else {
            ""
        };
        problems.push(format!(
            "{label}: coordinate [{x}, {y}] out of range (lon ±180, lat ±90){hint}"
        ));
        return None;
    }
    let clamped = Coord {
        x: x.clamp(-180.0, 180.0),
        y: y.clamp(-90.0, 90.0),
    };
    if clamped != (Coord { x, y }) {
        problems.warn(format!(
            "{label}: coordinate [{x}, {y}] is float noise past the valid range; clamped to [{}, {}]",
            clamped.x, clamped.y
        ));
    }
    Some(clamped)
}

fn validate_ring(
    ring: &[Position],
    label: &str,
    problems: &mut Findings,
) -> Option<Vec<Coord<f64>>> {
    let before = problems.len();
    let coords: Vec<Coord<f64>> = ring
        .iter()
        .enumerate()
        .filter_map(|(i, p)| coordinate(p, &format!("{label} position {i}"), problems))
        .collect();
    if problems.len() > before {
        return None;
    }
    if coords.len() < 4 {
        problems.push(format!(
            "{label} has {} positions; a ring needs at least 4",
            coords.len()
        ));
        return None;
    }
    if coords.first() != coords.last() {
        problems.push(format!(
            "{label} is not closed: the first and last positions differ"
        ));
        return None;
    }
    // An edge along a pole (both ends at ±90°) or along the cut itself
    // (both at ±180°) may span the whole map: Natural Earth closes
    // Antarctica with [180,-90] → [-180,-90]. Any other edge longer than
    // 180° of longitude is a polygon that crosses the antimeridian unsplit.
    let along_a_pole_or_the_cut = |a: Coord<f64>, b: Coord<f64>| {
        (a.y.abs() == 90.0 && b.y.abs() == 90.0) || (a.x.abs() == 180.0 && b.x.abs() == 180.0)
    };
    if let Some(i) = coords
        .windows(2)
        .position(|w| (w[1].x - w[0].x).abs() > 180.0 && !along_a_pole_or_the_cut(w[0], w[1]))
    {
        problems.push(format!(
            "{label}: edge {i} spans {:.1}° of longitude; a polygon that crosses the antimeridian must be cut at ±180° into a MultiPolygon (RFC 7946 §3.1.9), as Natural Earth does",
            (coords[i + 1].x - coords[i].x).abs()
        ));
        return None;
    }
    if let Some((i, j)) = self_intersection(&coords) {
        problems.push(format!(
            "{label} is self-intersecting: edge {i} meets edge {j}"
        ));
        return None;
    }
    Some(coords)
}

/// The first pair of non-adjacent edges that touch, or of adjacent edges
/// that overlap (a spike), found through an R-tree of edge envelopes so that
/// a 10k-vertex border is checked in O(n log n) rather than O(n²).
fn self_intersection(coords: &[Coord<f64>]) -> Option<(usize, usize)> {
    let n = coords.len() - 1;
    let edge = |i: usize| Line::new(coords[i], coords[i + 1]);
    let tree = RTree::bulk_load(
        (0..n)
            .map(|i| {
                let (a, b) = (coords[i], coords[i + 1]);
                GeomWithData::new(Rectangle::from_corners([a.x, a.y], [b.x, b.y]), i)
            })
            .collect(),
    );
    for i in 0..n {
        for other in tree.locate_in_envelope_intersecting(&tree_envelope(coords, i)) {
            let j = other.data;
            if j <= i {
                continue;
            }
            let adjacent = j == i + 1 || (i == 0 && j == n - 1);
            match line_intersection(edge(i), edge(j)) {
                None => {}
                Some(LineIntersection::SinglePoint { .. }) if adjacent => {}
                Some(_) => return Some((i, j)),
            }
        }
    }
    None
}

fn tree_envelope(coords: &[Coord<f64>], i: usize) -> rstar::AABB<[f64; 2]> {
    let (a, b) = (coords[i], coords[i + 1]);
    rstar::AABB::from_corners([a.x, a.y], [b.x, b.y])
}
