#!/usr/bin/env bash
# Runs one libFuzzer harness for TP_FUZZ_SECONDS (default 20) over its seed corpus; new inputs
# go to WORK_DIR (the seeds in the repository are only read), a finding is saved there too.
# Usage: run_fuzzer.sh HARNESS SEED_DIR WORK_DIR [extra libFuzzer flags...]
set -euo pipefail
exe=$1 seeds=$2 work=$3
shift 3
mkdir -p "$work"
# Leaks and UBSan reports are findings (the harnesses are built with -fno-sanitize-recover=all);
# one allocation over 256 MiB from a 4 KiB input is an amplification bug.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# -error_exitcode: libFuzzer's default (77) is meson's "skipped".
exec "$exe" -error_exitcode=1 -timeout_exitcode=1 -max_total_time="${TP_FUZZ_SECONDS:-20}" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work" "$seeds"
