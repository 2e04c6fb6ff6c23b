#!/usr/bin/env bash
# bench/sim/build_emitter.sh — builds harp_sched (bench/sim/emit/) into
# build/sim/harp_sched: HARP's allreduce algorithm files compiled unchanged and
# linked with the tracing Context (emit/trace_context.cc) instead of the engine's.
# Usage: bash bench/sim/build_emitter.sh [OUT]   (nice it on a shared machine)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/build/sim/harp_sched}"
mkdir -p "$(dirname "$out")"
cxx="${CXX:-c++}"
command -v ccache >/dev/null && cxx="ccache $cxx"
src=(
  bench/sim/emit/main.cc bench/sim/emit/schedule.cc bench/sim/emit/trace_context.cc
  bench/sim/emit/trace_groups.cc bench/sim/emit/trace_kernels.cc
  core/engine/scratch.cc core/compress/compress.cc core/algorithms/registry.cc
  core/algorithms/allreduce_ring.cc core/algorithms/allreduce_recursive_doubling.cc
  core/algorithms/allreduce_halving_doubling.cc core/algorithms/allreduce_tree.cc
  core/algorithms/allreduce_leader.cc core/algorithms/compressed/compress_ring.cc core/algorithms/compressed/compress_topk.cc
  core/algorithms/reduce_binomial.cc core/algorithms/reduce_pipeline.cc
  core/algorithms/broadcast_binomial.cc core/algorithms/broadcast_pipeline.cc
  base/types.cc base/log.cc base/env.cc base/params.cc base/folder.cc base/stall.cc base/probe.cc
)
cd "$root"
$cxx -std=c++20 -O2 -I. -o "$out" "${src[@]}" -lpthread
echo "$out"
