"""Peer for benches/geofence.rs: Shapely 2's vectorised STRtree query on the
identical fences and points, exported by `cargo bench --bench geofence` to
target/geofence-bench/<n>/. Single-threaded, like one geogate core.

Circles become polygons as in fence_shapes.py.

Usage: .venv/bin/python benches/peers/shapely_strtree.py [target/geofence-bench]
Prints one JSON line per fence count: points/s for the query alone (best of 5).
"""
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import shapely
from fence_shapes import shapes

root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/geofence-bench")
for case in sorted(root.iterdir(), key=lambda p: int(p.name)):
    features = json.loads((case / "fences.geojson").read_text())["features"]
    geoms, _ = shapes(features)
    xy = np.fromfile(case / "points.f64", dtype="<f8").reshape(-1, 2)
    points = shapely.points(xy)
    tree = shapely.STRtree(geoms)
    shapely.prepare(geoms)
    geoms = np.array(geoms)

    def tree_predicate():
        # The documented one-call form: GEOS prepares the *input* points.
        return tree.query(points, predicate="intersects")

    def bbox_then_prepared():
        # Faster for big polygons: candidates by bbox, then the prepared
        # polygons' vectorised intersects.
        p, g = tree.query(points)
        keep = shapely.intersects(geoms[g], points[p])
        return np.vstack([p[keep], g[keep]])

    for name, run in [("tree_predicate", tree_predicate), ("bbox_then_prepared", bbox_then_prepared)]:
        best = math.inf
        for _ in range(5):
            start = time.perf_counter()
            hits = run()
            best = min(best, time.perf_counter() - start)
        print(json.dumps({"fences": int(case.name), "method": name, "points": len(points),
                          "pairs": int(hits.shape[1]), "points_per_s": round(len(points) / best)}))
