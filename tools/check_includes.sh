#!/usr/bin/env bash
# check_includes.sh: holds every `#include "..."` in the tree to the layer order of
# docs/architecture.md, and finds include circles between modules.
#
#   base < format < text < engine < place < api (src/*.c|h) < serve, mpi
#   tools/gen may use base and format; app/, bench/ and src/serve/ use include/ only
#   (plus headers in their own folder); tests/ and fuzz/ may use anything.
#
# A module is a file's name without .c/.h (vfs.c and vfs.h are the module vfs); a
# circle is a cycle in the graph "module A includes a header of module B".
# Prints each violation and exits 1 on any; run by `make test` (Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."

{
  for f in $(find src app bench tools/gen tests fuzz include -name '*.[ch]' | sort); do
    grep -o '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' "$f" | sed 's/.*"\(.*\)"/\1/' |
      while read -r h; do echo "$f $h"; done || true
  done
} | awk '
function layer_of(path,    d) {
  if (path ~ /^include\//) return 0
  if (path ~ /^src\/base\//) return 1
  if (path ~ /^src\/format\//) return 2
  if (path ~ /^src\/text\//) return 3
  if (path ~ /^src\/engine\//) return 4
  if (path ~ /^src\/place\//) return 5
  if (path ~ /^tools\/gen\//) return 2.5
  if (path ~ /^src\/[^\/]*$/) return 6
  if (path ~ /^src\/(serve|mpi)\//) return 7
  return 9                                  # app, bench, tests, fuzz
}
function dir_of(p) { sub(/\/[^\/]*$/, "", p); return p }
function stem(p) { sub(/^.*\//, "", p); sub(/\.[ch]$/, "", p); return p }
BEGIN {
  n = split("include src/base src/format src/text src/engine src/place src tools/gen", dirs, " ")
  bad = 0
}
{ from = $1; inc = $2; lines[NR] = $0; files[from] = 1 }
END {
  # every header the tree has, by path
  cmd = "find include src tools/gen app bench tests fuzz -name \"*.h\""
  while ((cmd | getline h) > 0) have[h] = 1
  close(cmd)
  for (i = 1; i <= NR; i++) {
    split(lines[i], a, " "); from = a[1]; inc = a[2]
    # resolve: own folder first, then the include path in the Makefile order
    to = ""
    if ((dir_of(from) "/" inc) in have) to = dir_of(from) "/" inc
    else for (k = 1; k <= n; k++) if ((dirs[k] "/" inc) in have) { to = dirs[k] "/" inc; break }
    if (to == "") {                         # generated or system-style header
      if (inc ~ /^tests_list\.h$/ || inc ~ /^\.\.\//) continue
      printf "check_includes: %s includes \"%s\", found in no source folder\n", from, inc; bad = 1; continue
    }
    lf = layer_of(from); lt = layer_of(to)
    consumer = (from ~ /^(app|bench)\// || from ~ /^src\/serve\//)
    if (consumer && lt != 0 && dir_of(to) != dir_of(from)) {
      printf "check_includes: %s includes internal header %s (app/, bench/ and src/serve/ use include/ only)\n", from, to; bad = 1
    } else if (!consumer && lf < 9 && lt > lf) {
      printf "check_includes: %s includes %s, a layer above it\n", from, to; bad = 1
    } else if (lf == 2.5 && lt > 2.5 && lt != 0) {
      printf "check_includes: %s (tools/gen) includes %s above format\n", from, to; bad = 1
    }
    if (from ~ /^(tests|fuzz)\// || lt == 0) continue
    a1 = stem(from); b1 = stem(to)
    if (a1 != b1) { edge[a1, b1] = 1; adj[a1] = adj[a1] " " b1 }
  }
  # circles: depth-first search with colours over the module graph
  for (m in adj) if (!(m in colour)) dfs(m)
  exit bad
}
function dfs(m,    nb, k, c, x) {
  colour[m] = 1; stack[++sp] = m
  c = split(adj[m], nb, " ")
  for (k = 1; k <= c; k++) {
    x = nb[k]
    if ((x in colour) && colour[x] == 1) { report(x); bad = 1 }
    else if (!(x in colour)) dfs(x)
  }
  colour[m] = 2; sp--
}
function report(x,    k, s) {
  s = x
  for (k = sp; k >= 1 && stack[k] != x; k--) s = stack[k] " -> " s
  printf "check_includes: include circle: %s -> %s\n", x, s
}
'
