//! The geofence engine: loader errors, exact geometry (boundary included),
//! jitter suppression, and the R-tree path against a linear scan.

use geo::Coord;
use geogate::geofence::generate::{SplitMix64, random_fences};
use geogate::geofence::ring::METRES_PER_DEGREE;
use geogate::geofence::{
    Coverings, Evaluator, EvaluatorSettings, FenceIndex, Fix, FixOutcome, Transition,
    TransitionKind, VehicleSnapshot, parse_fences,
};
use geogate::model::VehicleId;
use serde_json::json;
use std::sync::Arc;

fn index(features: serde_json::Value) -> FenceIndex {
    let doc = json!({"type": "FeatureCollection", "features": features});
    FenceIndex::new(parse_fences(&doc.to_string()).expect("valid fences"))
}

fn poly(id: &str, rings: serde_json::Value) -> serde_json::Value {
    json!({"type": "Feature", "id": id, "properties": {}, "geometry": {"type": "Polygon", "coordinates": rings}})
}

fn covering(index: &FenceIndex, x: f64, y: f64) -> Vec<String> {
    let mut out = Vec::new();
    index.containing(Coord { x, y }, &mut out);
    out.iter().map(|&f| index.fence(f).id.to_string()).collect()
}

#[test]
fn boundary_counts_as_inside_and_holes_are_respected() {
    let idx = index(json!([poly(
        "yard",
        json!([
            [[0, 0], [4, 0], [4, 4], [0, 4], [0, 0]],
            [[1, 1], [3, 1], [3, 3], [1, 3], [1, 1]]
        ])
    )]));
    for (x, y) in [
        (0.0, 0.0),
        (2.0, 0.0),
        (4.0, 2.5),
        (0.5, 0.5),
        (1.0, 2.0),
        (2.0, 3.0),
        (3.0, 3.0),
    ] {
        assert_eq!(
            covering(&idx, x, y),
            ["yard"],
            "({x}, {y}) is on a boundary or inside"
        );
    }
    for (x, y) in [(2.0, 2.0), (1.5, 2.5), (4.000001, 2.0), (-1.0, -1.0)] {
        assert!(
            covering(&idx, x, y).is_empty(),
            "({x}, {y}) is outside or in the hole"
        );
    }
}

#[test]
fn multipolygon_circle_and_antimeridian() {
    let idx = index(json!([
        {"type": "Feature", "properties": {"id": "pair"}, "geometry": {"type": "MultiPolygon", "coordinates": [
            [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]],
            [[[5, 5], [6, 5], [6, 6], [5, 6], [5, 5]]]
        ]}},
        // An island group cut at the antimeridian, as RFC 7946 asks.
        {"type": "Feature", "id": 7, "geometry": {"type": "MultiPolygon", "coordinates": [
            [[[179, -17], [180, -17], [180, -16], [179, -16], [179, -17]]],
            [[[-180, -17], [-179, -17], [-179, -16], [-180, -16], [-180, -17]]]
        ]}},
        {"type": "Feature", "id": "wrap", "properties": {"radius_m": 2000}, "geometry": {"type": "Point", "coordinates": [179.99, 0]}},
        {"type": "Feature", "id": "pin", "properties": {"radius_m": 100}, "geometry": {"type": "Point", "coordinates": [10, 50]}}
    ]));
    assert_eq!(covering(&idx, 0.5, 0.5), ["pair"]);
    assert_eq!(covering(&idx, 5.5, 5.5), ["pair"]);
    assert!(covering(&idx, 3.0, 3.0).is_empty());
    assert_eq!(covering(&idx, 179.5, -16.5), ["7"]);
    assert_eq!(covering(&idx, -179.5, -16.5), ["7"]);
    assert_eq!(
        covering(&idx, 180.0, -16.5),
        ["7"],
        "the cut line is boundary"
    );
    assert_eq!(
        covering(&idx, -179.995, 0.0),
        ["wrap"],
        "circle wraps the antimeridian"
    );
    assert!(covering(&idx, -179.97, 0.0).is_empty());
    let north = 100.0 / METRES_PER_DEGREE;
    assert_eq!(covering(&idx, 10.0, 50.0 + north * 0.999), ["pin"]);
    assert!(covering(&idx, 10.0, 50.0 + north * 1.001).is_empty());
}

#[test]
fn empty_fence_set_evaluates_to_nothing() {
    let idx = Arc::new(index(json!([])));
    let mut ev = Evaluator::new(idx, EvaluatorSettings::default());
    let mut out = Vec::new();
    ev.evaluate(
        &VehicleId::from("v"),
        1_700_000_000_000,
        52.5,
        13.4,
        &mut out,
    );
    assert!(out.is_empty());
    assert_eq!(ev.stats().evaluated, 1);
}

