"""Scale-out harness: events/s with the state in memory, in the embedded
store, and in Redis with 1, 2 and 3 instances on one shared subscription.

One mosquitto, one redis-server (appendfsync everysec), and a synthetic
shift-change capture (`geogate synth shift-change --vehicles V --seed 2`).
Each run registers its instances' persistent sessions (on a shared
subscription group of its own when there are several), stops them, has
`geogate replay` publish the whole capture while they are away (the broker
queues it, spread over the sessions), then starts them again: the rate is
the messages finished by all instances together over the time from the
first one received to the last one finished (metrics polled every 5 ms),
with no publisher competing for the cores. Rounds alternate the
configurations; each is reported as the median of its rounds with the
min–max, and as a ratio to the memory backend's median.

Everything shares this machine's 2 cores with the broker, Redis and the
publisher, so more instances here measure contention, not capacity; the
per-call script cost (pipeline bench, INFO commandstats) is what the scale
model in ARCHITECTURE.md builds on.

Usage: python3 benches/scale_out.py [--vehicles V] [--rounds R]
Needs: mosquitto, redis-server, redis-cli, target/release/geogate.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from harness import free_port, scrape, start_mosquitto, synth_capture, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEOGATE = os.path.join(ROOT, "target/release/geogate")
FENCES = os.path.join(ROOT, "config/fences.geojson")
ap = argparse.ArgumentParser()
ap.add_argument("--vehicles", type=int, default=500)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--only", help="one configuration, backend:instances (e.g. redis:3)")
args = ap.parse_args()

tmp = tempfile.mkdtemp()
CAPTURE, N = synth_capture(GEOGATE, args.vehicles, tmp)
broker, port = start_mosquitto(tmp, "")
rport = free_port()
redis = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(rport), "--save", "",
                          "--appendonly", "yes", "--appendfsync", "everysec", "--dir", tmp],
                         stdout=subprocess.DEVNULL)
wait_port(rport)


def config(client_id, backend, group):
    """The example config: no worker cap, a gate that never sheds, 2 shards."""
    mport = free_port()
    cfg = open(os.path.join(ROOT, "config/geogate.toml")).read()
    for old, new in [("port = 1883\n", f"port = {port}\n"), ('client_id = "geogate-1"', f'client_id = "{client_id}"'),
                     ('# listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{mport}"'),
                     ('path = "geogate-dead-letter.ndjson"', f'path = "{tmp}/dl-{client_id}.ndjson"'),
                     ('path = "config/fences.geojson"', f'path = "{FENCES}"'), ("mqtt = true ", "mqtt = false "),
                     ('# path = "geogate-events.ndjson"', f'path = "{tmp}/events-{client_id}.ndjson"'),
                     ('# backend = "embedded"', f'backend = "{backend}"'),
                     ("rate = 32000 ", "rate = 1000000 "), ("burst = 24000 ", "burst = 1000000 ")]:
        assert old in cfg, old
        cfg = cfg.replace(old, new, 1)
    if backend == "embedded":
        cfg = cfg.replace('# path = "geogate-state.sqlite"', f'path = "{tmp}/state-{client_id}.sqlite"', 1)
    if backend == "redis":
        state = cfg.index("[state]")
        cfg = cfg[:state] + cfg[state:].replace('# urls = ["redis://127.0.0.1:6379"]',
                                                f'urls = ["redis://127.0.0.1:{rport}"]', 1)
    if group:
        cfg = cfg.replace('topics = ["fleet/+/telemetry", "owntracks/+/+"]',
                          f'topics = ["$share/{group}/fleet/+/telemetry", "$share/{group}/owntracks/+/+"]', 1)
    path = os.path.join(tmp, f"{client_id}.toml")
    open(path, "w").write(cfg)
    return path, mport


def start(paths):
    procs = []
    for i, (path, mport) in enumerate(paths):
        err = open(os.path.join(tmp, f"stderr-{os.path.basename(path)}.log"), "a")
        procs.append((subprocess.Popen([GEOGATE, "run", "--config", path], stdout=subprocess.PIPE,
                                       stderr=err, text=True), mport))
    return procs


def stop(procs):
    for proc, _ in procs:
        proc.terminate()
    for proc, _ in procs:
        proc.communicate(timeout=60)


def run(backend, instances):
    subprocess.run(["redis-cli", "-p", str(rport), "FLUSHALL"], stdout=subprocess.DEVNULL, check=True)
    stamp = time.time_ns()
    # A group of its own: sessions of earlier runs stay subscribed to theirs.
    group = f"bench{stamp}" if instances > 1 else None
    paths = [config(f"{backend}-{instances}-{i}-{stamp}", backend, group) for i in range(instances)]
    procs = start(paths)
    deadline = time.time() + 30
    while any(scrape(m).get("geogate_mqtt_subscribed", 0) < 1 for _, m in procs):
        if time.time() > deadline:
            raise SystemExit("an instance did not subscribe")
        time.sleep(0.05)
    stop(procs)
    subprocess.run([GEOGATE, "replay", CAPTURE, "--mqtt", f"mqtt://127.0.0.1:{port}", "--speed", "1000"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)
    procs = start(paths)
    first = last = None
    late_fixes = shed = 0
    while True:
        ms = [scrape(m) for _, m in procs]
        now = time.perf_counter()
        got = sum(m.get("geogate_events_received_total", 0) for m in ms)
        done = sum(m.get(k, 0) for m in ms for k in ("geogate_events_evaluated_total", "geogate_events_invalid_total",
                                                     "geogate_events_shed_total", "geogate_fixes_late_total"))
        if got > 0 and first is None:
            first = now
        if done >= N:
            last = now
            late_fixes = sum(m.get("geogate_fixes_late_total", 0) for m in ms)
            # Low pings shed at a full queue never reach the state, so they
            # are not out of order either: a slower drain sheds more.
            shed = sum(m.get("geogate_events_shed_total", 0) for m in ms)
            break
        if first and now - first > 120:
            print(json.dumps({"stalled": [{k: m.get(k, 0) for k in (
                "geogate_events_received_total", "geogate_events_evaluated_total", "geogate_events_invalid_total",
                "geogate_fixes_late_total", "geogate_mqtt_unacked", "geogate_state_redis_errors_total")}
                for m in ms], "logs": tmp}), flush=True)
            break
        time.sleep(0.005)
    stop(procs)
    return (round(N / (last - first)) if last else 0), int(late_fixes), int(shed)


configs = [("memory", 1), ("embedded", 1), ("redis", 1), ("redis", 2), ("redis", 3)]
if args.only:
    backend, instances = args.only.split(":")
    configs = [(backend, int(instances))]
rates = {c: [] for c in configs}
ooo = {c: [] for c in configs}
sheds = {c: [] for c in configs}
for r in range(args.rounds):
    for c in configs:
        rate, late, shed = run(*c)
        rates[c].append(rate)
        ooo[c].append(late)
        sheds[c].append(shed)
        print(json.dumps({"round": r + 1, "backend": c[0], "instances": c[1], "rate": rate,
                          "late": late, "shed": shed}), flush=True)

base = statistics.median(rates[configs[0]])
print(f"\n{N} messages; events/s over all instances, median of {args.rounds} rounds [min–max]; "
      f"ratio to {configs[0][0]} ×{configs[0][1]}")
for c in configs:
    med = statistics.median(rates[c])
    print(f"{c[0]:9} ×{c[1]}  {med:>9,.0f} [{min(rates[c]):,}–{max(rates[c]):,}]  "
          f"{med / base:.2f}×   late median {statistics.median(ooo[c]):.0f}"
          f"   shed median {statistics.median(sheds[c]):.0f}")
broker.terminate()
redis.terminate()
