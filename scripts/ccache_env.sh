# Sourced by the build scripts: ccache keyed by paths relative to this checkout, so that a fresh
# clone in another folder (CI's) reuses what any earlier clone compiled. Meson passes the project's
# own paths relative to the build folder already; base_dir rewrites any absolute path under the
# checkout, and hash_dir=false leaves the working directory out of the key (it only names the
# compile directory in the debug info). A developer's own CCACHE_* settings win.
_tp_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$_tp_root}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
# Depend mode: a miss compiles at once, keyed by the compiler's own -MD list of headers, instead of
# running the preprocessor first to hash its output (about half a second per translation unit here,
# all of it wasted on an empty cache). Meson passes -MD to every compile.
export CCACHE_DEPEND=${CCACHE_DEPEND:-true}
# Four configurations (default, ASan+UBSan, TSan, clang fuzz) with debug info: more than the 5 GB default.
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-20G}
unset _tp_root
