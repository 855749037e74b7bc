"""Runs one criterion bench N times and reports ratios as medians with spread.

Each round runs every benchmark of the group once, in the same process and
order, so the contenders alternate; after each round the median point
estimate of each benchmark is read from target/criterion. A ratio is
computed per round (same round, same machine state) and reported as the
median over rounds with its min–max, because this 2-core machine moves by
±30% from run to run.

Usage:
  python3 benches/alternate.py --bench pipeline --filter 'in_process/pipeline_' \
      --rounds 5 --base 'in_process/pipeline_memory/2'
Ratios are base time / contender time (> 1: the contender is faster than
the base; for throughput, contender rate / base rate).
"""
import argparse
import json
import os
import statistics
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True)
ap.add_argument("--filter", required=True)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--base", required=True,
                help="criterion id (group/function[/param]) to divide by; with --same-param, group/function "
                     "and each contender is divided by the base with its own parameter")
ap.add_argument("--same-param", action="store_true")
ap.add_argument("--measurement-time", default="3")
args = ap.parse_args()

# Criterion writes under the target directory, which CARGO_TARGET_DIR moves
# (a build with other RUSTFLAGS, say).
root = os.path.join(os.environ.get("CARGO_TARGET_DIR")
                    or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target"),
                    "criterion")


def estimates():
    """criterion id -> median time (ns) of the last run."""
    out = {}
    for dirpath, _, files in os.walk(root):
        if "estimates.json" in files and dirpath.endswith(os.sep + "new"):
            rel = os.path.relpath(os.path.dirname(dirpath), root)
            with open(os.path.join(dirpath, "estimates.json")) as f:
                out[rel] = json.load(f)["median"]["point_estimate"]
    return out


rounds = []
for r in range(args.rounds):
    before = estimates()
    subprocess.run(["cargo", "bench", "--bench", args.bench, "--", args.filter,
                    "--measurement-time", args.measurement_time, "--warm-up-time", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    after = estimates()
    ran = {k: v for k, v in after.items() if before.get(k) != v}
    rounds.append(ran)
    print(f"round {r + 1}: " + ", ".join(f"{k} {v / 1e6:.2f} ms" for k, v in sorted(ran.items())), flush=True)

ids = sorted(set().union(*rounds))
print(f"\nratio = {args.base}{'/<param>' if args.same_param else ''} time / contender time, median of {args.rounds} rounds [min–max]")
def base_of(i):
    return f"{args.base}/{i.rsplit('/', 1)[1]}" if args.same_param else args.base


for i in ids:
    b = base_of(i)
    ratios = [r[b] / r[i] for r in rounds if i in r and b in r]
    if ratios:
        print(f"{i:50s} {statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}]  "
              f"median time {statistics.median(r[i] for r in rounds if i in r) / 1e6:.3f} ms")
