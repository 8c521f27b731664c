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
for b in $BUDGETS; do
  echo "== budget $b GB: plain" >&2
  ./strata run "$M" --ids "$PROMPT" --gen "$GEN" --ram-gb "$b" --print-ids --json "$OUT/spec-plain.json" > "$OUT/spec-plain.ids" 2> "$OUT/spec-$b-plain.log"
  plain_ids=$(cat "$OUT/spec-plain.ids")
  p=$(field "$OUT/spec-plain.json" "d['timings']['decode_s_per_token']")
  echo "$b,plain,0,$p,$(awk -v p="$p" 'BEGIN{printf "%.3f", 1/p}'),1.000,1.000,0,0,1" >> "$CSV"
  tail -1 "$CSV"
  for k in $KS; do
    echo "== budget $b GB: --spec $k, own continuation as drafts" >&2
    ./strata run "$M" --ids "$PROMPT" --gen "$GEN" --ram-gb "$b" --print-ids --spec "$k" --draft-ids "$plain_ids" \
      --json "$OUT/spec-k.json" > "$OUT/spec-k.ids" 2> "$OUT/spec-$b-$k.log"
    s=$(field "$OUT/spec-k.json" "d['timings']['decode_s_per_token']")
    acc=$(field "$OUT/spec-k.json" "d['speculation']['accepted']")
    dr=$(field "$OUT/spec-k.json" "d['speculation']['drafted']")
    vp=$(field "$OUT/spec-k.json" "d['speculation']['verifying_passes']")
    nd=$(field "$OUT/spec-k.json" "len(d['generated_ids']) - 1")
    eq=$([ "$(cat "$OUT/spec-k.ids")" = "$plain_ids" ] && echo 1 || echo 0)
    # passes = decode tokens - accepted; cost of one pass relative to a 1-row pass
    awk -v b="$b" -v k="$k" -v s="$s" -v p="$p" -v acc="$acc" -v dr="$dr" -v nd="$nd" -v eq="$eq" 'BEGIN {
      passes = nd - acc; cost = (s * nd / passes) / p;
      printf "%s,own,%s,%.4f,%.3f,%.3f,%.3f,%s,%s,%s\n", b, k, s, 1 / s, p / s, cost, acc, dr, eq }' >> "$CSV"
    tail -1 "$CSV"
  done
  echo "== budget $b GB: --spec 4, drafts that always fail" >&2
  bad=$(echo "$plain_ids" | awk -F, '{ for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), ($i + 7) % 4000 }')
  ./strata run "$M" --ids "$PROMPT" --gen "$GEN" --ram-gb "$b" --print-ids --spec 4 --draft-ids "$bad" \
    --json "$OUT/spec-k.json" > "$OUT/spec-k.ids" 2> "$OUT/spec-$b-bad.log"
  s=$(field "$OUT/spec-k.json" "d['timings']['decode_s_per_token']")
  acc=$(field "$OUT/spec-k.json" "d['speculation']['accepted']")
  dr=$(field "$OUT/spec-k.json" "d['speculation']['drafted']")
  eq=$([ "$(cat "$OUT/spec-k.ids")" = "$plain_ids" ] && echo 1 || echo 0)
  awk -v b="$b" -v s="$s" -v p="$p" -v acc="$acc" -v dr="$dr" -v eq="$eq" 'BEGIN {
    printf "%s,failing,4,%.4f,%.3f,%.3f,,%s,%s,%s\n", b, s, 1 / s, p / s, acc, dr, eq }' >> "$CSV"
  tail -1 "$CSV"
  echo "== budget $b GB: --spec 4 --draft self (the model on what is in RAM)" >&2
  ./strata run "$M" --ids "$PROMPT" --gen "$GEN" --ram-gb "$b" --print-ids --spec 4 --draft self \
    --json "$OUT/spec-k.json" > "$OUT/spec-k.ids" 2> "$OUT/spec-$b-self.log"
  s=$(field "$OUT/spec-k.json" "d['timings']['decode_s_per_token']")
  acc=$(field "$OUT/spec-k.json" "d['speculation']['accepted']")
  dr=$(field "$OUT/spec-k.json" "d['speculation']['drafted']")
  eq=$([ "$(cat "$OUT/spec-k.ids")" = "$plain_ids" ] && echo 1 || echo 0)
  awk -v b="$b" -v s="$s" -v p="$p" -v acc="$acc" -v dr="$dr" -v eq="$eq" 'BEGIN {
    printf "%s,self,4,%.4f,%.3f,%.3f,,%s,%s,%s\n", b, s, 1 / s, p / s, acc, dr, eq }' >> "$CSV"
  tail -1 "$CSV"
  grep "^self-draft" "$OUT/spec-$b-self.log" >&2 || true
  # a prompt with a repeated passage: n-gram drafts against plain decode
  echo "== budget $b GB: repeated passage, plain and --spec 4 (n-gram drafts)" >&2
  ./strata run "$M" --ids "$REPEAT" --gen "$GEN" --ram-gb "$b" --print-ids --json "$OUT/spec-plain.json" \
    > "$OUT/spec-rplain.ids" 2> "$OUT/spec-$b-rplain.log"
  rp=$(field "$OUT/spec-plain.json" "d['timings']['decode_s_per_token']")
  echo "$b,repeat-plain,0,$rp,$(awk -v p="$rp" 'BEGIN{printf "%.3f", 1/p}'),1.000,,0,0,1" >> "$CSV"
  tail -1 "$CSV"
  ./strata run "$M" --ids "$REPEAT" --gen "$GEN" --ram-gb "$b" --print-ids --spec 4 \
    --json "$OUT/spec-k.json" > "$OUT/spec-k.ids" 2> "$OUT/spec-$b-rngram.log"
  s=$(field "$OUT/spec-k.json" "d['timings']['decode_s_per_token']")
  acc=$(field "$OUT/spec-k.json" "d['speculation']['accepted']")
  dr=$(field "$OUT/spec-k.json" "d['speculation']['drafted']")
  eq=$([ "$(cat "$OUT/spec-k.ids")" = "$(cat "$OUT/spec-rplain.ids")" ] && echo 1 || echo 0)
  awk -v b="$b" -v s="$s" -v p="$rp" -v acc="$acc" -v dr="$dr" -v eq="$eq" 'BEGIN {
    printf "%s,repeat-ngram,4,%.4f,%.3f,%.3f,,%s,%s,%s\n", b, s, 1 / s, p / s, acc, dr, eq }' >> "$CSV"
  tail -1 "$CSV"
done
echo
column -s, -t < "$CSV"
if awk -F, 'NR > 1 && $10 == 0 { bad = 1 } END { exit !bad }' "$CSV"; then echo "FAIL: speculation changed the ids"; exit 1; fi
echo "ids identical with and without speculation in every run"
if command -v gnuplot > /dev/null; then
  gnuplot -e "csv='$CSV'; out='$OUT/spec.png'" bench/spec/plot.gp && echo "plot: $OUT/spec.png"
fi
