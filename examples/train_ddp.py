"""Train a small model with DistributedDataParallel over HARP.

    torchrun --nproc-per-node 3 examples/train_ddp.py            # harp
    torchrun --nproc-per-node 3 examples/train_ddp.py --backend gloo

The only HARP-specific thing is the backend string: with harp installed,
torch loads the backend through its `torch.backends` entry point. From a
source tree (PYTHONPATH=python) the `import harp.torch` fallback below
registers it. Every rank prints the same final loss and parameter checksum,
and the checksum equals the gloo run's.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

if "harp" not in dist.Backend.backend_list:  # not installed: register from the source tree
    import harp.torch  # noqa: F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="harp")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    w_true = torch.linspace(-1, 1, 32)
    for step in range(args.steps):
        x = torch.randn(64, 32, generator=g)
        y = (x @ w_true).unsqueeze(1)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {rank}/{world} backend {dist.get_backend()}: mean loss {total.item() / world:.6f} "
          f"param checksum {checksum:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
