#!/usr/bin/env python3
"""The seams between the layers, as docs/map.md draws them, checked on the sources:

- src/rpc reaches the transport layer only through its interface to the library:
  transport/connection_ext.hpp (connection extensions), transport/transport.hpp (the registry,
  listeners) and transport/device_channels.hpp (the device channels); never a channel's or the
  connection's private header;
- the connection's code names no transport (no "shm" in src/transport/connection*.cpp): byte
  streams come through ByteStream, read modes through Transport::tcp(); the handshake names no
  channel (it asks channels/channel.hpp's setup functions);
- src/rpc has no CUDA IPC or staging code of its own (nothing that names cuda_ipc's or cuda_basic's
  internals);
- the public headers take no raw Asio sockets.
Usage: check_layers.py SOURCE_ROOT"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
failures = []

interface = {"transport/connection_ext.hpp", "transport/transport.hpp", "transport/device_channels.hpp"}
for f in sorted((root / "src/rpc").rglob("*.[ch]pp")):
    for n, line in enumerate(f.read_text().splitlines(), 1):
        m = re.match(r'\s*#\s*include\s+"(transport/[^"]+)"', line)
        if m and m.group(1) not in interface:
            failures.append(f"{f.relative_to(root)}:{n} includes \"{m.group(1)}\", not the transport's interface "
                            f"({', '.join(sorted(interface))})")
        if re.search(r"\b(Outbox|OutboxHold|PeerDevices|RingSend|RingLanding|RingNotice|PendingFrame|IpcRef|IpcParams|PoolExport|stage_in_chunks|land_in_chunks)\b", line):
            failures.append(f"{f.relative_to(root)}:{n} names a device channel's internals: {line.strip()}")

for f in sorted((root / "src/transport").glob("connection*.cpp")):
    for n, line in enumerate(f.read_text().splitlines(), 1):
        if "shm" in line:
            failures.append(f"{f.relative_to(root)}:{n} names the shm transport: {line.strip()}")
        code = line.split("//", 1)[0]  # (comments may name what the functions they call do)
        if f.name == "connection_handshake.cpp" and re.search(r"\bcma\b|_cma\b|\bcma_", code):
            failures.append(f"{f.relative_to(root)}:{n} names a channel in the handshake (ask channels/channel.hpp): {line.strip()}")

for f in sorted((root / "include/tensorplay").rglob("*.hpp")):
    for n, line in enumerate(f.read_text().splitlines(), 1):
        if re.search(r"#\s*include\s+<asio/(ip/tcp|generic/stream_protocol|local/stream_protocol)\.hpp>", line):
            failures.append(f"{f.relative_to(root)}:{n} makes raw Asio sockets part of the API: {line.strip()}")

for msg in failures:
    print(msg)
print(f"{len(failures)} layering violation(s)" if failures else "layers: ok")
sys.exit(1 if failures else 0)
