"""Helpers for the end-to-end harness (e2e.py)."""
import socket
import time
import urllib.request


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


def scrape(mport):
    """geogate's /metrics on `mport`, each metric summed over its labels."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2).read().decode()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def latency_quantiles(mport, metric="geogate_end_to_end_latency_seconds", qs=(0.5, 0.99)):
    """Quantiles of one of geogate's histograms, in milliseconds, as
    Prometheus's histogram_quantile reads them (linear within a bucket, so
    good to the bucket's width: the latency buckets are about 2.5x apart);
    None when nothing was recorded."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    buckets = []
    for line in body.splitlines():
        if line.startswith(metric + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return None
    total, out = buckets[-1][1], {}
    for q in qs:
        rank, lower, below = q * total, 0.0, 0.0
        for upper, count in buckets:
            if count >= rank:
                upper = lower if upper == float("inf") else upper
                share = (rank - below) / (count - below) if count > below else 1.0
                out[f"p{round(q * 100)}_ms"] = round((lower + (upper - lower) * share) * 1e3, 3)
                break
            lower, below = upper, count
    return out


def synth_capture(geogate, vehicles, tmp):
    """The synthetic shift change for `vehicles` (seed 2) in `tmp`: (path, messages)."""
    import gzip
    import os
    import subprocess
    capture = os.path.join(tmp, "capture.ndjson.gz")
    subprocess.run([geogate, "synth", "shift-change", "--vehicles", str(vehicles), "--seed", "2", "--out", capture],
                   stdout=subprocess.DEVNULL, check=True)
    with gzip.open(capture, "rt") as f:
        return capture, sum(1 for _ in f)


def start_mosquitto(tmp, extra=""):
    """mosquitto on a free loopback port with no inflight or queue limits: (process, port)."""
    import os
    import subprocess
    port = free_port()
    conf = os.path.join(tmp, "m.conf")
    open(conf, "w").write(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_inflight_messages 0\n"
                          f"max_queued_messages 0\n{extra}")
    broker = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return broker, port
