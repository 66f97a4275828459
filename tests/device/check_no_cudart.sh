#!/bin/sh
# The library reaches the CUDA runtime through dlopen only: no NEEDED libcudart, and ldd finds none.
lib=$1
if readelf -d "$lib" | grep -q 'NEEDED.*libcudart'; then echo "FAIL: $lib links libcudart"; readelf -d "$lib"; exit 1; fi
if ldd "$lib" | grep -q libcudart; then echo "FAIL: ldd shows libcudart for $lib"; ldd "$lib"; exit 1; fi
echo "ok: $lib does not link libcudart"
