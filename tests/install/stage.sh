# Sourced by the install tests: `stage BUILD` runs `meson install` into a scratch DESTDIR (removed on
# exit) and sets tmp (scratch directory), root (the installed prefix inside it), libdir, pc_dir and
# cflags / libs (what `pkg-config tensorplay-rpc` gives a user of that prefix).
# The tests run what they installed as a user would: LD_LIBRARY_PATH is never set, so the installed
# RUNPATHs (or the lack of them) decide whether a program starts.
unset LD_LIBRARY_PATH

stage() {
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # One `meson install` of a build folder at a time (they share its install log); the tests that
    # stage run in parallel otherwise.
    flock "$1/meson-private/tp-install.lock" meson install -C "$1" --no-rebuild --quiet --destdir "$tmp" >/dev/null
    local pc
    pc=$(find "$tmp" -name tensorplay-rpc.pc | head -n 1)
    [ -n "$pc" ] || { echo "FAIL: tensorplay-rpc.pc was not installed"; exit 1; }
    pc_dir=$(dirname "$pc")
    libdir=$(dirname "$pc_dir")  # .../lib/<multiarch>/pkgconfig -> .../lib/<multiarch>
    root="$tmp$(pkg-config --variable=prefix "$pc")"
    cflags=$(tp_pkg_config --cflags tensorplay-rpc)
    libs=$(tp_pkg_config --libs tensorplay-rpc)
}

# pkg-config on the staged prefix: --define-variable moves ${prefix} (and so ${libdir}, and the
# -Wl,-rpath,${libdir} that Libs may carry) into the DESTDIR, where the files are.
tp_pkg_config() {
    PKG_CONFIG_PATH="$pc_dir" pkg-config --define-variable=prefix="$root" "$@"
}

fail() { echo "FAIL: $*"; exit 1; }
