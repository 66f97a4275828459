#!/usr/bin/env python3
"""For each test of the given suites in a configured meson build folder, prints one line
"name target...": the ninja targets the test needs (its executable and what it depends on, such
as a worker program), so that a script builds only what it runs.

Usage: suite_targets.py BUILD SUITE...   (exit 1, saying so, when no test is in those suites)"""
import json
import os
import subprocess
import sys


def main() -> int:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    suites = set(sys.argv[2:])
    tests = json.loads(subprocess.check_output(["meson", "introspect", "--tests", build]))
    by_id = {t["id"]: t for t in json.loads(subprocess.check_output(["meson", "introspect", "--targets", build]))}
    found = False
    for t in tests:
        # suites read "project:suite"
        if not suites & {s.split(":")[-1] for s in t["suite"]}:
            continue
        files = {t["cmd"][0]}
        for dep in t.get("depends", []):
            if dep in by_id:
                files.update(by_id[dep]["filename"])
        # Only what the build makes is a ninja target (a test's command may be a script in the sources).
        built = sorted(os.path.relpath(f, build) for f in files if os.path.abspath(f).startswith(build + os.sep))
        print(t["name"], *built)
        found = True
    if not found:
        print(f"suite_targets: no test of the suites {sorted(suites)} in {build}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
