#!/bin/bash
# torchrun (PyTorch's launcher, from /usr/bin/python3) starts three workers in each rendezvous
# mode; every one must init, echo to the others and exit 0 within the deadline.
# usage: torchrun_test.sh LAUNCH_WORKER ; exits 77 (skip) when /usr/bin/python3 has no torch.
set -u
worker="$1"
py=/usr/bin/python3
if ! "$py" -c "import torch.distributed.run" 2>/dev/null; then
    echo "SKIP: PyTorch is not installed for $py (install python3-torch to run the torchrun tests)"
    exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# --redirects 1 --tee 1: on Python 3.11, torchrun 1.13 without them fails to start its workers
# (a launcher bug); they send each worker's stdout to a file and tee it to the launcher's.
run() {
    local mode=$1
    shift
    TP_TEST_INIT_TIMEOUT=60 TP_LOG_LEVEL=info timeout 120 "$py" -m torch.distributed.run --nproc_per_node=3 \
        --no_python --redirects 1 --tee 1 --log_dir "$dir/logs-$mode" "$@" "$worker" >"$dir/$mode.out" 2>&1
    local rc=$?
    local ok
    ok=$(grep -c "rank [0-2] of 3: ok" "$dir/$mode.out")
    if [ "$rc" != 0 ] || [ "$ok" != 3 ]; then
        echo "FAIL: torchrun $mode: exit $rc, $ok of 3 workers ok"
        cat "$dir/$mode.out"
        find "$dir/logs-$mode" -type f -exec sh -c 'echo "--- $1"; cat "$1"' _ {} \;
        exit 1
    fi
    echo "torchrun $mode: 3 workers ok"
}
# default: the static rendezvous; the launcher hosts a PyTorch 1.13 store on MASTER_PORT
# (TORCHELASTIC_USE_AGENT_STORE=True): the workers must detect its dialect.
run default --master_addr 127.0.0.1 --master_port "$(free_port)"
grep -q "speaks the PyTorch 1.13/2.0 dialect" "$dir/default.out" || { echo "FAIL: default mode: no dialect detection logged"; cat "$dir/default.out"; exit 1; }
# --standalone: a c10d rendezvous on a local port; rank 0 hosts the workers' store.
run standalone --standalone
grep -q "no launcher-hosted store" "$dir/standalone.out" || { echo "FAIL: standalone: rank 0 hosting not logged"; cat "$dir/standalone.out"; exit 1; }
# c10d rendezvous on an explicit endpoint.
run c10d --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$(free_port)"
echo "torchrun ok"
