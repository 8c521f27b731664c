#!/usr/bin/env bash
# install-deps.sh: installs the Debian packages strata needs to build, test and
# benchmark (chromium: the headless browser test of strata serve's page). Idempotent:
# does nothing when everything is present.
set -euo pipefail
PKGS=(gcc make pkg-config clang libjansson-dev libpcre2-dev libxxhash-dev liburing-dev libmicrohttpd-dev
      python3 python3-numpy python3-regex gnuplot-nox chromium libopenmpi-dev openmpi-bin curl)
missing=()
# Node.js (npm oracles for the tokenizer tests) may come from another apt source.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
