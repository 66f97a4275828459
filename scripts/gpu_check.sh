#!/usr/bin/env bash
# The GPU check, in one command, on a machine with an NVIDIA GPU, from a fresh clone:
#   1. what the host has: each GPU's name, driver, compute mode, MIG mode and memory, and what each
#      libcudart soname says (its runtime version, the driver's, and the device count it sees);
#   2. a build of only what the checks need (-Dcuda=enabled; the `cuda` suite's programs and two
#      benchmarks);
#   3. the `cuda` suite against the real runtime: a test that skips fails here (this host has a GPU);
#   4. `rpc_bench --device cuda --quick` and `cuda_bench`.
# Writes summary.txt and one log per step to $OUT when set, else to BUILD/gpu-check/ (eight files at
# most: what a device machine sends back). Exit 0 only when every step passed.
# Usage: scripts/gpu_check.sh [build-dir]   (default build-gpu)
#
# The machine needs meson, ninja, a C++20 compiler and the CUDA toolkit's headers. Asio, Catch2
# and tl-expected come from Debian's packages when they are installed, else from the wraps'
# fallbacks: on a machine without internet their sources must be in subprojects/packagecache
# beforehand (`meson subprojects download` where there is internet, then copy subprojects/).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}
out=${OUT:-$dir/gpu-check}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
status=0
start=$SECONDS
say() { echo "$*" | tee -a "$summary"; }
# step NAME COMMAND...: runs COMMAND with its output in NAME.log; one PASS or FAIL line in the summary.
step() {
  local name=$1 t0=$SECONDS
  shift
  if "$@" >"$out/$name.log" 2>&1; then
    say "PASS $name ($((SECONDS - t0)) s)"
  else
    say "FAIL $name ($((SECONDS - t0)) s): see $name.log"
    status=1
  fi
}

# ---- 1. the host ----
say "== GPUs (nvidia-smi)"
nvidia-smi --query-gpu=index,name,driver_version,compute_mode,mig.mode.current,memory.total,pci.bus_id --format=csv \
  2>&1 | tee -a "$summary" || { say "FAIL host: nvidia-smi did not answer"; status=1; }
say "== CUDA runtimes (in the order the library tries them)"
python3 - 2>&1 <<'PY' | tee -a "$summary"
import ctypes

def version(v):
    return f"{v // 1000}.{v % 1000 // 10}"

for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"):
    try:
        rt = ctypes.CDLL(name)
    except OSError as e:
        print(f"{name}: cannot load ({e})")
        continue
    runtime, driver, count = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    rt.cudaRuntimeGetVersion(ctypes.byref(runtime))
    rt.cudaDriverGetVersion(ctypes.byref(driver))
    err = rt.cudaGetDeviceCount(ctypes.byref(count))
    rt.cudaGetErrorName.restype = ctypes.c_char_p
    said = "cudaSuccess" if err == 0 else rt.cudaGetErrorName(err).decode()
    print(f"{name}: runtime {version(runtime.value)}, the driver supports {version(driver.value)}, "
          f"cudaGetDeviceCount: {said}, {count.value} device(s)")
PY

# ---- 2. the build: only what the checks need ----
opts=(-Dcuda=enabled -Dexamples=false -Dbench=true)
if ! printf '#include <asio.hpp>\n#include <tl/expected.hpp>\n#include <catch2/catch.hpp>\n' |
  ${CXX:-c++} -std=c++20 -fsyntax-only -x c++ - >/dev/null 2>&1; then
  opts+=(-Dwrap_mode=forcefallback)  # (no Debian packages here: the wraps, from subprojects/packagecache)
fi
if [ -f "$dir/build.ninja" ]; then
  step configure meson configure "$dir" "${opts[@]}"
else
  step configure meson setup "$dir" "${opts[@]}"
fi
plan=$out/cuda-tests.txt
if python3 scripts/suite_targets.py "$dir" cuda >"$plan" 2>"$out/plan.err"; then
  # shellcheck disable=SC2046
  step build ninja -C "$dir" $(cut -d' ' -f2- "$plan" | tr ' ' '\n' | sort -u) bench/rpc_bench bench/cuda_bench
else
  say "FAIL build: $(cat "$out/plan.err")"
  status=1
fi
rm -f "$plan" "$out/plan.err"

# ---- 3. the cuda suite; a skip is a failure on a GPU host ----
rm -f "$dir/meson-logs/testlog.json"
step cuda_suite meson test -C "$dir" --suite cuda --no-rebuild --print-errorlogs
if [ -f "$dir/meson-logs/testlog.json" ]; then
  cp "$dir/meson-logs/testlog.json" "$out/testlog.json"
  python3 - "$dir/meson-logs/testlog.json" <<'PY' | tee -a "$summary"
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    print(f"  {t['result']:8} {t['name']} ({t['duration']:.1f} s)")
PY
  if grep -q '"result": "SKIP"' "$dir/meson-logs/testlog.json"; then
    say "FAIL no_skips: a test of the cuda suite skipped on a host with a GPU (it found no usable device)"
    status=1
  fi
fi

# ---- 4. the benchmarks ----
step rpc_bench "$dir/bench/rpc_bench" --device cuda --quick
step cuda_bench "$dir/bench/cuda_bench"
for b in rpc_bench cuda_bench; do
  [ -s "$out/$b.log" ] && { say "== $b"; tail -n 60 "$out/$b.log" >>"$summary"; }
done

say "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s; logs in $out"
exit $status
