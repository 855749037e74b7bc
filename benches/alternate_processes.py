"""Alternates criterion benchmarks, each in a process of its own.

`alternate.py` runs a round's benchmarks in one process and always in the
bench's order, so the first one always meets the machine first; this
script starts a fresh process per benchmark, gives the odd rounds in the
order given and the even rounds reversed, and can mix builds (each a bench
binary built at the state being compared, e.g. copied from
target/release/deps/pipeline-*) and benchmark ids freely.

Each spec is LABEL=BINARY::ID (ID matched exactly). A ratio A/B is
A's time over B's, per round, reported as the median [min-max]
over rounds: above 1, B is the faster.

Each run's time is read two ways, and both are reported: criterion's
printed point estimate (the slope of a linear sampling, the mean of a flat
one) and the median of the run's per-iteration times from its
`sample.json` (what `alternate.py` reads). Why both: the pipeline's
benchmarks sample flat, and their mean carries every slow outlier of a
noisy machine, while decode-only's slope does not; a ratio of the two
mixes statistics. The median of both sides is the like-for-like one.

  # decode-only against the pipeline, each in its own process:
  GEOGATE_NO_DIAG=1 python3 benches/alternate_processes.py --rounds 6 \\
      --messages 40945 \\
      decode=target/release/deps/pipeline-HASH::in_process/decode_only \\
      memory=target/release/deps/pipeline-HASH::in_process/pipeline_memory/2 \\
      --ratio decode/memory

Run from the repository root (the benches read the bundled capture).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

UNIT = {"s": 1, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9, "ps": 1e-12}
# The estimate line, not the change line after it ("time: [-6.5% -5.4% ...").
ESTIMATE = re.compile(r"time: *\[\S+ \S+ (\S+) (s|ms|µs|us|ns|ps) ")

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("specs", nargs="+", metavar="LABEL=BINARY::ID")
ap.add_argument("--rounds", type=int, default=6)
ap.add_argument("--ratio", action="append", default=[], metavar="A/B")
ap.add_argument("--messages", type=int, help="messages per iteration, to print rates too")
ap.add_argument("--measurement-time", default="3")
args = ap.parse_args()

specs = []
for spec in args.specs:
    label, sep, rest = spec.partition("=")
    binary, sep2, bench_id = rest.partition("::")
    if not (sep and sep2 and label and binary and bench_id):
        sys.exit(f"not LABEL=BINARY::ID: {spec}")
    specs.append((label, binary, bench_id))
labels = [label for label, _, _ in specs]
if len(set(labels)) != len(labels):
    sys.exit("each spec needs a label of its own")
ratios = []
for ratio in args.ratio:
    a, sep, b = ratio.partition("/")
    if not sep or a not in labels or b not in labels:
        sys.exit(f"--ratio {ratio}: not LABEL/LABEL of the specs given")
    ratios.append((a, b))


# Where criterion saves its runs, as criterion works it out (run from the
# repository root, as the benches need anyway).
SAMPLES = os.environ.get("CRITERION_HOME") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or "target", "criterion")


def median_time(bench_id, since):
    """The median per-iteration time in seconds of the run criterion saved
    for this id (its sample.json: iterations and total time per sample),
    or None when it saved none after `since` (a file left by an earlier
    run is not this run's)."""
    path = os.path.join(SAMPLES, bench_id, "new", "sample.json")
    if not os.path.exists(path) or os.path.getmtime(path) < since:
        print(f"  {bench_id}: no sample.json from this run at {path}", file=sys.stderr)
        return None
    with open(path) as f:
        sample = json.load(f)
    return statistics.median(t / n for n, t in zip(sample["iters"], sample["times"])) * 1e-9


def estimate_time(binary, bench_id):
    """Criterion's printed point estimate and the run's median, in
    seconds, or None (and why) when the run failed or did not give
    exactly one estimate or saved no samples."""
    since = time.time()
    run = subprocess.run([binary, "--bench", "--exact", bench_id, "--color", "never",
                          "--measurement-time", args.measurement_time, "--warm-up-time", "1"],
                         capture_output=True, text=True, encoding="utf-8")
    found = ESTIMATE.findall(run.stdout)
    if run.returncode != 0 or len(found) != 1:
        print(f"  {bench_id}: exit {run.returncode}, {len(found)} estimates; "
              f"stderr ends: {run.stderr[-300:]!r}", file=sys.stderr)
        return None
    value, unit = found[0]
    median = median_time(bench_id, since)
    return None if median is None else (float(value) * UNIT[unit], median)


STATISTICS = ("estimate", "median")
# statistic -> label -> round -> seconds
times = {stat: {label: {} for label in labels} for stat in STATISTICS}
for r in range(1, args.rounds + 1):
    order = specs if r % 2 else specs[::-1]
    for label, binary, bench_id in order:
        t = estimate_time(binary, bench_id)
        if t is None:
            print(f"round {r} {label}: no estimate (see above)", flush=True)
            continue
        print(f"round {r} {label}: estimate {t[0] * 1e3:.2f} ms, median {t[1] * 1e3:.2f} ms", flush=True)
        for stat, value in zip(STATISTICS, t):
            times[stat][label][r] = value


def spread(values, fmt):
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}-{fmt(max(values))}]"


for stat in STATISTICS:
    print(f"by the {stat}:")
    for label in labels:
        ts = list(times[stat][label].values())
        if not ts:
            print(f"{label}: no estimate")
            continue
        line = f"{label}: {spread(ts, lambda t: f'{t * 1e3:.2f} ms')}"
        if args.messages:
            # The rate of the median over rounds, and of the slowest and fastest runs.
            rate = lambda t: f"{args.messages / t / 1e6:.2f}"
            line += f", {rate(statistics.median(ts))} [{rate(max(ts))}-{rate(min(ts))}] M/s"
        print(f"{line} over {len(ts)} rounds")
    for a, b in ratios:
        per_round = [times[stat][a][r] / times[stat][b][r] for r in times[stat][a] if r in times[stat][b]]
        if per_round:
            print(f"{a} time / {b} time: {spread(per_round, lambda v: f'{v:.3f}x')} over {len(per_round)} rounds")
        else:
            print(f"{a} time / {b} time: no round with both estimates")
