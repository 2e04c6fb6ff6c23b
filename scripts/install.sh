#!/usr/bin/env bash
# Install HARP for the main job: the main-job packages (scripts/install-deps.sh),
# then HARP itself into the project's virtual environment .venv/ (built from this
# checkout with pip; the build tools come from .venv, so no download at build
# time), and harp-dev, the pure-Python developer tools (python/pyproject.toml:
# harp-bench, harp-cluster), which the runtime does not need.
# Afterwards: .venv/bin/harp-bench, .venv/bin/harp-run, .venv/bin/harp-config,
# or `. .venv/bin/activate` first. Extra arguments go to install-deps.sh
# (--compare adds torch and mpi4py for harp-bench --compare gloo,mpi).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh "$@"
VENV=${HARP_VENV:-.venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if command -v ccache >/dev/null 2>&1; then  # faster rebuilds where ccache is installed
  export CCACHE_BASEDIR="$PWD" CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
fi
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps . </dev/null
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps ./python </dev/null
"$VENV/bin/harp-config" --version
