#!/usr/bin/env bash
# Benchmark: HARP over TCP loopback against gloo (torch.distributed) and
# Open MPI (mpi4py) in the same run, float32 sum allreduce, 2 and 4 ranks.
#   bench/tcp_vs_peers.sh [outdir]
# Two sweeps per rank count:
#   * bandwidth, 1 MB..64 MB, against gloo and Open MPI (default btl: shared memory)
#   * latency, 8 B, against gloo and Open MPI held to its TCP btl (btl=tcp,self)
set -euo pipefail
out=${1:-bench/out}
mkdir -p "$out"
BENCH=${HARP_BENCH:-harp-bench}
for np in 2 4; do
  $BENCH allreduce -np "$np" -b 1M -e 64M -f 2 -n 8 -w 2 --transport tcp --compare gloo,mpi \
    --json "$out/tcp_bw_np$np.json" --no-progress | tee "$out/tcp_bw_np$np.txt"
  HARP_BENCH_MPI_MCA="btl=tcp,self" $BENCH allreduce -np "$np" -b 8 -e 8 -n 2000 -w 200 --transport tcp \
    --compare gloo,mpi --json "$out/tcp_lat_np$np.json" --no-progress | tee "$out/tcp_lat_np$np.txt"
done
