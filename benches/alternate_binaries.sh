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
names=""
for bin in "${builds[@]}"; do names="$names $(basename "$bin")"; done
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
done | awk -v names="$names" '
  function seconds(v, unit) {
    if (unit == "s") return v
    if (unit == "ms") return v * 1e-3
    if (unit == "µs" || unit == "us") return v * 1e-6
    if (unit == "ns") return v * 1e-9
    if (unit == "ps") return v * 1e-12
    print "unknown unit " unit > "/dev/stderr"
    return -1
  }
  BEGIN { builds = split(names, name, " ") }
  {
    print
    # round R NAME time: [low unit median unit high unit]
    line = $0
    gsub(/\[|\]/, "", line)
    split(line, f, /[ \t]+/)
    # a run that printed no estimate leaves its round out of the ratios
    if (f[4] == "time:" && f[7] != "") t[f[2], f[3]] = seconds(f[7], f[8])
    rounds = f[2]
  }
  END {
    for (b = 2; b <= builds; b++) {
      k = 0
      for (r = 1; r <= rounds; r++)
        if (t[r, name[1]] > 0 && t[r, name[b]] > 0) ratio[++k] = t[r, name[1]] / t[r, name[b]]
      if (k == 0) { printf "%s time / %s time: no round with both estimates\n", name[1], name[b]; continue }
      # insertion sort, then the median
      for (i = 2; i <= k; i++) { v = ratio[i]; for (j = i - 1; j >= 1 && ratio[j] > v; j--) ratio[j + 1] = ratio[j]; ratio[j + 1] = v }
      median = (k % 2) ? ratio[(k + 1) / 2] : (ratio[k / 2] + ratio[k / 2 + 1]) / 2
      printf "%s time / %s time: %.2fx [%.2f-%.2f] over %d rounds\n", name[1], name[b], median, ratio[1], ratio[k], k
    }
  }'
