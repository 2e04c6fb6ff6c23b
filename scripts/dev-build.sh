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
# BUILD_DIR (default build/dev), HARP_BUILD_TESTS (default ON; OFF where GoogleTest is absent, e.g.
# the GPU machine) and HARP_CMAKE_ARGS (extra cmake arguments) are for scripts/gpu-check.sh.
B=${BUILD_DIR:-build/dev}
if [ ! -f "$B/build.ninja" ]; then
  pyb=()
  if d=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null); then pyb=(-Dpybind11_DIR="$d"); fi
  # shellcheck disable=SC2086
  cmake -S . -B "$B" -G Ninja -DHARP_BUILD_TESTS="${HARP_BUILD_TESTS:-ON}" "${launcher[@]}" "${pyb[@]}" ${HARP_CMAKE_ARGS:-}
fi
ninja -C "$B" -j"${JOBS:-2}"
rm -f python/harp/*.so
cp "$B/libharp.so" python/harp/
# Optional transport modules (libharp-verbs.so, libharp-dpdk.so), loaded with
# dlopen from the directory of libharp.so.
find "$B" -maxdepth 1 -name 'libharp-*.so' ! -name 'libharp-nccl.so' -exec cp {} python/harp/ \;
find "$B/bindings" -maxdepth 1 -name '*.so' -exec cp {} python/harp/ \;
cp "$B/libharp-nccl.so" python/harp/ 2>/dev/null || true
