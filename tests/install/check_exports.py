#!/usr/bin/env python3
"""What the shared library exports (meson test `exports`).

Usage: check_exports.py LIBRARY SOURCE_ROOT

The library is built with hidden visibility: it must export its API (what include/ marks TP_API)
and Asio's compiled part, which its users link (ASIO_SEPARATE_COMPILATION), and nothing of
tensorplay::detail. Asio is exported only if every Asio header the sources include is read first
under default visibility: each one must be listed in src/core/asio_visibility.hpp.
"""
import pathlib
import re
import subprocess
import sys

lib, root = sys.argv[1], pathlib.Path(sys.argv[2])
failures = []

out = subprocess.run(["nm", "-D", "--defined-only", "-C", lib], check=True, capture_output=True, text=True).stdout
names = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]

leaked = sorted(n for n in names if "tensorplay::detail" in n)
if leaked:
    failures.append(f"{len(leaked)} tensorplay::detail symbol(s) exported, e.g.:\n  " + "\n  ".join(leaked[:10]))

# A sample of the API, one per layer, and the Asio functions every user's program calls.
for wanted in ["tensorplay::Error::Error(", "tensorplay::Runtime::Runtime(", "tensorplay::Tensor::",
               "tensorplay::TcpStore::", "tensorplay::Connection::", "tensorplay::init_backend(",
               "tensorplay::RpcAgent::", "typeinfo for tensorplay::Store",
               "asio::detail::scheduler::run(", "asio::detail::thread_context::top_of_thread_call_stack("]:
    if not any(n.startswith(wanted) for n in names):
        failures.append(f"nothing exported named {wanted}...")

# Every namespace of an exported symbol is the API's, Asio's, or a standard template instantiated
# with the API's types.
def outer(name: str) -> str:
    name = re.sub(r"^(typeinfo name for|typeinfo for|vtable for|VTT for|guard variable for|"
                  r"construction vtable for .* in|TLS init function for|TLS wrapper function for|"
                  r"non-virtual thunk to|virtual thunk to) ", "", name)
    name = re.sub(r"^[^(<]*? (?=[A-Za-z0-9_:]+(<|\(|$))", "", name)  # a return type (templates)
    return name.split("::", 1)[0] if "::" in name else ""

others = sorted({n for n in names if outer(n) not in ("tensorplay", "asio", "std", "__gnu_cxx", "tl", "")})
if others:
    failures.append(f"{len(others)} symbol(s) outside tensorplay, asio and std exported, e.g.:\n  " +
                    "\n  ".join(others[:10]))

listed = set(re.findall(r"#include <(asio[^>]*)>", (root / "src/core/asio_visibility.hpp").read_text()))
for tree in ("src", "include"):
    for f in sorted((root / tree).rglob("*.[ch]pp")):
        if f.name in ("asio_visibility.hpp", "asio_impl.cpp"):
            continue
        for h in re.findall(r"#include <(asio[^>]*)>", f.read_text()):
            if h not in listed:
                failures.append(f"{f.relative_to(root)} includes <{h}>, which src/core/asio_visibility.hpp does not list")

print(f"{len(names)} symbols exported, {sum(n.startswith('tensorplay::') for n in names)} of them tensorplay's")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
