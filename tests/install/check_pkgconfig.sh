#!/usr/bin/env bash
# Installs the build into a scratch prefix, then runs what a user outside meson would, without
# LD_LIBRARY_PATH: the installed tensorplay-store (a serve / set / get round trip), and
# tests/install/consumer.cpp built with nothing but `pkg-config --cflags --libs tensorplay-rpc`, by
# c++ and, when it is installed, by clang++ (the .pc must carry the defines clang needs, and the
# library the Asio symbols clang names differently; see src/core/asio_clang_abi.cpp).
set -euo pipefail
build=$1 src=$2
. "$src/tests/install/stage.sh"
stage "$build"
echo "pkg-config: $cflags $libs"

# --- the installed tool finds the installed library by itself ---
cli="$root/bin/tensorplay-store"
[ -x "$cli" ] || cli=$(find "$root" -name tensorplay-store -type f | head -n 1)
"$cli" --help >/dev/null 2>&1 || fail "installed tensorplay-store does not start: $("$cli" --help 2>&1 | head -n 1)"
log="$tmp/serve.log"
"$cli" serve --host 127.0.0.1 --port 0 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
addr=$(sed -n 's/^listening on //p' "$log")
[ -n "$addr" ] || { cat "$log"; fail "installed tensorplay-store serve printed no address"; }
"$cli" --addr "$addr" --timeout 5 set installed yes
[ "$("$cli" --addr "$addr" --timeout 5 get installed)" = yes ] || fail "installed tensorplay-store get"
kill -TERM "$pid"
wait "$pid" || fail "installed tensorplay-store serve exited non-zero after SIGTERM"
echo "installed tensorplay-store: ok"

# --- programs built with pkg-config alone ---
build_and_run() {  # COMPILER NAME
    "$1" "$src/tests/install/consumer.cpp" -o "$tmp/$2" $cflags $libs || fail "$2: does not build with $1"
    "$tmp/$2" || fail "$2: built with $1, does not run"
}
build_and_run "${CXX:-c++}" consumer
clangxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -n "$clangxx" ]; then
    build_and_run "$clangxx" consumer-clang
else
    echo "clang++ not installed: the clang consumer is skipped"
fi

# --- a meson project: dependency('tensorplay-rpc') reads the same .pc ---
# A prefix moved into a DESTDIR is one whose .pc names another prefix: give meson a copy that names
# the staged one, as an install there would have written it.
mkdir -p "$tmp/meson-pc" "$tmp/meson-src"
sed "s|^prefix=.*|prefix=$root|" "$pc_dir/tensorplay-rpc.pc" >"$tmp/meson-pc/tensorplay-rpc.pc"
cp "$src/tests/install/meson_consumer/meson.build" "$src/tests/install/consumer.cpp" "$tmp/meson-src/"
meson setup "$tmp/meson-build" "$tmp/meson-src" -Dpkg_config_path="$tmp/meson-pc" >"$tmp/meson.log" 2>&1 \
    || { tail -n 20 "$tmp/meson.log"; fail "meson consumer: setup"; }
meson compile -C "$tmp/meson-build" >"$tmp/meson-build.log" 2>&1 || { tail -n 30 "$tmp/meson-build.log"; fail "meson consumer: build"; }
"$tmp/meson-build/consumer" || fail "meson consumer: does not run"
echo "consumers built with pkg-config, clang++ and meson: ok"
