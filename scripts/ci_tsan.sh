#!/usr/bin/env bash
# CI: ThreadSanitizer over the rpc and transport suites. Builds only the library and the executables
# those suites run (names from meson introspect), runs them with meson test, and fails on any test
# failure or TSan report (halt_on_error: the first report ends the test with exit code 66).
# Usage: scripts/ci_tsan.sh [build-dir]   (default build-tsan; $NINJA overrides the ninja command)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-tsan}
ninja_cmd=${NINJA:-ninja}

if [ ! -f "$dir/build.ninja" ]; then
  # -Wno-tsan: GCC 12 warns that TSan does not instrument atomic_thread_fence (Asio's std_fenced_block);
  # the fences Asio uses are paired with atomics TSan does see.
  meson setup "$dir" -Db_sanitize=thread -Db_lundef=false -Dexamples=false -Dbench=false -Dcuda=disabled \
    -Dwerror=true -Dcpp_args=-Wno-tsan
fi

# The executables of the two suites and what they depend on (lifecycle's worker), as ninja targets.
targets=$(python3 - "$dir" <<'PY'
import json, os, subprocess, sys
d = os.path.abspath(sys.argv[1])
tests = json.loads(subprocess.check_output(["meson", "introspect", "--tests", d]))
targets = json.loads(subprocess.check_output(["meson", "introspect", "--targets", d]))
by_id = {t["id"]: t for t in targets}
names = set()
for t in tests:
    # suites read "project:suite"
    if not {"rpc", "transport"} & {s.split(":")[-1] for s in t["suite"]}:
        continue
    names.add(t["cmd"][0])
    for dep in t.get("depends", []):
        if dep in by_id:
            names.update(by_id[dep]["filename"])
if not names:
    sys.exit("ci_tsan: no rpc or transport tests in " + d)
print(" ".join(sorted(os.path.relpath(n, d) for n in names)))
PY
)
# -k 0: a target that fails to build fails its own test (meson reports it) without hiding the
# TSan verdict on the others; the build's status still decides the exit status.
build_status=0
# shellcheck disable=SC2086
$ninja_cmd -C "$dir" -k 0 $targets || build_status=1

# second_deadlock_stack: lock-order reports name both acquisitions. Each test's exit status says
# whether TSan reported (66), so meson's testlog.json carries the verdict to the CI summary.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1}
rm -f "$dir/meson-logs/testlog.json"
meson test -C "$dir" --no-rebuild --print-errorlogs --suite rpc --suite transport --timeout-multiplier 4 || true
python3 scripts/meson_summary.py "$dir/meson-logs/testlog.json" || exit 1
exit $build_status
