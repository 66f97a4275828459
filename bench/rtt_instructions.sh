#!/usr/bin/env bash
# Instructions per 64-byte RPC round trip, for each side (callee, caller), counted by callgrind:
# repeatable to a few instructions whatever else the machine is doing, unlike wall time here.
# Runs rpc_bench --quick --idle 0 twice (2,000 and 22,000 latency iterations) and divides the difference
# of each worker's total by the 22,000 extra calls of the second run (the latency loop's 20,000
# plus its 10% warm-up). Usage: bench/rtt_instructions.sh [BUILD_DIR]   (needs valgrind)
set -euo pipefail
build=$(realpath "${1:-build}")
ninja -C "$build" bench/rpc_bench >/dev/null  # (not built by default)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for n in 2000 22000; do
  mkdir -p "$out/$n"
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$out/$n/cg.%p" \
    "$build/bench/rpc_bench" --quick --blocks 0 --idle 0 --iters "$n" > "$out/$n.log" 2>&1 &
done
wait
python3 - "$out" <<'PY'
import glob, sys
out = sys.argv[1]
def total(path):
    for line in open(path):
        if line.startswith(('totals:', 'summary:')):
            return int(line.split()[1])
    raise SystemExit(f"no total in {path}")
def workers(n):  # spawn order: baseline callee, baseline caller, rpc callee, rpc caller (+ the parent)
    files = sorted(glob.glob(f"{out}/{n}/cg.*"), key=lambda f: int(f.rsplit('.', 1)[1]))
    return files[-2], files[-1]
small, large = workers(2000), workers(22000)
for i, side in enumerate(("callee", "caller")):
    print(f"{side}: {round((total(large[i]) - total(small[i])) / 22000)} instructions per round trip")
PY
