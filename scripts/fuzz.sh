#!/usr/bin/env bash
# Runs every fuzz harness (or those named) for SECONDS each, TP_FUZZ_JOBS (default 2) at a time,
# keeping what each finds in BUILD/tests/fuzz/corpus/<harness> between runs; prints each harness's
# executions and the total, and exits non-zero on any finding (the input is saved beside the corpus).
# Usage: scripts/fuzz.sh [SECONDS [HARNESS...]]   (default 600 s; build dir $TP_FUZZ_BUILD_DIR or build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
dir=${TP_FUZZ_BUILD_DIR:-build-fuzz}
bash scripts/ci_fuzz.sh --build-only "$dir"

harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for exe in "$dir"/tests/fuzz/*_fuzz; do harnesses+=("$(basename "$exe" _fuzz)"); done
fi
logs=$dir/fuzz-logs
mkdir -p "$logs"
run_one() {
  local h=$1
  TP_FUZZ_SECONDS=$seconds tests/fuzz/run_fuzzer.sh "$dir/tests/fuzz/${h}_fuzz" "tests/fuzz/corpus/$h" \
    "$dir/tests/fuzz/corpus/$h" >"$logs/$h.log" 2>&1
}
export -f run_one
export dir seconds logs
status=0
printf '%s\n' "${harnesses[@]}" | xargs -P "${TP_FUZZ_JOBS:-2}" -I{} bash -c 'run_one {}' || status=1

total=0
for h in "${harnesses[@]}"; do
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$h.log" | tail -1)
  verdict=ok
  grep -q -E '^(SUMMARY|==[0-9]+== ?ERROR)|fuzz invariant failed' "$logs/$h.log" && verdict="FINDING (see $logs/$h.log)"
  printf '%-14s %12s executions  %s\n' "$h" "${n:-?}" "$verdict"
  total=$((total + ${n:-0}))
done
echo "total: $total executions ($seconds s per harness)"
exit $status
