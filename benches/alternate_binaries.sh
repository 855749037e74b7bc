#!/bin/bash
# Alternates several builds of one criterion bench (each a binary built at
# the state being compared, e.g. copied from target/release/deps/pipeline-*)
# on one benchmark id, round after round, and prints each run's criterion
# estimate [low median high]; ratios are taken per round from the medians.
#
#   benches/alternate_binaries.sh 'in_process/pipeline_memory/2' 5 /tmp/before /tmp/after
#
# Run from the repository root (the bench reads the bundled capture).
F="$1"; R="$2"; shift 2
for r in $(seq 1 "$R"); do
  for bin in "$@"; do
    t=$("$bin" --bench "$F" --measurement-time 3 --warm-up-time 1 2>/dev/null | grep -o "time: *\[[^]]*\]" | head -1)
    echo "round $r $(basename "$bin") $t"
  done
done
