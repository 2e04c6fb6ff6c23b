#!/usr/bin/env bash
# Insurance for scripts/gpu-check.sh: build HARP's libraries HERE for the GPU machine's Python
# (CPython 3.12, x86-64) into python/harp, so they can be carried there in case building on the
# machine fails (no Python.h there, say). gpu-check.sh builds there first and falls back to
# libraries carried in python/harp when that build fails; GPU_CHECK_USE_CARRIED=1 skips the build.
#
#   bash scripts/gpu-carry-build.sh [/path/to/python3.12]     # default: pyenv's 3.12, else python3.12
#   run(command="bash scripts/gpu-check.sh", carry=["python/harp/libharp.so",
#       "python/harp/libharp-nccl.so", "python/harp/_harp.cpython-312-x86_64-linux-gnu.so"], timeout_s=480)
#
# This replaces python/harp/*.so (your dev build's, for this machine's Python) with the 3.12 build:
# run scripts/dev-build.sh afterwards to get yours back. Built with -DHARP_BUILD_TESTS=OFF in
# build/gpu-carry (ccache, when installed, reuses a dev build's objects).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(uname -m)" = x86_64 ] || { echo "the GPU machine is x86-64; this machine is $(uname -m): build there" >&2; exit 1; }
PY=${1:-}
if [ -z "$PY" ]; then
  PY=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
  [ -n "$PY" ] || PY=$(command -v python3.12 || true)
fi
[ -n "$PY" ] || { echo "no CPython 3.12 found: pass its path" >&2; exit 1; }
"$PY" -c 'import sys, sysconfig, os; assert sys.version_info[:2] == (3, 12); assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")), "no Python.h"'
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
B=build/gpu-carry
cmake -S . -B "$B" -G Ninja -DHARP_BUILD_TESTS=OFF -DPython_EXECUTABLE="$PY" "${launcher[@]}" \
  -Dpybind11_DIR="$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())')" >/dev/null
ninja -C "$B" -j"${JOBS:-2}" harp harp-nccl _harp
rm -f python/harp/*.so
cp "$B/libharp.so" "$B/libharp-nccl.so" "$B"/bindings/_harp.cpython-312-*.so python/harp/
ls -la python/harp/*.so
echo "carry these three files (glibc here: $(ldd --version | head -1 | awk '{print $NF}'))"
