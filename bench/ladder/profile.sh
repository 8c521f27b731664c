#!/usr/bin/env bash
# bench/ladder/profile.sh: where a rung's decode spends its CPU time, by function.
#
# For each budget, runs place_run under `perf record` (a 999 Hz CPU clock sample,
# timestamps on CLOCK_MONOTONIC) and keeps only the samples between the instants
# place_run prints as its decode window, so the load, the preload and the prefill
# are left out. Prints, per rung, the decode s/token and the CPU milliseconds per
# decode token of each function (both compute threads, the I/O threads and the
# kernel's work on the process's behalf; "[k]" marks kernel functions), split into
# the thread that drives the pass and the others. With two budgets or more it then
# prints, function by function, each rung against the last one: what a budget
# costs over another, in CPU time (which the host's noise disturbs far less than
# wall time).
#
# usage: BUDGETS="6.2 16" GEN=64 bash bench/ladder/profile.sh   (make bench-profile)
#   BUDGETS  budgets in GB or "resident" (default "6.2 16")
#   GEN      tokens generated per run (default 64)
#   TOP      functions listed per rung (default 25)
#   PLACE_ARGS  extra place_run arguments for every rung (e.g. --no-prefetch)
# Needs perf (Debian package linux-perf) and perf_event_paranoid <= 2 for
# user-space sampling of one's own process.
set -euo pipefail
BUILD=${BUILD:-build}
M=${LADDER_MODEL:-$BUILD/models/ladder}
OUT=$BUILD/bench/profile
BUDGETS=${BUDGETS:-"6.2 16"}
GEN=${GEN:-64}
TOP=${TOP:-25}
PLACE_ARGS=${PLACE_ARGS:-}
case "$GEN" in '' | *[!0-9]* | 0 | 1) echo "GEN must be an integer >= 2, got '$GEN'"; exit 2 ;; esac
case "$TOP" in '' | *[!0-9]*) echo "TOP must be a non-negative integer, got '$TOP'"; exit 2 ;; esac
if ! command -v perf > /dev/null; then
  echo "profile.sh: perf not found (Debian: apt-get install linux-perf)"
  exit 2
fi
par=$(cat /proc/sys/kernel/perf_event_paranoid 2> /dev/null || echo 2)
if [ "$par" -gt 2 ]; then
  echo "profile.sh: kernel.perf_event_paranoid is $par; sampling needs <= 2 (sysctl kernel.perf_event_paranoid=2)"
  exit 2
fi
[ -f "$M/config.json" ] || ./strata gen-model "$M" --preset ladder
[ -f "$M/strata.pack/manifest.json" ] || ./strata pack "$M"
mkdir -p "$OUT"
for b in $BUDGETS; do
  if [ "$b" = resident ]; then arg="--resident"; else arg="--ram-gb $b"; fi
  data=$OUT/perf-$b.data
  log=$OUT/run-$b.log
  echo "== budget $b: place_run $arg $PLACE_ARGS --gen $GEN under perf" >&2
  perf record -q -k CLOCK_MONOTONIC -F 999 -o "$data" -- \
    "$BUILD/place_run" "$M" $arg $PLACE_ARGS --gen "$GEN" --prompt-len 16 > "$OUT/line-$b.csv" 2> "$log" ||
    { echo "rung $b failed:"; tail -5 "$log"; exit 1; }
  read -r w0 w1 < <(sed -n 's/^decode window: \([0-9.]*\) \([0-9.]*\) .*/\1 \2/p' "$log")
  [ -n "${w1:-}" ] || { echo "profile.sh: no decode window in $log (place_run too old?)"; exit 1; }
  spt=$(tail -1 "$OUT/line-$b.csv" | cut -d, -f4)
  # one line per sample: pid/tid time: ip symbol (dso); the driving thread is the
  # process's first (tid == pid)
  perf script -i "$data" -F pid,tid,time,ip,sym,dso 2> /dev/null |
    awk -v w0="$w0" -v w1="$w1" -v tok=$((GEN - 1)) '
      { t = $2; sub(":", "", t); if (t + 0 < w0 || t + 0 > w1) next
        split($1, id, "/")
        s = $4; sub(/\+0x[0-9a-f]+$/, "", s); d = $NF
        if (d ~ /kernel/) s = "[k]" s
        else if (d ~ /libxxhash/) s = "xxhash (libxxhash)"
        else if (s == "[unknown]" || s == "") s = "[unknown] " d
        who = (id[1] == id[2]) ? "drv" : "oth"
        n[s]++; w[s, who]++; tot++; tw[who]++ }
      END { for (s in n) printf "%s\t%.3f\t%.3f\t%.3f\n", s, n[s] / tok, w[s, "drv"] / tok, w[s, "oth"] / tok
            printf "TOTAL\t%.3f\t%.3f\t%.3f\n", tot / tok, tw["drv"] / tok, tw["oth"] / tok }' |
    sort -t$'\t' -k2,2gr > "$OUT/ms-$b.tsv"
  echo
  echo "budget $b: decode $spt s/token; CPU ms per decode token (sampled at 999 Hz, $((GEN - 1)) tokens)"
  printf "  %9s %9s %9s  %s\n" all driver others function
  awk -F'\t' -v top="$TOP" '$1 == "TOTAL" { t = $0; next } n++ < top { printf "  %9.2f %9.2f %9.2f  %s\n", $2, $3, $4, $1 }
    END { split(t, f, "\t"); printf "  %9.2f %9.2f %9.2f  (all functions)\n", f[2], f[3], f[4] }' "$OUT/ms-$b.tsv"
done
set -- $BUDGETS
if [ $# -ge 2 ]; then
  last=${!#}
  for b in "$@"; do
    [ "$b" = "$last" ] && continue
    echo
    echo "budget $b against $last: CPU ms per decode token, largest differences first"
    printf "  %9s %9s %9s  %s\n" "$b" "$last" diff function
    awk -F'\t' -v top="$TOP" 'FNR == NR { a[$1] = $2; next } { b[$1] = $2 }
      END { for (s in a) if (!(s in b)) b[s] = 0
            for (s in b) { if (!(s in a)) a[s] = 0; printf "%s\t%.3f\t%.3f\t%.3f\n", s, a[s], b[s], a[s] - b[s] } }' \
      "$OUT/ms-$b.tsv" "$OUT/ms-$last.tsv" |
      awk -F'\t' '{ d = $4 < 0 ? -$4 : $4; print d "\t" $0 }' | sort -t$'\t' -k1,1gr | cut -f2- |
      awk -F'\t' -v top="$TOP" '$1 == "TOTAL" { t = $0; next } n++ < top { printf "  %9.2f %9.2f %+9.2f  %s\n", $2, $3, $4, $1 }
        END { split(t, f, "\t"); printf "  %9.2f %9.2f %+9.2f  (all functions)\n", f[2], f[3], f[4] }'
  done
fi
