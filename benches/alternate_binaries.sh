#!/bin/bash
# Alternates several builds of one criterion bench (each a binary built at
# the state being compared, e.g. copied from target/release/deps/pipeline-*)
# on one benchmark id, round after round (odd rounds in the order given,
# even rounds reversed, so no build always runs first), and prints each
# run's median time; then, for each build after the first, the first
# build's median time over its own, per round, as the median [min–max] of
# those ratios (above 1: that build is the faster).
#
#   benches/alternate_binaries.sh 'in_process/pipeline_memory/2$' 5 /tmp/before /tmp/after
#
# Compare builds by their times in the same round, not each by its ratio
# to another benchmark of its own: a build's decode-only time differed by
# up to 1.5× by the median in some runs and not in others of the same
# binaries (docs/decisions/0018-builds-compared-by-same-round-times.md).
#
# The id is matched exactly (a trailing `$`, as older commands give it, is
# dropped). Each build runs in a process of its own through
# benches/alternate_processes.py, labelled by its file name, so the names
# must differ. Run from the repository root (the bench reads the bundled
# capture).
F="${1%\$}"; R="$2"; shift 2
specs=(); ratios=()
for bin in "$@"; do
  specs+=("$(basename "$bin")=$bin::$F")
  [ "$bin" = "$1" ] || ratios+=(--ratio "$(basename "$1")/$(basename "$bin")")
done
exec python3 "$(dirname "$0")/alternate_processes.py" --rounds "$R" "${specs[@]}" "${ratios[@]}"
