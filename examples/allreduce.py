"""The harp API: every rank sums a vector with the others.

    harp-run -n 4 python examples/allreduce.py          # 4 local ranks
    torchrun --nproc-per-node 4 examples/allreduce.py   # harp.init() reads torchrun's variables too

Each rank fills x with its rank number; after the allreduce every element is
0 + 1 + ... + (size-1). Rank 0 prints the transport to rank 1 and the algorithm
HARP picked.
"""
import numpy as np

import harp

comm = harp.init()
x = np.full(1 << 20, comm.rank, dtype=np.float32)
comm.allreduce(x)  # in place
expect = comm.size * (comm.size - 1) / 2
assert np.all(x == expect), (x[:4], expect)
if comm.rank == 0:
    peer = 1 if comm.size > 1 else 0
    print(f"harp {harp.__version__}: {comm.size} ranks, sum = {x[0]:g} everywhere; "
          f"transport to rank {peer}: {comm.transport(peer)}, algorithm: {comm.algorithm('allreduce', x.size)}")
comm.destroy()
