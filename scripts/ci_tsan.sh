#!/usr/bin/env bash
# CI: ThreadSanitizer over the rpc and transport suites. Builds only the library and the executables
# those suites run (names from meson introspect), runs them with meson test, and fails on any test
# failure or TSan report (halt_on_error: the first report ends the test with exit code 66).
# Usage: scripts/ci_tsan.sh [build-dir]   (default build-tsan; $NINJA overrides the ninja command)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ccache_env.sh
dir=${1:-build-tsan}
ninja_cmd=${NINJA:-ninja}

if [ ! -f "$dir/build.ninja" ]; then
  # -Wno-tsan: GCC 12 warns that TSan does not instrument atomic_thread_fence (Asio's std_fenced_block);
  # the fences Asio uses are paired with atomics TSan does see.
  meson setup "$dir" -Db_sanitize=thread -Db_lundef=false -Dexamples=false -Dbench=false -Dcuda=disabled \
    -Dwerror=true -Doptimization=1 "-Dcpp_args=-Wno-tsan -g1"  # -O1 -g1: as the ASan build (.ci/run)
fi

# The tests of the two suites, each with the ninja targets it needs (its executable and what it
# depends on, e.g. lifecycle's worker): one line "name target..." per test.
plan=$dir/tsan-tests.txt
python3 scripts/suite_targets.py "$dir" rpc transport >"$plan" || exit 1
# -k 0: a target that fails to build fails the step (and is named) without hiding the TSan
# verdict on the tests that did build (meson test refuses to start when one executable is missing).
status=0
# shellcheck disable=SC2046
$ninja_cmd -C "$dir" -k 0 $(cut -d' ' -f2- "$plan" | tr ' ' '\n' | sort -u) || status=1
runnable=()
while read -r name files; do
  ok=true
  for f in $files; do [ -e "$dir/$f" ] || ok=false; done
  if $ok; then runnable+=("$name"); else echo "FAILED: $name was not built" >&2; status=1; fi
done <"$plan"

# second_deadlock_stack: lock-order reports name both acquisitions. Each test's exit status says
# whether TSan reported (66), so meson's testlog.json carries the verdict to the CI summary.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1}
if [ ${#runnable[@]} -eq 0 ]; then echo "ci_tsan: nothing was built to run" >&2; exit 1; fi
rm -f "$dir/meson-logs/testlog.json"
meson test -C "$dir" --no-rebuild --print-errorlogs --timeout-multiplier 4 "${runnable[@]}" || true
python3 scripts/meson_summary.py "$dir/meson-logs/testlog.json" || status=1
exit $status
