#!/bin/bash
# Alternates several builds of one criterion bench (each a binary built at
# the state being compared, e.g. copied from target/release/deps/pipeline-*)
# on one benchmark id, round after round (odd rounds in the order given,
# even rounds reversed, so no build always runs first), and prints each
# run's criterion estimate [low median high]; then, for each build after
# the first, the first build's median time over its own, per round, as the
# median [min–max] of those ratios (above 1: that build is the faster).
#
#   benches/alternate_binaries.sh 'in_process/pipeline_memory/2$' 5 /tmp/before /tmp/after
#
# Compare builds by their times in the same round, not each by its ratio
# to another benchmark of its own: a build's decode-only time differed by
# up to 1.5× by the median in some runs and not in others of the same
# binaries (BENCHMARKS.md, "Router lanes").
#
# Run from the repository root (the bench reads the bundled capture). The
# builds' file names must differ: they label the results.
F="$1"; R="$2"; shift 2
builds=("$@")
if [ -n "$(printf '%s\n' "${builds[@]##*/}" | sort | uniq -d)" ]; then
  echo "the builds need different file names: they label the results" >&2
  exit 2
fi
for r in $(seq 1 "$R"); do
  order=("${builds[@]}")
  if (( r % 2 == 0 )); then
    order=()
    for (( i = ${#builds[@]} - 1; i >= 0; i-- )); do order+=("${builds[i]}"); done
  fi
  for bin in "${order[@]}"; do
    t=$("$bin" --bench "$F" --measurement-time 3 --warm-up-time 1 2>/dev/null | grep -o "time: *\[[^]]*\]" | head -1)
    echo "round $r $(basename "$bin") ${t:-(no estimate: the run failed or matched no benchmark)}"
  done
done | python3 -c '
import re, statistics, sys
names = [a.rsplit("/", 1)[-1] for a in sys.argv[1:]]
unit = {"s": 1, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9, "ps": 1e-12}
times = {}  # (round, build) -> median seconds
for line in sys.stdin:
    print(line, end="", flush=True)
    m = re.match(r"round (\d+) (\S+) time: *\[\S+ \S+ (\S+) (\S+) ", line)
    if m:
        times[m[1], m[2]] = float(m[3]) * unit[m[4]]
rounds = {r for r, _ in times}
for name in names[1:]:
    ratios = [times[r, names[0]] / times[r, name] for r in rounds
              if (r, names[0]) in times and (r, name) in times]
    if ratios:
        print(f"{names[0]} time / {name} time: {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} rounds")
    else:
        print(f"{names[0]} time / {name} time: no round with both estimates")
' "${builds[@]}"
