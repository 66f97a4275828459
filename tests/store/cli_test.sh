#!/bin/sh
# Runs tensorplay-store end to end: serve on an ephemeral port, every client command, clean SIGTERM stop.
set -eu
cli="$1"
out=$(mktemp)
trap 'rm -f "$out"; kill "$pid" 2>/dev/null || true' EXIT
"$cli" serve --host 127.0.0.1 --port 0 >"$out" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q "listening on" "$out" && break; sleep 0.1; done
addr=$(sed -n 's/^listening on //p' "$out")
[ -n "$addr" ] || { echo "server did not print its address"; cat "$out"; exit 1; }
c() { "$cli" --addr "$addr" --timeout 5 "$@"; }
fail() { echo "FAIL: $*"; exit 1; }
c set greeting hello
[ "$(c get greeting)" = hello ] || fail get
[ "$(c add n 5)" = 5 ] || fail add
[ "$(c --dialect torch113 add n -2)" = 3 ] || fail "add torch113"
[ "$(c --dialect torch113 get n)" = 3 ] || fail "get torch113"
[ "$(c --dialect torch2 get n)" = 3 ] || fail "get torch2"
[ "$(c --dialect auto get n)" = 3 ] || fail "get auto"
[ "$(TP_STORE_DIALECT=torch113 c get n)" = 3 ] || fail "get TP_STORE_DIALECT=torch113"
if TP_STORE_DIALECT=bogus c get n 2>/dev/null; then fail "a bad TP_STORE_DIALECT was accepted"; fi
[ "$(c check greeting n)" = true ] || fail check
# check: a missing key prints false and fails, as test(1) does
if c check greeting missing >"$out.check"; then fail "check of a missing key exited 0"; fi
[ "$(cat "$out.check")" = false ] || fail "check missing printed $(cat "$out.check")"
rm -f "$out.check"
c wait greeting n || fail wait
[ "$(c num-keys)" = 2 ] || fail num-keys
[ "$(c delete greeting)" = true ] || fail delete
[ "$(c delete greeting)" = false ] || fail "delete again"
if c --timeout 0.2 wait never 2>/dev/null; then fail "wait on a missing key succeeded"; fi
err=$(c --timeout 0.2 get never 2>&1 || true)
echo "$err" | grep -q "timeout" || fail "get error: $err"
if c bogus 2>/dev/null; then fail "unknown command accepted"; fi
kill -TERM "$pid"
wait "$pid" || fail "serve exited non-zero after SIGTERM"
# a refused connection: the address once, the reason once
err=$("$cli" --addr "$addr" --timeout 0.3 get greeting 2>&1 || true)
[ "$(echo "$err" | grep -o "connecting to the store at $addr" | wc -l)" = 1 ] || fail "context repeated: $err"
[ "$(echo "$err" | grep -o "Connection refused" | wc -l)" = 1 ] || fail "reason: $err"
echo "cli ok"