#[test]
fn every_defect_is_reported_at_once() {
    let doc = json!({"type": "FeatureCollection", "features": [
        poly("open", json!([[[0, 0], [1, 0], [1, 1], [0, 1]]])),
        poly("short", json!([[[0, 0], [1, 0], [0, 0]]])),
        poly("far", json!([[[0, 0], [181, 0], [1, 1], [0, 0]]])),
        poly("bowtie", json!([[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]])),
        {"type": "Feature", "id": "line", "geometry": {"type": "LineString", "coordinates": [[0, 0], [1, 1]]}},
        poly("ok", json!([[[0, 0], [1, 0], [1, 1], [0, 0]]])),
        poly("ok", json!([[[0, 0], [1, 0], [1, 1], [0, 0]]])),
        {"type": "Feature", "id": "noradius", "geometry": {"type": "Point", "coordinates": [0, 0]}},
        {"type": "Feature", "id": "negradius", "properties": {"radius_m": -5}, "geometry": {"type": "Point", "coordinates": [0, 0]}},
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [0, 0]}, "properties": {"radius_m": 5}},
        poly("spike", json!([[[0, 0], [2, 0], [1, 0], [1, 1], [0, 0]]])),
        poly("badhyst", json!([[[0, 0], [1, 0], [1, 1], [0, 0]]])),
    ]});
    let mut doc = doc;
    doc["features"][11]["properties"] = json!({"hysteresis_m": -1});
    let errors = parse_fences(&doc.to_string()).unwrap_err().0;
    let expect = [
        (0, "open", "not closed"),
        (1, "short", "at least 4"),
        (2, "far", "out of range"),
        (3, "bowtie", "self-intersecting"),
        (4, "line", "unsupported geometry type LineString"),
        (6, "ok", "duplicate id"),
        (7, "noradius", "radius_m"),
        (8, "negradius", "positive"),
        (9, "", "missing id"),
        (10, "spike", "self-intersecting"),
        (11, "badhyst", "hysteresis_m"),
    ];
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    for ((index, id, text), e) in expect.iter().zip(&errors) {
        assert_eq!(e.index, Some(*index));
        assert_eq!(e.id.as_deref().unwrap_or(""), *id);
        assert!(e.defect.contains(text), "feature {index}: {}", e.defect);
    }
    assert!(
        parse_fences("{\"type\": \"Feature\"}")
            .unwrap_err()
            .to_string()
            .contains("FeatureCollection")
    );
    assert!(
        parse_fences("not json")
            .unwrap_err()
            .to_string()
            .contains("not JSON")
    );
}

