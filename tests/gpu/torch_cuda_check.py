"""torch.distributed over HARP with CUDA tensors (needs a CUDA GPU; skips cleanly without one).

    python tests/gpu/torch_cuda_check.py [--ranks 2] [--steps 5] [--json PATH] [--require-cuda]
    python tests/gpu/torch_cuda_check.py --device cpu     # the same checks on CPU tensors (no GPU needed)

Run by scripts/gpu-check.sh on the GPU machine. Each rank is a spawned process (CUDA does not
survive fork); all ranks share device LOCAL_RANK % device count (device 0 on a one-GPU machine).
Every rank calls init_process_group("harp") (file:// rendezvous), so CUDA tensors go through
HARP's staging (device -> pinned host -> HARP -> device, in the order of the current stream).

Checks, each against values computed locally:
  1. all_reduce on a non-default stream: work queued before it (mul_) is seen, work queued after
     it (add_) sees the result; SUM float32 (1M elements), MAX int64, SUM bfloat16, AVG float64;
  2. broadcast from the last rank (float64) and from rank 0 (int32);
  3. all_gather (list of tensors) and all_gather_into_tensor;
  4. async all_reduce: the Work's future value;
  5. DDP for --steps steps: a small MLP on CUDA over harp against the same model's CPU copy
     under DDP over gloo (a gloo group on the same ranks), same data: the parameters must agree
     (float32 rounding, tolerance 1e-4) and must have moved. gloo runs first, then harp twice
     (timings ddp_harp_first, with one-time costs, and ddp_harp_warm); both harp runs are checked.
Prints one line per check, "ALL TORCH CUDA CHECKS PASSED" and exits 0; exits 1 on a failed check.
Without CUDA: prints "SKIP: no CUDA ..." and exits 0 (exit 2 with --require-cuda).
--json PATH writes {"status", "checks", "timings_s", "ddp": {...}, "torch", "device"}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_SRC = os.path.join(ROOT, "python")
if os.path.exists(os.path.join(_SRC, "harp", "libharp.so")):  # a dev build; else the installed harp
    sys.path.insert(0, _SRC)
sys.path.insert(0, os.path.join(ROOT, "tests", "nccl"))
import device_check  # noqa: E402  (collect: the rank-gathering loop shared with tests/nccl and bench/gpu)


def _model(torch, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 8))


def _data(torch, rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)


def _train(torch, dist, model, group, dev, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = model.to(dev)
    kw = {"device_ids": [dev.index]} if dev.type == "cuda" else {}
    # small buckets: several allreduces per step, overlapping the backward pass
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01, **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(steps):
        x, y = _data(torch, rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return [p.detach().cpu().clone() for p in model.parameters()]


def rank_main(rank, size, url, device_kind, steps, q):
    try:
        os.environ.setdefault("HARP_TIMEOUT", "60")
        import torch
        import torch.distributed as dist

        import harp.torch  # noqa: F401  (registers "harp")

        torch.set_num_threads(1)
        if device_kind == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            dev = torch.device("cuda", torch.cuda.current_device())
        else:
            dev = torch.device("cpu")
        t = {}
        t0 = time.monotonic()
        dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=60))
        t["init"] = time.monotonic() - t0
        checks, bad = [], []

        def chk(name, ok, detail=""):
            checks.append((name, bool(ok)))
            if not ok:
                bad.append(f"rank {rank}: {name} {detail}")

        # 1. all_reduce in stream order, several dtypes/ops
        t0 = time.monotonic()
        tri = sum(r + 1 for r in range(size))
        if dev.type == "cuda":
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x = torch.full((1 << 20,), float(rank + 1), device=dev)
                x.mul_(2)  # queued on s before the collective: staging must see it
                dist.all_reduce(x)
                x.add_(1)  # queued after: must see the result
            s.synchronize()
        else:
            x = torch.full((1 << 20,), float(rank + 1))
            x.mul_(2)
            dist.all_reduce(x)
            x.add_(1)
        chk("all_reduce sum float32 1M, stream order", torch.all(x == 2 * tri + 1).item(), str(x[:3]))
        i = torch.arange(1000, dtype=torch.int64, device=dev) * (rank + 1)
        dist.all_reduce(i, op=dist.ReduceOp.MAX)
        chk("all_reduce max int64", torch.equal(i.cpu(), torch.arange(1000, dtype=torch.int64) * size))
        b = torch.full((4096,), float(rank + 1), dtype=torch.bfloat16, device=dev)
        dist.all_reduce(b)
        chk("all_reduce sum bfloat16", torch.all(b.float() == tri).item(), str(b[:3]))
        a = torch.full((333,), float(rank), dtype=torch.float64, device=dev)
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        chk("all_reduce avg float64", torch.allclose(a.cpu(), torch.full((333,), (size - 1) / 2, dtype=torch.float64)))
        t["all_reduce"] = time.monotonic() - t0

        # 2. broadcast
        t0 = time.monotonic()
        bc = torch.full((1000,), float(rank), dtype=torch.float64, device=dev)
        dist.broadcast(bc, size - 1)
        chk("broadcast float64 from last rank", torch.all(bc == size - 1).item(), str(bc[:3]))
        bi = torch.arange(77, dtype=torch.int32, device=dev) + rank
        dist.broadcast(bi, 0)
        chk("broadcast int32 from rank 0", torch.equal(bi.cpu(), torch.arange(77, dtype=torch.int32)))
        t["broadcast"] = time.monotonic() - t0

        # 3. all_gather
        t0 = time.monotonic()
        mine = torch.arange(5, dtype=torch.float32, device=dev) + 10 * rank
        outs = [torch.empty(5, device=dev) for _ in range(size)]
        dist.all_gather(outs, mine)
        chk("all_gather (list)", all(torch.equal(o.cpu(), torch.arange(5.0) + 10 * r) for r, o in enumerate(outs)))
        flat = torch.empty(size * 1000, device=dev)
        dist.all_gather_into_tensor(flat, torch.full((1000,), float(rank), device=dev))
        chk("all_gather_into_tensor", torch.equal(flat.cpu(), torch.arange(size).float().repeat_interleave(1000)))
        t["all_gather"] = time.monotonic() - t0

        # 4. async op, future
        w = dist.all_reduce(torch.ones(3, device=dev), async_op=True)
        v = w.get_future().wait()[0]
        chk("async all_reduce future", torch.all(v.cpu() == size).item(), str(v))

        # 5. DDP on harp (device tensors) vs DDP on gloo (CPU copies)
        gloo = dist.new_group(backend="gloo")
        # gloo first, then harp twice: the first DDP in a process pays one-time costs (lazy imports,
        # CUDA's first kernels and cuBLAS handle); the second harp run is the warm figure
        t0 = time.monotonic()
        p_gloo = _train(torch, dist, _model(torch), gloo, torch.device("cpu"), steps)
        t["ddp_gloo_cpu"] = time.monotonic() - t0
        t0 = time.monotonic()
        p_harp = _train(torch, dist, _model(torch), dist.group.WORLD, dev, steps)
        t["ddp_harp_first"] = time.monotonic() - t0
        t0 = time.monotonic()
        p_harp2 = _train(torch, dist, _model(torch), dist.group.WORLD, dev, steps)
        t["ddp_harp_warm"] = time.monotonic() - t0
        diff = max((x - y).abs().max().item() for x, y in zip(p_harp, p_gloo))
        diff = max([diff] + [(x - y).abs().max().item() for x, y in zip(p_harp2, p_gloo)])
        moved = max((x - y).abs().max().item() for x, y in zip(p_harp, _model(torch).parameters()))
        chk(f"DDP {steps} steps, harp ({dev.type}) vs gloo (cpu copies): parameters agree (<= 1e-4)", diff <= 1e-4,
            f"max diff {diff:.3e}")
        chk("DDP moved the parameters (> 1e-3)", moved > 1e-3, f"moved {moved:.3e}")
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, "ok", {"checks": checks, "bad": bad, "timings_s": t,
                            "ddp": {"steps": steps, "max_param_diff": diff, "moved": moved}}))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same checks with CPU tensors (tests this script where there is no GPU)")
    ap.add_argument("--require-cuda", action="store_true", help="no CUDA is a failure (exit 2), not a skip")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=float, default=240)
    a = ap.parse_args()
    out = {"status": "fail", "checks": [], "timings_s": {}, "device": a.device}

    def finish(status, code, msg):
        out["status"] = status
        print(msg)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        sys.exit(code)

    try:
        import torch
    except ImportError as e:
        finish("skip", 2 if a.require_cuda else 0, f"SKIP: no CUDA (torch not importable: {e})")
    out["torch"] = torch.__version__
    if a.device == "cuda":
        if not torch.cuda.is_available():
            finish("skip", 2 if a.require_cuda else 0,
                   f"SKIP: no CUDA (torch {torch.__version__}: torch.cuda.is_available() is False); "
                   "--device cpu runs the same checks on CPU tensors")
        out["gpu"] = torch.cuda.get_device_name(0)
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {out['gpu']}, {a.ranks} ranks")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="harp-torch-cuda-")
    url = f"file://{tmp}/store"
    t0 = time.monotonic()
    ps = [ctx.Process(target=rank_main, args=(r, a.ranks, url, a.device, a.steps, q)) for r in range(a.ranks)]
    for p in ps:
        p.start()
    res = device_check.collect(ps, q, a.ranks, a.timeout)
    out["timings_s"]["total"] = round(time.monotonic() - t0, 2)
    if len(res) < a.ranks:
        finish("fail", 1, f"FAILED: ranks {sorted(set(range(a.ranks)) - set(res))} hung or died "
                          f"(timeout {a.timeout:.0f} s)")
    errs = [f"rank {r}: {v}" for r, (st, v) in sorted(res.items()) if st != "ok"]
    if errs:
        finish("fail", 1, "FAILED:\n" + "\n".join(errs))
    r0 = res[0][1]
    out["checks"] = [{"name": n, "ok": all(dict(res[r][1]["checks"]).get(n, False) for r in res)}
                     for n, _ in r0["checks"]]
    out["timings_s"].update({k: round(v, 3) for k, v in r0["timings_s"].items()})
    out["ddp"] = r0["ddp"]
    for c in out["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}")
    print(f"DDP: max parameter difference harp vs gloo {out['ddp']['max_param_diff']:.3e}, "
          f"moved {out['ddp']['moved']:.3e}")
    print("timings (rank 0, s): " + ", ".join(f"{k} {v}" for k, v in out["timings_s"].items()))
    bad = [b for r in res.values() for b in r[1]["bad"]]
    if bad:
        finish("fail", 1, "FAILED:\n" + "\n".join(bad))
    finish("pass", 0, "ALL TORCH CUDA CHECKS PASSED" if a.device == "cuda" else
           "ALL TORCH CHECKS PASSED (cpu tensors: --device cpu)")


if __name__ == "__main__":
    main()
