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
# HARP_SANITIZE=address|thread|undefined (issue 18's memory-safety hunt): a
# separate build (build/<kind>-san, RelWithDebInfo, no GoogleTest) whose
# libraries go into a copy of the package, build/<kind>-san/python/harp, never
# into python/harp. Run with the runtime preloaded, e.g.
#   LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
#     PYTHONPATH=build/address-san/python python3 ...
san=()
if [ -n "${HARP_SANITIZE:-}" ]; then
  B=${BUILD_DIR:-build/${HARP_SANITIZE}-san}
  f="-fsanitize=${HARP_SANITIZE} -fno-omit-frame-pointer -g"
  san=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS=$f" "-DCMAKE_C_FLAGS=$f"
       "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=${HARP_SANITIZE}" "-DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=${HARP_SANITIZE}")
  HARP_BUILD_TESTS=${HARP_BUILD_TESTS:-OFF}
fi
if [ ! -f "$B/build.ninja" ]; then
  pyb=()
  if d=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null); then pyb=(-Dpybind11_DIR="$d"); fi
  # shellcheck disable=SC2086
  cmake -S . -B "$B" -G Ninja -DHARP_BUILD_TESTS="${HARP_BUILD_TESTS:-ON}" "${launcher[@]}" "${pyb[@]}" "${san[@]}" ${HARP_CMAKE_ARGS:-}
fi
ninja -C "$B" -j"${JOBS:-2}"
dest=python/harp
if [ -n "${HARP_SANITIZE:-}" ]; then
  dest="$B/python/harp"
  mkdir -p "$dest"
  cp -r python/harp/. "$dest"/
fi
rm -f "$dest"/*.so
cp "$B/libharp.so" "$dest"/
# Optional transport modules (libharp-verbs.so, libharp-dpdk.so), loaded with
# dlopen from the directory of libharp.so.
find "$B" -maxdepth 1 -name 'libharp-*.so' ! -name 'libharp-nccl.so' -exec cp {} "$dest"/ \;
find "$B/bindings" -maxdepth 1 -name '*.so' -exec cp {} "$dest"/ \;
cp "$B/libharp-nccl.so" "$dest"/ 2>/dev/null || true
