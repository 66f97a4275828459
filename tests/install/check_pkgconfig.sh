#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs tests/install/consumer.cpp with
# nothing but `pkg-config --cflags --libs tensorplay-rpc`, as a user outside meson would.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$tmp" >/dev/null
pc=$(find "$tmp" -name tensorplay-rpc.pc | head -n 1)
[ -n "$pc" ] || { echo "tensorplay-rpc.pc was not installed"; exit 1; }
prefix=$(pkg-config --variable=prefix "$pc")
flags=$(PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --define-variable=prefix="$tmp$prefix" --cflags --libs tensorplay-rpc)
echo "pkg-config: $flags"
c++ "$src/tests/install/consumer.cpp" -o "$tmp/consumer" $flags
libdir=$(dirname "$(dirname "$pc")")  # .../lib/<multiarch>/pkgconfig -> .../lib/<multiarch>
LD_LIBRARY_PATH="$libdir" "$tmp/consumer"