/// A square fence 0.01° a side at the equator, its east edge at lon 0.01.
fn edge_fence(props: serde_json::Value) -> Arc<FenceIndex> {
    Arc::new(index(
        json!([{"type": "Feature", "id": "yard", "properties": props,
        "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [0.01, 0], [0.01, 0.01], [0, 0.01], [0, 0]]]}}]),
    ))
}

/// Fixes one second apart zig-zagging ±5 m across the east edge, after a
/// start deep inside.
fn zigzag(ev: &mut Evaluator, crossings: usize) -> Vec<Transition> {
    let v = VehicleId::from("truck");
    let metre = 1.0 / METRES_PER_DEGREE;
    let mut out = Vec::new();
    let t0 = 1_700_000_000_000;
    ev.evaluate(&v, t0, 0.005, 0.005, &mut out);
    for i in 0..=crossings {
        let side = if i % 2 == 0 { -5.0 } else { 5.0 };
        ev.evaluate(
            &v,
            t0 + 1000 * (i as i64 + 1),
            0.005,
            0.01 + side * metre,
            &mut out,
        );
    }
    out
}

#[test]
fn hysteresis_suppresses_edge_jitter() {
    let mut steady = Evaluator::new(
        edge_fence(json!({"hysteresis_m": 10})),
        EvaluatorSettings::default(),
    );
    let events = zigzag(&mut steady, 40);
    assert_eq!(events.len(), 1, "only the initial enter: {events:?}");
    assert_eq!(events[0].event, TransitionKind::Enter);

    let mut jittery = Evaluator::new(edge_fence(json!({})), EvaluatorSettings::default());
    let events = zigzag(&mut jittery, 40);
    assert_eq!(
        events.len(),
        1 + 40,
        "enter plus one transition per crossing"
    );
    assert!(
        events.windows(2).all(|w| w[0].event != w[1].event),
        "alternates"
    );

    // The global setting does the same as the per-fence one.
    let settings = EvaluatorSettings {
        hysteresis_m: 10.0,
        ..Default::default()
    };
    let mut global = Evaluator::new(edge_fence(json!({})), settings);
    assert_eq!(zigzag(&mut global, 40).len(), 1);
}

#[test]
fn dwell_confirms_only_a_sustained_stay() {
    let settings = EvaluatorSettings {
        dwell_s: 5.0,
        ..Default::default()
    };
    let mut ev = Evaluator::new(edge_fence(json!({})), settings);
    let v = VehicleId::from("van");
    let metre = 1.0 / METRES_PER_DEGREE;
    let mut out = Vec::new();
    let t0 = 1_700_000_000_000;
    // Zig-zag for 20 s: never 5 s inside in a row, so never entered.
    for i in 0..20 {
        let side = if i % 2 == 0 { -5.0 } else { 5.0 };
        ev.evaluate(&v, t0 + 1000 * i, 0.005, 0.01 + side * metre, &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    // Stay inside: first inside fix at t0 + 20 s confirms at t0 + 25 s.
    for i in 20..30 {
        ev.evaluate(&v, t0 + 1000 * i, 0.005, 0.005, &mut out);
    }
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].event, out[0].ts),
        (TransitionKind::Enter, t0 + 25_000)
    );
    // Exits are immediate.
    ev.evaluate(&v, t0 + 31_000, 0.005, 0.02, &mut out);
    assert_eq!(out[1].event, TransitionKind::Exit);
}

#[test]
fn exits_precede_enters_and_old_fixes_change_nothing() {
    let idx = Arc::new(index(json!([
        poly("west", json!([[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]])),
        poly("east", json!([[[2, 0], [3, 0], [3, 1], [2, 1], [2, 0]]])),
    ])));
    let mut ev = Evaluator::new(idx, EvaluatorSettings::default());
    let v = VehicleId::from("car");
    let mut out = Vec::new();
    ev.evaluate(&v, 2_000_000_000_000, 0.5, 2.5, &mut out);
    out.clear();
    ev.evaluate(&v, 2_000_000_001_000, 0.5, 0.5, &mut out);
    let kinds: Vec<_> = out.iter().map(|t| (t.event, t.fence.to_string())).collect();
    assert_eq!(
        kinds,
        [
            (TransitionKind::Exit, "east".into()),
            (TransitionKind::Enter, "west".into())
        ]
    );
    out.clear();
    ev.evaluate(&v, 2_000_000_000_500, 0.5, 2.5, &mut out);
    assert!(out.is_empty());
    assert_eq!(ev.stats().late, 1);
    assert_eq!(ev.memberships("car"), [Arc::from("west")]);
}

#[test]
fn idle_vehicles_expire_and_reload_keeps_surviving_memberships() {
    let settings = EvaluatorSettings {
        idle_expiry_ms: 60_000,
        ..Default::default()
    };
    let idx = Arc::new(index(json!([
        poly("a", json!([[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]])),
        poly("b", json!([[[0, 0], [2, 0], [2, 2], [0, 2], [0, 0]]])),
    ])));
    let mut ev = Evaluator::new(idx, settings);
    let mut out = Vec::new();
    let t0 = 1_800_000_000_000;
    ev.evaluate(&VehicleId::from("old"), t0, 0.5, 0.5, &mut out);
    ev.evaluate(&VehicleId::from("new"), t0 + 50_000, 0.5, 0.5, &mut out);
    let mut expired = Vec::new();
    assert_eq!(ev.expire_idle(t0 + 100_000, &mut expired), 1);
    // "old" was in a and b: an exit from each, at the time it became idle.
    assert_eq!(expired.len(), 2, "{expired:?}");
    assert!(
        expired
            .iter()
            .all(|t| t.ts == t0 + 60_000 && t.vehicle == "old")
    );
    assert_eq!(ev.stats().expired, 1);
    assert_eq!(ev.tracked_vehicles(), 1);

    // Reload: "b" is gone, "a" moved to a new position in the file.
    ev.swap_index(Arc::new(index(json!([
        poly("c", json!([[[5, 5], [6, 5], [6, 6], [5, 6], [5, 5]]])),
        poly("a", json!([[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]])),
    ]))));
    assert_eq!(ev.memberships("new"), [Arc::from("a")]);
    out.clear();
    ev.evaluate(&VehicleId::from("new"), t0 + 60_000, 0.5, 0.5, &mut out);
    assert!(out.is_empty(), "still inside a, no spurious enter: {out:?}");
}

#[test]
fn rtree_agrees_with_linear_scan_on_100k_points() {
    let (idx, points) = random_index_and_points(42, 2_000, 3, 12_000, 7, 100_000);
    let (hits, _) = agree_with_linear_scan(&idx, &points);
    assert!(
        hits > 20_000 && hits < 95_000,
        "both hits and misses: {hits}"
    );
}

/// An index of `random_fences(seed, n, big, big_vertices)` and `count`
/// points drawn over its area from `point_seed`.
fn random_index_and_points(
    seed: u64,
    n: usize,
    big: usize,
    big_vertices: usize,
    point_seed: u64,
    count: usize,
) -> (FenceIndex, Vec<Coord<f64>>) {
    let (fences, area) = random_fences(seed, n, big, big_vertices);
    let mut rng = SplitMix64::new(point_seed);
    let points = (0..count).map(|_| area.random_point(&mut rng)).collect();
    (FenceIndex::new(fences), points)
}

/// Asserts that the point query and the batch give the linear scan's
/// answer for every point; returns how many points some fence covers and
/// the most fences covering one point.
fn agree_with_linear_scan(idx: &FenceIndex, points: &[Coord<f64>]) -> (usize, usize) {
    let (mut fast, mut slow) = (Vec::new(), Vec::new());
    let mut batch = Coverings::default();
    idx.containing_batch(points, &mut batch);
    assert_eq!(batch.len(), points.len());
    let (mut covered, mut most) = (0, 0);
    for (i, p) in points.iter().enumerate() {
        idx.containing(*p, &mut fast);
        idx.containing_linear(*p, &mut slow);
        assert_eq!(fast, slow, "at {p:?}");
        assert_eq!(
            batch.of(i),
            slow.as_slice(),
            "point {i} of the batch, at {p:?}"
        );
        covered += usize::from(!slow.is_empty());
        most = most.max(slow.len());
    }
    (covered, most)
}

/// Batches of every length around the window's (16 points), one after
/// another into the same `Coverings`: each answers as the point query does
/// (which the tests above hold to the linear scan).
#[test]
fn batches_of_any_length_answer_point_by_point() {
    let (idx, points) = random_index_and_points(5, 500, 1, 2_000, 11, 200);
    let mut batch = Coverings::default();
    let mut one = Vec::new();
    for len in [0, 1, 2, 15, 16, 17, 31, 32, 33, 200, 0] {
        idx.containing_batch(&points[..len], &mut batch);
        assert_eq!(batch.len(), len);
        assert_eq!(batch.is_empty(), len == 0);
        for (i, p) in points[..len].iter().enumerate() {
            idx.containing(*p, &mut one);
            assert_eq!(batch.of(i), one.as_slice(), "point {i} of {len}");
        }
    }
    let empty = FenceIndex::new(Vec::new());
    empty.containing_batch(&points, &mut batch);
    assert_eq!(batch.len(), points.len());
    assert!((0..points.len()).all(|i| batch.of(i).is_empty()));
}

/// Batches pay only where the index outgrows the cache: 100 city blocks
/// stay point by point, 2,000 with three 12k-vertex polygons go by batch.
#[test]
fn only_an_index_past_the_cache_prefers_batches() {
    let (small, _) = random_index_and_points(5, 100, 0, 0, 1, 0);
    let (large, _) = random_index_and_points(42, 2_000, 3, 12_000, 1, 0);
    assert!(!small.prefers_batches());
    assert!(large.prefers_batches());
    assert!(!FenceIndex::new(Vec::new()).prefers_batches());
}

/// Where the grids could slip: every vertex, points along every edge, and
/// points a hair off each side of the edges and outside the boxes. The
/// index (part cells, flat walks, slabs) must answer as the linear scan.
#[test]
fn boundary_probes_agree_with_linear_scan() {
    use geogate::geofence::shape::Part;
    let (fences, _) = random_fences(77, 1_000, 2, 3_000);
    let idx = FenceIndex::new(fences);
    let mut probes = Vec::new();
    for fence in idx.fences() {
        for part in &fence.parts {
            let Part::Polygon(polygon) = part else {
                continue;
            };
            for ring in std::iter::once(&polygon.exterior).chain(&polygon.holes) {
                for e in ring.coords().windows(2) {
                    let d = e[1] - e[0];
                    for t in [0.0, 0.25, 0.5, 0.999] {
                        let on = e[0] + d * t;
                        probes.push(on);
                        for (dx, dy) in [(1e-9, 0.0), (-1e-9, 0.0), (0.0, 1e-9), (0.0, -1e-9)] {
                            probes.push(on + Coord { x: dx, y: dy });
                        }
                    }
                }
            }
        }
    }
    let (covered, _) = agree_with_linear_scan(&idx, &probes);
    assert!(
        covered > probes.len() / 2,
        "{covered} of {} probes covered",
        probes.len()
    );
}

#[test]
fn crowded_spots_agree_with_linear_scan() {
    // 200 fences stacked on one square kilometre among 2,000 spread ones:
    // the grid's cells there are crowded and the R-tree answers instead.
    let (mut fences, area) = random_fences(9, 2_000, 0, 0);
    let mut rng = SplitMix64::new(3);
    let spot = area.random_point(&mut rng);
    let mut features = Vec::new();
    for i in 0..200 {
        let c = Coord {
            x: spot.x + rng.range(-0.005, 0.005),
            y: spot.y + rng.range(-0.005, 0.005),
        };
        let r = rng.range(0.001, 0.004);
        features.push(poly(
            &format!("stack{i}"),
            json!([[
                [c.x - r, c.y - r],
                [c.x + r, c.y - r],
                [c.x + r, c.y + r],
                [c.x - r, c.y + r],
                [c.x - r, c.y - r]
            ]]),
        ));
    }
    let doc = json!({"type": "FeatureCollection", "features": features});
    fences.extend(parse_fences(&doc.to_string()).expect("valid fences"));
    let idx = FenceIndex::new(fences);
    let points: Vec<Coord<f64>> = (0..50_000)
        .map(|_| Coord {
            x: spot.x + rng.range(-0.02, 0.02),
            y: spot.y + rng.range(-0.02, 0.02),
        })
        .collect();
    let (_, most) = agree_with_linear_scan(&idx, &points);
    assert!(most > 48, "the stack overlaps deeply: {most}");
}

/// Polygon parts too large for the flat walk answer from their latitude
/// bands (`banded.rs`): spiky and border-like parts of 97–600 vertices,
/// with holes of a few edges and of more than the slab threshold's, mixed
/// with a small polygon and a circle, probed on every vertex, along the
/// edges, a hair off them and at random.
mod large_parts {
    use super::{SplitMix64, agree_with_linear_scan};
    use geo::Coord;
    use geogate::geofence::generate::{polygon, smooth_ring, star_ring};
    use geogate::geofence::shape::{Circle, Part};
    use geogate::geofence::{Fence, FenceIndex};
    use proptest::prelude::*;

    fn fence(id: &str, part: Part) -> Fence {
        Fence {
            id: id.into(),
            name: None,
            parts: vec![part],
            hysteresis_m: None,
            dwell_s: None,
            ..Fence::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        #[test]
        fn banded_parts_agree_with_linear_scan(
            seed in any::<u64>(),
            vertices in 97usize..600,
            hole_sizes in prop::collection::vec(prop::sample::select(vec![4usize, 9, 40, 150]), 0..3),
            smooth in any::<bool>(),
        ) {
            let mut rng = SplitMix64::new(seed);
            let centre = Coord { x: rng.range(-170.0, 170.0), y: rng.range(-80.0, 80.0) };
            let exterior = if smooth {
                smooth_ring(&mut rng, centre, vertices, 0.03)
            } else {
                star_ring(&mut rng, centre, vertices, 0.005, 0.05)
            };
            let holes = hole_sizes
                .iter()
                .map(|&n| {
                    let at = Coord { x: centre.x + rng.range(-0.01, 0.01), y: centre.y + rng.range(-0.01, 0.01) };
                    star_ring(&mut rng, at, n, 0.001, 0.004)
                })
                .collect();
            let fences = vec![
                fence("block", polygon(star_ring(&mut rng, centre, 12, 0.002, 0.01), vec![])),
                fence("large", polygon(exterior, holes)),
                fence("circle", Part::Circle(Circle { center: centre, radius_m: 800.0 })),
            ];
            let index = FenceIndex::new(fences);
            let mut probes = Vec::new();
            let large_at = index.find("large").expect("built above");
            let Part::Polygon(large) = &index.fence(large_at).parts[0] else {
                unreachable!("built as a polygon above");
            };
            for ring in std::iter::once(&large.exterior).chain(&large.holes) {
                for e in ring.coords().windows(2) {
                    let d = e[1] - e[0];
                    for t in [0.0, 0.5, 0.999] {
                        let on = e[0] + d * t;
                        probes.push(on);
                        for (dx, dy) in [(1e-9, 0.0), (-1e-9, 0.0), (0.0, 1e-9), (0.0, -1e-9)] {
                            probes.push(on + Coord { x: dx, y: dy });
                        }
                    }
                }
            }
            let (lo, hi) = large.exterior.bounds();
            probes.extend((0..500).map(|_| Coord {
                x: rng.range(lo.x - 0.01, hi.x + 0.01),
                y: rng.range(lo.y - 0.01, hi.y + 0.01),
            }));
            let (covered, _) = agree_with_linear_scan(&index, &probes);
            prop_assert!(covered > 0 && covered < probes.len(), "{covered} of {}", probes.len());
        }
    }
}

mod ring_position {
    use geo::coordinate_position::{CoordPos, CoordinatePosition};
    use geo::{Coord, LineString, Polygon};
    use geogate::geofence::generate::{SplitMix64, smooth_ring, star_ring};
    use geogate::geofence::ring::{Position, PreparedRing};
    use proptest::prelude::*;

    fn agree(coords: Vec<Coord<f64>>, seed: u64) -> Result<(), TestCaseError> {
        let prepared = PreparedRing::new(coords.clone());
        let oracle = Polygon::new(LineString::from(coords.clone()), vec![]);
        let (lo, hi) = prepared.bounds();
        let (w, h) = (hi.x - lo.x, hi.y - lo.y);
        let mut rng = SplitMix64::new(seed);
        let probes = (0..300)
            .map(|_| Coord {
                x: rng.range(lo.x - w * 0.05, hi.x + w * 0.05),
                y: rng.range(lo.y - h * 0.05, hi.y + h * 0.05),
            })
            .chain(coords.iter().copied());
        for p in probes {
            let expected = match oracle.coordinate_position(&p) {
                CoordPos::Inside => Position::Inside,
                CoordPos::OnBoundary => Position::Boundary,
                CoordPos::Outside => Position::Outside,
            };
            prop_assert_eq!(prepared.position(p), expected, "at {:?}", p);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The cell grid and slab shortcuts give geo's own (robust,
        /// boundary-aware) answer for spiky and border-like rings of every
        /// size around the thresholds.
        #[test]
        fn prepared_rings_agree_with_geo(seed in any::<u64>(), vertices in 4usize..400, smooth in any::<bool>()) {
            let mut rng = SplitMix64::new(seed);
            let centre = Coord { x: rng.range(-170.0, 170.0), y: rng.range(-80.0, 80.0) };
            let coords = if smooth {
                smooth_ring(&mut rng, centre, vertices.max(8), 0.05)
            } else {
                star_ring(&mut rng, centre, vertices, 0.001, 0.01)
            };
            agree(coords, seed ^ 0x5eed)?;
        }
    }
}

/// Natural Earth's 1:110m countries cut Russia at ±180° and leave float
/// noise there (`180.00000000000006`). Noise within a billionth of a degree
/// is clamped with a warning naming the feature and the position; a value
/// clearly out of range is still refused; a polygon crossing ±180° unsplit
/// is refused with the rule.
#[test]
fn float_noise_at_the_antimeridian_and_poles_is_clamped_with_a_warning() {
    let noisy = r#"{"type":"FeatureCollection","features":[
      {"type":"Feature","id":"ru","properties":{},"geometry":{"type":"MultiPolygon","coordinates":[
        [[[170,60],[180.00000000000006,60],[180.00000000000006,70],[170,70],[170,60]]],
        [[[-180.00000000000006,60],[-170,60],[-170,70],[-180,70],[-180.00000000000006,60]]]]}},
      {"type":"Feature","id":"cap","properties":{},"geometry":{"type":"Polygon","coordinates":
        [[[0,80],[10,80],[10,90.0000000001],[0,90.0000000001],[0,80]]]}},
      {"type":"Feature","id":"south","properties":{},"geometry":{"type":"Polygon","coordinates":
        [[[0,-90.0000000002],[10,-90.0000000002],[10,-80],[0,-80],[0,-90.0000000002]]]}}]}"#;
    let loaded = geogate::geofence::parse_fences_with_warnings(noisy).expect("noise is tolerated");
    assert_eq!(loaded.fences.len(), 3);
    // ru: 2 + 2 noisy positions (the closing one repeats the first),
    // cap: 2, south: 3.
    assert_eq!(loaded.warnings.len(), 9, "{:#?}", loaded.warnings);
    let first = &loaded.warnings[0];
    assert_eq!((first.index, first.id.as_deref()), (Some(0), Some("ru")));
    assert!(
        first.defect.contains("polygon 0: exterior ring position 1")
            && first.defect.contains("clamped to [180, 60]"),
        "{}",
        first.defect
    );
    let idx = FenceIndex::new(loaded.fences);
    assert_eq!(covering(&idx, 179.5, 65.0), ["ru"]);
    assert_eq!(covering(&idx, -179.5, 65.0), ["ru"]);
    assert_eq!(
        covering(&idx, 180.0, 65.0),
        ["ru"],
        "the cut edge is boundary"
    );
    assert!(covering(&idx, 0.0, 65.0).is_empty());
    assert_eq!(covering(&idx, 5.0, 90.0), ["cap"]);
    assert_eq!(covering(&idx, 5.0, -90.0), ["south"]);

    // A thousandth of a degree is not noise.
    let far = noisy.replace("180.00000000000006,60]", "180.001,60]");
    let err = parse_fences(&far).unwrap_err().to_string();
    assert!(
        err.contains("out of range") && err.contains("180.001"),
        "{err}"
    );

    // Natural Earth's Antarctica: a polar cap closed along -90° from +180
    // to -180, an edge 360° long that is not a crossing.
    let antarctica = json!([poly(
        "aq",
        json!([[
            [-180, -80],
            [180, -80],
            [180, -90],
            [-180, -90],
            [-180, -80]
        ]])
    )]);
    let doc = json!({"type": "FeatureCollection", "features": antarctica});
    let idx = FenceIndex::new(parse_fences(&doc.to_string()).expect("a polar cap loads"));
    assert_eq!(covering(&idx, 0.0, -85.0), ["aq"]);
    assert_eq!(covering(&idx, 179.9, -89.0), ["aq"]);
    assert!(covering(&idx, 0.0, -70.0).is_empty());

    // Continued past 180° instead of cut: refused, naming the rule.
    let past = json!([poly(
        "past",
        json!([[[170, 0], [190, 0], [190, 10], [170, 10], [170, 0]]])
    )]);
    let doc = json!({"type": "FeatureCollection", "features": past});
    let err = parse_fences(&doc.to_string()).unwrap_err().to_string();
    assert!(
        err.contains("out of range") && err.contains("antimeridian"),
        "{err}"
    );

    // Unsplit across ±180°: refused, with the rule.
    let unsplit = json!([poly(
        "pacific",
        json!([[[170, 0], [-170, 0], [-170, 10], [170, 10], [170, 0]]])
    )]);
    let doc = json!({"type": "FeatureCollection", "features": unsplit});
    let err = parse_fences(&doc.to_string()).unwrap_err().to_string();
    assert!(
        err.contains("antimeridian") && err.contains("edge 0"),
        "{err}"
    );
}

/// Circles against a haversine written here, not the crate's: a sphere of
/// radius 6,371,008.8 m (the IUGG mean Earth radius, stated, not imported).
#[test]
fn circle_radii_agree_with_an_independent_haversine() {
    const R: f64 = 6_371_008.8;
    fn haversine((lon1, lat1): (f64, f64), (lon2, lat2): (f64, f64)) -> f64 {
        let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
        let (dp, dl) = ((lat2 - lat1).to_radians(), (lon2 - lon1).to_radians());
        let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
        2.0 * R * h.sqrt().asin()
    }
    // A thousandth of a degree of latitude is R·π/180/1000 = 111.19508 m.
    assert!((haversine((13.4, 52.5), (13.4, 52.501)) - 111.19508).abs() < 1e-3);
    let circle = |lon: f64, lat: f64, radius_m: f64| {
        index(
            json!([{"type": "Feature", "id": "c", "properties": {"radius_m": radius_m},
            "geometry": {"type": "Point", "coordinates": [lon, lat]}}]),
        )
    };
    let mut rng = SplitMix64::new(7);
    let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    for _ in 0..500 {
        // Centres anywhere but the poles, including the antimeridian.
        let centre = (unit() * 360.0 - 180.0, unit() * 160.0 - 80.0);
        let mut lon = centre.0 + (unit() - 0.5) * 0.2;
        if lon > 180.0 {
            lon -= 360.0;
        }
        if lon < -180.0 {
            lon += 360.0;
        }
        let point = (lon, centre.1 + (unit() - 0.5) * 0.2);
        let d = haversine(centre, point);
        assert_eq!(
            covering(
                &circle(centre.0, centre.1, d * (1.0 + 1e-9) + 1e-6),
                point.0,
                point.1
            ),
            ["c"],
            "{centre:?} {point:?} {d}"
        );
        assert!(
            covering(
                &circle(centre.0, centre.1, d * (1.0 - 1e-6)),
                point.0,
                point.1
            )
            .is_empty(),
            "{centre:?} {point:?} {d}"
        );
    }
}

/// What a state commit reads: each changed vehicle once per batch with its
/// state by fence id, an expired one as a deletion, and nothing for a fix
/// that changed nothing; restored elsewhere, the state behaves the same.
#[test]
fn changed_vehicles_are_listed_for_the_store_and_restore_faithfully() {
    let fences = || {
        Arc::new(index(json!([
            poly("a", json!([[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]])),
            poly("b", json!([[[2, 0], [3, 0], [3, 1], [2, 1], [2, 0]]])),
        ])))
    };
    let settings = EvaluatorSettings {
        idle_expiry_ms: 60_000,
        ..EvaluatorSettings::default()
    };
    let mut ev = Evaluator::new(fences(), settings).tracking_changes(1);
    let (v, w) = (VehicleId::from("v"), VehicleId::from("w"));
    let mut out = Vec::new();
    ev.evaluate(&v, 1_000, 0.5, 0.5, &mut out);
    ev.evaluate(&v, 2_000, 0.5, 0.6, &mut out);
    ev.evaluate(&w, 1_000, 0.5, 2.5, &mut out);
    // Already applied, and older: neither changes anything.
    assert_eq!(
        ev.evaluate_delivery(&v, 2_000, 0.5, 0.6, false, &mut out),
        FixOutcome::Duplicate
    );
    assert_eq!(
        ev.evaluate_delivery(&v, 1_500, 0.5, 5.0, true, &mut out),
        FixOutcome::Duplicate
    );
    assert_eq!(
        ev.evaluate_delivery(&v, 1_500, 0.5, 5.0, false, &mut out),
        FixOutcome::Late { by_ms: 500 }
    );
    let mut changed = Vec::new();
    ev.take_changed(&mut changed);
    changed.sort_by(|x, y| x.0.cmp(&y.0));
    let snapshot = |t, fence: &str| VehicleSnapshot {
        last_fix_ms: t,
        last_digests: vec![Fix::position_digest(
            t,
            0.5,
            if fence == "a" { 0.6 } else { 2.5 },
        )],
        last_heard_ms: t,
        members: vec![fence.into()],
        position: Some((0.5, if fence == "a" { 0.6 } else { 2.5 })),
        ..VehicleSnapshot::default()
    };
    assert_eq!(
        changed,
        vec![
            (v.clone(), Some(snapshot(2_000, "a"))),
            (w.clone(), Some(snapshot(1_000, "b")))
        ]
    );
    ev.take_changed(&mut changed);
    assert_eq!(changed.len(), 2, "nothing new since");

    // Restored into a fresh evaluator, v is still in a: no second enter.
    let mut restored = Evaluator::new(fences(), settings);
    restored.restore(v.clone(), &snapshot(2_000, "a"));
    out.clear();
    restored.evaluate(&v, 3_000, 0.5, 0.5, &mut out);
    assert!(out.is_empty(), "{out:?}");
    restored.evaluate(&v, 4_000, 0.5, 5.0, &mut out);
    assert_eq!(out.len(), 1, "one exit: {out:?}");

    // Idle expiry: w is listed as a deletion.
    changed.clear();
    ev.evaluate(&v, 100_000, 0.5, 0.5, &mut out);
    out.clear();
    assert_eq!(ev.expire_idle(100_000, &mut out), 1);
    // w was in b: its expiry leaves b, at the time it became idle.
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (
            out[0].vehicle.as_str(),
            &*out[0].fence,
            out[0].event,
            out[0].ts
        ),
        ("w", "b", TransitionKind::Exit, 61_000)
    );
    assert_eq!(out[0].cause, Some(geogate::geofence::Cause::Expired));
    ev.take_changed(&mut changed);
    assert!(changed.contains(&(w, None)), "{changed:?}");

    // A reload that drops v's fence lists v, with the membership gone.
    changed.clear();
    ev.swap_index(Arc::new(index(json!([poly(
        "b",
        json!([[[2, 0], [3, 0], [3, 1], [2, 1], [2, 0]]])
    )]))));
    ev.take_changed(&mut changed);
    let after_reload = VehicleSnapshot {
        last_fix_ms: 100_000,
        last_digests: vec![Fix::position_digest(100_000, 0.5, 0.5)],
        last_heard_ms: 100_000,
        position: Some((0.5, 0.5)),
        ..VehicleSnapshot::default()
    };
    assert_eq!(changed, vec![(v, Some(after_reload))]);
}

/// The shard worker's path (a batch's fences looked up together, then each
/// fix applied with its covering from the batch) against fix by fix: the
/// same outcomes, transitions, counts and changed states, over 6,000 fixes
/// of 40 vehicles wandering among 300 random fences with hysteresis,
/// dwell, idle expiry, out-of-order, repeated and redelivered fixes, in
/// batches of 1 to 300. Two reloads: one between batches, one in the
/// middle of a batch (its remaining fixes must look their fences up
/// again), and some fixes are given the wrong batch position.
#[test]
fn batch_covered_evaluation_matches_fix_by_fix() {
    let (fences, area) = random_fences(21, 300, 1, 2_000);
    let reloaded = || {
        let (mut fences, _) = random_fences(21, 300, 1, 2_000);
        fences.retain(|f| f.id.len() % 2 == 0);
        Arc::new(FenceIndex::new(fences))
    };
    let idx = Arc::new(FenceIndex::new(fences));
    let settings = EvaluatorSettings {
        hysteresis_m: 10.0,
        dwell_s: 20.0,
        idle_expiry_ms: 120_000,
        ..EvaluatorSettings::default()
    };
    let mut one = Evaluator::new(idx.clone(), settings).tracking_changes(1);
    let mut batched = Evaluator::new(idx, settings).tracking_changes(1);
    let mut rng = SplitMix64::new(3);
    let vehicles: Vec<VehicleId> = (0..40).map(|v| VehicleId::from(format!("v{v}"))).collect();
    let mut at: Vec<Coord<f64>> = (0..40).map(|_| area.random_point(&mut rng)).collect();
    let mut clock = vec![1_800_000_000_000_i64; 40];
    let fixes: Vec<(usize, i64, Coord<f64>, bool)> = (0..6_000)
        .map(|_| {
            let v = rng.below(40) as usize;
            let step = rng.below(10);
            // Step 1 sends the vehicle's last fix again (the same message);
            // the others move it.
            if step != 1 {
                at[v].x = (at[v].x + rng.range(-0.001, 0.001)).clamp(area.min.x, area.max.x);
                at[v].y = (at[v].y + rng.range(-0.001, 0.001)).clamp(area.min.y, area.max.y);
            }
            let t = match step {
                0 => clock[v] - 5_000,
                1 => clock[v],
                _ => {
                    clock[v] += rng.below(60_000) as i64;
                    clock[v]
                }
            };
            (v, t, at[v], rng.below(20) == 0)
        })
        .collect();
    let (mut out_one, mut out_batched) = (Vec::new(), Vec::new());
    let (mut changed_one, mut changed_batched) = (Vec::new(), Vec::new());
    let mut start = 0;
    let mut batches = 0;
    while start < fixes.len() {
        let len = (1 + rng.below(300) as usize).min(fixes.len() - start);
        let batch = &fixes[start..start + len];
        batches += 1;
        if batches == 7 {
            let index = reloaded();
            one.swap_index(index.clone());
            batched.swap_index(index);
        }
        let fix = |&(v, fix_ms, p, redelivered): &(usize, i64, Coord<f64>, bool)| Fix {
            vehicle: &vehicles[v],
            fix_ms,
            lat: p.y,
            lon: p.x,
            redelivered,
            received_ms: fix_ms,
            digest: Fix::position_digest(fix_ms, p.y, p.x),
        };
        batched.cover_batch(batch.iter().map(fix));
        for (i, f) in batch.iter().enumerate() {
            if batches == 12 && i == len / 2 {
                let index = Arc::new(FenceIndex::new(random_fences(22, 300, 0, 0).0));
                one.swap_index(index.clone());
                batched.swap_index(index);
            }
            let position = if i % 97 == 5 { i + 1 } else { i };
            let expected = one.evaluate_fix(fix(f), &mut out_one);
            let got = batched.evaluate_covered(position, fix(f), &mut out_batched);
            assert_eq!(got, expected, "fix {} ({f:?})", start + i);
        }
        // Idle expiry on the newest fix time seen, standing in for the
        // receive clock (each fix is received at its own time here).
        let newest = batch.iter().map(|f| f.1).max().unwrap_or(i64::MIN);
        one.expire_now(newest, &mut out_one);
        batched.expire_now(newest, &mut out_batched);
        assert!(
            out_batched == out_one,
            "transitions differ after batch {batches}"
        );
        // A reload lists vehicles in hash order, which differs between
        // the two evaluators' maps.
        changed_one.clear();
        changed_batched.clear();
        one.take_changed(&mut changed_one);
        batched.take_changed(&mut changed_batched);
        changed_one.sort_by(|x, y| x.0.cmp(&y.0));
        changed_batched.sort_by(|x, y| x.0.cmp(&y.0));
        assert!(
            changed_batched == changed_one,
            "changed states differ after batch {batches}"
        );
        start += len;
    }
    let stats = batched.stats();
    assert_eq!(stats, one.stats());
    // Most applied fixes (about a fifth are late or repeats) took their
    // fences from the batch: the path under test ran.
    assert!(
        batched.read_from_batch() > 4_500 && one.read_from_batch() == 0,
        "{} of 6,000 read from the batch",
        batched.read_from_batch()
    );
    assert!(batches > 12, "both reloads ran: {batches} batches");
    assert!(
        stats.enters > 300 && stats.exits > 300 && stats.expired > 0,
        "{stats:?}"
    );
    assert!(stats.late > 100 && stats.duplicates > 100, "{stats:?}");
}
