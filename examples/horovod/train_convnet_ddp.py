"""The same training as train_convnet.py under torch DistributedDataParallel (the reference).

    harp-run -n 3 python examples/horovod/train_convnet_ddp.py [--backend harp|gloo]

Same model, seeds, data and learning rate; rank 0's initial weights everywhere
(DDP broadcasts them, as hvd.broadcast_parameters does); DDP averages gradients
as hvd.DistributedOptimizer does. Accumulation over several batches uses
no_sync(), Horovod's backward_passes_per_step.
"""
import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_convnet import Net, synthetic_batch  # noqa: E402

if "harp" not in dist.Backend.backend_list:
    import harp.torch  # noqa: F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batches-per-allreduce", type=int, default=1)
    ap.add_argument("--backend", default="harp")
    args = ap.parse_args()
    import harp._env
    rank, size, _ = harp._env.launch_env()
    dist.init_process_group(args.backend, rank=rank, world_size=size)
    torch.set_num_threads(1)
    torch.manual_seed(42 + rank)
    model = Net()
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr * size, momentum=0.5)
    for step in range(args.steps):
        optimizer.zero_grad()
        for k in range(args.batches_per_allreduce):
            last = k == args.batches_per_allreduce - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                x, y = synthetic_batch(rank, step * args.batches_per_allreduce + k, args.batch_size)
                loss = F.nll_loss(ddp(x), y) / args.batches_per_allreduce
                loss.backward()
        optimizer.step()
    avg = loss.detach().clone()
    dist.all_reduce(avg)
    avg /= size
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(f"FINAL loss {avg.item():.8f} checksum {checksum:.8f} size {size}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
