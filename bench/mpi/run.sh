#!/usr/bin/env bash
# bench/mpi/run.sh: the ladder model on 2 ranks against 1 rank at the same total
# budget (make bench-mpi). For each total T: `strata run --ram-gb T` and
# `mpirun -np 2 strata-mpi run --ram-gb T/2` (each rank its own half), a 1-token
# prompt, GEN1 and GEN2 generated tokens: decode s/token (the report's, first
# token excluded), bytes read per token over all ranks and network bytes per
# token (both as the difference between the two lengths, so loads and the first
# pass's pinning drop out), and the ids of the two must be equal. Both machines
# of the "cluster" are this one: the same disk, memory and 2 cores.
# Writes build/bench/mpi.csv and a markdown table on stdout.
set -euo pipefail
BUILD=${BUILD:-build}
M=${LADDER_MODEL:-$BUILD/models/ladder}
OUT=$BUILD/bench
TOTALS=${TOTALS:-"2 4"}
GEN1=${GEN1:-2}
GEN2=${GEN2:-8}
THREADS=${THREADS:-2}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
mkdir -p "$OUT"
[ -f "$M/config.json" ] || { echo "bench-mpi: no ladder model at $M (LADDER_MODEL=DIR)" >&2; exit 2; }
[ -x ./strata-mpi ] || { echo "bench-mpi: ./strata-mpi is not built (needs libopenmpi-dev)" >&2; exit 2; }
for t in $TOTALS; do
  half=$(awk -v t="$t" 'BEGIN{printf "%g", t / 2}')
  for g in $GEN1 $GEN2; do
    echo "== total $t GB, 1 rank, $g tokens" >&2
    ./strata run "$M" --ids 1 --gen "$g" --ram-gb "$t" --threads "$THREADS" --print-ids --json "$OUT/mpi-1-$t-$g.json" \
      > "$OUT/mpi-1-$t-$g.ids" 2> "$OUT/mpi-1-$t-$g.log"
    echo "== total $t GB, 2 ranks x $half GB, $g tokens" >&2
    "${MPIRUN[@]}" -np 2 ./strata-mpi run "$M" --ids 1 --gen "$g" --ram-gb "$half" --threads "$THREADS" --print-ids \
      > "$OUT/mpi-2-$t-$g.ids" 2> "$OUT/mpi-2-$t-$g.log"
  done
done
/usr/bin/python3 - "$OUT" "$TOTALS" "$GEN1" "$GEN2" <<'PY'
import json, re, sys
out, totals, g1, g2 = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
def one(t, g):   # 1 rank: bytes read from the JSON report
    d = json.load(open(f"{out}/mpi-1-{t}-{g}.json"))
    s = d["placement"]["stats"]
    rd = sum(s[k] for k in ("bytes_trunk", "bytes_head", "bytes_embed", "bytes_experts"))
    return d["timings"]["decode_s_per_token"], rd, 0.0, d["placement"]["plan"]["n_pinned"]
def two(t, g):   # 2 ranks: the per-rank table of the report
    log = open(f"{out}/mpi-2-{t}-{g}.log").read()
    dec = float(re.search(r"decode ([0-9.]+) s/token", log).group(1))
    rows = re.findall(r"^mpi: +\d+ +\S+ +([0-9.]+) +[0-9.]+ +([0-9.]+) +[0-9.]+ +[0-9.]+$", log, re.M)
    rd = sum(float(r[0]) for r in rows) * 1e9
    net = sum(float(r[1]) for r in rows) * 1e6
    pins = re.findall(r"(\d+) of (\d+) trunk units pinned|trunk pinned", log)
    return dec, rd, net, pins
csv = open(f"{out}/mpi.csv", "w")
csv.write("total_gb,ranks,decode_s_per_token,tokens_per_s,gb_read_per_token,net_kb_per_token,ids_equal\n")
print("| total budget | ranks | decode s/token | tokens/s | GB read/token (all ranks) | network KB/token | ids equal |")
print("|---:|---:|---:|---:|---:|---:|:---:|")
for t in totals:
    ids = [open(f"{out}/mpi-{r}-{t}-{g2}.ids").read().strip() for r in (1, 2)]
    eq = ids[0] == ids[1] and ids[0] != ""
    for r, f in ((1, one), (2, two)):
        a, b = f(t, g1), f(t, g2)
        dec = b[0]
        rd = (b[1] - a[1]) / (g2 - g1) / 1e9
        net = (b[2] - a[2]) / (g2 - g1) / 1e3
        desc = f"1 x {t} GB" if r == 1 else f"2 x {float(t)/2:g} GB"
        csv.write(f"{t},{r},{dec:.4f},{1/dec:.3f},{rd:.3f},{net:.1f},{int(eq)}\n")
        print(f"| {t} GB | {desc} | {dec:.3f} | {1/dec:.2f} | {rd:.3f} | {net:.1f} | {'yes' if eq else 'NO'} |")
PY
