"""Partitioned state against the embedded store, end to end, one instance each.

embedded: one geogate (`[state] backend = "embedded"`) drains a synthetic
shift-change capture that mosquitto queued for its persistent session
while it was stopped; rate = messages finished / (last finished − first
received), metrics polled every 5 ms.

partitioned: one geogate (`backend = "partitioned"`) drains the same
capture that nats-server (JetStream, its MQTT listener, the partition
mapping of README) stored in the partitions while it was stopped; the same
measure. Each round starts the engine afresh.

Rounds alternate the two; each is the median of its rounds [min–max], and
the ratio is partitioned / embedded. CPU seconds per million fixes, of
geogate and of the broker or engine, are read from /proc over each drain.

`--sweep 1,8,64` also drains once per partition count (the engine's cost as
partitions grow), and `--live RATE` publishes the capture live at RATE
messages/s to each and reports receive-to-written latency p50/p99 of the
transitions (`geogate_transition_latency_seconds`: embedded, receive to
the events file; partitioned, the engine's store to the events stream).

Usage: python3 benches/partitioned.py [--vehicles V] [--rounds R] [--partitions P]
           [--sweep 1,8,64] [--live 5000]
Needs: mosquitto, nats-server, target/release/geogate.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from harness import free_port, latency_quantiles, scrape, start_mosquitto, synth_capture, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEOGATE = os.environ.get("GEOGATE_BIN", os.path.join(ROOT, "target/release/geogate"))
FENCES = os.path.join(ROOT, "config/fences.geojson")
ap = argparse.ArgumentParser()
ap.add_argument("--vehicles", type=int, default=500)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--partitions", type=int, default=8)
ap.add_argument("--sweep", default="")
ap.add_argument("--live", type=int, default=0)
args = ap.parse_args()

tmp = tempfile.mkdtemp()
CAPTURE, N = synth_capture(GEOGATE, args.vehicles, tmp)
broker, mport_broker = start_mosquitto(tmp, "")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Nats:
    """nats-server with JetStream, MQTT and the partition mapping, fresh."""

    def __init__(self, partitions):
        self.dir = tempfile.mkdtemp(dir=tmp)
        self.port, self.mqtt = free_port(), free_port()
        conf = os.path.join(self.dir, "nats.conf")
        n = partitions
        open(conf, "w").write(
            f'listen: 127.0.0.1:{self.port}\nserver_name: bench\njetstream {{ store_dir: "{self.dir}/js" }}\n'
            f"mqtt {{ listen: 127.0.0.1:{self.mqtt} }}\nmappings = {{\n"
            f'  "fleet.*.telemetry": "in.{{{{partition({n},1)}}}}.fleet.{{{{wildcard(1)}}}}.telemetry"\n'
            f'  "owntracks.*.*": "in.{{{{partition({n},1,2)}}}}.owntracks.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}"\n}}\n')
        self.proc = subprocess.Popen(["nats-server", "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_port(self.port)
        wait_port(self.mqtt)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def config(name, backend, partitions=0, nats=None):
    """The example config: no worker cap, a gate that never sheds."""
    mport = free_port()
    cfg = open(os.path.join(ROOT, "config/geogate.toml")).read()
    port = nats.mqtt if nats else mport_broker
    for old, new in [("port = 1883\n", f"port = {port}\n"), ('client_id = "geogate-1"', f'client_id = "{name}"'),
                     ('# listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{mport}"'),
                     ('path = "geogate-dead-letter.ndjson"', f'path = "{tmp}/dl-{name}.ndjson"'),
                     ('path = "config/fences.geojson"', f'path = "{FENCES}"'), ("mqtt = true ", "mqtt = false "),
                     ('# backend = "embedded"', f'backend = "{backend}"'),
                     ("rate = 32000 ", "rate = 1000000 "), ("burst = 24000 ", "burst = 1000000 "),
                     # No reorder window: a fix is finished when applied, in
                     # both (a held fix would be counted at different times).
                     ("# reorder_window_ms = 2000", "reorder_window_ms = 0")]:
        assert old in cfg, old
        cfg = cfg.replace(old, new, 1)
    if backend == "embedded":
        cfg = cfg.replace('# path = "geogate-events.ndjson"', f'path = "{tmp}/events-{name}.ndjson"', 1)
        cfg = cfg.replace('# path = "geogate-state.sqlite"', f'path = "{tmp}/state-{name}.sqlite"', 1)
    else:
        state = cfg.index("[state]")
        cfg = cfg[:state] + cfg[state:].replace(
            '# urls = ["nats://127.0.0.1:4222"]', f'urls = ["nats://127.0.0.1:{nats.port}"]', 1).replace(
            "# partitions = 16", f"partitions = {partitions}", 1)
    path = os.path.join(tmp, f"{name}.toml")
    open(path, "w").write(cfg)
    return path, mport


def start(path):
    err = open(os.path.join(tmp, f"stderr-{os.path.basename(path)}.log"), "a")
    return subprocess.Popen([GEOGATE, "run", "--config", path], stdout=subprocess.DEVNULL, stderr=err)


def stop(proc):
    proc.terminate()
    proc.wait(timeout=60)


def wait_ready(mport, proc):
    deadline = time.time() + 30
    while not scrape(mport):
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit(f"geogate did not start (logs in {tmp})")
        time.sleep(0.02)


def publish(port, live=0):
    cmd = [GEOGATE, "replay", CAPTURE, "--mqtt", f"mqtt://127.0.0.1:{port}"]
    cmd += ["--max-rate", str(live)] if live else ["--speed", "1000"]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=900)


def drain(path, mport, server_pid, ingest):
    """Starts geogate on a queued backlog; (rate, geogate CPU s, server CPU s
    while draining, late, server CPU s while devices published)."""
    proc = start(path)
    server_before = cpu_seconds(server_pid)
    first = last = None
    while True:
        m = scrape(mport)
        now = time.perf_counter()
        got = m.get("geogate_events_received_total", 0)
        done = sum(m.get(k, 0) for k in ("geogate_events_evaluated_total", "geogate_events_invalid_total",
                                          "geogate_events_shed_total", "geogate_fixes_late_total"))
        if got > 0 and first is None:
            first = now
        if done >= N:
            last = now
            break
        if first and now - first > 300:
            raise SystemExit(f"stalled at {done} of {N} (logs in {tmp})")
        time.sleep(0.005)
    own = cpu_seconds(proc.pid)
    server = cpu_seconds(server_pid) - server_before
    late = m.get("geogate_fixes_late_total", 0)
    stop(proc)
    return round(N / (last - first)), own, server, int(late), ingest


def embedded_round(stamp, live=0):
    path, mport = config(f"emb{stamp}", "embedded")
    proc = start(path)
    deadline = time.time() + 30
    while scrape(mport).get("geogate_mqtt_subscribed", 0) < 1:
        if time.time() > deadline:
            raise SystemExit("geogate did not subscribe")
        time.sleep(0.05)
    if live:
        publish(mport_broker, live)
        time.sleep(3)
        q = latency_quantiles(mport, "geogate_transition_latency_seconds")
        stop(proc)
        return q
    stop(proc)
    before = cpu_seconds(broker.pid)
    publish(mport_broker)
    return drain(path, mport, broker.pid, cpu_seconds(broker.pid) - before)


def partitioned_round(stamp, partitions, live=0):
    nats = Nats(partitions)
    try:
        path, mport = config(f"part{stamp}", "partitioned", partitions, nats)
        # A first start makes the input streams: the engine keeps what
        # devices publish only once they exist.
        proc = start(path)
        wait_ready(mport, proc)
        time.sleep(0.5)
        if live:
            publish(nats.mqtt, live)
            time.sleep(3)
            q = latency_quantiles(mport, "geogate_transition_latency_seconds")
            stop(proc)
            return q
        stop(proc)
        before = cpu_seconds(nats.proc.pid)
        publish(nats.mqtt)
        return drain(path, mport, nats.proc.pid, cpu_seconds(nats.proc.pid) - before)
    finally:
        nats.stop()


def show(name, rows):
    rates = [r[0] for r in rows]
    per_m = lambda i: statistics.median(r[i] for r in rows) / N * 1e6
    print(f"{name:22} {statistics.median(rates):>9,.0f} [{min(rates):,}–{max(rates):,}]  CPU s per M fixes: "
          f"geogate {per_m(1):.1f}, server draining {per_m(2):.1f}, server taking the publishes {per_m(4):.1f}"
          f"   late {statistics.median(r[3] for r in rows):.0f}", flush=True)
    return statistics.median(rates)


results = {"embedded": [], "partitioned": []}
for r in range(args.rounds):
    stamp = time.time_ns()
    results["embedded"].append(embedded_round(stamp))
    results["partitioned"].append(partitioned_round(stamp, args.partitions))
    print(f"round {r + 1}: embedded {results['embedded'][-1]}, partitioned {results['partitioned'][-1]}",
          flush=True)

if args.rounds:
    print(f"\n{N} messages; one instance each; median of {args.rounds} alternating rounds [min–max]")
    base = show("embedded (mosquitto)", results["embedded"])
    part = show(f"partitioned ({args.partitions} p)", results["partitioned"])
    ratios = [p[0] / e[0] for e, p in zip(results["embedded"], results["partitioned"])]
    print(f"ratio partitioned / embedded: {part / base:.2f}× (per round {min(ratios):.2f}–{max(ratios):.2f})")

if args.sweep:
    print("\npartition count sweep (one drain each)")
    for n in [int(x) for x in args.sweep.split(",")]:
        show(f"partitioned ({n} p)", [partitioned_round(time.time_ns(), n)])

if args.live:
    print(f"\nlive at {args.live} msgs/s: transition latency, receive to written")
    print("embedded (mosquitto):", embedded_round(time.time_ns(), args.live))
    print(f"partitioned ({args.partitions} p):", partitioned_round(time.time_ns(), args.partitions, args.live))
broker.terminate()
