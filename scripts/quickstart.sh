#!/usr/bin/env bash
# quickstart.sh: the one-command demo. Installs what it needs, builds, generates the
# `demo` model (1.87 GB, K3 format, random weights) unless a model directory is given,
# packs it for streaming, and generates text from it within a RAM budget smaller than
# the model, printing the run report.
#
#   bash scripts/quickstart.sh [MODEL_DIR] [extra `strata run` options...]
#
# Env: STRATA_RAM_GB (default 1: the demo model is 1.87 GB), STRATA_PROMPT.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
make -s strata
model="${1:-models/demo}"
[ $# -gt 0 ] && shift
if [ ! -f "$model/config.json" ]; then
  if [ "$model" != "models/demo" ]; then
    echo "quickstart: $model has no config.json" >&2; exit 1
  fi
  echo "quickstart: generating the demo model into $model (1.87 GB, once)" >&2
  ./strata gen-model "$model" --preset demo --seed 1
fi
if [ ! -f "$model/strata.pack/manifest.json" ]; then
  echo "quickstart: packing $model for streaming (once)" >&2
  ./strata pack "$model"
fi
ram="${STRATA_RAM_GB:-1}"
prompt="${STRATA_PROMPT:-The quick brown fox}"
echo "quickstart: strata run $model --prompt \"$prompt\" --gen 48 --ram-gb $ram" >&2
exec ./strata run "$model" --prompt "$prompt" --gen 48 --temp 0.8 --top-p 0.95 --seed 7 --ram-gb "$ram" "$@"
