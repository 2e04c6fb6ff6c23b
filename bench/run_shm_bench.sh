#!/usr/bin/env bash
# Intra-host benchmark for bench/RESULTS-shm.md: HARP (shm transport, automatic
# choice) vs Open MPI (mpi4py; its shared-memory btl/vader) vs gloo, allreduce
# float32 sum, 8 B .. 64 MB, 2 and 4 ranks, plus a STREAM-like copy measured in
# the same run (before and after the sweeps).
#
#   bench/run_shm_bench.sh [outdir]      (default bench/out-shm)
# Needs: the harp package importable (pip install . or PYTHONPATH=python with
# scripts/dev-build.sh), torch (gloo), mpi4py + mpirun (Open MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/out-shm}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-python}
ITERS=${ITERS:-20}
WARM=${WARM:-5}
{
  echo "# $(date -u) $(uname -r) $(nproc) cpus; $(lscpu | grep 'Model name' | sed 's/  */ /g')"
  echo "# load before: $(cat /proc/loadavg)"
  for np_ in 2 4; do python3 bench/stream_copy.py -np $np_; done
  for np_ in 2 4; do
    python3 -m harp_dev.bench.cli allreduce -np $np_ -b 8 -e 64M -f 2 -n "$ITERS" -w "$WARM" \
      --compare gloo,mpi --json "$out/allreduce-np$np_.json" --no-progress
  done
  for np_ in 2 4; do python3 bench/stream_copy.py -np $np_; done
  echo "# load after: $(cat /proc/loadavg)"
} 2>&1 | tee "$out/run.log"
