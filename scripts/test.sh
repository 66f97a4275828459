#!/usr/bin/env bash
# Builds the library, tests and examples (not the benchmarks: `ninja -C build benchmarks`), runs every
# test suite, prints "N passed, N failed".
# Idempotent: reuses the build folder (default build/, or $TP_BUILD_DIR). Extra arguments go to meson setup.
# Prints the wall time of each step ("test.sh: STEP took N s") and of the whole run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ccache_env.sh
start=$SECONDS
step=$SECONDS
took() { echo "test.sh: $1 took $((SECONDS - step)) s"; step=$SECONDS; }
bash scripts/deps.sh
took "packages"
build=${TP_BUILD_DIR:-build}
opts=("$@")
if [ "${CI:-}" = true ]; then opts+=(-Dwerror=true); fi
if [ -f "$build/build.ninja" ]; then
  [ ${#opts[@]} -gt 0 ] && meson configure "$build" "${opts[@]}"
else
  meson setup "$build" "${opts[@]}"
fi
took "configure"
ninja -C "$build"
took "build"
meson test -C "$build" --print-errorlogs || true   # the summary below decides; meson's status wraps at 256
took "tests"
echo "test.sh: total $((SECONDS - start)) s"
python3 scripts/meson_summary.py "$build/meson-logs/testlog.json"
