#!/usr/bin/env bash
# bench/RESULTS-shm.md: HARP (shm) vs Open MPI (mpi4py, vader) vs gloo,
# allreduce float32 sum 8 B .. 64 MB, 2 and 4 ranks, interleaved in the same
# processes, with a STREAM-like copy measured in the same run.
#   [NICE="nice -n -19"] bench/run_shm_compare.sh [outdir]
# NICE raises the priority of all three libraries alike (shared, loaded machines).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out-shm}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# numpy's BLAS threads are not used by any library here; idle, they only take CPU.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
for np_ in ${NPS:-2 4}; do
  echo "# $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)"
  ${NICE:-} mpirun -np "$np_" --oversubscribe --bind-to none python3 bench/shm_compare.py -b 8 -e 64M \
    --json "$out/compare-np$np_.json" 2>"$out/progress-np$np_.log"
done | tee "$out/compare.md"
