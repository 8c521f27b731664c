#!/usr/bin/env bash
# bench/spec/run.sh: speculative decoding on the ladder model (make bench-spec).
# At each budget: plain greedy decode, then --spec K with --draft-ids set to the
# model's own greedy continuation (every draft accepted: a pass verifies K + 1
# rows), K = 1..8: decode tokens/s, ratio to plain, and the cost of a K + 1-row
# pass relative to a 1-row pass. Then drafts that always fail (random ids): the
# adaptive draft length must keep it within a few percent of plain decode. Then
# self-drafts (--draft self), and a prompt with a repeated passage with n-gram
# drafts against plain decode on the same prompt. Every
# run's ids must equal plain decode's. Writes build/bench/spec.csv and spec.png.
set -euo pipefail
BUILD=${BUILD:-build}
M=${LADDER_MODEL:-$BUILD/models/ladder}
OUT=$BUILD/bench
BUDGETS=${BUDGETS:-"1 4"}
KS=${KS:-"1 2 3 4 5 6 7 8"}
GEN=${GEN:-25}
PROMPT=${PROMPT:-"1,2,3,4,5,6,7,8"}
# a passage of 24 ids said three times (prompt lookup finds it; what the model
# continues with decides whether the drafts hold)
REPEAT=${REPEAT:-$(for r in 1 2 3; do seq 100 37 951 | head -24; done | paste -sd,)}
mkdir -p "$OUT"
[ -f "$M/config.json" ] || ./strata gen-model "$M" --preset ladder
[ -f "$M/strata.pack/manifest.json" ] || ./strata pack "$M"
CSV=$OUT/spec.csv
echo "budget_gb,mode,k,decode_s_per_token,tokens_per_s,ratio_to_plain,pass_cost_vs_one_row,accepted,drafted,ids_equal" > "$CSV"
field() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"; }
# run_one NAME ARGS...: one `strata run` at budget $b into $OUT/spec-NAME.{json,ids}
# (log spec-$b-NAME.log); sets s (decode s/token), acc, dr (accepted, drafted) and
# nd (decode tokens).
run_one() {
  local name=$1; shift
  ./strata run "$M" --gen "$GEN" --ram-gb "$b" --print-ids --json "$OUT/spec-$name.json" "$@" \
    > "$OUT/spec-$name.ids" 2> "$OUT/spec-$b-$name.log"
  s=$(field "$OUT/spec-$name.json" "d['timings']['decode_s_per_token']")
  acc=$(field "$OUT/spec-$name.json" "(d.get('speculation') or {}).get('accepted', 0)")
  dr=$(field "$OUT/spec-$name.json" "(d.get('speculation') or {}).get('drafted', 0)")
  nd=$(field "$OUT/spec-$name.json" "len(d['generated_ids']) - 1")
}
# row NAME MODE K REF_S REF_IDS_FILE [cost]: appends the CSV row of run NAME against
# the reference run (its s/token and ids); with `cost`, the cost of one pass
# relative to a 1-row pass (passes = decode tokens - accepted).
row() {
  local eq; eq=$(cmp -s "$OUT/spec-$1.ids" "$5" && echo 1 || echo 0)
  awk -v b="$b" -v mode="$2" -v k="$3" -v s="$s" -v p="$4" -v acc="$acc" -v dr="$dr" -v nd="$nd" -v eq="$eq" -v c="${6:-}" 'BEGIN {
    cost = c == "" || nd <= acc ? "" : sprintf("%.3f", (s * nd / (nd - acc)) / p);
    printf "%s,%s,%s,%.4f,%.3f,%.3f,%s,%s,%s,%s\n", b, mode, k, s, 1 / s, p / s, cost, acc, dr, eq }' >> "$CSV"
  tail -1 "$CSV"
}
for b in $BUDGETS; do
  echo "== budget $b GB: plain" >&2
  run_one plain --ids "$PROMPT"
  plain_ids=$(cat "$OUT/spec-plain.ids")
  p=$s
  echo "$b,plain,0,$p,$(awk -v p="$p" 'BEGIN{printf "%.3f", 1/p}'),1.000,1.000,0,0,1" >> "$CSV"
  tail -1 "$CSV"
  for k in $KS; do
    echo "== budget $b GB: --spec $k, own continuation as drafts" >&2
    run_one "$k" --ids "$PROMPT" --spec "$k" --draft-ids "$plain_ids"
    row "$k" own "$k" "$p" "$OUT/spec-plain.ids" cost
  done
  echo "== budget $b GB: --spec 4, drafts that always fail" >&2
  bad=$(echo "$plain_ids" | awk -F, '{ for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), ($i + 7) % 4000 }')
  run_one bad --ids "$PROMPT" --spec 4 --draft-ids "$bad"
  row bad failing 4 "$p" "$OUT/spec-plain.ids"
  echo "== budget $b GB: --spec 4 --draft self (the model on what is in RAM)" >&2
  run_one self --ids "$PROMPT" --spec 4 --draft self
  row self self 4 "$p" "$OUT/spec-plain.ids"
  grep "^self-draft" "$OUT/spec-$b-self.log" >&2 || true
  # a prompt with a repeated passage: n-gram drafts against plain decode
  echo "== budget $b GB: repeated passage, plain and --spec 4 (n-gram drafts)" >&2
  run_one rplain --ids "$REPEAT"
  rp=$s
  echo "$b,repeat-plain,0,$rp,$(awk -v p="$rp" 'BEGIN{printf "%.3f", 1/p}'),1.000,,0,0,1" >> "$CSV"
  tail -1 "$CSV"
  run_one rngram --ids "$REPEAT" --spec 4
  row rngram repeat-ngram 4 "$rp" "$OUT/spec-rplain.ids"
done
echo
column -s, -t < "$CSV"
if awk -F, 'NR > 1 && $10 == 0 { bad = 1 } END { exit !bad }' "$CSV"; then echo "FAIL: speculation changed the ids"; exit 1; fi
echo "ids identical with and without speculation in every run"
if command -v gnuplot > /dev/null; then
  gnuplot -e "csv='$CSV'; out='$OUT/spec.png'" bench/spec/plot.gp && echo "plot: $OUT/spec.png"
fi
