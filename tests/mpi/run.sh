#!/usr/bin/env bash
# tests/mpi/run.sh: strata-mpi under mpirun on this machine (ranks 1-4 over
# shared memory) against the plain strata: ids and logits bit for bit for run,
# batched run (with passes split across sequences) and speculative decode
# (accepted, rejected and sampled); refusals at start-up (another version, another
# model, too many ranks); a killed rank stopping the run within seconds. Ends with
# "N passed, N failed" (make test-mpi; make test runs it when mpirun exists).
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
S="$ROOT/strata"
SM="$ROOT/strata-mpi"
T=$(mktemp -d /tmp/strata-mpi-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
# ASan/LSan builds (make check): Open MPI keeps allocations until exit
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export OMPI_MCA_btl_vader_single_copy_mechanism=none   # containers without CMA
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
# a failure shows its log: the first lines (strata's own message comes first) and
# the last ones (mpirun's summary), without Open MPI's boilerplate paragraphs
bad() {
  fail=$((fail + 1)); echo "FAIL $1"
  [ -n "${2:-}" ] || return 0
  if [ "$(wc -l < "$2")" -le 40 ]; then sed 's/^/     /' "$2"; return 0; fi
  head -20 "$2" | sed 's/^/     /'; echo "     ..."; tail -15 "$2" | sed 's/^/     /'
}
t0=$(date +%s)

for b in "$S" "$SM"; do
  [ -x "$b" ] || { echo "FAIL $b is not built"; echo "0 passed, 1 failed"; exit 1; }
done
M="$T/m"
"$S" gen-model "$M" --preset tiny --seed 1 >/dev/null 2>&1 && "$S" pack "$M" >/dev/null 2>&1 || { echo "FAIL gen-model"; exit 1; }
L=$(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1/p' "$M/config.json" | head -1)

# same: ids and every logits file of a plain run and an mpirun -np N run
same() { # name np args...
  local name=$1 np=$2; shift 2
  local a="$T/a" b="$T/b"
  rm -rf "$a" "$b"; mkdir -p "$a" "$b"
  "$S" run "$M" --threads 1 --print-ids --dump-logits "$a/lg" "$@" >"$a/out" 2>"$a/err" || { bad "$name: plain run" "$a/err"; return; }
  timeout 60 "${MPIRUN[@]}" -np "$np" "$SM" run "$M" --threads 1 --print-ids --dump-logits "$b/lg" "$@" >"$b/out" 2>"$b/err" ||
    { bad "$name: np=$np" "$b/err"; return; }
  if ! cmp -s "$a/out" "$b/out"; then bad "$name np=$np: ids differ: $(head -c 200 "$a/out") vs $(head -c 200 "$b/out")"; return; fi
  local n=0
  for f in "$a"/lg*; do
    n=$((n + 1))
    cmp -s "$f" "$b/$(basename "$f")" || { bad "$name np=$np: logits $(basename "$f") differ"; return; }
  done
  [ "$np" -lt 2 ] || grep -q "mpi: rank $((np - 1)) on" "$b/err" || { bad "$name np=$np: no stage line for rank $((np - 1))" "$b/err"; return; }
  ok "$name np=$np (ids and $n logits files bit-identical)"
}

for np in 1 2 3 4; do same "run" $np --ids 1,2,3,4,5,6,7 --gen 12; done
for np in 2 4; do same "run sampled" $np --ids 9,8,7 --gen 10 --temp 0.9 --top-k 40 --seed 7; done
same "run budget 0.3 GB per rank" 3 --ids 5,4,3,2,1 --gen 8 --ram-gb 0.3

# another architecture (Kimi Linear: plain residual, softplus KDA gate, plain MoE)
# and its router convention (--router hf travels to every stage)
K="$T/k"
"$S" gen-model "$K" --preset kimi-linear-tiny --seed 2 >/dev/null 2>&1 || { echo "FAIL gen-model kimi-linear-tiny"; exit 1; }
samek() { local M="$K"; same "$@"; }
samek "kimi linear" 2 --ids 1,2,3,4,5 --gen 8
for np in 2 3; do samek "kimi linear router hf" $np --ids 1,2,3,4,5 --gen 8 --router hf; done

# batched: 5 sequences, 3 at once, 4 rows per pass: passes mix sequences and
# prompts split over passes
printf '1,2,3,4,5,6,7,8,9\n11,12\n400,401,402,403,404,405\n7\n50,60,70,80\n' >"$T/batch"
for np in 2 3 4; do same "batch" $np --batch "$T/batch" --parallel 3 --chunk 4 --gen 6; done

# speculative decode: drafts that are the model's own continuation (all
# accepted), wrong drafts (rolled back), and sampled output
G=$("$S" run "$M" --threads 1 --print-ids --ids 3,1,4,1,5 --gen 16 2>/dev/null)
for np in 2 4; do
  same "spec accepted" $np --ids 3,1,4,1,5 --gen 16 --spec 4 --draft-ids "$G"
  same "spec rejected" $np --ids 3,1,4,1,5 --gen 16 --spec 3 --draft-ids 9,9,9,9,9,9,9,9,9,9,9,9,9,9,9,9
done
same "spec sampled" 3 --ids 3,1,4,1,5 --gen 16 --spec 3 --temp 0.7 --seed 3 --draft-ids "$G"
same "spec batch" 2 --batch "$T/batch" --parallel 3 --chunk 8 --gen 8 --spec 2

# strata serve on 3 ranks answers as the plain server does (same ids, same text)
serve_once() { # binary-and-args... ; prints the completion's text
  local log="$T/serve.log" port="" i
  "$@" serve "$M" --port 0 --threads 1 --parallel 2 >"$log" 2>&1 &
  local sp=$!
  for i in $(seq 1 100); do port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1); [ -n "$port" ] && break; sleep 0.1; done
  for i in $(seq 1 100); do curl -s "localhost:$port/health" 2>/dev/null | grep -q '"ok"' && break; sleep 0.1; done
  curl -s "localhost:$port/v1/completions" -d '{"prompt":[1,2,3,4],"max_tokens":8}' | sed 's/.*"text":"\([^"]*\)".*/\1/'
  kill -TERM $sp 2>/dev/null
  wait $sp 2>/dev/null
}
if command -v curl >/dev/null 2>&1; then
  a=$(serve_once "$S")
  b=$(serve_once "${MPIRUN[@]}" -np 3 "$SM")
  if [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "mpi: rank 2 on" "$T/serve.log"; then ok "serve np=3 answers as the plain server"
  else bad "serve np=3: '$a' vs '$b'" "$T/serve.log"; fi
else
  echo "skip serve np=3 (no curl)"
fi

# more ranks than layers
out="$T/many"
timeout 60 "${MPIRUN[@]}" -np $((L + 1)) "$SM" run "$M" --threads 1 --ids 1,2 --gen 2 >"$out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "at most one rank per layer" "$out"; then ok "np=$((L + 1)) > $L layers refused"; else bad "too many ranks (rc $rc)" "$out"; fi

# strata plan --ranks under mpirun measures the network round the ring
out="$T/plan"
timeout 60 "${MPIRUN[@]}" -np 2 "$SM" plan "$M" --ranks 3 --ram-gb 0.5 >"$out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -Eq "^network measured between 2 ranks: [0-9.]+ GB/s" "$out" && grep -q "predicted decode" "$out"; then
  ok "plan --ranks with the network measured ($(grep -o 'measured between.*' "$out"))"
else bad "plan with a measured network (rc $rc)" "$out"; fi

# a rank that runs another version is refused at start-up, before any model
out="$T/ver"
timeout 60 "${MPIRUN[@]}" -np 1 "$SM" run "$M" --threads 1 --ids 1,2 --gen 2 : -np 1 -x STRATA_MPI_FAKE_VERSION=0.0.1 "$SM" run "$M" >"$out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "rank 1 on .* runs strata 0.0.1.*every rank must run the same binary" "$out"; then ok "another version refused"
else bad "version mismatch (rc $rc)" "$out"; fi

# a rank that sees another model at the same path is refused at load
mkdir -p "$T/w0" "$T/w1"
ln -s "$M" "$T/w0/model"
"$S" gen-model "$T/w1/model" --preset tiny --seed 2 >/dev/null 2>&1
out="$T/mm"
timeout 60 "${MPIRUN[@]}" -np 1 -wdir "$T/w0" "$SM" run model --threads 1 --ids 1,2 --gen 2 : -np 1 -wdir "$T/w1" "$SM" run model >"$out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "opened a different model" "$out"; then ok "another model refused"; else bad "model mismatch (rc $rc)" "$out"; fi

# a killed rank: pid of rank R among mpirun's children
rank_pid() { # mpirun_pid rank
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
  done
}
killed() { # name extra-mpirun-args expect-regex
  local name=$1 extra=$2 want=$3 out="$T/kill" i pid mp
  STRATA_MPI_STEP_DELAY_MS=20 STRATA_MPI_TIMEOUT=2 "${MPIRUN[@]}" $extra -x STRATA_MPI_STEP_DELAY_MS -x STRATA_MPI_TIMEOUT \
    -np 3 "$SM" run "$M" --threads 1 --ids 1,2,3 --gen 2000 --ctx 2100 --print-ids >"$out" 2>&1 &
  mp=$!
  pid=""
  for i in $(seq 1 100); do pid=$(rank_pid $mp 1); [ -n "$pid" ] && grep -q "mpi: rank 2 on" "$out" && break; sleep 0.1; done
  if [ -z "$pid" ]; then kill $mp 2>/dev/null; wait $mp; bad "$name: rank 1 not found" "$out"; return; fi
  sleep 0.5
  local k0=$(date +%s.%N)
  kill -9 "$pid"
  for i in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
  local k1=$(date +%s.%N)
  if kill -0 $mp 2>/dev/null; then kill $mp; wait $mp; bad "$name: still running 30 s after the kill" "$out"; return; fi
  wait $mp
  local rc=$?
  local dt=$(awk -v a="$k0" -v b="$k1" 'BEGIN{printf "%.2f", b - a}')
  # with --enable-recovery mpirun itself exits 0 after rank 0's MPI_Abort: the
  # message is what counts there (and no ids line, which --print-ids prints at the end)
  if { [ $rc -ne 0 ] || [ -n "$extra" ]; } && grep -Eq "$want" "$out" && ! grep -Eq '^[0-9]+(,[0-9]+)+$' "$out" &&
     awk -v d="$dt" 'BEGIN{exit !(d < 10)}'; then
    local how="the rank named"
    grep -q "has not answered" "$out" || how="only the SIGTERM note"
    ok "$name: rank 0 stopped in $dt s, exit $rc, $how"
  else bad "$name (rc $rc, ${dt} s)" "$out"; fi
}
# mpirun stops the job by SIGCONT, SIGTERM 1 s later, SIGKILL right after: the
# SIGCONT's quick check names the rank (the SIGTERM note is the fallback)
killed "killed rank (mpirun stops the job)" "" \
  "strata run: mpi: rank 1 \(layers [0-9]+-[0-9]+\) has not answered for [0-9.]+ s.*the MPI runtime is stopping the job|strata: rank 0: stopped by the MPI runtime"
killed "killed rank (mpirun --enable-recovery: the heartbeat notices)" "--enable-recovery" \
  "strata run: mpi: rank 1 \(layers [0-9]+-[0-9]+\) has not answered for [0-9.]+ s"

echo "test-mpi: $(($(date +%s) - t0)) s"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
