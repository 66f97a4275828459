#!/bin/sh
# tensorplay-store against a PyTorch 1.13 TCPStore: the dialect is detected without --dialect.
# usage: cli_torch_test.sh TENSORPLAY_STORE INTEROP_DIR ; exits 77 (skip) when /usr/bin/python3 has no torch.
set -eu
cli="$1"
py=/usr/bin/python3
"$py" -c "import torch.distributed" 2>/dev/null || { echo "SKIP: no torch for $py"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"; kill "$pid" 2>/dev/null || true' EXIT
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
"$py" -u "$2/torch_server.py" >"$out" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^PORT" "$out" && break; sleep 0.1; done
port=$(sed -n 's/^PORT //p' "$out")
[ -n "$port" ] || fail "the PyTorch store did not start"
c() { "$cli" --addr "127.0.0.1:$port" --timeout 10 "$@"; }
[ "$(c get from_py)" = hi ] || fail "get from a PyTorch 1.13 store (detected dialect)"
err=$(c --dialect torch2 get from_py 2>&1 || true)
echo "$err" | grep -q "torch113" || fail "forced torch2 does not point to torch113: $err"
c set cpp_set v1
c add cpp_counter 10 >/dev/null
c --dialect torch113 set cpp_appended abcd
c set cpp_multi2 m2
c set cpp_done 1
wait "$pid" || fail "the PyTorch side's checks failed"
grep -q VERIFIED "$out" || fail "not verified"
echo "cli torch ok"
