"""End-to-end harness: geogate against its limits and peers on loopback.

Two phases, one mosquitto, and a synthetic shift-change capture (`geogate
synth shift-change --vehicles 1500 --seed 2`: 204,779 messages, native and
OwnTracks, 1% corrupt) written to a temporary directory:

live      each consumer subscribes, then `geogate replay --speed 1000`
          publishes the capture as fast as the broker takes it. Every fast
          consumer is held to the publisher's rate here, so this phase shows
          "keeps up with the stream", not a ceiling.
preloaded every consumer first registers a persistent session and leaves;
          the capture is published once while all are offline, so the broker
          queues it for each; then the consumers come back one at a time and
          drain. No publisher competes for the two cores, so these rates are
          each consumer's own ceiling, and mosquitto_sub's is the broker's
          raw delivery rate.

Consumers: mosquitto_sub at QoS 0 and 1 (the limit; when draining it prints
nothing and is timed by its wall clock), geogate run at QoS 0 and
1 (2 shards, no worker cap, a gate that never sheds; a full shard queue
still sheds idle pings whatever the gate, so a drain that outruns the workers
by a whole queue evaluates fewer, and its accounting line says how many), and
the paho-mqtt + Shapely peer (benches/peers/paho_shapely.py) at QoS 1. A rate is messages
over the time from the consumer's first to its last message (geogate: first
received to all evaluated or dead-lettered, from /metrics polled every 5 ms
from the moment the process starts, so the rate is if anything understated).
In the preloaded phase mosquitto_sub is timed over its whole process, connect
and session resume included; geogate also reports `rate_from_connect`, timed
from the first poll that sees it connected (the same window, less its own
start-up), and both report `broker_cpu` and `consumer_cpu`: the CPUs the
broker and the consumer kept busy (CPU seconds from /proc/<pid>/stat, or
times(2) of the reaped mosquitto_sub, over wall seconds) over mosquitto_sub's
whole process and over geogate's window from its connect. geogate's records
also carry `latency`: the p50 and p99 of its own sampled receive-to-finished
histogram, in ms, read as Prometheus reads a histogram (linear within a
bucket, and the buckets are about 2.5x apart, so coarse). Each CPU time is
cut to whole 10 ms ticks, so a difference is good to ±20 ms: about ±4% on
a half-second drain.

Usage: .venv/bin/python benches/e2e.py [--vehicles V] [--phase live|preloaded|both] [--skip-peer]
       GEOGATE_STATE_BACKEND=memory ... runs geogate with the memory state backend;
       GEOGATE_DECODE_LANES=N ... runs geogate with N decode lanes;
       GEOGATE_SCHED_BATCH=false ... runs geogate's threads on the normal policy;
       GEOGATE_BIN=path ... runs another build (to alternate two builds run by run).
Needs: mosquitto, mosquitto_sub, target/release/geogate, Shapely 2, paho-mqtt.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from harness import free_port, latency_quantiles, scrape, start_mosquitto, synth_capture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# GEOGATE_BIN: another build, to alternate two builds run by run.
GEOGATE = os.environ.get("GEOGATE_BIN") or os.path.join(ROOT, "target/release/geogate")
PEER = os.path.join(ROOT, "benches/peers/paho_shapely.py")
FENCES = os.path.join(ROOT, "config/fences.geojson")
TOPICS = ["-t", "fleet/+/telemetry", "-t", "owntracks/+/+"]
ap = argparse.ArgumentParser()
ap.add_argument("--vehicles", type=int, default=1500)
ap.add_argument("--phase", choices=["live", "preloaded", "both"], default="both")
ap.add_argument("--skip-peer", action="store_true", help="leave the Python peer out (geogate vs mosquitto_sub only)")
args = ap.parse_args()


tmp = tempfile.mkdtemp()
CAPTURE, N = synth_capture(GEOGATE, args.vehicles, tmp)
broker, port = start_mosquitto(tmp, "queue_qos0_messages true\n")


def publish_all():
    subprocess.run([GEOGATE, "replay", CAPTURE, "--mqtt", f"mqtt://127.0.0.1:{port}", "--speed", "1000"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)


def publish_background():
    return subprocess.Popen([GEOGATE, "replay", CAPTURE, "--mqtt", f"mqtt://127.0.0.1:{port}", "--speed", "1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def mosquitto_sub(qos, client_id=None, register_only=False):
    cmd = ["mosquitto_sub", "-p", str(port), "-q", str(qos)] + TOPICS
    if client_id:
        cmd += ["-c", "-i", client_id]
    cmd += ["-E"] if register_only else ["-C", str(N), "-F", "%U"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU time a live process has used so far (utime and
    stime, fields 14 and 15 of /proc/<pid>/stat; the split after the
    command's closing parenthesis starts at field 3)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def drain_rate(qos, client_id):
    """mosquitto_sub draining its queued session with no per-message output
    (formatting and writing a line per message was its own bottleneck):
    messages over the process's wall time, connect included. Also the CPUs
    the broker and mosquitto_sub kept busy meanwhile (CPU s / wall s)."""
    cmd = ["mosquitto_sub", "-p", str(port), "-q", str(qos), "-c", "-i", client_id, "-C", str(N)] + TOPICS
    broker_before, children_before = cpu_seconds(broker.pid), os.times()
    started = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, timeout=600)
    wall = time.perf_counter() - started
    children = os.times()
    consumer = (children.children_user + children.children_system
                - children_before.children_user - children_before.children_system)
    return N, round(N / wall), {"broker_cpu": round((cpu_seconds(broker.pid) - broker_before) / wall, 2),
                                "consumer_cpu": round(consumer / wall, 2)}


def sub_rate(proc):
    out, _ = proc.communicate(timeout=600)
    stamps = [float(l) for l in out.split()]
    return len(stamps), round(len(stamps) / (stamps[-1] - stamps[0]))


def geogate_config(client_id, qos):
    """The example config on this broker: no worker cap, a gate that never sheds (a full queue still does)."""
    mport = free_port()
    cfg = open(os.path.join(ROOT, "config/geogate.toml")).read()
    for old, new in [("port = 1883\n", f"port = {port}\n"), ('client_id = "geogate-1"', f'client_id = "{client_id}"'),
                     ("# subscribe_qos = 1 ", f"subscribe_qos = {qos} "),
                     ('# listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{mport}"'),
                     ('path = "geogate-dead-letter.ndjson"', f'path = "{tmp}/dl-{client_id}.ndjson"'),
                     ('path = "config/fences.geojson"', f'path = "{FENCES}"'), ("mqtt = true ", "mqtt = false "),
                     ('# path = "geogate-state.sqlite"', f'path = "{tmp}/state-{client_id}.sqlite"'),
                     ("rate = 32000 ", "rate = 1000000 "), ("burst = 24000 ", "burst = 1000000 ")]:
        assert old in cfg, old
        cfg = cfg.replace(old, new, 1)
    if os.environ.get("GEOGATE_STATE_BACKEND"):
        # For a same-session comparison of the state backends.
        cfg = cfg.replace('# backend = "embedded"', f'backend = "{os.environ["GEOGATE_STATE_BACKEND"]}"', 1)
    if os.environ.get("GEOGATE_DECODE_LANES"):
        # For a same-session comparison of lane counts with one build.
        assert "# decode_lanes = 0 " in cfg
        cfg = cfg.replace("# decode_lanes = 0 ", f'decode_lanes = {int(os.environ["GEOGATE_DECODE_LANES"])} ', 1)
    if os.environ.get("GEOGATE_SCHED_BATCH"):
        # For a same-session comparison of the scheduling policies.
        assert "# sched_batch = true " in cfg
        value = {"true": "true", "false": "false"}[os.environ["GEOGATE_SCHED_BATCH"]]
        cfg = cfg.replace("# sched_batch = true ", f"sched_batch = {value} ", 1)
    path = os.path.join(tmp, f"{client_id}.toml")
    open(path, "w").write(cfg)
    return path, mport


def start_geogate(client_id, qos, wait_connected=True):
    path, mport = geogate_config(client_id, qos)
    proc = subprocess.Popen([GEOGATE, "run", "--config", path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    deadline = time.time() + 30
    while wait_connected and scrape(mport).get("geogate_mqtt_connected", 0) < 1:
        if time.time() > deadline:
            raise SystemExit("geogate did not connect")
        time.sleep(0.05)
    return proc, mport


def geogate_rate(proc, mport):
    """Messages over the time from the first received to all finished; and,
    timed from the first poll that sees geogate connected to all finished,
    the same rate (`rate_from_connect`) and the CPUs the broker and geogate
    kept busy. Gives up after 120 s without a message or 300 s of drain."""
    started = time.perf_counter()
    first = last = connected = None
    done = transitions = 0
    cpu_at_connect = cpu = None
    while True:
        m = scrape(mport)
        now = time.perf_counter()
        got = m.get("geogate_events_received_total", 0)
        # Finished by the accounting line's terms: a fix released from its
        # reorder window finished as held, and is in the evaluated metric too.
        done = sum(m.get(k, 0) for k in ("geogate_events_evaluated_total", "geogate_events_invalid_total",
                                         "geogate_events_shed_total", "geogate_fixes_late_total",
                                         "geogate_fixes_held_total", "geogate_messages_ignored_total")) \
            - m.get("geogate_fixes_released_total", 0)
        if connected is None and (got > 0 or m.get("geogate_mqtt_connected", 0) >= 1):
            connected = now
            cpu_at_connect = (cpu_seconds(broker.pid), cpu_seconds(proc.pid))
        if got > 0 and first is None:
            first = now
        if done >= N:
            last = now
            transitions = int(m.get("geogate_fence_transitions_total", 0))
            break
        if (first and now - first > 300) or (not first and now - started > 120):
            print(f"warning: geogate's drain did not finish ({int(done)} of {N} finished)", file=sys.stderr)
            break
        time.sleep(0.005)
    if last is not None and last > first:
        window = last - connected
        cpu = {"rate_from_connect": round(done / window),
               "broker_cpu": round((cpu_seconds(broker.pid) - cpu_at_connect[0]) / window, 2),
               "consumer_cpu": round((cpu_seconds(proc.pid) - cpu_at_connect[1]) / window, 2)}
    elif last is not None:
        # One poll saw the whole drain: no window to time.
        print("warning: geogate's drain was not timed (no poll fell inside it)", file=sys.stderr)
        last = None
    # Receive to finished, from geogate's own sampled histogram.
    cpu = (cpu or {}) | {"latency": latency_quantiles(mport)}
    proc.terminate()
    accounting = proc.communicate(timeout=60)[0].strip()
    return int(done), (round(done / (last - first)) if last else 0), accounting, transitions, cpu


def peer(client_id=None, register_only=False):
    cmd = [sys.executable, PEER, "--port", str(port), "--fences", FENCES, "--count", str(N)]
    if client_id:
        cmd += ["--client-id", client_id]
    if register_only:
        cmd += ["--register-only"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


results = []


def record(phase, consumer, messages, rate, **extra):
    results.append({"phase": phase, "consumer": consumer, "messages": messages, "rate": rate} | extra)
    print(json.dumps(results[-1]), flush=True)


if args.phase in ("live", "both"):
    for qos in (0, 1):
        sub = mosquitto_sub(qos)
        time.sleep(0.5)
        pub = publish_background()
        record("live", f"mosquitto_sub qos{qos}", *sub_rate(sub))
        pub.wait()
    for qos in (0, 1):
        gg, mport = start_geogate(f"live-{qos}-{time.time_ns()}", qos)
        pub = publish_background()
        done, rate, accounting, transitions, extra = geogate_rate(gg, mport)
        pub.wait()
        record("live", f"geogate run qos{qos}", done, rate, accounting=accounting, transitions=transitions,
               latency=extra["latency"])
    p = peer()
    time.sleep(1.5)
    pub = publish_background()
    out, _ = p.communicate(timeout=900)
    pub.wait()
    r = json.loads(out)
    record("live", "python paho-mqtt + shapely qos1", r["messages"], r["rate"], transitions=r["transitions"])

if args.phase in ("preloaded", "both"):
    stamp = time.time_ns()
    ids = {k: f"pre-{k}-{stamp}" for k in ("sub0", "sub1", "gg0", "gg1", "peer")}
    # Register every persistent session, then leave.
    mosquitto_sub(0, ids["sub0"], register_only=True).wait(timeout=30)
    mosquitto_sub(1, ids["sub1"], register_only=True).wait(timeout=30)
    for qos in (0, 1):
        gg, mport = start_geogate(ids[f"gg{qos}"], qos)
        gg.terminate()
        gg.communicate(timeout=60)
    if not args.skip_peer:
        peer(ids["peer"], register_only=True).wait(timeout=60)
    publish_all()
    time.sleep(0.5)
    for qos in (0, 1):
        messages, rate, cpu = drain_rate(qos, ids[f"sub{qos}"])
        record("preloaded", f"mosquitto_sub qos{qos}", messages, rate, **cpu)
    for qos in (0, 1):
        # Polling starts before the connection: the broker empties the queue
        # into the socket the moment the session resumes.
        gg, mport = start_geogate(ids[f"gg{qos}"], qos, wait_connected=False)
        done, rate, accounting, transitions, cpu = geogate_rate(gg, mport)
        record("preloaded", f"geogate run qos{qos}", done, rate, accounting=accounting,
               transitions=transitions, **(cpu or {}))
    if not args.skip_peer:
        out, _ = peer(ids["peer"]).communicate(timeout=900)
        r = json.loads(out)
        record("preloaded", "python paho-mqtt + shapely qos1", r["messages"], r["rate"],
               transitions=r["transitions"])

broker.terminate()
