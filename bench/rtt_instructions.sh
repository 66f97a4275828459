#!/usr/bin/env bash
# Instructions per 64-byte RPC round trip, for each side (callee, caller), counted by callgrind:
# repeatable to a few instructions whatever else the machine is doing, unlike wall time here.
# Runs rpc_bench --quick --idle 0 twice (2,000 and 22,000 latency iterations) and divides the difference
# of each worker's total by the 22,000 extra calls of the second run (the latency loop's 20,000
# plus its 10% warm-up). With --files, it lists instead the files of this project that a round
# trip runs code from, per side, each with its instructions and busiest functions (callgrind's
# self cost per function, the same difference); a file counts from `min` instructions per round
# trip (default 5: below that is background, a store poll).
# Usage: bench/rtt_instructions.sh [BUILD_DIR] [--files [min]]   (needs valgrind)
set -euo pipefail
build=$(realpath "${1:-build}")
files=${2:-}
min=${3:-5}
ninja -C "$build" bench/rpc_bench >/dev/null  # (not built by default)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for n in 2000 22000; do
  mkdir -p "$out/$n"
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$out/$n/cg.%p" \
    "$build/bench/rpc_bench" --quick --blocks 0 --idle 0 --iters "$n" > "$out/$n.log" 2>&1 &
done
wait
if [ "$files" = --files ]; then
python3 - "$out" "$min" <<'PY'
import collections, glob, re, subprocess, sys
out, minimum = sys.argv[1], float(sys.argv[2])
def workers(n):  # spawn order: baseline callee, baseline caller, rpc callee, rpc caller (+ the parent)
    files = sorted(glob.glob(f"{out}/{n}/cg.*"), key=lambda f: int(f.rsplit('.', 1)[1]))
    return files[-2], files[-1]
def costs(path):  # (file, function) -> self instructions, for this project's sources
    text = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", path],
                          capture_output=True, text=True, check=True).stdout
    d = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"^\s*([0-9,]+)\s+\(\s*[0-9.]+%\)\s+(\S[^:]*):(.*?)(\s+\[.*\])?$", line)
        if not m: continue
        f = re.sub(r"^.*?/(src|include/tensorplay)/", r"\1/", m.group(2))
        if not (f.startswith("src/") or f.startswith("include/tensorplay/")): continue
        fn = re.sub(r"\(.*", "", m.group(3)).split("::")[-1] or m.group(3)[:40]
        d[(f, fn)] += int(m.group(1).replace(",", ""))
    return d
small, large = workers(2000), workers(22000)
union = set()
for i, side in enumerate(("callee", "caller")):
    a, b = costs(small[i]), costs(large[i])
    per_file = collections.defaultdict(float)
    funcs = collections.defaultdict(list)
    for key in set(a) | set(b):
        per = (b[key] - a[key]) / 22000
        if per <= 0: continue
        per_file[key[0]] += per
        funcs[key[0]].append((per, key[1]))
    files = sorted((f for f in per_file if per_file[f] >= minimum), key=lambda f: -per_file[f])
    union |= set(files)
    print(f"{side}: {len(files)} files")
    for f in files:
        top = ", ".join(fn for _, fn in sorted(funcs[f], reverse=True)[:3])
        print(f"  {per_file[f]:7.1f}  {f}  ({top})")
print(f"both sides: {len(union)} files")
PY
  exit
fi
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
