#!/usr/bin/env bash
# Runs examples/elastic_pool: a front and a pool whose workers join and leave while the front sends
# requests: pool1 and pool2 start; pool3 joins; pool1 leaves gracefully; pool2 is SIGKILLed (a
# crash: the others remove it); pool4 joins; pool3 leaves; a new worker joins under rank 1 (so it is
# a new "pool1", under the name of the one that left).
# Exit 0 only if the front lost no request and every gracefully stopped worker left cleanly.
#   run_elastic_pool.sh path/to/elastic_pool
set -u
bin=${1:?usage: run_elastic_pool.sh path/to/elastic_pool}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
declare -A pids
log() { echo "[script] $*"; }
start() {  # start NAME RANK
    "$bin" worker --port "$port" --rank "$2" &
    pids[$1]=$!
    log "started $1 (rank $2)"
}
stop() {  # stop NAME: SIGTERM, the worker leaves; its exit status must be 0
    kill -TERM "${pids[$1]}"
    if wait "${pids[$1]}"; then log "$1 left"; else log "$1 FAILED to leave"; failed=1; fi
    unset "pids[$1]"
}
failed=0
trap 'kill -9 ${pids[@]:-} "${front:-}" 2>/dev/null' EXIT

"$bin" front --port "$port" --duration 7 --in-flight 16 &
front=$!
start pool1 1
start pool2 2
sleep 1.5; start pool3 3
sleep 1;   stop pool1
sleep 0.5; kill -9 "${pids[pool2]}"; wait "${pids[pool2]}" 2>/dev/null; unset "pids[pool2]"; log "killed pool2 (SIGKILL)"
sleep 0.5; start pool4 4
sleep 1;   stop pool3
sleep 0.5; start pool1-again 1
# The front stops sending after 7 s, then waits for the pool to leave before it goes.
sleep 3
for name in "${!pids[@]}"; do stop "$name"; done
wait "$front"
rc=$?
trap - EXIT
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ] && { log "ok"; exit 0; }
log "failed (front exit $rc, worker failures $failed)"
exit 1
