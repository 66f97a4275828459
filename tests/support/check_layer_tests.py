#!/usr/bin/env python3
"""Checks that a layer's test executable runs every one of its test cases under some meson test.

Usage: check_layer_tests.py EXE NAME...   (NAME: each meson test of the layer, run as
EXE -# '[#NAME_test]~[.]'). Fails when a case that a plain run of EXE would run is selected by no
NAME (a TEST_CASE written in a header, say, is tagged with the header's name), when one is selected
by two, or when a NAME selects nothing (its file has no cases, or was left out of the build).
"""
import subprocess
import sys


def names(exe, *args):
    out = subprocess.run([exe, "--list-test-names-only", *args], check=False, capture_output=True, text=True)
    # Catch2 exits with the number of cases listed; the list is on stdout, one name per line.
    return [line for line in out.stdout.splitlines() if line.strip()]


def main():
    exe, tests = sys.argv[1], sys.argv[2:]
    every = names(exe)
    claimed = {}
    problems = []
    for t in tests:
        chosen = names(exe, "-#", f"[#{t}_test]~[.]")
        if not chosen:
            problems.append(f"meson test {t} selects no test case (expected some in {t}_test.cpp)")
        for case in chosen:
            if case in claimed:
                problems.append(f"test case '{case}' is run by both {claimed[case]} and {t}")
            claimed[case] = t
    for case in every:
        if case not in claimed:
            problems.append(f"test case '{case}' is run by no meson test (is it written outside a *_test.cpp?)")
    for p in problems:
        print(p)
    print(f"{len(every)} test cases, {len(claimed)} claimed by {len(tests)} meson tests")
    return 1 if problems or not every else 0


if __name__ == "__main__":
    sys.exit(main())
