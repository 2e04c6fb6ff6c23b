#!/usr/bin/env bash
# bench/sim/build_replayer.sh — builds harp_replay (bench/sim/replay/harp_replay.cc)
# into build/sim/harp_replay against the system SimGrid (libsimgrid-dev,
# scripts/deps/sim.apt; install-deps.sh --sim).
# Usage: bash bench/sim/build_replayer.sh [OUT]   (nice it on a shared machine)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/build/sim/harp_replay}"
mkdir -p "$(dirname "$out")"
if [ ! -f /usr/include/simgrid/s4u.hpp ]; then
  echo "build_replayer: SimGrid's headers are missing: bash scripts/install-deps.sh --sim" >&2
  exit 1
fi
cxx="${CXX:-c++}"
command -v ccache >/dev/null && cxx="ccache $cxx"
cd "$root"
$cxx -std=c++17 -O2 -Wall -o "$out" bench/sim/replay/harp_replay.cc -lsimgrid
echo "$out"
