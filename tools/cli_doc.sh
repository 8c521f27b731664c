#!/usr/bin/env bash
# cli_doc.sh [--check] [STRATA]: docs/cli.md holds each command's `--help` and the
# preset list verbatim, in the first ``` block after its heading ("## strata CMD",
# "## Presets"). Without --check the blocks are rewritten from the binary; with
# --check a difference is printed and the exit status is 1 (TEST(cli_doc_in_sync)),
# so the reference cannot drift from the code.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
S=${1:-./strata}
doc=docs/cli.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for c in run chat serve inspect gen-model pack plan tokenize; do
  "$S" "$c" --help > "$tmp/$c.txt" 2>&1 || true
done
"$S" gen-model --list-presets > "$tmp/Presets.txt" 2>&1 || true
awk -v dir="$tmp" '
  /^## / {
    key = ""
    if ($0 ~ /^## strata [a-z-]+$/) key = $3
    if ($0 == "## Presets") key = "Presets"
    print; next
  }
  key != "" && /^```/ && !inside {
    print; inside = 1
    f = dir "/" key ".txt"
    while ((getline line < f) > 0) print line
    close(f)
    next
  }
  inside && /^```/ { inside = 0; key = ""; print; next }
  inside { next }
  { print }
' "$doc" > "$tmp/cli.md"
if [ $check = 1 ]; then
  if ! diff -u "$doc" "$tmp/cli.md"; then
    echo "cli_doc: docs/cli.md differs from the binary's --help: run tools/cli_doc.sh" >&2
    exit 1
  fi
else
  cp "$tmp/cli.md" "$doc"
fi
