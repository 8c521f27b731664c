#!/usr/bin/env bash
# kl_check.sh: the C engine against the float64 Kimi Linear reference (klref.py) on
# one model directory. Prints one line:
#   PASS|FAIL MODEL router=R steps=N max_rel=X (tol T) ids=equal|differ A/B [detail]
#
# Usage: tests/reference/kl_check.sh MODEL_DIR STRATA [--router unbiased|hf] [--gen N]
#            [--ids LIST | --long] [--tol X] [--kv-norm-eps X] [--out DIR]
#            [-- ENGINE_RUN_ARGS...]
#   STRATA            the engine binary (e.g. ./strata)
#   --router          routing weights (default unbiased); hf passes --router hf to both
#   --gen N           greedy tokens (default 16)
#   --ids LIST        prompt ids (default 1,17,42,9,250,3,88,130 mod vocab);
#   --long            150 prompt ids instead (several 64-token prefill chunks)
#   --tol X           max |logit - ref| / max |ref| over all steps (default 1e-4)
#   --kv-norm-eps X   the reference's kv_a_layernorm eps: a number or config (default 1e-6)
#   --out DIR         keep the dumps there (default: a temp dir, removed)
#   -- ARGS           extra `strata run` arguments (e.g. --ram-gb 0.002 --threads 2)
# The engine runs `STRATA run MODEL --ids P --gen N --temp 0 --print-ids
# --dump-logits F [--router hf] ARGS`, the reference `klref.py` with the same ids.
# PASS needs max_rel <= tol AND equal greedy ids. If the ids differ, the logits are
# compared with the reference forced along the engine's ids (same contexts).
# Exit: 0 PASS, 1 FAIL, 2 usage, 77 SKIP (the engine does not accept Kimi Linear
# yet: its `run --help` has no --router).
set -u
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/usr/bin/python3}
. "$here/check_lib.sh"

usage() { echo "usage: $0 MODEL_DIR STRATA [--router unbiased|hf] [--gen N] [--ids LIST|--long] [--tol X] [--kv-norm-eps X] [--out DIR] [-- ENGINE_ARGS...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
M=$1; STRATA=$2; shift 2
router=unbiased; gen=16; ids=""; long=0; tol=1e-4; kveps=""; out=""
while [ $# -gt 0 ]; do
  case $1 in
    --router) [ $# -ge 2 ] || usage; router=$2; shift 2 ;;
    --gen) [ $# -ge 2 ] || usage; gen=$2; shift 2 ;;
    --ids) [ $# -ge 2 ] || usage; ids=$2; shift 2 ;;
    --long) long=1; shift ;;
    --tol) [ $# -ge 2 ] || usage; tol=$2; shift 2 ;;
    --kv-norm-eps) [ $# -ge 2 ] || usage; kveps=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "kl_check: unknown option '$1'" >&2; usage ;;
  esac
done
case $router in unbiased|hf) ;; *) echo "kl_check: --router must be unbiased or hf" >&2; exit 2 ;; esac
case $gen in ''|*[!0-9]*|0) echo "kl_check: --gen must be a positive integer" >&2; exit 2 ;; esac
[ -f "$M/config.json" ] || { echo "kl_check: $M/config.json not found" >&2; exit 2; }
[ -x "$STRATA" ] || { echo "kl_check: engine '$STRATA' not found or not executable" >&2; exit 2; }

if ! "$STRATA" run --help 2>&1 | grep -q -- '--router'; then
  echo "SKIP $M router=$router: the engine does not accept Kimi Linear yet (no --router in '$STRATA run --help')"
  exit 77
fi

eng_router=(); [ "$router" = hf ] && eng_router=(--router hf)
ref_extra=(--router "$router"); [ -n "$kveps" ] && ref_extra+=(--kv-norm-eps "$kveps")
chk_compare klref " router=$router" "${eng_router[@]}" "$@"
