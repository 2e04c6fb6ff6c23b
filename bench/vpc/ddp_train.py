"""A communication-heavy data-parallel training step loop: DDP over gloo or HARP.

    harp-cluster run --hosts 4 -- python bench/vpc/ddp_train.py --backend harp
    harp-cluster run --hosts 4 --launcher torchrun -- python bench/vpc/ddp_train.py --backend harp

The same script runs unmodified under harp-run/the arena's harp launcher,
torchrun and mpirun: rank and world size come from harp._env.launch_env()
(HARP_RANK, RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID), the rendezvous from
MASTER_ADDR/MASTER_PORT (env://). Model: MLP 1024-4096-4096-1024 (25.2 M
float32 parameters, 100 MB of gradients per step), synthetic data seeded by
(rank, step), SGD. Rank 0 prints one JSON line "TRAIN {...}" with samples/s
over the timed steps and the final loss averaged over ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import harp._env  # noqa: E402
import harp.torch  # noqa: E402,F401  (registers "harp" when harp is used from a source tree)


def model_of(width, depth_in=1024):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(depth_in, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, depth_in))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="harp", choices=["harp", "gloo"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--width", type=int, default=4096)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, size, _ = harp._env.launch_env()
    dist.init_process_group(a.backend, rank=rank, world_size=size)
    model = torch.nn.parallel.DistributedDataParallel(model_of(a.width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    nparams = sum(p.numel() for p in model.parameters())
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(a.batch, 1024, generator=g)
        y = torch.sin(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    avg = loss.detach().clone()
    dist.all_reduce(avg)
    avg = float(avg) / size
    if rank == 0:
        rec = {"backend": a.backend, "world": size, "params": nparams, "batch_per_rank": a.batch,
               "steps": a.steps, "seconds": elapsed, "samples_per_s": size * a.batch * a.steps / elapsed,
               "final_loss": avg, "host": os.uname().nodename}
        print("TRAIN " + json.dumps(rec), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
