#!/bin/bash
# Instructions per decode, counted by valgrind's callgrind: the same count
# on every run of the same binary, whatever else the machine is doing, so
# a change to the codec can be compared without the ±30% this machine's
# timings move by. It counts instructions, not time: a change that trades
# instructions for branch misses or cache misses can count fewer and run
# slower (or, as the typed reading did, run faster than its count says),
# so a count decides nothing alone; the criterion A/B still does.
#
#   benches/decode_instructions.sh target/release/deps/pipeline-<hash> [more builds...]
#
# Each build is a pipeline bench binary; it runs one round of its stages
# diagnostic (GEOGATE_STAGES=1), and only its decode-only pass over the
# bundled capture (`decode_all`, kept out of line for this) is counted.
# Run from the repository root (the bench reads the bundled capture).
set -euo pipefail
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 2; }
# One record a line, none blank (capture::read would skip a blank one).
messages=$(zcat replay/shift-change.ndjson.gz | grep -c .)
for bin in "$@"; do
  out=$(mktemp)
  # The bench forks a check for gnuplot, which valgrind reports as a
  # process of its own: the largest count is the bench's.
  if GEOGATE_STAGES=1 valgrind --tool=callgrind --toggle-collect='pipeline::decode_all' \
      --callgrind-out-file="$out" "$bin" --bench stages_alone >/dev/null 2>"$out.log" \
      && total=$(grep -o 'Collected : [0-9]*' "$out.log" | grep -o '[0-9]*$' | sort -n | tail -1) \
      && [ -n "$total" ]; then
    echo "$(basename "$bin"): $((total / messages)) instructions per decode ($total over $messages decodes)"
    rm -f "$out" "$out.log"
  else
    echo "$(basename "$bin"): the count failed; valgrind's log:" >&2
    cat "$out.log" >&2
    rm -f "$out" "$out.log"
    exit 1
  fi
done
