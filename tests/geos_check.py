"""Independent containment oracle for tests/geos_crosscheck.rs.

Reads a GeoJSON FeatureCollection of (Multi)Polygons and a file of points
(little-endian f64 pairs lon, lat), and writes, for each point, the sorted
indices of the features covering it (boundary included: GEOS `intersects`)
as one space-separated line.
"""
import json
import sys

import numpy as np
import shapely

fences_path, points_path, out_path = sys.argv[1:4]
with open(fences_path) as f:
    features = json.load(f)["features"]
geoms = [shapely.geometry.shape(feat["geometry"]) for feat in features]
xy = np.fromfile(points_path, dtype="<f8").reshape(-1, 2)
points = shapely.points(xy)
tree = shapely.STRtree(geoms)
point_idx, geom_idx = tree.query(points, predicate="intersects")
hits = [[] for _ in range(len(points))]
for p, g in zip(point_idx.tolist(), geom_idx.tolist()):
    hits[p].append(g)
with open(out_path, "w") as f:
    for h in hits:
        f.write(" ".join(map(str, sorted(h))) + "\n")
