"""The peer a team without geogate would write: paho-mqtt + Shapely 2.

Subscribes (QoS 1) to the fleet topics, decodes each JSON payload (native or
OwnTracks), finds the covering fences with an STRtree, diffs each vehicle's
membership, and counts enter/exit events. Prints one JSON line when it has
handled --count messages: its rate from the first to the last message.

With --client-id the session is persistent (clean_session=False), so a
broker can queue the stream for it while it is offline; --register-only
subscribes and leaves at once (to create that session).

Usage: python paho_shapely.py --port P --fences config/fences.geojson --count N
       [--qos Q] [--client-id ID [--register-only]]
"""
import argparse
import json
import time

import paho.mqtt.client as mqtt
import shapely
from fence_shapes import shapes

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--fences", required=True)
ap.add_argument("--count", type=int, required=True)
ap.add_argument("--qos", type=int, default=1)
ap.add_argument("--client-id")
ap.add_argument("--register-only", action="store_true")
args = ap.parse_args()

geoms, ids = shapes(json.load(open(args.fences))["features"])
tree = shapely.STRtree(geoms)
shapely.prepare(geoms)
members = {}
state = {"n": 0, "first": None, "last": None, "events": 0, "bad": 0}


def on_message(client, userdata, msg):
    now = time.perf_counter()
    if state["first"] is None:
        state["first"] = now
    state["n"] += 1
    try:
        d = json.loads(msg.payload)
        if "vehicle" in d:
            vehicle, lat, lon = d["vehicle"], float(d["lat"]), float(d["lon"])
        else:
            vehicle = "/".join(msg.topic.split("/")[1:3])
            lat, lon = float(d["lat"]), float(d["lon"])
        hits = tree.query(shapely.Point(lon, lat), predicate="intersects")
        now_in = {ids[i] for i in hits}
        before = members.get(vehicle, set())
        state["events"] += len(before - now_in) + len(now_in - before)
        members[vehicle] = now_in
    except Exception:
        state["bad"] += 1
    if state["n"] >= args.count:
        state["last"] = time.perf_counter()
        client.disconnect()


client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=args.client_id or f"paho-peer-{time.time_ns()}",
                     clean_session=args.client_id is None)
client.on_message = on_message
client.on_connect = lambda c, u, f, rc, p=None: c.subscribe([("fleet/+/telemetry", args.qos), ("owntracks/+/+", args.qos)])
if args.register_only:
    client.on_subscribe = lambda c, u, mid, codes, p=None: c.disconnect()
client.connect("127.0.0.1", args.port)
client.loop_forever()
if args.register_only:
    raise SystemExit(0)
elapsed = state["last"] - state["first"]
print(json.dumps({"peer": "paho+shapely", "messages": state["n"], "seconds": round(elapsed, 3),
                  "rate": round(state["n"] / elapsed), "transitions": state["events"], "bad": state["bad"]}))
