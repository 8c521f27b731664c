#!/usr/bin/env bash
# real_models.sh: the "Real models" table of docs/performance.md, from the real
# configs in tests/data/configs and strata's own census and planner, so it can be
# regenerated whenever either changes:
#
#   bash tools/real_models.sh [./strata]  >  the table (markdown) on stdout
#
# Per model: `strata inspect --config --json` gives the bytes as the checkpoint
# stores them (quantization_config decides: FP8 e4m3 + 128x128 f32 scales, INT4
# pack-quantized + bf16 group scales, MXFP4, bf16); `strata plan --config --json`
# gives the minimum budget and, at a budget, the bytes read from disk per token
# (the streamed trunk, the top-k experts of every MoE layer less the expert
# cache's hit rate under uniform routing, one embedding row) and the bytes touched
# in memory. The prediction is the planner's: read / disk + touched / memory,
# here with the disk at 2 and 7 GB/s and memory at 25 GB/s (--disk-gbs, --mem-gbs).
set -euo pipefail
S=${1:-./strata}
D=tests/data/configs
MEM=25
rows=(
    "Kimi K2-Instruct (FP8)|$D/kimi-k2-instruct.config.json"
    "Kimi K2-Thinking (INT4 experts)|$D/kimi-k2-thinking-style.config.json"
    "DeepSeek-V3 / R1 (FP8)|$D/deepseek-r1.config.json"
    "Kimi Linear 48B (bf16)|$D/kimi-linear-48b-a3b-instruct.config.json"
    "Kimi K3 (MXFP4 experts)|$D/k3-config.json"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| model | checkpoint | trunk + head | cold bytes/token | minimum budget | s/token at the minimum, 2 / 7 GB/s | s/token at 16 GB, 2 / 7 GB/s |"
echo "|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
    name=${r%%|*} cfg=${r#*|}
    "$S" inspect --config "$cfg" --json >"$tmp/i.json"
    # the minimum budget first (a plan at a budget that fits), then plans 1% above it
    # (the minimum moves a little with the budget: index and scratch sizes) and at 16 GB
    "$S" plan --config "$cfg" --ram-gb 4000 --json --mem-gbs $MEM >"$tmp/p.json"
    min=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["min_bytes"])' "$tmp/p.json")
    at_min=$(python3 -c 'import sys; print("%.6f" % (int(sys.argv[1]) * 1.01e-9))' "$min")
    for bw in 2 7; do
        "$S" plan --config "$cfg" --ram-gb "$at_min" --json --disk-gbs $bw --mem-gbs $MEM >"$tmp/min$bw.json"
        if ! "$S" plan --config "$cfg" --ram-gb 16 --json --disk-gbs $bw --mem-gbs $MEM >"$tmp/g16_$bw.json" 2>/dev/null; then
            echo '{}' >"$tmp/g16_$bw.json"
        fi
    done
    python3 - "$name" "$tmp" <<'EOF'
import json, sys
name, t = sys.argv[1], sys.argv[2]
i = json.load(open(t + "/i.json"))
c, cfg = i["census"], i["config"]
P = lambda f: json.load(open(t + "/" + f))
m2, m7, g2, g7 = P("min2.json"), P("min7.json"), P("g16_2.json"), P("g16_7.json")
n_moe = cfg["n_layers"] - cfg["first_dense"]
head = c["embed_bytes_bf16"] / 2          # lm_head (the embedding is read by row)
ckpt = c["experts_bytes"] + c["trunk_bytes_bf16"] + c["embed_bytes_bf16"]
cold = c["trunk_bytes_bf16"] + head + cfg["topk"] * n_moe * c["expert_bytes"]
gb = lambda x: "%.1f GB" % (x / 1e9)
s = lambda p: "%.2f" % p["pred_s_per_token"] if p else "-"
print("| %s | %s | %s | %s (%d x %d x %.1f MB) | %s | %s / %s | %s / %s |" % (
    name, gb(ckpt), gb(c["trunk_bytes_bf16"] + head), gb(cold), cfg["topk"], n_moe, c["expert_bytes"] / 1e6,
    "%.2f GB" % (m2["min_bytes"] / 1e9), s(m2), s(m7), s(g2), s(g7)))
EOF
done
