"""End-to-end harness: geogate against its limits and peers on loopback.

Measures, in one session, on the bundled capture's payloads:
  (b) mosquitto_sub's raw delivery rate at QoS 0 and QoS 1 (the broker's
      limit), and geogate's sustained ingest rate through the same broker;
  (c) the paho-mqtt + Shapely peer (benches/peers/paho_shapely.py).
Each consumer subscribes first; then `geogate replay --speed 1000` publishes
the capture (as fast as the broker takes it). A rate is messages divided by
the time from the consumer's first to its last message.

Usage: .venv/bin/python benches/e2e.py [--messages N]
Needs: mosquitto, mosquitto_sub, target/release/geogate, Shapely 2, paho-mqtt.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEOGATE = os.path.join(ROOT, "target/release/geogate")
ap = argparse.ArgumentParser()
ap.add_argument("--messages", type=int, default=40945)
args = ap.parse_args()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing on {port}")


tmp = tempfile.mkdtemp()
port = free_port()
conf = os.path.join(tmp, "m.conf")
open(conf, "w").write(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_inflight_messages 0\nmax_queued_messages 0\n")
broker = subprocess.Popen(["mosquitto", "-c", conf], stderr=subprocess.DEVNULL)
wait_port(port)
capture = os.path.join(ROOT, "replay/shift-change.ndjson.gz")


def publish():
    return subprocess.Popen([GEOGATE, "replay", capture, "--mqtt", f"mqtt://127.0.0.1:{port}", "--speed", "1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


results = []
for qos in (0, 1):
    sub = subprocess.Popen(["mosquitto_sub", "-p", str(port), "-q", str(qos), "-t", "fleet/+/telemetry", "-t", "owntracks/+/+",
                            "-C", str(args.messages), "-F", "%U"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    pub = publish()
    out, _ = sub.communicate(timeout=300)
    pub.wait()
    stamps = [float(l) for l in out.split()]
    rate = len(stamps) / (stamps[-1] - stamps[0])
    results.append({"consumer": f"mosquitto_sub qos{qos}", "messages": len(stamps), "rate": round(rate)})

# geogate: no worker cap, a gate that never sheds, default queues.
mport = free_port()
cfg = open(os.path.join(ROOT, "config/geogate.toml")).read()
cfg = cfg.replace("port = 1883\n", f"port = {port}\n", 1).replace('client_id = "geogate-1"', f'client_id = "bench-{time.time_ns()}"')
cfg = cfg.replace('# listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{mport}"').replace('path = "geogate-dead-letter.ndjson"', f'path = "{tmp}/dl.ndjson"')
cfg = cfg.replace('path = "config/fences.geojson"', f'path = "{ROOT}/config/fences.geojson"').replace("mqtt = true ", "mqtt = false ")
cfg = cfg.replace("rate = 32000 ", "rate = 1000000 ").replace("burst = 24000 ", "burst = 1000000 ")
open(os.path.join(tmp, "g.toml"), "w").write(cfg)
gg = subprocess.Popen([GEOGATE, "run", "--config", os.path.join(tmp, "g.toml")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
time.sleep(1.0)


def received():
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2).read().decode()
    except OSError:
        return 0, 0
    got = done = 0.0
    for line in body.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name == "geogate_events_received_total":
            got += float(line.rsplit(" ", 1)[1])
        if name in ("geogate_events_evaluated_total", "geogate_events_invalid_total", "geogate_events_shed_total"):
            done += float(line.rsplit(" ", 1)[1])
    return got, done


pub = publish()
first = last = None
while True:
    got, done = received()
    now = time.perf_counter()
    if got > 0 and first is None:
        first = now
    if done >= args.messages:
        last = now
        break
    if first and now - first > 120:
        break
    time.sleep(0.02)
pub.wait()
gg.terminate()
accounting = gg.communicate(timeout=30)[0].strip()
results.append({"consumer": "geogate run (qos1, ack after evaluation)", "messages": int(done), "rate": round(done / (last - first)) if last else 0,
                "accounting": accounting})

peer = subprocess.Popen([sys.executable, os.path.join(ROOT, "benches/peers/paho_shapely.py"), "--port", str(port),
                         "--fences", os.path.join(ROOT, "config/fences.geojson"), "--count", str(args.messages)],
                        stdout=subprocess.PIPE, text=True)
time.sleep(1.5)
pub = publish()
out, _ = peer.communicate(timeout=600)
pub.wait()
results.append(json.loads(out) | {"consumer": "python paho-mqtt + shapely (qos1)"})
broker.terminate()
for r in results:
    print(json.dumps(r))
