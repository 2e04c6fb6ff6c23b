"""The Horovod-style convnet (train_convnet.py) as an elastic job: it keeps training when a worker dies.

    harp-run -n 3 --grace 600 python examples/horovod/train_convnet_elastic.py --steps 8
    harp-run -n 3 --grace 600 python examples/horovod/train_convnet_elastic.py --die-rank 2 --die-at-step 4

Written the way Horovod's elastic PyTorch examples are (hvd.elastic.TorchState,
@hvd.elastic.run, state.commit() every step); the HARP-specific line is the
import. --die-rank/--die-at-step make that rank kill itself (SIGKILL) at that
step, for tests/test_horovod.py: the survivors shrink to the others, roll back
to the last commit and finish every step. harp-run --grace keeps the survivors
running after a rank has died (harp-run stops the others after a failure
otherwise).
"""
import argparse
import os
import signal

import torch
import torch.nn.functional as F

import harp.horovod.torch as hvd
from train_convnet import Net, synthetic_batch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-at-step", type=int, default=-1)
    args = ap.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(42)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    resets = []  # outside the state: a restore does not roll it back
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    original_rank = hvd.rank()

    @hvd.elastic.run
    def train(state):
        for state.step in range(state.step, args.steps):
            if original_rank == args.die_rank and state.step == args.die_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            # the data follows the step, not the rank count: after a shrink each survivor keeps its own stream
            x, y = synthetic_batch(hvd.rank(), state.step, args.batch_size)
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            optimizer.step()
            state.commit()
        return loss

    loss = train(state)
    avg = hvd.allreduce(loss.detach(), name="avg_loss")
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"FINAL rank {hvd.rank()} size {hvd.size()} steps {state.step + 1} resets {len(resets)} "
          f"loss {avg.item():.8f} checksum {checksum:.8f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
