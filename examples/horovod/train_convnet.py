"""A Horovod-style PyTorch training script (MNIST-shaped convnet, synthetic data) on HARP.

    harp-run -n 3 python examples/horovod/train_convnet.py            # was: horovodrun -np 3 python ...
    harp-run -n 3 python examples/horovod/train_convnet.py --fp16-allreduce --batches-per-allreduce 2

Written the way Horovod's PyTorch examples are; the one HARP-specific line is the
import (`import horovod.torch as hvd` before). tests/test_horovod.py runs it and
compares its final loss with examples/horovod/train_convnet_ddp.py, the same
training under torch DistributedDataParallel.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import harp.horovod.torch as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = nn.Linear(256, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_batch(rank, step, batch):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--fp16-allreduce", action="store_true")
    ap.add_argument("--batches-per-allreduce", type=int, default=1)
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(42 + hvd.rank())  # different initial weights per rank: broadcast_parameters fixes that
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.batches_per_allreduce)
    model.train()
    for step in range(args.steps):
        optimizer.zero_grad()
        for k in range(args.batches_per_allreduce):
            x, y = synthetic_batch(hvd.rank(), step * args.batches_per_allreduce + k, args.batch_size)
            loss = F.nll_loss(model(x), y) / args.batches_per_allreduce
            loss.backward()
        optimizer.step()
    avg = hvd.allreduce(loss.detach(), name="avg_loss")
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if hvd.rank() == 0:
        print(f"FINAL loss {avg.item():.8f} checksum {checksum:.8f} size {hvd.size()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
