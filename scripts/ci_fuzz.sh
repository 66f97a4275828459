#!/usr/bin/env bash
# CI: builds the libFuzzer harnesses of tests/fuzz with clang 14 under ASan+UBSan and runs each for
# a short fixed time (TP_FUZZ_SECONDS, default 15) over its seed corpus; any crash, leak, UBSan
# report, invariant failure or oversized allocation fails the harness's test. Results land in
# BUILD/meson-logs/testlog.json (one test per harness) for scripts/meson_summary.py.
# Usage: scripts/ci_fuzz.sh [--build-only] [build-dir]   (default build-fuzz; $NINJA overrides ninja)
#
# The build dir is the main project configured with clang and -Dfuzz=true; only the harness
# targets are built (each compiles the few library sources it needs), never the library itself.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ccache_env.sh
build_only=false
if [ "${1:-}" = --build-only ]; then build_only=true; shift; fi
dir=${1:-build-fuzz}
ninja_cmd=${NINJA:-ninja}
cxx=${TP_FUZZ_CXX:-clang++-14}

# clang and its runtimes (libFuzzer, the sanitizers): libclang-rt-14-dev is only a recommendation
# of clang-14, which scripts/deps.sh's --no-install-recommends would skip.
if ! command -v "$cxx" >/dev/null || ! dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "ok installed"; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null
  else
    echo "ci_fuzz: needs clang-14 and libclang-rt-14-dev (apt-get install clang-14 libclang-rt-14-dev)" >&2
    exit 1
  fi
fi
if [ ! -f "$dir/build.ninja" ]; then
  # buildtype debugoptimized (-O2 -g) as libFuzzer's docs advise; the fuzzer's own coverage
  # instrumentation is added per target in tests/fuzz/meson.build.
  CXX=$cxx meson setup "$dir" -Dfuzz=true -Dexamples=false -Dbench=false -Dcuda=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true -Dcpp_args=-fno-sanitize-recover=all
fi

targets=$(meson introspect --targets "$dir" | python3 -c '
import json, os, sys
d = os.path.abspath(sys.argv[1])
for t in json.load(sys.stdin):
    if t["name"].endswith("_fuzz") and t["type"] == "executable":
        print(os.path.relpath(t["filename"][0], d))' "$dir")
# shellcheck disable=SC2086
$ninja_cmd -C "$dir" $targets
$build_only && exit 0

export TP_FUZZ_SECONDS=${TP_FUZZ_SECONDS:-15}
rm -f "$dir/meson-logs/testlog.json"
meson test -C "$dir" --no-rebuild --print-errorlogs --suite fuzz --num-processes "${TP_FUZZ_JOBS:-2}" || true
python3 scripts/meson_summary.py "$dir/meson-logs/testlog.json"
