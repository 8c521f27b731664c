#!/usr/bin/env bash
# bench/ladder/run.sh: the memory ladder (make bench). Generates and packs the
# `ladder` model once (~30 GB, larger than this machine's RAM), measures disk and
# memory read bandwidth, then runs one prompt at budgets 1, 2, 4, 8, 16 GB and
# resident; prints a table, writes build/bench/ladder.csv and ladder.png, and
# fails if any rung's ids differ or a rung's peak RSS exceeds its budget.
set -euo pipefail
BUILD=${BUILD:-build}
M=${LADDER_MODEL:-$BUILD/models/ladder}
OUT=$BUILD/bench
GEN=${GEN:-8}
BUDGETS=${BUDGETS:-"1 2 4 8 16 resident"}
mkdir -p "$OUT"
[ -f "$M/config.json" ] || ./strata gen-model "$M" --preset ladder
[ -f "$M/strata.pack/manifest.json" ] || ./strata pack "$M"
echo "== bandwidth (O_DIRECT 4 MiB reads at depth 16 on a fresh file; 256 MB memory read)"
./strata plan "$M" --ram-gb 4 --measure | tail -1
CSV=$OUT/ladder.csv
echo "budget_gb,pinned,prefill_s_tok,decode_s_tok,gb_read_tok,io_floor_s_tok,pct_io_limit,expert_hit_pct,io_wait_pct,peak_rss_gb,ids_hash" > "$CSV"
for b in $BUDGETS; do
  if [ "$b" = resident ]; then arg=--resident; else arg="--ram-gb $b"; fi
  echo "== budget $b" >&2
  "$BUILD/place_run" "$M" $arg --gen "$GEN" --prompt-len 16 --csv "$CSV" 2> "$OUT/ladder-$b.log" || { echo "rung $b failed:"; tail -5 "$OUT/ladder-$b.log"; exit 1; }
done
echo
column -s, -t < "$CSV"
n=$(tail -n +2 "$CSV" | cut -d, -f11 | sort -u | wc -l)
if [ "$n" != 1 ]; then echo "FAIL: ids differ across budgets"; exit 1; fi
echo "ids hash identical at every budget"
tail -n +2 "$CSV" | awk -F, '$1 != "resident" && $10 > $1 { print "FAIL: peak RSS " $10 " GB over the " $1 " GB budget"; bad = 1 } END { exit bad }'
if command -v gnuplot > /dev/null; then
  gnuplot -e "csv='$CSV'; out='$OUT/ladder.png'" bench/ladder/plot.gp && echo "plot: $OUT/ladder.png"
fi
