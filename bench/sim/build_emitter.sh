#!/usr/bin/env bash
# bench/sim/build_emitter.sh — builds harp_sched (bench/sim/emit/) into
# build/sim/harp_sched: HARP's algorithm files of allreduce, allgather,
# reduce_scatter and alltoall (and the legs hierarchical ones call: reduce,
# broadcast, gather, scatter), compiled unchanged and linked with the tracing
# Context (emit/trace_context.cc) instead of the engine's, and HARP's selector
# (core/select) with the tuning table embedded as the library embeds it.
# -fno-builtin: every copy an algorithm makes is a call that
# emit/trace_memory.cc records instead of doing.
# Usage: bash bench/sim/build_emitter.sh [OUT]   (nice it on a shared machine)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/build/sim/harp_sched}"
gen="$(dirname "$out")/gen"
mkdir -p "$gen"
cxx="${CXX:-c++}"
command -v ccache >/dev/null && cxx="ccache $cxx"
cd "$root"
# core/CMakeLists.txt's configure_file of tuning_data.cc.in, done with python3.
python3 - "$gen/tuning_data.cc" <<'PY'
import sys
tpl = open("core/select/tuning_data.cc.in").read()
text = tpl.replace("@HARP_TUNING_TSV@", open("core/select/tuning.tsv").read())
try:
    if open(sys.argv[1]).read() == text:
        sys.exit(0)
except OSError:
    pass
open(sys.argv[1], "w").write(text)
PY
algos=(
  allreduce_ring allreduce_ring_weighted allreduce_recursive_doubling allreduce_halving_doubling allreduce_tree
  allreduce_leader allreduce_rail hier compressed/compress_ring compressed/compress_topk
  allgather_ring allgather_bruck allgather_recursive_doubling allgather_direct allgather_leader allgather_pat
  reduce_scatter_ring reduce_scatter_bruck reduce_scatter_recursive_halving reduce_scatter_leader reduce_scatter_pat
  alltoall_pairwise alltoall_bruck
  reduce_binomial reduce_pipeline broadcast_binomial broadcast_pipeline broadcast_leader
  gather_linear gather_binomial scatter_linear scatter_binomial
)
src=(
  bench/sim/emit/main.cc bench/sim/emit/schedule.cc bench/sim/emit/trace_context.cc
  bench/sim/emit/trace_groups.cc bench/sim/emit/trace_kernels.cc bench/sim/emit/trace_memory.cc
  bench/sim/emit/trace_shm.cc
  core/engine/scratch.cc core/compress/compress.cc core/algorithms/registry.cc
  core/select/select.cc core/select/tuning.cc core/select/cost.cc "$gen/tuning_data.cc"
  base/types.cc base/log.cc base/env.cc base/params.cc base/folder.cc base/stall.cc base/probe.cc
)
for a in "${algos[@]}"; do src+=("core/algorithms/$a.cc"); done
$cxx -std=c++20 -O2 -fno-builtin -fno-tree-loop-distribute-patterns -I. -o "$out" "${src[@]}" -lpthread -ldl
echo "$out"
