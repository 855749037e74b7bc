#!/bin/bash
# Containment at 10k fences against Shapely 2, alternating, in one session:
# each round runs every geogate build given (copies of
# target/release/deps/geofence-*, one per state compared) on
# `containment/rtree/10000` and `containment/rtree_batch/10000` where the
# build has it, and Shapely's two forms on the identical exported fences and
# points (`benches/peers/shapely_strtree.py`, the better form's best of 5,
# which favours Shapely). Odd rounds run in the order given, Shapely last;
# even rounds in reverse, Shapely first. Prints one line per measurement,
# "r<round> <build>:<benchmark> <M points/s>" and "r<round> shapely <M>",
# then per-round ratios to Shapely as median [min–max].
#
#   cargo bench --bench geofence --no-run
#   cp target/release/deps/geofence-<hash> /tmp/after
#   /tmp/after --bench 'containment/rtree/10000$' --measurement-time 1   # exports the points
#   benches/alternate_containment.sh 6 /tmp/before /tmp/after
#
# Run from the repository root, with Shapely 2 in .venv (benches/README.md).
set -euo pipefail
rounds="$1"; shift
builds=("$@")
if [ -n "$(printf '%s\n' "${builds[@]##*/}" | sort | uniq -d)" ]; then
  echo "the builds need different file names: they label the results" >&2
  exit 2
fi
if [ ! -s target/geofence-bench/10000/points.f64 ]; then
  echo "no exported points: run a build's containment bench once first (see above)" >&2
  exit 2
fi
data=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$data" "$log"' EXIT
ln -s "$PWD/target/geofence-bench/10000" "$data/10000"
for r in $(seq 1 "$rounds"); do
  order=("${builds[@]}" shapely)
  if (( r % 2 == 0 )); then
    order=(shapely)
    for (( i = ${#builds[@]} - 1; i >= 0; i-- )); do order+=("${builds[i]}"); done
  fi
  for side in "${order[@]}"; do
    if [ "$side" = shapely ]; then
      (cd benches/peers && ../../.venv/bin/python shapely_strtree.py "$data") |
        python3 -c "import sys, json; print('r$r shapely', round(max(json.loads(l)['points_per_s'] for l in sys.stdin) / 1e6, 4))"
    else
      "$side" --bench 'containment/rtree(_batch)?/10000$' --measurement-time 3 --warm-up-time 1 2>&1 |
        awk -v r="$r" -v b="${side##*/}" '/^containment\//{id=$1}
          /thrpt:/ && !/%/ {if ($5 != "Melem/s") {print "unexpected unit: " $0 > "/dev/stderr"; exit 1}
                            print "r" r " " b ":" id " " $4}'
    fi
  done
done | tee "$log"
python3 - "$log" <<'PY'
import collections, re, statistics, sys
rounds = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, value = line.split()
    rounds[r][name] = float(value)
names = sorted({n for row in rounds.values() for n in row if n != "shapely"})
for name in names:
    rates = [row[name] for row in rounds.values() if name in row]
    ratios = [row[name] / row["shapely"] for row in rounds.values() if name in row and "shapely" in row]
    print(f"{name}: {statistics.median(rates):.2f} M/s [{min(rates):.2f}-{max(rates):.2f}], "
          f"{statistics.median(ratios):.2f}x Shapely [{min(ratios):.2f}-{max(ratios):.2f}] over {len(ratios)} rounds")
PY
