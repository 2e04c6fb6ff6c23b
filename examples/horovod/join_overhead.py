"""What hvd.init(join=True) costs: per-call time of hvd collectives with and without the join control round.

    harp-run -n 3 python examples/horovod/join_overhead.py [--iters 300] [--rounds 5] [--out FILE.json]

Every rank runs the same sequence; join mode is switched on and off between
phases of one run (A/B alternated `--rounds` times, so load drifts hit both).
Measured: blocking hvd.allreduce of 1, 4K and 1M float32, and one
DistributedOptimizer step (forward, backward, averaged gradients, SGD) of the
MNIST-shaped convnet of train_convnet.py on a 32-sample batch. Rank 0 prints
one JSON line: median microseconds per call for each case, off and on, their
ratio, the spread (min-max of the per-round medians) and the provenance stamp
(bench/vpc/stamp.py: commit, CPU, cores, load average, time). No rank joins
here: this is the price every step pays for the possibility.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import harp.horovod.torch as hvd
from harp.horovod.torch import _join

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "vpc"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stamp import stamp  # noqa: E402
from train_convnet import Net  # noqa: E402


def _time_allreduce(n, iters):
    t = torch.ones(n)
    hvd.allreduce(t)
    t0 = time.perf_counter()
    for _ in range(iters):
        hvd.allreduce(t)
    return (time.perf_counter() - t0) / iters * 1e6


def _time_steps(model, opt, iters):
    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g)
    t0 = time.perf_counter()
    for _ in range(iters):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / iters * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    cases = {"allreduce_1": lambda: _time_allreduce(1, a.iters),
             "allreduce_4K": lambda: _time_allreduce(4096, a.iters),
             "allreduce_1M": lambda: _time_allreduce(1 << 20, max(1, a.iters // 20)),
             "optimizer_step": lambda: _time_steps(model, opt, max(1, a.iters // 10))}
    got = {c: {"off": [], "on": []} for c in cases}
    for _ in range(a.rounds):
        for mode in ("off", "on"):
            _join.enable(mode == "on")  # the same on every rank, between collectives
            for c, fn in cases.items():
                got[c][mode].append(fn())
    _join.enable(False)
    res = {}
    for c, d in got.items():
        off, on = statistics.median(d["off"]), statistics.median(d["on"])
        res[c] = {"off_us": round(off, 2), "on_us": round(on, 2), "ratio": round(on / off, 3),
                  "off_spread_us": [round(min(d["off"]), 2), round(max(d["off"]), 2)],
                  "on_spread_us": [round(min(d["on"]), 2), round(max(d["on"]), 2)]}
    if hvd.rank() == 0:
        rec = {"size": hvd.size(), "iters": a.iters, "rounds": a.rounds, "results": res, "stamp": stamp(),
               "command": " ".join(sys.argv)}
        print(json.dumps(rec))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(rec, f, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
