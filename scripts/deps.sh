#!/usr/bin/env bash
# Installs the Debian packages the build needs, when some are missing (as root); idempotent.
# TP_WITH_TORCH=1 also installs python3-torch, the peer of the store interop tests.
set -euo pipefail
pkgs=(meson ninja-build g++ pkg-config python3 libasio-dev libexpected-dev liburing-dev libssl-dev catch2 ccache lld)
if [ "${TP_WITH_TORCH:-0}" = 1 ]; then pkgs+=(python3-torch); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
