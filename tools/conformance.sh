#!/usr/bin/env bash
# conformance.sh: the C engine against the independent float64 Python reference.
#
# For each generated model (tiny presets + demo; made with ./strata gen-model into
# build/models/<preset> when absent) run
#   ./strata run MODEL --ids <prompt> --gen 32 --temp 0 --print-ids --dump-logits F
# and tests/reference/k3ref.py with the same arguments, then print per model the
# max relative logit error (max |logit - ref| / max |ref| over all steps) and how
# many ids match. If the greedy ids diverge, the reference is re-run forced along
# the engine's ids (--force-ids) so the logits compare on the same contexts; a
# divergence is tolerated only where the reference's own top-2 gap is within tol.
#
# Models named ref-* are written by the reference's own independent generator
# (tests/reference/make_tiny.py), so the engine's reader also meets a checkpoint
# it did not write: ref-tiny (nested config, 2 shards, MXFP4), ref-flat (flat
# config), ref-bf16experts (plain expert weights), ref-9l (9 layers, AttnRes block 2),
# ref-ties (exact ties in router top-k and in every greedy argmax: lowest index wins).
# NAME@long runs model NAME with a 150-token prompt (several prefill chunks).
#
# Kimi Linear (issue 40): models named kl-* are written in the published layout by
# tests/reference/make_kimi_linear.py (never by strata's generator) and checked with
# tests/reference/kl_check.sh against klref.py, once per router convention
# (unbiased, and hf = the released modeling_kimi.py's biased weights): kl-tiny
# (4 layers KKKM, 3 shards), kl-f32 (f32 bias/norm vectors), kl-variant (2 dense
# layers, conv 2, top-3 of 6, no shared expert, no renormalisation), kl-wide
# (8 layers, hidden 96, 16 experts top-4), kl-base0 (0-based layer lists with
# linear_attn_config.kda_layer_index_base 0, family-math 12.2), kl-tiny@long.
# They are skipped with a message while the engine does not accept Kimi Linear
# (its `run --help` has no --router).
#
# DeepSeek-V3 / Kimi K2 (issue 41): models named ds-* are written in the published
# layouts by tests/reference/make_deepseek.py and checked with
# tests/reference/ds_check.sh against dsref.py: ds-dsv3-fp8 (FP8 128x128 blocks with
# edge blocks, n_group 4 / topk_group 2, F32 norms, an MTP layer to skip),
# ds-dsv3-bf16norm, ds-k2-fp8 (K2-Instruct), ds-k2-int4 (K2-Thinking INT4 experts),
# ds-k25-int4 (kimi_k25 wrapper, language_model. prefix, vision tensors, I64
# weight_shape), ds-bf16, ds-k2-int4@long. Skipped with ds_check.sh's message while
# the engine lacks the architecture or the weight format.
#
# Usage: tools/conformance.sh [model ...]      (default: all models below)
# The 'f32_yard' column is a yardstick, not a verdict: the error of the reference
# itself with every matmul/norm output rounded to float32 (k3ref --sim-f32) along
# the same ids, i.e. how much this model amplifies float32 activation rounding. An
# engine error within a small factor of it is float32 noise. It costs a second
# reference run, so by default it is computed only for models under 200 MB
# (CONF_YARD=1 always, CONF_YARD=0 never).
#
# Env:   CONF_TOL (default 1e-4), CONF_GEN (32), CONF_OUT (build/conformance), CONF_YARD,
#        STRATA (./strata), PY (/usr/bin/python3)
# Exit:  0 all pass, 1 a failure or the engine is missing.
set -u
cd "$(dirname "$0")/.."

STRATA=${STRATA:-./strata}
PY=${PY:-/usr/bin/python3}
TOL=${CONF_TOL:-1e-4}
GEN=${CONF_GEN:-32}
YARD=${CONF_YARD:-auto}
OUT=${CONF_OUT:-build/conformance}
REF=tests/reference/k3ref.py
CMP=tests/reference/compare.py
PROMPT_BASE="1,17,42,9,250,3,88,130"
if [ $# -gt 0 ]; then
  PRESETS=""; KL_MODELS=""; DS_MODELS=""
  for a in "$@"; do case $a in kl-*) KL_MODELS="$KL_MODELS $a" ;; ds-*) DS_MODELS="$DS_MODELS $a" ;; *) PRESETS="$PRESETS $a" ;; esac; done
