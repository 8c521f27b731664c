#!/usr/bin/env bash
# forward_hashes.sh: md5 of the ids and logits of every tiny preset (and, with
# --demo, the demo preset) at 1 and 2 threads, resident and under a small budget
# (weights streamed), plus sampled speculation, a batch and a self-draft run.
# Refactors that must not change a bit compare its output before and after:
#
#   tests/forward_hashes.sh [--demo] [STRATA] > after.md5
#   diff tests/data/forward_hashes.md5 after.md5   # recorded with --demo
#
# Models are generated once into $FH_MODELS (default /tmp/strata-fh-models).
# Tiny presets only: ~10 s; with --demo: ~1-2 min (1.9 GB of disk).
set -euo pipefail
demo=0
if [ "${1:-}" = --demo ]; then demo=1; shift; fi
S=${1:-./strata}
M=${FH_MODELS:-/tmp/strata-fh-models}
O=$(mktemp -d)
trap 'rm -rf "$O"' EXIT
mkdir -p "$M"
models="tiny tiny-odd tiny-blocks tiny-shards tiny-mixed tiny-bf16experts"
[ $demo = 1 ] && models="$models demo"
printf '1,2,3\n7,9\n4,4,4,4,4,4,4,4,4,4\n' > "$O/batch.txt"
for m in $models; do
  [ -d "$M/$m" ] || "$S" gen-model "$M/$m" --preset $m --quiet >/dev/null
  if [ $m = demo ]; then B=0.12; G=8; else B=0.0405; G=16; fi
  for t in 1 2; do
    for b in res bud; do
      R=""; [ $b = bud ] && R="--ram-gb $B"
      k=$m.t$t.$b
      "$S" run "$M/$m" --ids 1,2,3,5,8,13 --gen $G --print-ids --threads $t $R --dump-logits "$O/$k.logits" --ignore-eos >"$O/$k.ids" 2>/dev/null
      "$S" run "$M/$m" --ids 4,8,15 --gen $G --temp 0.7 --seed 3 --spec 3 --print-ids --threads $t $R --dump-logits "$O/$k.spec.logits" --ignore-eos >"$O/$k.spec.ids" 2>/dev/null
    done
  done
  "$S" run "$M/$m" --batch "$O/batch.txt" --gen 6 --print-ids --parallel 3 --chunk 4 --threads 2 --ram-gb $B --dump-logits "$O/$m.batch.logits" >"$O/$m.batch.ids" 2>/dev/null
  "$S" run "$M/$m" --ids 4,8,15 --gen 8 --spec 2 --draft self --print-ids --threads 2 --ram-gb $B >"$O/$m.self.ids" 2>/dev/null
done
(cd "$O" && md5sum -- *.ids *.logits* | sort -k2)
