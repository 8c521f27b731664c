#!/usr/bin/env bash
# ds_check.sh: the C engine against the float64 DeepSeek-V3 / Kimi K2 reference
# (dsref.py) on one model directory. Prints one line:
#   PASS|FAIL MODEL steps=N max_rel=X (tol T) ids=equal|differ A/B [detail]
#
# Usage: tests/reference/ds_check.sh MODEL_DIR STRATA [--gen N] [--ids LIST | --long]
#            [--tol X] [--out DIR] [--ref-args "ARGS"] [-- ENGINE_RUN_ARGS...]
#   STRATA            the engine binary (e.g. ./strata)
#   --gen N           greedy tokens (default 16)
#   --ids LIST        prompt ids (default 1,17,42,9,250,3,88,130 mod vocab);
#   --long            150 prompt ids instead
#   --tol X           max |logit - ref| / max |ref| over all steps (default 1e-4)
#   --out DIR         keep the dumps there (default: a temp dir, removed)
#   --ref-args "A"    extra dsref.py arguments (e.g. "--lora-norm-eps config")
#   -- ARGS           extra `strata run` arguments (e.g. --ram-gb 0.05 --threads 2)
# The engine runs `STRATA run MODEL --ids P --gen N --temp 0 --print-ids
# --dump-logits F ARGS`, the reference `dsref.py` with the same ids. PASS needs
# max_rel <= tol AND equal greedy ids. If the ids differ, the logits are compared
# with the reference forced along the engine's ids (same contexts).
# Exit: 0 PASS, 1 FAIL, 2 usage, 77 SKIP: the engine does not have the architecture
# yet (no DeepSeek/K2 preset in `STRATA gen-model --list-presets`), or the model
# stores FP8 / INT4 weights and the engine's `gen-model --help` names neither format
# (the weight formats land separately). Both probes read the binary's own listings,
# never the outcome of the run, so a capable engine never skips.
set -u
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/usr/bin/python3}
. "$here/check_lib.sh"

usage() { echo "usage: $0 MODEL_DIR STRATA [--gen N] [--ids LIST|--long] [--tol X] [--out DIR] [--ref-args A] [-- ENGINE_ARGS...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
M=$1; STRATA=$2; shift 2
gen=16; ids=""; long=0; tol=1e-4; out=""; refargs=""
while [ $# -gt 0 ]; do
  case $1 in
    --gen) [ $# -ge 2 ] || usage; gen=$2; shift 2 ;;
    --ids) [ $# -ge 2 ] || usage; ids=$2; shift 2 ;;
    --long) long=1; shift ;;
    --tol) [ $# -ge 2 ] || usage; tol=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --ref-args) [ $# -ge 2 ] || usage; refargs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "ds_check: unknown option '$1'" >&2; usage ;;
  esac
done
case $gen in ''|*[!0-9]*|0) echo "ds_check: --gen must be a positive integer" >&2; exit 2 ;; esac
[ -f "$M/config.json" ] || { echo "ds_check: $M/config.json not found" >&2; exit 2; }
[ -x "$STRATA" ] || { echo "ds_check: engine '$STRATA' not found or not executable" >&2; exit 2; }

# Capability probes (see the header).
if ! "$STRATA" gen-model --list-presets 2>&1 | grep -qiE 'deepseek|kimi-k2'; then
  echo "SKIP $M: the engine does not accept DeepSeek-V3 yet (no deepseek/kimi-k2 preset in '$STRATA gen-model --list-presets')"
  exit 77
fi
fmt=$("$PY" -c "
import json, sys
n = json.load(open(sys.argv[1] + '/model.safetensors.index.json'))['weight_map']
print(('fp8 ' if any(k.endswith('.weight_scale_inv') for k in n) else '') +
      ('int4' if any(k.endswith('.weight_packed') for k in n) else ''))" "$M" 2>/dev/null)
ghelp=$("$STRATA" gen-model --help 2>&1)
for f in $fmt; do
  if ! grep -qi "$f" <<<"$ghelp"; then
    echo "SKIP $M: the engine does not read ${f^^} weights yet ('$f' not in '$STRATA gen-model --help')"
    exit 77
  fi
done

# shellcheck disable=SC2206
ref_extra=($refargs)
chk_compare dsref "" "$@"
