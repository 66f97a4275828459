#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main demo: a 4-worker echo RPC cluster on this host.
# Idempotent: reuses the build folder (default build/, or $TP_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ccache_env.sh
bash scripts/deps.sh
build=${TP_BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build"
if [ -f examples/echo_cluster/echo_cluster.cpp ]; then
  ninja -C "$build" examples/echo_cluster
  exec "$build/examples/echo_cluster" --world-size 4
else
  ninja -C "$build" examples/smoke
  exec "$build/examples/smoke"
fi
