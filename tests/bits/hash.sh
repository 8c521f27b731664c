#!/usr/bin/env bash
# hash.sh STRATA WORKDIR PRESET...: prints one line per preset and mode,
#   PRESET MODE md5(ids) md5(logits)
# for a generated model (seed 7) run greedy on fixed ids, resident and with a
# budget below the model's size. tests/bits/expected.txt holds these lines as
# recorded before the source tree was reorganised; TEST(bits_recorded) compares.
set -euo pipefail
strata=$1 work=$2; shift 2
mkdir -p "$work"
for p in "$@"; do
  m=$work/$p
  [ -f "$m/config.json" ] || "$strata" gen-model "$m" --preset "$p" --seed 7 --quiet >/dev/null
  # the budget: 60% of the model's bytes, or the engine's minimum where that is more
  # (a tiny model's fixed buffers are larger than its weights)
  b=$(du -sb "$m" | awk '{printf "%.6f", $1 * 0.6 / 1e9}')
  min=$("$strata" run "$m" --ids 1,5,9,2,7,3 --gen 8 --ram-gb 0.001 2>&1 | sed -n 's/.*needs at least \([0-9.]*\) MB.*/\1/p' || true)
  [ -n "$min" ] && b=$(awk -v a="$b" -v m="$min" 'BEGIN { m = m * 1.05e-3; printf "%.6f", (a > m ? a : m) }')
  for mode in resident budget threads1; do
    extra=(--threads 2)
    [ $mode = budget ] && extra=(--threads 2 --ram-gb "$b")
    [ $mode = threads1 ] && extra=(--threads 1)
    ids=$("$strata" run "$m" --ids 1,5,9,2,7,3 --gen 8 --print-ids \
          --dump-logits "$work/$p.$mode.logits" ${extra[@]+"${extra[@]}"} 2>"$work/$p.$mode.err") ||
      { echo "$p $mode FAILED: $(tail -2 "$work/$p.$mode.err")"; continue; }
    echo "$p $mode $(printf '%s' "$ids" | md5sum | cut -c1-32) $(md5sum < "$work/$p.$mode.logits" | cut -c1-32)"
  done
done
