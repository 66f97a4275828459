#!/usr/bin/env python3
"""Checks that a layer's test executable runs every one of its test cases under some meson test.

Usage: check_layer_tests.py EXE NAME...   (NAME: each meson test of the layer, run as
EXE -# '[#NAME_test]~[.]'). Fails when a case that a plain run of EXE would run is selected by no
NAME (a TEST_CASE written in a header, say, is tagged with the header's name), or when a NAME
selects nothing (its file has no cases, or was left out of the build). No case is selected by two
NAMEs: Catch2's -# gives each case exactly one "#<file>" tag.

Two runs of EXE (under a sanitizer each start costs a second or more): the names of the cases a
plain run runs, and the count of those cases per tag.
"""
import re
import subprocess
import sys


def listing(exe, *args):
    out = subprocess.run([exe, *args], check=False, capture_output=True, text=True)
    # Catch2 exits with the number of cases (or tags) listed; the list is on stdout.
    return out.stdout.splitlines()


def main():
    exe, tests = sys.argv[1], sys.argv[2:]
    plain = "~[.]"  # what a plain run selects: every case but the hidden ones
    every = [line for line in listing(exe, "--list-test-names-only", plain) if line.strip()]
    # "Tags for matching test cases:" then lines "   N  [tag]"; only the -# file tags matter here.
    per_file = {}
    for line in listing(exe, "--list-tags", "-#", plain):
        m = re.match(r"\s*(\d+)\s+\[#(.+)\]\s*$", line)
        if m:
            per_file[m.group(2)] = int(m.group(1))
    problems = []
    claimed = 0
    for t in tests:
        n = per_file.pop(f"{t}_test", 0)
        if n == 0:
            problems.append(f"meson test {t} selects no test case (expected some in {t}_test.cpp)")
        claimed += n
    for f, n in sorted(per_file.items()):
        problems.append(f"{n} test case(s) of {f} are run by no meson test (is it a *_test.cpp in unit_tests?)")
    if claimed + sum(per_file.values()) != len(every):
        problems.append(f"{len(every)} test cases listed but {claimed + sum(per_file.values())} tagged by file")
    for p in problems:
        print(p)
    print(f"{len(every)} test cases, {claimed} claimed by {len(tests)} meson tests")
    return 1 if problems or not every else 0


if __name__ == "__main__":
    sys.exit(main())
