#!/usr/bin/env bash
# bench/RESULTS-shm.md: HARP (shm) vs Open MPI (mpi4py, vader) vs gloo,
# allreduce float32 sum 8 B .. 64 MB, 2 and 4 ranks, interleaved in the same
# processes (harp-bench --interleave: batches in rotating order, median turn of
# the slowest rank), with a STREAM-like copy measured before and after.
#   [NICE="nice -n -19"] [BIND=core|none] [REPS=5] bench/run_shm_compare.sh [outdir]
# NICE raises the priority of all three libraries alike (shared, loaded machines).
# BIND: mpirun's placement, the same for all three libraries (they run in the
# same processes). Default core: rank i on core i mod cores. Unbound ranks
# (BIND=none) can end up 3:1 on 2 cores and stay so for seconds: one 4-rank run
# then measures the scheduler's placement, not the libraries (measured: 4 MB
# HARP batches 1250 us at 2:2, 1900 us at 3:1).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out-shm}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-python}
# numpy's BLAS threads are not used by any library here; idle, they only take CPU.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
for np_ in ${NPS:-2 4}; do
  echo "# $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 bench/stream_copy.py -np "$np_"
  ${NICE:-} python3 -m harp_dev.bench.cli allreduce -np "$np_" -b 8 -e 64M -f 2 --compare gloo,mpi \
    --interleave "${REPS:-5}" --mpi-bind "${BIND:-core}" --json "$out/compare-np$np_.json" \
    --plot "$out/compare-np$np_.png" --no-progress 2>"$out/progress-np$np_.log"
  python3 bench/stream_copy.py -np "$np_"
done | tee "$out/compare.md"
