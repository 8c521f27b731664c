#!/usr/bin/env bash
# bench/batch/run.sh: many rows per weight pass (make bench-batch). On the ladder
# model (~30 GB, larger than RAM): at each budget, decode with 1, 2, 4, 8, 16
# sequences stepped together (aggregate tokens/s, GB read per token, ratio to one
# sequence) and prefill a 64-, 256- and 1,024-token prompt (seconds and GB read
# against the ideal: the streamed trunk once per pass plus each distinct expert of
# a pass's union once, over the disk bandwidth measured at the start of the run).
# Writes build/bench/batch.csv and batch.png.
set -euo pipefail
BUILD=${BUILD:-build}
M=${LADDER_MODEL:-$BUILD/models/ladder}
OUT=$BUILD/bench
BUDGETS=${BUDGETS:-"1 4"}
SEQS=${SEQS:-"1 2 4 8 16"}
PREFILLS=${PREFILLS:-"64 256 1024"}
GEN=${GEN:-4}
mkdir -p "$OUT"
[ -f "$M/config.json" ] || ./strata gen-model "$M" --preset ladder
[ -f "$M/strata.pack/manifest.json" ] || ./strata pack "$M"
echo "== bandwidth (O_DIRECT 4 MiB reads at depth 16 on a fresh file; memory read)"
bwline=$(./strata plan "$M" --ram-gb 4 --measure | grep -m1 'GB/s disk')
echo "$bwline"
DISK=$(echo "$bwline" | sed -n 's/.* at \([0-9.]*\) GB\/s disk.*/\1/p')
[ -n "$DISK" ] || { echo "run.sh: no disk bandwidth in strata plan's output"; exit 1; }
DISK_BPS=$(awk -v g="$DISK" 'BEGIN { printf "%.0f", g * 1e9 }')
CSV=$OUT/batch.csv
echo "budget_gb,mode,n,tokens,seconds,tokens_per_s,gb_read,gb_read_per_token,ideal_gb,floor_s,time_over_floor,read_over_ideal,ids_hash" > "$CSV"
for b in $BUDGETS; do
  for n in $SEQS; do
    echo "== budget $b GB, $n sequences" >&2
    "$BUILD/b_batch" "$M" --ram-gb "$b" --seqs "$n" --gen "$GEN" --disk-bw "$DISK_BPS" --csv "$CSV" > /dev/null 2> "$OUT/batch-$b-$n.log" \
      || { echo "run failed:"; tail -5 "$OUT/batch-$b-$n.log"; exit 1; }
    tail -1 "$CSV"
  done
  for p in $PREFILLS; do
    echo "== budget $b GB, prefill $p" >&2
    "$BUILD/b_batch" "$M" --ram-gb "$b" --prefill "$p" --disk-bw "$DISK_BPS" --csv "$CSV" > /dev/null 2> "$OUT/batch-$b-p$p.log" \
      || { echo "run failed:"; tail -5 "$OUT/batch-$b-p$p.log"; exit 1; }
    tail -1 "$CSV"
  done
done
echo
# decode: aggregate tokens/s relative to one sequence at the same budget
# and the gain the bytes allow: GB/token of one sequence over GB/token of n (what
# n sequences would gain if the disk stayed the limit at the same rate; a router
# that spreads n rows over n x top-k distinct experts leaves little to share)
awk -F, 'NR > 1 && $2 == "decode" { if ($3 == 1) { one[$1] = $6; b1[$1] = $8 }
  r = one[$1] > 0 ? $6 / one[$1] : 0; rb = $8 > 0 && b1[$1] > 0 ? b1[$1] / $8 : 0;
  printf "budget %s GB  %2d sequences  %7.3f tok/s  %6.3f GB/token  x%.2f vs 1 sequence (bytes allow x%.2f)\n", $1, $3, $6, $8, r, rb }' "$CSV"
awk -F, 'NR > 1 && $2 == "prefill" {
  printf "budget %s GB  prefill %4d  %7.2f s  read %6.2f GB (ideal %6.2f: x%.2f)  time / floor x%.2f\n", $1, $3, $5, $7, $9, $12, $11 }' "$CSV"
if command -v gnuplot > /dev/null; then
  gnuplot -e "csv='$CSV'; out='$OUT/batch.png'" bench/batch/plot.gp && echo "plot: $OUT/batch.png"
fi
