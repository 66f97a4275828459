#!/usr/bin/env bash
# Installs the build into a scratch prefix, then configures, builds and runs the CMake project in
# tests/install/cmake_consumer with CMAKE_PREFIX_PATH at that prefix (find_package(tensorplay-rpc),
# target tensorplay::rpc), with the default C++ compiler and, when installed, with clang++. Also
# checks the version file: the project's own major.minor is found, a newer minor is refused.
set -euo pipefail
build=$1 src=$2 version=$3
command -v cmake >/dev/null || { echo "cmake not installed: skipped"; exit 77; }
. "$src/tests/install/stage.sh"
stage "$build"

configure() {  # BUILD_DIR EXTRA_ARGS...
    local dir=$1; shift
    cmake -S "$src/tests/install/cmake_consumer" -B "$dir" -DCMAKE_PREFIX_PATH="$root" \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir.log" 2>&1
}

run_consumer() {  # NAME EXTRA_CMAKE_ARGS...
    local name=$1; shift
    configure "$tmp/$name" "$@" || { cat "$tmp/$name.log"; fail "$name: cmake configure"; }
    cmake --build "$tmp/$name" >"$tmp/$name.build.log" 2>&1 || { cat "$tmp/$name.build.log"; fail "$name: build"; }
    # No LD_LIBRARY_PATH: CMake gives the build-tree program a RUNPATH to the imported library.
    "$tmp/$name/consumer" || fail "$name: does not run"
}

major_minor=${version%.*}
run_consumer cmake-consumer -DTP_WANTED_VERSION="$major_minor"
clangxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -n "$clangxx" ]; then
    run_consumer cmake-consumer-clang -DCMAKE_CXX_COMPILER="$clangxx"
else
    echo "clang++ not installed: the clang CMake consumer is skipped"
fi

# A newer minor than installed (0.1 installed, 0.2 asked) must not be found.
major=${version%%.*} minor=${major_minor#*.}
newer="$major.$((minor + 1))"
if configure "$tmp/cmake-newer" -DTP_WANTED_VERSION="$newer"; then
    fail "find_package(tensorplay-rpc $newer) accepted version $version"
fi
grep -q "compatible with requested version \"$newer\"" "$tmp/cmake-newer.log" || { cat "$tmp/cmake-newer.log"; fail "no message about the version"; }
echo "cmake consumer: ok (version $newer refused)"
