#!/bin/bash
# netns_fault_test.sh WORKER: two workers (tests/rpc/netns_worker.cpp) in two network namespaces
# joined by a veth pair. With tc netem loss 5% and delay 20 ms on both ends every call still
# succeeds, slower; with the caller's link down, pending calls end at their timeout (or with
# connection_lost once detected). Needs root, `ip netns`, veth and netem: exits 77 (skip) otherwise.
# The namespaces, the veth pair and the workers are removed on every exit path.
set -u
worker=$(realpath "${1:?usage: netns_fault_test.sh WORKER}")

skip() { echo "SKIP: $*"; exit 77; }
fail() {
    echo "FAIL: $*"
    for r in 0 1; do
        echo "--- worker$r stdout:"; cat "$dir/out$r" 2>/dev/null
        echo "--- worker$r stderr:"; tail -n 30 "$dir/err$r" 2>/dev/null
    done
    exit 1
}

[ "$(id -u)" = 0 ] || skip "not running as root"
command -v ip >/dev/null || skip "no ip command"
command -v tc >/dev/null || skip "no tc command"

ns0=tpf0-$$ ns1=tpf1-$$ v0=tpv0-$$ v1=tpv1-$$
a0=10.77.0.1 a1=10.77.0.2
dir=$(mktemp -d /tmp/tp-netns-XXXXXX)
pids=()
cleanup() {
    exec 7>&- 8>&- 2>/dev/null
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    ip netns del "$ns0" 2>/dev/null
    ip netns del "$ns1" 2>/dev/null
    ip link del "$v0" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$ns0" 2>/dev/null || skip "cannot create a network namespace"
ip netns add "$ns1" || fail "cannot create a second network namespace"
ip link add "$v0" type veth peer name "$v1" 2>/dev/null || skip "cannot create a veth pair"
ip link set "$v0" netns "$ns0" && ip link set "$v1" netns "$ns1" || fail "cannot move the veth ends"
ip -n "$ns0" addr add "$a0/24" dev "$v0" && ip -n "$ns1" addr add "$a1/24" dev "$v1" || fail "cannot set addresses"
for n in "$ns0:$v0" "$ns1:$v1"; do
    ip -n "${n%%:*}" link set lo up && ip -n "${n%%:*}" link set "${n##*:}" up || fail "cannot bring up ${n##*:}"
done
# Without netem (no sch_netem in the kernel) the link-down phase still runs; the test then ends as
# skipped (77) rather than passed.
netem=1
if ip netns exec "$ns0" tc qdisc add dev "$v0" root netem delay 1ms 2>/dev/null; then
    ip netns exec "$ns0" tc qdisc del dev "$v0" root
else
    netem=0
    echo "note: tc netem is unavailable (no sch_netem?): the loss and delay phase is skipped"
fi
if command -v ping >/dev/null; then
    ip netns exec "$ns0" ping -c 1 -W 2 "$a1" >/dev/null 2>&1 || fail "the namespaces cannot reach each other"
fi

mkfifo "$dir/in0" "$dir/in1"
start_worker() {  # rank namespace address
    ip netns exec "$2" env MASTER_ADDR=$a0 MASTER_PORT=29500 RANK=$1 WORLD_SIZE=2 TP_NETNS_LISTEN=$3 \
        "$worker" <"$dir/in$1" >"$dir/out$1" 2>"$dir/err$1" &
    pids+=($!)
}
start_worker 0 "$ns0" "$a0"
start_worker 1 "$ns1" "$a1"
exec 7>"$dir/in0" 8>"$dir/in1"

# wait_for FILE PATTERN COUNT SECONDS: until FILE has COUNT lines matching PATTERN.
wait_for() {
    local deadline=$((SECONDS + $4))
    local n
    while n=$(grep -c -- "$2" "$1" 2>/dev/null); [ "${n:-0}" -lt "$3" ]; do
        [ $SECONDS -lt $deadline ] || fail "no \"$2\" (#$3) from $1 within $4 s"
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a worker exited early (waiting for \"$2\")"; done
        sleep 0.05
    done
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
results=0
run() {  # command seconds -> sets $res to the result line
    echo "$1" >&7
    results=$((results + 1))
    wait_for "$dir/out0" '^result' $results "$2"
    res=$(grep '^result' "$dir/out0" | tail -n 1)
    echo "$1: $res"
}

wait_for "$dir/out0" '^ready' 1 30
wait_for "$dir/out1" '^ready' 1 30
# Same host, other network namespaces: the uds transport (abstract sockets live in one namespace)
# must not be chosen; the workers negotiate TCP.
grep -q '^transport worker1 uv$' "$dir/out0" || fail "worker0 did not negotiate uv with worker1 across namespaces"
grep -q '^transport worker0 uv$' "$dir/out1" || fail "worker1 did not negotiate uv with worker0 across namespaces"

run "calls 20 5 echo" 20
[ "$(field ok "$res")" = 20 ] || fail "baseline calls failed: $res"
base_ms=$(field mean_ms "$res")

lossy_ms=skipped
if [ $netem = 1 ]; then
    for n in "$ns0:$v0" "$ns1:$v1"; do
        ip netns exec "${n%%:*}" tc qdisc add dev "${n##*:}" root netem loss 5% delay 20ms || fail "tc netem failed"
    done
    run "calls 50 20 echo" 40
    [ "$(field ok "$res")" = 50 ] || fail "with 5% loss and 20 ms delay some calls failed: $res"
    lossy_ms=$(field mean_ms "$res")
    awk -v l="$lossy_ms" -v b="$base_ms" 'BEGIN { exit !(l >= 40 && l > b) }' ||
        fail "calls over the 20 ms delay each way took $lossy_ms ms on average (baseline $base_ms ms)"
fi

echo "pending 5 3 slow" >&7
wait_for "$dir/out0" '^started' 1 10
ip -n "$ns0" link set "$v0" down || fail "cannot set $v0 down"
results=$((results + 1))
wait_for "$dir/out0" '^result' $results 15
res=$(grep '^result' "$dir/out0" | tail -n 1)
echo "pending 5 3 slow, link down: $res"
[ "$(field ok "$res")" = 0 ] || fail "a call succeeded over a link that was down: $res"
codes=$(field codes "$res")
[ -z "$(tr ',' '\n' <<<"$codes" | grep -v -e '^timeout:' -e '^connection_lost:')" ] ||
    fail "pending calls ended with other errors than timeout / connection_lost: $codes"
awk -v m="$(field max_ms "$res")" 'BEGIN { exit !(m < 4000) }' ||
    fail "a 3 s call ended after $(field max_ms "$res") ms (link down)"
if grep -q '^timeout:' <<<"${codes//,/$'\n'}"; then
    awk -v f="$(field first_ms "$res")" 'BEGIN { exit !(f >= 2990) }' ||
        fail "calls timed out before their 3 s timeout: first after $(field first_ms "$res") ms"
fi

exec 7>&- 8>&-
for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
done
[ $netem = 1 ] || skip "tc netem is unavailable; baseline ${base_ms} ms per call; link down: $codes (passed)"
echo "PASS: baseline ${base_ms} ms per call, ${lossy_ms} ms with netem loss 5% delay 20 ms; link down: $codes"
