#!/usr/bin/env python3
"""Totals over meson testlog.json files: prints failures, then one line 'N passed, N failed, N skipped'.

Each failure comes with the last lines of its output (Catch's failed assertions, a child's stderr):
CI keeps only the tail of what it printed, so what failed must be said at the end.

Exit status 1 when anything failed or nothing ran (meson's own status wraps at 256)."""
import json
import sys

TAIL = 25  # lines of each failure's output
passed = failed = skipped = 0
for path in sys.argv[1:] or ["build/meson-logs/testlog.json"]:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        print(f"FAILED: cannot read {path}: {e}")
        failed += 1
        continue
    for line in lines:
        if not line.strip():
            continue
        t = json.loads(line)
        r = t["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
            print(f"FAILED: {path}: {t['name']} [{r}]")
            out = ((t.get("stdout") or "") + (t.get("stderr") or "")).splitlines()
            kept = [l for l in out if l.strip() and not set(l.strip()) <= set("-.=~")]
            for l in kept[-TAIL:]:
                print(f"  | {l[:300]}")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
