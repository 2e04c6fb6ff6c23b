#!/usr/bin/env bash
# Developer build: configure once, rebuild incrementally into build/dev, and copy
# the libraries into python/harp so `PYTHONPATH=python` uses them (no reinstall).
# Users and CI install with `pip install .` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache, when installed, shares objects between checkouts (CCACHE_BASEDIR
# makes paths relative, so two worktrees of the same commit hit the same cache).
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
if [ ! -f build/dev/build.ninja ]; then
  cmake -S . -B build/dev -G Ninja -DHARP_BUILD_TESTS=ON "${launcher[@]}" \
    -Dpybind11_DIR="$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())')"
fi
ninja -C build/dev -j"${JOBS:-2}"
rm -f python/harp/*.so
cp build/dev/libharp.so python/harp/
# Optional transport modules (libharp-verbs.so, libharp-dpdk.so), loaded with
# dlopen from the directory of libharp.so.
find build/dev -maxdepth 1 -name 'libharp-*.so' ! -name 'libharp-nccl.so' -exec cp {} python/harp/ \;
find build/dev/bindings -maxdepth 1 -name '*.so' -exec cp {} python/harp/ \;
cp build/dev/libharp-nccl.so python/harp/ 2>/dev/null || true
