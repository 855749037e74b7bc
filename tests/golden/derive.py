"""Derives tests/golden/*.csv a second time, independently of the Rust.

Written from the model the lab states (src/lab/shaping.rs CONVENTIONS and
tests/golden/README.md), not from its code: a textbook token bucket that
counts tokens, and a leaky bucket that counts what waits in its queue.
Integers only (nanoseconds), so the two implementations must agree to the
last digit. Usage: derive.py OUT_DIR  (writes lab_shaping.csv and
lab_shaping_windows.csv there).
"""
import math
import sys
from pathlib import Path

NS = 1_000_000_000
MS = 1_000_000
T = 10 * MS            # 100 rps: one token / one release every 10 ms
SERVICE = 10 * MS      # the server: 10 ms per request
DEADLINE = 200 * MS    # on time: completion - arrival <= 200 ms
BIN = 100 * MS
WINDOW = 5 * NS
DIMENSIONS = [1, 2, 4, 8, 12, 16, 20, 28, 40, 80]


def arrivals():
    """Valley 20 rps for 1000 ms, spike 600 rps for 200 ms, repeated."""
    out, start = [], 0
    while True:
        for length, rate in ((1000 * MS, 20), (200 * MS, 600)):
            k = 0
            while True:
                t = start + k * NS // rate
                if t >= start + length:
                    break
                if t >= WINDOW:
                    return out
                out.append(t)
                k += 1
            start += length


def token_bucket(b, times):
    """b tokens, starts full, one token back every T; a token per admit."""
    tokens, credit, last, out = b, 0, 0, []
    for t in times:
        credit += t - last
        last = t
        refill, credit = divmod(credit, T)
        tokens += refill
        if tokens >= b:
            tokens, credit = b, 0   # a full bucket accrues nothing more
        if tokens >= 1:
            tokens -= 1
            out.append(t)
        else:
            out.append(None)
    return out


def leaky_bucket(b, times):
    """A queue of depth b drained one every T. An event is in the bucket
    from its arrival until its release slot [release, release + T) is over,
    so the one being released counts; the first release after an idle
    spell is immediate."""
    queue, out = [], []   # release times of events still in the bucket
    for t in times:
        queue = [r for r in queue if r + T > t]
        if len(queue) < b:
            release = max(t, queue[-1] + T) if queue else t
            queue.append(release)
            out.append(release)
        else:
            out.append(None)
    return out


def nearest_rank(sorted_values, q):
    if not sorted_values:
        return 0
    rank = min(max(math.ceil(q * len(sorted_values)), 1), len(sorted_values))
    return sorted_values[rank - 1]


def row(name, b, times):
    released = (token_bucket if name == "token-bucket" else leaky_bucket)(b, times)
    busy, on_time, late, rejects = 0, 0, 0, 0
    gate, waits, bins = [], [], {}
    for arrival, release in zip(times, released):
        if release is None:
            rejects += 1
            continue
        start = max(busy, release)
        busy = start + SERVICE
        if busy - arrival <= DEADLINE:
            on_time += 1
        else:
            late += 1
        gate.append(release - arrival)
        waits.append(start - release)
        bins[release // BIN] = bins.get(release // BIN, 0) + 1
    gate.sort()
    waits.sort()
    n = len(times)
    return "{},{},{:.1f},{:.2f},{:.2f},{:.1f},{:.1f},{}".format(
        name, b, on_time / 5, 100 * rejects / n, 100 * late / n,
        nearest_rank(gate, 0.99) / MS, nearest_rank(waits, 0.99) / MS,
        max(bins.values()) * (NS // BIN),
    )


def main():
    out = Path(sys.argv[1])
    times = arrivals()
    rows = ["limiter,burst,goodput_rps,reject_pct,served_late_pct,gate_delay_p99,server_wait_p99,downstream_peak"]
    for name in ("token-bucket", "leaky-bucket"):
        rows += [row(name, b, times) for b in DIMENSIONS]
    (out / "lab_shaping.csv").write_text("\n".join(rows) + "\n")

    def count(ts):
        bins = {}
        for t in ts:
            bins[t // BIN] = bins.get(t // BIN, 0) + 1
        return bins
    token = count(t for t in token_bucket(20, times) if t is not None)
    leaky = count(t for t in leaky_bucket(20, times) if t is not None)
    offered = count(times)
    last = max(max(m) for m in (offered, token, leaky))
    lines = ["window_start_ms,offered_rps,token_bucket_rps,leaky_bucket_rps"]
    for w in range(last + 1):
        lines.append("{},{},{},{}".format(
            w * BIN // MS, offered.get(w, 0) * 10, token.get(w, 0) * 10, leaky.get(w, 0) * 10))
    (out / "lab_shaping_windows.csv").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
