#!/usr/bin/env bash
# bench/serve/run.sh: `strata serve` on the ladder model at a 1 GB budget (make
# bench-serve). Throughput: for 1, 2, 4, 8 concurrent streaming clients, a server
# loaded for that many sequences (each its own plan, as bench-batch does) and
# REQS greedy requests of TOKENS tokens per client: aggregate tokens/s, time to
# first token and inter-token latency p50/p99 (bench.mjs). Then a two-turn chat
# whose second turn re-sends the history (chat2.mjs), on one sequence: without
# prefix reuse, with snapshots in RAM, and with snapshots only on disk
# (--prefix-gb 0 --cache-dir): bytes read and time of the second turn; the
# replies must be equal in every mode. Writes build/bench/serve.csv,
# serve-chat.csv and serve.png. The model is never modified (LADDER_MODEL or
# build/models/ladder, generated and packed once if missing). SPEC=K runs the
# throughput servers with --spec K; CLIENTS="" skips them, TWO_TURN=0 the chat.
set -euo pipefail
BUILD=${BUILD:-build}
M=${LADDER_MODEL:-$BUILD/models/ladder}
OUT=$BUILD/bench
RAM=${RAM:-1}
CLIENTS=${CLIENTS-"1 2 4 8"}
REQS=${REQS:-2}
TOKENS=${TOKENS:-12}
CTX=${CTX:-1024}
SPEC=${SPEC:-0}
TWO_TURN=${TWO_TURN:-1}
mkdir -p "$OUT"
[ -f "$M/config.json" ] || ./strata gen-model "$M" --preset ladder
[ -f "$M/strata.pack/manifest.json" ] || ./strata pack "$M"

PID=
stop_server() {
  if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=; fi
}
trap stop_server EXIT
# start_server LOG ARGS...: starts strata serve on a free port; sets PID and PORT
start_server() {
  local log=$1; shift
  ./strata serve "$M" --port 0 --ram-gb "$RAM" --ctx "$CTX" "$@" 2> "$log" &
  PID=$!
  PORT=
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    if [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then return 0; fi
    kill -0 "$PID" 2>/dev/null || { echo "server failed:"; tail -5 "$log"; exit 1; }
    sleep 0.5
  done
  echo "server not ready after 300 s"; tail -5 "$log"; exit 1
}
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | sed -n "s/^$1 //p" | head -1; }

CSV=$OUT/serve$([ "$SPEC" = 0 ] || echo "-spec$SPEC").csv
[ -z "$CLIENTS" ] || echo "label,clients,requests,tokens,seconds,tokens_per_s,ttft_p50_s,ttft_p99_s,itl_p50_s,itl_p99_s,peak_rss_gb,mean_rows_per_step,drafted,accepted" > "$CSV"
for c in $CLIENTS; do
  echo "== $c clients (--parallel $c, --ram-gb $RAM, --spec $SPEC)" >&2
  start_server "$OUT/serve-$c.log" --parallel "$c" --no-prefix --spec "$SPEC"
  node bench/serve/bench.mjs "$PORT" "$c" "$REQS" "$TOKENS" --csv "$OUT/serve-row.csv" --label "ram${RAM}-spec${SPEC}"
  rss=$(metric strata_peak_rss_bytes)
  rows=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^strata_step_rows_sum/ {s=$2} /^strata_step_rows_count/ {n=$2} END {printf "%.2f", n ? s / n : 0}')
  dr=$(metric strata_spec_drafted_tokens_total)
  ac=$(metric strata_spec_accepted_tokens_total)
  stop_server
  sed "s/\$/,$(awk -v r="$rss" 'BEGIN{printf "%.3f", r/1e9}'),$rows,$dr,$ac/" "$OUT/serve-row.csv" >> "$CSV"
  rm -f "$OUT/serve-row.csv"
done

CHAT=$OUT/serve-chat.csv
[ "$TWO_TURN" = 0 ] || echo "label,turn,prompt_tokens,cached_tokens,ttft_s,total_s,gb_read_weights,gb_read_snapshots,reply_hash" > "$CHAT"
SNAP=$OUT/serve-snapshots
for mode in $([ "$TWO_TURN" = 1 ] && echo none ram disk); do
  echo "== two-turn chat: prefix $mode" >&2
  rm -rf "$SNAP"
  case $mode in
    none) start_server "$OUT/serve-chat-$mode.log" --parallel 1 --no-prefix ;;
    ram)  start_server "$OUT/serve-chat-$mode.log" --parallel 1 ;;
    disk) start_server "$OUT/serve-chat-$mode.log" --parallel 1 --prefix-gb 0 --cache-dir "$SNAP" ;;
  esac
  node bench/serve/chat2.mjs "$PORT" --csv "$CHAT" --label "$mode"
  stop_server
done
rm -rf "$SNAP"
echo
awk -F, 'NR > 1 { if ($2 == 1) one = $6; printf "%d clients: %6.3f tok/s (x%.2f vs 1), TTFT p50 %.2f s p99 %.2f s, inter-token p50 %.2f s p99 %.2f s, %.2f rows/step, peak RSS %.3f GB, %d drafted, %d accepted\n",
  $2, $6, (one > 0 ? $6 / one : 0), $7, $8, $9, $10, $12, $11, $13, $14 }' "$CSV"
[ "$TWO_TURN" = 0 ] || awk -F, 'NR > 1 && $2 == 2 { printf "turn 2, prefix %-4s: %d prompt tokens (%d cached), first token %.2f s, total %.2f s, read %.3f GB weights + %.3f GB snapshots, reply %s\n",
  $1, $3, $4, $5, $6, $7, $8, $9 }' "$CHAT"
n=$(awk -F, 'NR > 1 && $2 == 2 { print $9 }' "$CHAT" | sort -u | wc -l)
[ "$TWO_TURN" = 0 ] || [ "$n" = 1 ] || { echo "second-turn replies differ between modes"; exit 1; }
if command -v gnuplot > /dev/null; then
  gnuplot -e "csv='$CSV'; out='${CSV%.csv}.png'" bench/serve/plot.gp && echo "plot: ${CSV%.csv}.png"
fi
