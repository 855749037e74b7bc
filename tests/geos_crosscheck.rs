//! Containment cross-checked against GEOS (Shapely 2) on 100k points over
//! complex polygons: holes, MultiPolygons and rings of 1,000+ vertices.
//! Points within 1e-9° of an edge may disagree by rounding and are excluded,
//! except the 200 exact vertices added on purpose: both sides must call
//! those inside, and agree on every other fence there.

mod support;

use geo::Coord;
use geogate::geofence::generate::{SplitMix64, random_fences, to_geojson};
use geogate::geofence::shape::Part;
use geogate::geofence::{Fence, FenceIndex};
use std::io::Write;
use std::process::Command;

fn near_an_edge(fence: &Fence, p: Coord<f64>) -> bool {
    fence.parts.iter().any(|part| match part {
        Part::Polygon(poly) => std::iter::once(&poly.exterior)
            .chain(&poly.holes)
            .any(|ring| {
                ring.coords().windows(2).any(|w| {
                    let (a, b) = (w[0], w[1]);
                    let d = b - a;
                    let t = (((p - a).x * d.x + (p - a).y * d.y) / (d.x * d.x + d.y * d.y))
                        .clamp(0.0, 1.0);
                    let c = a + d * t;
                    (c.x - p.x).hypot(c.y - p.y) < 1e-9
                })
            }),
        Part::Circle(_) => false,
    })
}

#[test]
fn containment_matches_geos_on_100k_points() {
    let Some(python) = support::require("Python with Shapely 2 (GEOS)", support::shapely_python())
    else {
        return;
    };
    let (fences, area) = random_fences(2024, 1_500, 4, 2_000);
    // GEOS is planar; circles are haversine, so compare polygons only.
    let fences: Vec<Fence> = fences
        .into_iter()
        .filter(|f| f.parts.iter().all(|p| matches!(p, Part::Polygon(_))))
        .collect();
    assert!(
        fences.iter().any(|f| f.parts.len() > 1),
        "has MultiPolygons"
    );
    assert!(
        fences.iter().any(|f| f.vertex_count() >= 1_000),
        "has big rings"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let fences_path = dir.path().join("fences.geojson");
    std::fs::write(&fences_path, to_geojson(&fences).to_string()).expect("write fences");
    let mut rng = SplitMix64::new(99);
    let mut points: Vec<Coord<f64>> = (0..100_000).map(|_| area.random_point(&mut rng)).collect();
    // Add exact vertices: boundary points both sides must call inside.
    let vertices_from = points.len();
    points.extend(fences.iter().take(200).map(|f| match &f.parts[0] {
        Part::Polygon(p) => p.exterior.coords()[3],
        Part::Circle(c) => c.center,
    }));
    let points_path = dir.path().join("points.f64");
    let mut file = std::fs::File::create(&points_path).expect("points file");
    for p in &points {
        file.write_all(&p.x.to_le_bytes())
            .and_then(|_| file.write_all(&p.y.to_le_bytes()))
            .expect("write");
    }
    drop(file);
    let out_path = dir.path().join("geos.txt");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/geos_check.py");
    let status = Command::new(&python)
        .args([
            script.as_ref(),
            fences_path.as_os_str(),
            points_path.as_os_str(),
            out_path.as_os_str(),
        ])
        .status()
        .expect("run python");
    assert!(status.success(), "geos_check.py failed");
    let geos = std::fs::read_to_string(&out_path).expect("read GEOS output");

    // GEOS names fences by their place in the file; the index by its own
    // positions (in id order).
    let ids: Vec<_> = fences.iter().map(|f| f.id.clone()).collect();
    let index = FenceIndex::new(fences);
    let position = |j: usize| index.find(&ids[j]).expect("every fence is indexed");
    let mut ours = Vec::new();
    let (mut compared, mut excluded, mut hits) = (0, 0, 0);
    for (i, (p, line)) in points.iter().zip(geos.lines()).enumerate() {
        let mut theirs: Vec<u32> = line
            .split_whitespace()
            .map(|s| position(s.parse().expect("index")))
            .collect();
        theirs.sort_unstable();
        index.containing(*p, &mut ours);
        if i >= vertices_from {
            // On a vertex: compared, never excused as "near an edge".
            let fence = position(i - vertices_from);
            assert!(
                ours.contains(&fence) && theirs.contains(&fence),
                "vertex of fence {fence} at {p:?}: geogate {ours:?} vs GEOS {theirs:?}"
            );
            assert_eq!(ours, theirs, "at vertex {p:?}");
        }
        if ours != theirs {
            let disputed = ours
                .iter()
                .chain(&theirs)
                .filter(|f| !(ours.contains(f) && theirs.contains(f)));
            let all_near = disputed.clone().all(|&f| near_an_edge(index.fence(f), *p));
            assert!(all_near, "at {p:?}: geogate {ours:?} vs GEOS {theirs:?}");
            excluded += 1;
            continue;
        }
        compared += 1;
        hits += usize::from(!ours.is_empty());
    }
    assert_eq!(compared + excluded, points.len());
    assert!(compared >= 100_000, "compared {compared}");
    assert!(hits > 10_000, "the check must include hits: {hits}");
    eprintln!(
        "GEOS cross-check: {compared} points agree, {excluded} near-edge excluded, {hits} hits"
    );
}
