#!/bin/bash
# Workers started as a launcher starts them (env vars, separate processes): init's failures are
# fast, named and logged. usage: launch_test.sh LAUNCH_WORKER TENSORPLAY_STORE
set -u
worker="$1"
cli="$2"
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.err; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# run_rank NAME RANK WORLD [VAR=VALUE...]: starts one worker in the background, output in $dir/NAME.{out,err}
run_rank() {
    local name=$1 rank=$2 world=$3
    shift 3
    env MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK="$rank" WORLD_SIZE="$world" TP_LOG_LEVEL=info \
        TP_TEST_INIT_TIMEOUT="${timeout:-20}" "$@" timeout 60 "$worker" >"$dir/$name.out" 2>"$dir/$name.err" &
    pids+=($!)
    eval "pid_$name=$!"
}
# finish NAME: waits for it; sets rc and elapsed seconds since $t0
finish() { local p; eval "p=\$pid_$1"; wait "$p"; rc=$?; elapsed=$(( $(date +%s) - t0 )); }

# 1. A worker that never comes: the others fail at the init timeout, log progress, name rank 2 alone.
port=$(free_port); timeout=4; t0=$(date +%s)
run_rank a0 0 3; run_rank a1 1 3
finish a0; [ "$rc" = 1 ] || fail "never-coming worker: rank 0 exited $rc"
finish a1; [ "$rc" = 1 ] || fail "never-coming worker: rank 1 exited $rc"
[ "$elapsed" -lt 15 ] || fail "never-coming worker: took $elapsed s with a 4 s init timeout"
for r in 0 1; do
    grep -q "init_rpc failed: timeout: .*timed out after .* waiting for workers: 2/3 joined; missing: rank 2" "$dir/a$r.err" ||
        fail "rank $r did not name rank 2 as missing"
    grep -q "waiting for workers: 2/3 joined; missing: rank 2 (" "$dir/a$r.err" || fail "rank $r logged no progress"
    ! grep -q "missing: ranks\? 0\|missing: rank 1\|missing: ranks 1" "$dir/a$r.err" || fail "rank $r named a live rank as missing"
done

# 2. A refused port: retried until the timeout, one context, the reason.
port=$(free_port); timeout=2; t0=$(date +%s)
run_rank b1 1 2
finish b1; [ "$rc" = 1 ] || fail "refused port: exited $rc"
[ "$elapsed" -lt 10 ] || fail "refused port: took $elapsed s with a 2 s init timeout"
grep -q "Connection refused" "$dir/b1.err" || fail "refused port: no reason"
[ "$(grep -o "connecting to the store at 127.0.0.1:$port" "$dir/b1.err" | wc -l)" = 1 ] || fail "refused port: context repeated"

# 3. A host name that does not resolve fails at once, naming it (even with a long timeout).
port=$(free_port); timeout=120; t0=$(date +%s)
run_rank c1 1 2 MASTER_ADDR=no-such-host.invalid
finish c1; [ "$rc" = 1 ] || fail "unresolvable host: exited $rc"
[ "$elapsed" -lt 10 ] || fail "unresolvable host: took $elapsed s"
grep -q 'invalid_argument: .*"no-such-host.invalid" does not resolve' "$dir/c1.err" || fail "unresolvable host: message"

# 4. Listeners that are not stores: one that sends a banner, one that closes every connection,
#    one that never answers. Each is named as such, without suggesting a dialect.
for kind in banner closer silent; do
    python3 - "$kind" >"$dir/listener.$kind" <<'PY' &
import socket, sys, time
kind = sys.argv[1]
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
held = []
end = time.time() + 30
while time.time() < end:
    c, _ = s.accept()
    if kind == "banner": c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"); held.append(c)
    elif kind == "closer": c.close()
    else: held.append(c)
PY
    pids+=($!)
    for _ in $(seq 100); do [ -s "$dir/listener.$kind" ] && break; sleep 0.1; done
    port=$(cat "$dir/listener.$kind"); timeout=3; t0=$(date +%s)
    run_rank "d$kind" 1 2
    finish "d$kind"; [ "$rc" = 1 ] || fail "$kind listener: exited $rc"
    [ "$elapsed" -lt 12 ] || fail "$kind listener: took $elapsed s"
    grep -q "not a tensorplay/c10d store" "$dir/d$kind.err" || fail "$kind listener: not named as not a store"
    ! grep -q "use the torch113" "$dir/d$kind.err" || fail "$kind listener: suggested a dialect"
done

