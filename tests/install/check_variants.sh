#!/usr/bin/env bash
# What builds other than this one would install, checked at configure time (meson setup only, no
# compiling, so it stays cheap), each on a copy of the build description in a scratch directory:
#  - Asio and tl-expected taken from their wrap fallbacks (-Dforce_fallback_for, with the headers
#    this machine has standing in for the downloads): their headers are installed with ours, since
#    our installed headers include them and neither has a .pc to require;
#  - io_uring on (where liburing is installed): the .pc requires liburing and passes Asio's io_uring
#    defines, and the CMake package looks liburing up;
#  - prefix /usr: no -Wl,-rpath in the .pc (the loader searches /usr/lib itself); the default
#    prefix /usr/local gets one, -Drpath=never removes it.
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

tree="$tmp/src"
mkdir -p "$tree/subprojects"
cp -r "$src/meson.build" "$src/meson_options.txt" "$src/include" "$src/src" "$src/tools" "$src/cmake" "$tree/"
cp -r "$src/subprojects/packagefiles" "$src"/subprojects/*.wrap "$tree/subprojects/"

setup() {  # DIR ARGS...: configure the copy, quietly; print the log on failure
    local dir=$1; shift
    meson setup "$dir" "$tree" -Dtests=false -Dexamples=false -Dbench=false -Dcuda=disabled "$@" \
        >"$dir.log" 2>&1 || { tail -n 30 "$dir.log"; fail "meson setup $*"; }
}
installed() {  # DIR: the destinations of everything DIR would install, one a line
    meson introspect "$1" --installed | python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin).values()))'
}
pc_libs() { PKG_CONFIG_PATH="$1/meson-private" pkg-config --libs tensorplay-rpc; }

# --- wrap fallbacks ---
asio_inc="" expected_inc=""
for d in /usr/include "$src/subprojects/asio/asio/include"; do [ -f "$d/asio.hpp" ] && { asio_inc=$d; break; }; done
for d in /usr/include "$src/subprojects/tl-expected/include"; do [ -f "$d/tl/expected.hpp" ] && { expected_inc=$d; break; }; done
if [ -n "$asio_inc" ] && [ -n "$expected_inc" ]; then
    # A wrap's directory, as the download plus our patch_directory would leave it.
    mkdir -p "$tree/subprojects/asio/asio/include" "$tree/subprojects/tl-expected/include/tl"
    cp "$tree/subprojects/packagefiles/asio/meson.build" "$tree/subprojects/asio/"
    ln -s "$asio_inc/asio.hpp" "$asio_inc/asio" "$tree/subprojects/asio/asio/include/"
    cp "$tree/subprojects/packagefiles/tl-expected/meson.build" "$tree/subprojects/tl-expected/"
    ln -s "$expected_inc/tl/expected.hpp" "$tree/subprojects/tl-expected/include/tl/"
    setup "$tmp/fallback" --prefix=/opt/tp -Dforce_fallback_for=asio,tl-expected
    grep -q "Executing subproject asio" "$tmp/fallback.log" || fail "the asio fallback was not taken"
    grep -q "Executing subproject tl-expected" "$tmp/fallback.log" || fail "the tl-expected fallback was not taken"
    files=$(installed "$tmp/fallback")
    for f in /opt/tp/include/asio.hpp /opt/tp/include/asio /opt/tp/include/tl/expected.hpp; do
        grep -qx "$f" <<<"$files" || fail "a build from the wrap fallbacks does not install $f (installs: $files)"
    done
    echo "fallback build installs asio and tl/expected: ok"
else
    echo "no Asio or tl-expected headers on this machine to stand in for the wraps: fallback check skipped"
fi

# --- io_uring ---
if pkg-config --exists 'liburing >= 2.0'; then
    setup "$tmp/uring" --prefix=/usr -Dio_uring=enabled
    PKG_CONFIG_PATH="$tmp/uring/meson-private" pkg-config --print-requires tensorplay-rpc | grep -q '^liburing' \
        || fail "an io_uring build's .pc does not require liburing"
    PKG_CONFIG_PATH="$tmp/uring/meson-private" pkg-config --cflags tensorplay-rpc | grep -q -- '-DASIO_HAS_IO_URING' \
        || fail "an io_uring build's .pc lacks -DASIO_HAS_IO_URING"
    grep -q 'set(_tp_io_uring ON)' "$tmp/uring/tensorplay-rpcConfig.cmake" || fail "an io_uring build's CMake package does not look up liburing"
    grep -q 'ASIO_HAS_IO_URING' "$tmp/uring/tensorplay-rpcConfig.cmake" || fail "an io_uring build's CMake package lacks ASIO_HAS_IO_URING"
    echo "io_uring build requires liburing: ok"
    usr=$tmp/uring
else
    echo "liburing not installed: io_uring check skipped"
    setup "$tmp/usr" --prefix=/usr
    usr=$tmp/usr
fi

# --- rpath in the .pc ---
if pc_libs "$usr" | grep -q -- '-rpath'; then fail "a /usr build's .pc adds an rpath: $(pc_libs "$usr")"; fi
setup "$tmp/local"
pc_libs "$tmp/local" | grep -q -- '-Wl,-rpath,/usr/local/lib' || fail "a /usr/local build's .pc has no rpath: $(pc_libs "$tmp/local")"
setup "$tmp/never" -Drpath=never
if pc_libs "$tmp/never" | grep -q -- '-rpath'; then fail "-Drpath=never still adds an rpath"; fi
echo "rpath in the .pc: ok"
