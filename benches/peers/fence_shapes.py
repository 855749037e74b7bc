"""Fences as Shapely geometries, shared by the peer scripts.

Circles (Points with radius_m) become 64-segment polygons with the radius
converted to degrees at the circle's latitude: the closest planar
equivalent of geogate's haversine circles.
"""
import math

import shapely

METRES_PER_DEGREE = 6_371_008.8 * math.pi / 180.0


def shapes(features):
    """(geometries, ids) for a GeoJSON FeatureCollection's features."""
    geoms, ids = [], []
    for f in features:
        g = f["geometry"]
        if g["type"] == "Point":
            lon, lat = g["coordinates"]
            r = f["properties"]["radius_m"] / METRES_PER_DEGREE
            circle = shapely.Point(lon, lat).buffer(r, quad_segs=16)
            geoms.append(shapely.affinity.scale(circle, 1 / math.cos(math.radians(lat)), 1))
        else:
            geoms.append(shapely.geometry.shape(g))
        ids.append(f.get("id", f.get("properties", {}).get("id")))
    return geoms, ids
