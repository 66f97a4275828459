#!/usr/bin/env bash
# Builds the library, tests, examples and benchmarks, runs every test suite, prints "N passed, N failed".
# Idempotent: reuses the build folder (default build/, or $TP_BUILD_DIR). Extra arguments go to meson setup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
build=${TP_BUILD_DIR:-build}
opts=("$@")
if [ "${CI:-}" = true ]; then opts+=(-Dwerror=true); fi
if [ -f "$build/build.ninja" ]; then
  [ ${#opts[@]} -gt 0 ] && meson configure "$build" "${opts[@]}"
else
  meson setup "$build" "${opts[@]}"
fi
ninja -C "$build"
meson test -C "$build" --print-errorlogs || true   # the summary below decides; meson's status wraps at 256
python3 scripts/meson_summary.py "$build/meson-logs/testlog.json"
