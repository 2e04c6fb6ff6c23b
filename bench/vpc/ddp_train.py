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

Study options (defaults leave the run as before): --bucket-cap-mb (DDP's
bucket_cap_mb; default torch's 25), --compress SPEC (HARP backend only: DDP comm
hook harp.torch.hooks.topk_hook for topk:..., fp16_wire_hook / bf16_wire_hook for
fp16/bf16; ',ef' is added to top-k specs; a trailing '!' skips the gate),
--seed S (model init and data seeds; 0: the original ones), --lr, --no-sync (every step
in DDP's no_sync(): no gradient communication, the baseline of communication efficiency),
--fsdp (FSDP2 fully_shard instead of DDP; every step's loss in the record).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import harp._env  # noqa: E402
import harp.torch  # noqa: E402,F401  (registers "harp" when harp is used from a source tree)


def model_of(width, depth_in=1024, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(depth_in, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, depth_in))


def register_hook(model, spec, backend):
    """A harp.torch.hooks DDP comm hook for `spec` (topk:..., fp16, bf16)."""
    if backend != "harp":
        raise SystemExit("ddp_train: --compress needs --backend harp")
    from harp.torch import hooks
    force = spec.endswith("!")
    base = spec.rstrip("!")
    if base.startswith("topk"):
        base = base if ",ef" in base else base + ",ef"
        model.register_comm_hook(hooks.HookState(compress=base, force=force), hooks.topk_hook)
    elif base in ("fp16", "bf16"):
        model.register_comm_hook(hooks.HookState(force=force),
                                 hooks.fp16_wire_hook if base == "fp16" else hooks.bf16_wire_hook)
    else:
        raise SystemExit(f"ddp_train: --compress {spec!r}: use topk:RATIO, fp16 or bf16 (optionally with '!')")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="harp", choices=["harp", "gloo"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket_cap_mb (default: torch's 25)")
    ap.add_argument("--compress", default="none", help="harp backend: topk:RATIO, fp16 or bf16 DDP comm hook")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--fsdp", action="store_true",
                    help="shard the model with FSDP2 (torch.distributed.fsdp.fully_shard on each Linear and the "
                         "root: an allgather per layer forward and backward, a reduce-scatter per layer) instead "
                         "of DDP; rank 0 also prints every step's loss averaged over ranks")
    ap.add_argument("--no-sync", action="store_true",
                    help="every step inside DDP's no_sync(): the same ranks and work with communication skipped "
                         "(the denominator of communication efficiency)")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank, size, _ = harp._env.launch_env()
    dist.init_process_group(a.backend, rank=rank, world_size=size)
    if a.fsdp:
        if a.no_sync or a.compress != "none" or a.bucket_cap_mb is not None:
            raise SystemExit("ddp_train: --fsdp takes none of --no-sync, --compress, --bucket-cap-mb")
        from torch.distributed.fsdp import fully_shard
        model = model_of(a.width, seed=a.seed)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        ddp_kw = {} if a.bucket_cap_mb is None else {"bucket_cap_mb": a.bucket_cap_mb}
        model = torch.nn.parallel.DistributedDataParallel(model_of(a.width, seed=a.seed), **ddp_kw)
    if a.compress != "none":
        register_hook(model, a.compress, a.backend)
    losses = []
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    nparams = sum(p.numel() for p in model.parameters())
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        g = torch.Generator().manual_seed(1000 * rank + step + 1000003 * a.seed)
        x = torch.randn(a.batch, 1024, generator=g)
        y = torch.sin(x)
        with model.no_sync() if a.no_sync else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
        opt.step()
        if a.fsdp:
            losses.append(float(loss.detach()))
    dist.barrier()
    elapsed = time.perf_counter() - t0
    avg = loss.detach().clone()
    dist.all_reduce(avg)
    avg = float(avg) / size
    if a.fsdp:  # every step's loss, averaged over ranks (one allreduce after the timed steps)
        per_step = torch.tensor(losses, dtype=torch.float64)
        dist.all_reduce(per_step)
        losses = (per_step / size).tolist()
    if rank == 0:
        rec = {"backend": a.backend, "world": size, "params": nparams, "batch_per_rank": a.batch,
               "steps": a.steps, "seconds": elapsed, "samples_per_s": size * a.batch * a.steps / elapsed,
               "final_loss": avg, "host": os.uname().nodename, "bucket_cap_mb": a.bucket_cap_mb,
               "compress": a.compress, "seed": a.seed, "lr": a.lr, "width": a.width, "no_sync": a.no_sync,
               "fsdp": a.fsdp, "losses": losses if a.fsdp else None}
        print("TRAIN " + json.dumps(rec), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