else
  PRESETS="tiny tiny-odd tiny-blocks tiny-shards tiny-mixed tiny-bf16experts demo"
  PRESETS="$PRESETS ref-tiny ref-flat ref-bf16experts ref-9l ref-ties tiny@long ref-tiny@long"
  KL_MODELS="kl-tiny kl-f32 kl-variant kl-wide kl-base0 kl-tiny@long"
  DS_MODELS="ds-dsv3-fp8 ds-dsv3-bf16norm ds-k2-fp8 ds-k2-int4 ds-k25-int4 ds-bf16 ds-k2-int4@long"
fi

die() { echo "conformance: $*" >&2; exit 1; }

[ -x "$STRATA" ] || die "$STRATA not found (run 'make strata' first)"
"$PY" -c 'import numpy' 2>/dev/null || die "$PY has no numpy (apt-get install python3-numpy)"
# The engine's run command must exist and not be a placeholder.
if "$STRATA" run --help 2>&1 | grep -qi "not implemented"; then
  die "'strata run' is not implemented yet; nothing to compare"
fi

mkdir -p "$OUT" build/models
fail=0
printf '%-18s %7s %12s %10s %10s %9s %9s  %s\n' model steps max_rel_err f32_yard ids_match eng_s ref_s verdict
for p in $PRESETS; do
  name=${p%@long}
  long=0; [ "$name" != "$p" ] && long=1
  M=build/models/$name
  if [ ! -f "$M/config.json" ]; then
    case $p in
      ref-tiny)        gen=("$PY" tests/reference/make_tiny.py "$M" --seed 101) ;;
      ref-flat)        gen=("$PY" tests/reference/make_tiny.py "$M" --seed 102 --flat-config) ;;
      ref-bf16experts) gen=("$PY" tests/reference/make_tiny.py "$M" --seed 103 --plain-experts) ;;
      ref-9l)          gen=("$PY" tests/reference/make_tiny.py "$M" --seed 104 --layers 9 --block 2) ;;
      ref-ties)        gen=("$PY" tests/reference/make_tiny.py "$M" --seed 105 --ties) ;;
      *)               gen=("$STRATA" gen-model "$M" --preset "$name") ;;
    esac
    if ! "${gen[@]}" >"$OUT/$p.gen.log" 2>&1; then
      printf '%-18s %s\n' "$p" "FAIL: gen-model failed (see $OUT/$p.gen.log)"; fail=1; continue
    fi
  fi
  # Prompt ids reduced modulo the model's vocab; @long: 150 ids from a fixed LCG.
  prompt=$("$PY" -c "
import sys; sys.path.insert(0, 'tests/reference'); import k3ref
v = k3ref.load_config('$M').vocab
ids = [int(x) for x in '$PROMPT_BASE'.split(',')]
x = 12345
while $long and len(ids) < 150:
    x = (x * 1103515245 + 12345) % 2**31
    ids.append(x >> 8)
print(','.join(str(i % v) for i in ids))" 2>"$OUT/$p.cfg.log") \
    || { printf '%-18s %s\n' "$p" "FAIL: reference cannot read config (see $OUT/$p.cfg.log)"; fail=1; continue; }
  vocab=$("$PY" -c "import sys; sys.path.insert(0, 'tests/reference'); import k3ref; print(k3ref.load_config('$M').vocab)")

  t0=$(date +%s.%N)
  if ! "$STRATA" run "$M" --ids "$prompt" --gen "$GEN" --temp 0 --print-ids \
       --dump-logits "$OUT/$p.engine.bin" >"$OUT/$p.engine.ids" 2>"$OUT/$p.engine.log"; then
    printf '%-18s %s\n' "$p" "FAIL: strata run failed (see $OUT/$p.engine.log)"; fail=1; continue
  fi
  t1=$(date +%s.%N)
  if ! "$PY" "$REF" "$M" --ids "$prompt" --gen "$GEN" --temp 0 --print-ids \
       --dump-logits "$OUT/$p.ref.bin" >"$OUT/$p.ref.ids" 2>"$OUT/$p.ref.log"; then
    printf '%-18s %s\n' "$p" "FAIL: reference failed (see $OUT/$p.ref.log)"; fail=1; continue
  fi
  t2=$(date +%s.%N)
  eng_ids=$(tail -n 1 "$OUT/$p.engine.ids" | tr -d ' \r')
  ref_ids=$(tail -n 1 "$OUT/$p.ref.ids" | tr -d ' \r')
  cmp_ref="$OUT/$p.ref.bin"
  if [ "$eng_ids" != "$ref_ids" ] && [ -n "$eng_ids" ]; then
    # Same contexts for the logits: the reference forced along the engine's ids.
    "$PY" "$REF" "$M" --ids "$prompt" --gen "$GEN" --force-ids "$eng_ids" --quiet \
      --dump-logits "$OUT/$p.ref-forced.bin" >/dev/null 2>>"$OUT/$p.ref.log" \
      && cmp_ref="$OUT/$p.ref-forced.bin"
  fi
  yard=n/a
  want_yard=$YARD
  if [ "$want_yard" = auto ]; then
    kb=$(du -sk "$M" | cut -f1)
    if [ "$kb" -lt 204800 ]; then want_yard=1; else want_yard=0; fi
  fi
  if [ "$want_yard" = 1 ] && [ -n "$eng_ids" ] && "$PY" "$REF" "$M" --ids "$prompt" --gen "$GEN" --force-ids "$eng_ids" \
       --sim-f32 --quiet --dump-logits "$OUT/$p.ref-f32sim.bin" >/dev/null 2>>"$OUT/$p.ref.log"; then
    yard=$("$PY" "$CMP" --vocab "$vocab" "$OUT/$p.ref-f32sim.bin" "$cmp_ref" --json 2>/dev/null \
           | "$PY" -c 'import json,sys; print("%.3e" % json.load(sys.stdin)["logits"]["max_rel"])' 2>/dev/null) \
      || yard=n/a
  fi
  json=$("$PY" "$CMP" --vocab "$vocab" "$OUT/$p.engine.bin" "$cmp_ref" \
         --ids-a "$eng_ids" --ids-b "$ref_ids" --tol "$TOL" --allow-tie-flip --json 2>&1)
  rc=$?
  line=$("$PY" -c "
import json, sys
try:
    r = json.loads(sys.argv[1])
except ValueError:
    print('? ? ? ' + sys.argv[1].replace('\n', ' ')); sys.exit()
lg, ids = r['logits'], r['ids']
note = ''
if lg['steps_a'] != lg['steps_ref']: note += ' steps %d vs %d;' % (lg['steps_a'], lg['steps_ref'])
if not lg['finite']: note += ' non-finite logits;'
if 'first_divergence' in ids:
    note += ' ids diverge at step %d (ref gap %.2e%s)' % (ids['first_divergence'], ids['ref_rel_gap'],
                                                      ', tie flip' if ids.get('tie_flip') else '')
print('%d %.3e %d/%d%s' % (lg['steps'], lg['max_rel'], ids['equal'], max(ids['len_a'], ids['len_b']), note))
" "$json")
  steps=${line%% *}; rest=${line#* }; err=${rest%% *}; rest=${rest#* }; match=${rest%% *}
  note=${rest#"$match"}
  verdict=PASS; [ $rc -eq 0 ] || { verdict=FAIL; fail=1; }
  printf '%-18s %7s %12s %10s %10s %9.2f %9.2f  %s%s\n' "$p" "$steps" "$err" "$yard" "$match" \
    "$(awk "BEGIN{print $t1 - $t0}")" "$(awk "BEGIN{print $t2 - $t1}")" "$verdict" "$note"
done

# ref_model P WRITER GEN_FN: for P (NAME or NAME@long) sets name, M and longarg, and
# writes the checkpoint with tests/reference/WRITER and GEN_FN's arguments when it is
# not there yet; 1 after a FAIL line when that fails.
ref_model() {
  local p=$1 writer=$2 genfn=$3 args
  name=${p%@long}
  longarg=(); [ "$name" != "$p" ] && longarg=(--long)
  M=build/models/$name
  [ -f "$M/config.json" ] && return 0
  # shellcheck disable=SC2086
  if ! args=$("$genfn" "$name") || ! "$PY" "tests/reference/$writer" "$M" $args \
       >"$OUT/$name.gen.log" 2>&1; then
    printf '%-18s %s\n' "$p" "FAIL: $writer failed or unknown model (see $OUT/$name.gen.log)"
    fail=1; return 1
  fi
}
# run_timed LABEL CMD...: one row, LABEL, CMD's seconds and its output line; a status
# other than 0 or 77 (SKIP) fails the run.
run_timed() {
  local label=$1 t0 line rc; shift
  t0=$(date +%s.%N)
  line=$("$@" 2>&1)
  rc=$?
  printf '%s %6.2fs  %s\n' "$label" "$(awk "BEGIN{print $(date +%s.%N) - $t0}")" "$line"
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || fail=1
}
# Kimi Linear: published-layout checkpoints from make_kimi_linear.py, both routers.
kl_gen() {
  case $1 in
    kl-tiny)    echo "--seed 201" ;;
    kl-f32)     echo "--seed 202 --layers 5 --vec-dtype f32 --shards 4" ;;
    kl-variant) echo "--seed 203 --layers 6 --schedule KMKKMM --dense-layers 2 --conv 2 --topk 3 --experts 6 --shared 0 --no-renorm --shards 2" ;;
    kl-base0)   echo "--seed 205 --layers 5 --schedule KKMKM --index-base 0" ;;
    kl-wide)    echo "--seed 204 --layers 8 --hidden 96 --heads 6 --kda-head-dim 32 --experts 16 --topk 4 --vocab 1024 --shards 5" ;;
    *)          return 1 ;;
  esac
}
if [ -n "${KL_MODELS// /}" ]; then
  if ! "$STRATA" run --help 2>&1 | grep -q -- '--router'; then
    echo "kl-*: SKIP ($KL_MODELS ): the engine does not accept Kimi Linear yet (no --router in '$STRATA run --help')"
  else
    for p in $KL_MODELS; do
      ref_model "$p" make_kimi_linear.py kl_gen || continue
      for router in unbiased hf; do
        run_timed "$(printf '%-18s %-7s' "$p" "$router")" bash tests/reference/kl_check.sh "$M" "$STRATA" \
          --router "$router" --gen "$GEN" --tol "$TOL" "${longarg[@]}" --out "$OUT/$p-$router"
      done
    done
  fi
fi
# DeepSeek-V3 / Kimi K2: published-layout checkpoints from make_deepseek.py.
ds_gen() {
  case $1 in
    ds-dsv3-fp8)      echo "--layout dsv3-fp8 --seed 401" ;;
    ds-dsv3-bf16norm) echo "--layout dsv3-fp8 --seed 402 --norm-dtype bf16 --layers 6 --shards 4" ;;
    ds-k2-fp8)        echo "--layout k2-fp8 --seed 403" ;;
    ds-k2-int4)       echo "--layout k2-int4 --seed 404 --experts 24 --topk 6" ;;
    ds-k25-int4)      echo "--layout k25-int4 --seed 405 --shape-i64" ;;
    ds-bf16)          echo "--layout bf16 --seed 406 --shards 1" ;;
    *)                return 1 ;;
  esac
}
for p in $DS_MODELS; do
  ref_model "$p" make_deepseek.py ds_gen || continue
  run_timed "$(printf '%-18s' "$p")" bash tests/reference/ds_check.sh "$M" "$STRATA" \
    --gen "$GEN" --tol "$TOL" "${longarg[@]}" --out "$OUT/$p"
done
echo "tolerance: max relative logit error <= $TOL; outputs in $OUT/"
exit $fail