# 5. World sizes that disagree, where rank 0 waits for a rank that disagrees: all fail at once.
port=$(free_port); timeout=20; t0=$(date +%s)
run_rank e0 0 2; run_rank e1 1 3; run_rank e2 2 3
for r in 0 1 2; do
    finish "e$r"; [ "$rc" = 1 ] || fail "disagreeing sizes: rank $r exited $rc"
    grep -q "invalid_argument: .*world sizes disagree: rank 0 was told 2; ranks\? .*told 3" "$dir/e$r.err" ||
        fail "disagreeing sizes: rank $r did not name the disagreement"
done
[ "$elapsed" -lt 15 ] || fail "disagreeing sizes: took $elapsed s"

# 6. The issue's case: ranks 0 and 1 told 2, rank 2 told 3, on a launcher's store (torchrun's
#    agent store), rank 2 there first. Every rank fails naming the disagreement.
"$cli" serve --host 127.0.0.1 --port 0 >"$dir/store.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$dir/store.out" && break; sleep 0.1; done
addr=$(sed -n 's/^listening on //p' "$dir/store.out"); port=${addr##*:}
agent=(TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0)
timeout=20; t0=$(date +%s)
run_rank f2 2 3 "${agent[@]}"
# (its world size, then its count in "joined": rank 0 finds extra ranks by that count)
"$cli" --addr "$addr" --timeout 10 wait /worker/attempt_0/tp/rdzv/ws/2 /worker/attempt_0/tp/rdzv/joined ||
    fail "rank 2 never published its world size"
run_rank f0 0 2 "${agent[@]}"; run_rank f1 1 2 "${agent[@]}"
for r in 0 1 2; do
    finish "f$r"; [ "$rc" = 1 ] || fail "issue's sizes: rank $r exited $rc"
    grep -q "world sizes disagree: ranks 0, 1 were told 2; rank 2 was told 3" "$dir/f$r.err" ||
        fail "issue's sizes: rank $r did not name the disagreement"
done
[ "$elapsed" -lt 15 ] || fail "issue's sizes: took $elapsed s"

# 7. And a consistent world of 3 over plain env vars succeeds.
port=$(free_port); timeout=20
run_rank g0 0 3; run_rank g1 1 3; run_rank g2 2 3
for r in 0 1 2; do finish "g$r"; [ "$rc" = 0 ] || fail "a world of 3: rank $r exited $rc"; done
# run_env NAME [VAR=VALUE...]: a worker with only the given launcher variables (none of torch's
# unless given), output in $dir/NAME.{out,err}
run_env() {
    local name=$1
    shift
    env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE -u LOCAL_RANK TP_LOG_LEVEL=info TP_TEST_INIT_TIMEOUT=20 "$@" \
        timeout 60 "$worker" >"$dir/$name.out" 2>"$dir/$name.err" &
    pids+=($!)
    eval "pid_$name=$!"
}

# 8. srun's environment, no wrapper: SLURM_PROCID and SLURM_NTASKS for the rank and the world, the
#    first host of SLURM_JOB_NODELIST for MASTER_ADDR, a port derived from SLURM_JOB_ID (15000 + its
#    last four digits) for MASTER_PORT.
slurm_port=$(python3 -c '
import socket
for p in range(15000, 25000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError: pass
    finally: s.close()')
job=$((4200000 + slurm_port - 15000))
for r in 0 1 2; do
    run_env "s$r" SLURM_PROCID=$r SLURM_NTASKS=3 SLURM_LOCALID=$r SLURM_JOB_ID=$job \
        SLURM_JOB_NODELIST="localhost,gpu-[02-03]" SLURM_NODELIST="localhost,gpu-[02-03]"
done
for r in 0 1 2; do
    finish "s$r"; [ "$rc" = 0 ] || fail "srun's environment: task $r exited $rc"
    grep -q "rank $r of 3: ok" "$dir/s$r.out" || fail "srun's environment: task $r did not report its rank"
done

# 9. Kubeflow's PyTorchJob: MASTER_ADDR (the master's service; "localhost" in the master's own pod),
#    MASTER_PORT, WORLD_SIZE and RANK per pod, nothing else.
port=$(free_port)
run_env k0 MASTER_ADDR=localhost MASTER_PORT=$port WORLD_SIZE=3 RANK=0 PYTHONUNBUFFERED=0
for r in 1 2; do run_env "k$r" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=3 RANK=$r PYTHONUNBUFFERED=0; done
for r in 0 1 2; do
    finish "k$r"; [ "$rc" = 0 ] || fail "PyTorchJob's environment: pod $r exited $rc"
    grep -q "rank $r of 3: ok" "$dir/k$r.out" || fail "PyTorchJob's environment: pod $r did not report its rank"
done
echo "launch ok"
