#!/bin/bash
# Alternates several builds of one criterion bench (each a binary built at
# the state being compared, e.g. copied from target/release/deps/pipeline-*)
# on one benchmark id, round after round, and prints each run's criterion
# estimate [low median high]; then, for each build after the first, the
# first build's median time over its own, per round, as the median
# [min–max] of those ratios (above 1: that build is the faster).
#
#   benches/alternate_binaries.sh 'in_process/pipeline_memory/2$' 5 /tmp/before /tmp/after
#
# Compare builds by their times in the same round, not each by its ratio
# to another benchmark of its own: moving code around can change a build's
# decode-only time by up to a third (BENCHMARKS.md, "Router lanes").
#
# Run from the repository root (the bench reads the bundled capture).
F="$1"; R="$2"; shift 2
for r in $(seq 1 "$R"); do
  for bin in "$@"; do
    t=$("$bin" --bench "$F" --measurement-time 3 --warm-up-time 1 2>/dev/null | grep -o "time: *\[[^]]*\]" | head -1)
    echo "round $r $(basename "$bin") $t"
  done
done | tee /dev/stderr | awk -v builds=$# '
  function seconds(v, unit) {
    return v * (unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit ~ /^(µs|us)$/ ? 1e-6 : 1e-9)
  }
  {
    # round R NAME time: [low unit median unit high unit]
    gsub(/\[|\]/, "")
    if ($2 != round) { round = $2; n = 0 }
    name[++n] = $3
    # a run that printed no estimate leaves its round out of the ratio
    if (NF >= 10) t[round, n] = seconds($7, $8)
  }
  END {
    for (b = 2; b <= builds; b++) {
      k = 0
      for (r = 1; r <= round; r++)
        if (t[r, 1] > 0 && t[r, b] > 0) ratio[++k] = t[r, 1] / t[r, b]
      if (k == 0) continue
      # insertion sort, then the median
      for (i = 2; i <= k; i++) { v = ratio[i]; for (j = i - 1; j >= 1 && ratio[j] > v; j--) ratio[j + 1] = ratio[j]; ratio[j + 1] = v }
      median = (k % 2) ? ratio[(k + 1) / 2] : (ratio[k / 2] + ratio[k / 2 + 1]) / 2
      printf "%s time / %s time: %.2fx [%.2f-%.2f] over %d rounds\n", name[1], name[b], median, ratio[1], ratio[k], k
    }
  }'
