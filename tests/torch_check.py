"""Per-rank bodies of tests/test_torch.py: every torch.distributed operation over
the harp backend, checked against values computed locally (and against gloo for
training). Each function runs in a forked rank (tests/harness.py) and returns a
list of failure strings (empty = all good) or measured values.
"""
from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

import harp.torch  # noqa: F401  (registers "harp"; installed harp does this through the entry point)

R = dist.ReduceOp


def init(rank, size, url, backend="harp", timeout=60):
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))


def val(rank, n, dtype, salt=0):
    """Deterministic per-rank data, small enough that no dtype overflows."""
    x = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3 + salt) % 11 + 1
    if dtype.is_complex:
        return torch.complex(x.double(), (x * 2).double()).to(dtype)
    if dtype == torch.bool:
        return (x % 2).bool()
    return x.to(dtype)


DTYPES = [torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
INT_T = {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]  # SUM = or, PRODUCT = and (like gloo)
    if dtype.is_complex:
        return [R.SUM, R.AVG]
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    if dtype in INT_T:
        ops += [R.BAND, R.BOR, R.BXOR]
    else:
        ops += [R.AVG]
    return ops


def expect_reduce(ts, op):
    acc = ts[0].clone()
    for t in ts[1:]:
        if op == R.SUM:
            acc = (acc | t) if acc.dtype == torch.bool else acc + t
        elif op == R.PRODUCT:
            acc = acc * t
        elif op == R.MIN:
            acc = torch.minimum(acc, t)
        elif op == R.MAX:
            acc = torch.maximum(acc, t)
        elif op == R.BAND:
            acc = acc & t
        elif op == R.BOR:
            acc = acc | t
        elif op == R.BXOR:
            acc = acc ^ t
        elif op == R.AVG:
            acc = acc + t
    if op == R.AVG:
        acc = acc / len(ts)
    return acc.to(ts[0].dtype)


def close(a, b):
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    return torch.equal(a, b)


def every_op(rank, size, url):
    """All collectives x dtypes x ops, contiguous and not, sync and async."""
    init(rank, size, url)
    bad = []
    n = 37

    def chk(name, got, exp):
        if not close(got, exp):
            bad.append(f"rank {rank}: {name}: got {got.flatten()[:6].tolist()} expected {exp.flatten()[:6].tolist()}")

    for dt in DTYPES:
        for op in ops_for(dt):
            t = val(rank, n, dt)
            exp = expect_reduce([val(r, n, dt) for r in range(size)], op)
            if op == R.AVG and not (dt.is_floating_point or dt.is_complex):
                continue
            dist.all_reduce(t, op=op)
            chk(f"all_reduce {dt} {op}", t, exp)
        mop = R.SUM if dt.is_complex else R.MAX  # torch refuses MIN/MAX on complex
        # non-contiguous (a column of a 2-D tensor), async with a future
        if dt != torch.bool:
            m = torch.stack([val(rank, n, dt), val(rank, n, dt, 1)], dim=1)
            w = dist.all_reduce(m[:, 1], op=mop, async_op=True)
            w.get_future().wait()
            w.wait()
            chk(f"all_reduce non-contiguous {dt}", m[:, 1], expect_reduce([val(r, n, dt, 1) for r in range(size)], mop))
            chk(f"all_reduce non-contiguous untouched {dt}", m[:, 0], val(rank, n, dt))
        # broadcast from every root
        for root in range(size):
            t = val(rank, n, dt)
            dist.broadcast(t, src=root)
            chk(f"broadcast {dt} root {root}", t, val(root, n, dt))
        # reduce
        if dt != torch.bool:
            root = size - 1
            t = val(rank, n, dt)
            dist.reduce(t, dst=root, op=mop)
            if rank == root:
                chk(f"reduce {dt}", t, expect_reduce([val(r, n, dt) for r in range(size)], mop))
        # all_gather (list), all_gather_into_tensor
        outs = [torch.empty(n, dtype=dt) for _ in range(size)]
        dist.all_gather(outs, val(rank, n, dt))
        for r in range(size):
            chk(f"all_gather {dt} slot {r}", outs[r], val(r, n, dt))
        out = torch.empty(size * n, dtype=dt)
        dist.all_gather_into_tensor(out, val(rank, n, dt))
        chk(f"all_gather_into_tensor {dt}", out, torch.cat([val(r, n, dt) for r in range(size)]))
        # gather / scatter
        root = 0
        g = [torch.empty(n, dtype=dt) for _ in range(size)] if rank == root else None
        dist.gather(val(rank, n, dt), g, dst=root)
        if rank == root:
            for r in range(size):
                chk(f"gather {dt} slot {r}", g[r], val(r, n, dt))
        s_out = torch.empty(n, dtype=dt)
        dist.scatter(s_out, [val(r, n, dt, 5) for r in range(size)] if rank == root else None, src=root)
        chk(f"scatter {dt}", s_out, val(rank, n, dt, 5))
        # alltoall (list) and all_to_all_single with and without splits
        ins = [val(rank, 3 + q, dt, q) for q in range(size)]
        outs = [torch.empty(3 + rank, dtype=dt) for _ in range(size)]
        dist.all_to_all(outs, ins)
        for q in range(size):
            chk(f"all_to_all {dt} from {q}", outs[q], val(q, 3 + rank, dt, rank))
        inp = torch.cat([val(rank, 4, dt, q) for q in range(size)])
        out = torch.empty(4 * size, dtype=dt)
        dist.all_to_all_single(out, inp)
        chk(f"all_to_all_single {dt}", out, torch.cat([val(q, 4, dt, rank) for q in range(size)]))
        isz = [1 + (rank + q) % 3 for q in range(size)]
        osz = [1 + (q + rank) % 3 for q in range(size)]
        inp = torch.cat([val(rank, isz[q] * 2, dt, q).view(-1, 2) for q in range(size)])
        out = torch.empty(sum(osz), 2, dtype=dt)
        dist.all_to_all_single(out, inp, output_split_sizes=osz, input_split_sizes=isz)
        exp = torch.cat([val(q, osz[q] * 2, dt, rank).view(-1, 2) for q in range(size)])
        chk(f"all_to_all_single splits {dt}", out, exp)
        # reduce_scatter (list) and reduce_scatter_tensor
        if dt != torch.bool:
            ins = [val(rank, n, dt, q) for q in range(size)]
            out = torch.empty(n, dtype=dt)
            dist.reduce_scatter(out, ins, op=R.SUM)
            chk(f"reduce_scatter {dt}", out, expect_reduce([val(r, n, dt, rank) for r in range(size)], R.SUM))
            inp = torch.cat([val(rank, n, dt, q) for q in range(size)])
            out = torch.empty(n, dtype=dt)
            dist.reduce_scatter_tensor(out, inp, op=mop)
            chk(f"reduce_scatter_tensor {dt}", out, expect_reduce([val(r, n, dt, rank) for r in range(size)], mop))

    # PREMUL_SUM
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    chk("all_reduce PREMUL_SUM", t, torch.full((5,), sum(r + 1 for r in range(size)) * 0.5))
    # allreduce_coalesced through the coalescing manager and the deprecated API
    ts = [val(rank, k + 1, torch.float32) for k in range(4)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for k, t in enumerate(ts):
        chk(f"coalesced all_reduce {k}", t, expect_reduce([val(r, k + 1, torch.float32) for r in range(size)], R.SUM))
    # all_gather_coalesced-style: all_gather_object uses allgather + broadcast of sizes
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    if objs != [{"rank": r, "s": "x" * r} for r in range(size)]:
        bad.append(f"rank {rank}: all_gather_object {objs}")
    # uneven all_gather
    outs = [torch.empty(r + 2) for r in range(size)]
    dist.all_gather(outs, torch.full((rank + 2,), float(rank)))
    for r in range(size):
        chk(f"uneven all_gather {r}", outs[r], torch.full((r + 2,), float(r)))
    # uneven reduce_scatter
    out = torch.empty(rank + 1)
    dist.reduce_scatter(out, [torch.full((q + 1,), float(rank + q)) for q in range(size)])
    chk("uneven reduce_scatter", out, torch.full((rank + 1,), float(sum(r + rank for r in range(size)))))
    # coalesced all_gather_into_tensor / reduce_scatter_tensor
    outs = [torch.empty(size * 3), torch.empty(size * 2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((3,), float(rank)))
        dist.all_gather_into_tensor(outs[1], torch.full((2,), float(rank * 10)))
    cm.wait()
    chk("coalesced all_gather_into_tensor", outs[0], torch.arange(size).float().repeat_interleave(3))
    chk("coalesced all_gather_into_tensor 2", outs[1], (torch.arange(size) * 10).float().repeat_interleave(2))
    outs = [torch.empty(3), torch.empty(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(outs[0], torch.arange(3 * size).float() + rank)
        dist.reduce_scatter_tensor(outs[1], torch.ones(2 * size) * rank)
    cm.wait()
    chk("coalesced reduce_scatter_tensor", outs[0],
        sum(torch.arange(3 * size).float() + r for r in range(size))[3 * rank:3 * rank + 3])
    chk("coalesced reduce_scatter_tensor 2", outs[1], torch.full((2,), float(sum(range(size)))))
    # allgather_coalesced (the deprecated API still reaches the backend)
    ol = [[torch.empty(2), torch.empty(3, dtype=torch.float32)] for _ in range(size)]
    dist.all_gather_coalesced(ol, [torch.full((2,), float(rank)), torch.full((3,), rank + 0.5)])
    for r in range(size):
        chk(f"all_gather_coalesced {r}", torch.cat(ol[r]), torch.cat([torch.full((2,), float(r)),
                                                                          torch.full((3,), r + 0.5)]))
    # object collectives (broadcast, gather, scatter underneath)
    lst = [rank, "x"] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    if lst != [1, "x"]:
        bad.append(f"rank {rank}: broadcast_object_list {lst}")
    got = [None] * size if rank == 0 else None
    dist.gather_object({"r": rank}, got, dst=0)
    if rank == 0 and got != [{"r": r} for r in range(size)]:
        bad.append(f"gather_object {got}")
    sc = [None]
    dist.scatter_object_list(sc, [f"o{r}" for r in range(size)] if rank == 0 else None, src=0)
    if sc != [f"o{rank}"]:
        bad.append(f"rank {rank}: scatter_object_list {sc}")
    dist.barrier()
    # torch's dist.monitored_barrier() refuses every backend but gloo by name; the method is the group's
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    dist.destroy_process_group()
    return bad


def p2p(rank, size, url, big):
    """send/recv, isend/irecv both ways at once (large), batch_isend_irecv ring, recv from any source."""
    init(rank, size, url)
    bad = []
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    # ring with batch_isend_irecv, both directions at once, large messages
    a = torch.full((big,), float(rank))
    b = torch.full((big,), float(rank) + 0.5)
    ra, rb = torch.empty(big), torch.empty(big)
    ops = [dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.isend, b, prv),
           dist.P2POp(dist.irecv, ra, prv), dist.P2POp(dist.irecv, rb, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if not (torch.all(ra == prv) and torch.all(rb == nxt + 0.5)):
        bad.append(f"rank {rank}: batch_isend_irecv ring got {ra[0]} {rb[0]}")
    # blocking send/recv with tags, non-contiguous and int16
    if rank == 0:
        for peer in range(1, size):
            dist.send(torch.arange(10, dtype=torch.int16) * peer, peer, tag=7)
            m = torch.zeros(4, 6)[:, ::2]
            dist.recv(m, peer, tag=9)
            if not torch.equal(m, torch.full((4, 3), float(peer))):
                bad.append(f"rank 0: recv non-contiguous from {peer}: {m}")
    else:
        r = torch.empty(10, dtype=torch.int16)
        dist.recv(r, 0, tag=7)
        if not torch.equal(r, torch.arange(10, dtype=torch.int16) * rank):
            bad.append(f"rank {rank}: recv int16 {r}")
        dist.send(torch.full((4, 3), float(rank)), 0, tag=9)
    # recv from any source: rank 0 collects one message from every other rank, in whatever order
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.empty(3)
            src = dist.recv(t, tag=3)
            if not torch.equal(t, torch.full((3,), float(src))):
                bad.append(f"rank 0: anysource from {src} got {t}")
            seen.add(src)
        if seen != set(range(1, size)):
            bad.append(f"rank 0: anysource sources {seen}")
        w = dist.irecv(torch.empty(3), tag=4)  # async any-source
        w.wait()
        if w._source_rank() != size - 1:
            bad.append(f"rank 0: irecv anysource source {w._source_rank()}")
    else:
        time.sleep(0.05 * (size - rank))
        dist.send(torch.full((3,), float(rank)), 0, tag=3)
        if rank == size - 1:
            dist.send(torch.ones(3), 0, tag=4)
    dist.barrier()
    dist.destroy_process_group()
    return bad


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _data(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _train(model, group, hook=None, hook_state=None, steps=5):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, process_group=group, bucket_cap_mb=0.001)  # several buckets: overlap with backward
    if hook is not None:
        ddp.register_comm_hook(hook_state if hook_state is not None else group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(steps):
        x, y = _data(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp_vs_gloo(rank, size, url):
    """DDP over harp (default group) vs DDP over gloo (a gloo group on the same ranks): same parameters,
    with no hook, fp16/bf16 compression and PowerSGD."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    init(rank, size, url)
    gloo = dist.new_group(backend="gloo")
    harp_pg = dist.group.WORLD
    out = {}
    def bf16_hook(state, bucket):  # DDP refuses the hook by name without NCCL; the hook itself runs fine
        return dh.bf16_compress_hook(state, bucket)

    cases = [("plain", None, None), ("fp16", dh.fp16_compress_hook, None), ("bf16", bf16_hook, None),
             ("powersgd", ps.powerSGD_hook, "ps")]
    for name, hook, st in cases:
        res = []
        for pg in (harp_pg, gloo):
            state = ps.PowerSGDState(process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                     min_compression_rate=0.5, random_seed=0) if st else None
            t0 = time.monotonic()
            res.append(_train(_model(), pg, hook, state))
            out.setdefault("times", []).append((name, round(time.monotonic() - t0, 3)))
        diff = max((a - b).abs().max().item() for a, b in zip(*res))
        moved = max((a - b).abs().max().item() for a, b in zip(res[0], _model().parameters()))
        out[name] = (diff, moved)
    t0 = time.monotonic()
    dist.destroy_process_group()
    return out


def _sharded_vs_reference(rank, size, mesh=None):
    """fully_shard (over `mesh`, or the world) on CPU over harp, 3 steps, against a local
    full-batch reference: (largest parameter difference, largest change of the reference)."""
    from torch.distributed.fsdp import fully_shard

    kw = {} if mesh is None else {"mesh": mesh}
    model = _model(1)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = _model(1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x, y = _data(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ropt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(_data(r, step)[0]), _data(r, step)[1]) for r in range(size)) / size
        loss.backward()
        ropt.step()
    diff = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        diff = max(diff, (full.detach() - q.detach()).abs().max().item())
    moved = max((a.detach() - b.detach()).abs().max().item() for a, b in zip(ref.parameters(), _model(1).parameters()))
    return diff, moved


def fsdp_train(rank, size, url):
    """fully_shard on CPU over harp: the parameters after training equal a local full-batch reference."""
    init(rank, size, url)
    diff, _ = _sharded_vs_reference(rank, size)
    dist.destroy_process_group()
    return diff


def groups(rank, size, url):
    """new_group subsets, two groups in turn, destroy one, re-init after destroy."""
    bad = []
    init(rank, size, url)
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        if not torch.all(t == 3):
            bad.append(f"rank {rank}: subgroup allreduce {t}")
        if dist.get_backend(sub) != "harp":
            bad.append(f"backend of subgroup: {dist.get_backend(sub)}")
    t = torch.ones(2)
    dist.all_reduce(t)
    if not torch.all(t == size):
        bad.append(f"rank {rank}: world allreduce after subgroup {t}")
    # new_subgroups: one group per rank (size-1 groups work too)
    cur, _ = dist.new_subgroups(group_size=1)
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=cur)
    if not torch.all(t == rank):
        bad.append(f"rank {rank}: size-1 subgroup allreduce {t}")
    # split_group needs a bound accelerator device in torch 2.13 (for every backend): a clear torch error
    try:
        dist.split_group(split_ranks=[[0, 1]])
        bad.append("split_group unexpectedly worked without a device")
    except RuntimeError as e:
        if "device" not in str(e).lower():
            bad.append(f"split_group error: {e}")
    if rank in (0, 1):
        dist.destroy_process_group(sub)
    dist.destroy_process_group()
    # re-init in the same process (fresh store file is the caller's job: use a second url)
    init(rank, size, url + ".2")
    t = torch.ones(2)
    dist.all_reduce(t)
    if not torch.all(t == size):
        bad.append(f"rank {rank}: allreduce after re-init {t}")
    dist.destroy_process_group()
    return bad


def rendezvous(rank, size, method, port, tmp):
    """env://, tcp://, file:// (the Store torch makes is what HARP rendezvous through)."""
    torch.set_num_threads(1)
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        dist.init_process_group("harp", timeout=datetime.timedelta(seconds=30))
    elif method == "tcp":
        dist.init_process_group("harp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    else:
        dist.init_process_group("harp", init_method=f"file://{tmp}", rank=rank, world_size=size)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    ok = torch.all(t == sum(range(size))).item()
    name = dist.get_backend()
    dist.destroy_process_group()
    return ok, name


def mixed(rank, size, url):
    """"cpu:harp,cuda:gloo": CPU tensors through harp; the cuda entry builds gloo inside the harp group."""
    init(rank, size, url, backend="cpu:harp,cuda:gloo")
    pg = dist.group.WORLD
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    res = (type(pg).__name__, sorted(pg._other), torch.all(t == sum(r + 1 for r in range(size))).item())
    dist.destroy_process_group()
    init(rank, size, url + ".b", backend="cpu:harp,cuda:harp")  # harp for both: one group, nothing else built
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    res += (sorted(dist.group.WORLD._other), torch.all(t == sum(r + 1 for r in range(size))).item())
    dist.destroy_process_group()
    return res


def errors_mismatch(rank, size, url):
    """Rank 0 and the others call allreduce with different counts: every rank raises DistBackendError."""
    init(rank, size, url, timeout=10)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4 if rank == 0 else 5))
        return ("no error", 0.0)
    except dist.DistBackendError as e:
        return (str(e), time.monotonic() - t0)


def errors_dead(rank, size, url):
    """The last rank dies; the survivors' next allreduce raises DistBackendError within the timeout."""
    init(rank, size, url, timeout=8)
    dist.all_reduce(torch.ones(4))
    if rank == size - 1:
        os._exit(3)
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 16))
        dist.all_reduce(torch.ones(1 << 16))
        return ("no error", 0.0)
    except dist.DistBackendError as e:
        return (str(e), time.monotonic() - t0)


def errors_monitored(rank, size, url):
    """Rank 1 skips monitored_barrier: rank 0 names it."""
    init(rank, size, url, timeout=20)
    try:
        if rank != 1:
            dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=3), wait_all_ranks=True)
        else:
            time.sleep(5)
        return "no error"
    except dist.DistBackendError as e:
        return str(e)


# torch's own matching rules (torch/testing/_internal/distributed/distributed_test.py), kept verbatim:
# _test_barrier_timeout's assertRaisesRegex(Exception, " (Timed out|closed|timeout) ") and
# test_monitored_barrier_gloo_rank_0_timeout's f"Rank {rank} timed out in monitoredBarrier".
TORCH_TIMEOUT_RE = " (Timed out|closed|timeout) "
TORCH_MB_RANK0_RE = "Rank 0 timed out in monitoredBarrier"


def timeouts_torch_words(rank, size, url):
    """Both torch scenarios, as our own code: a full group of 1 s where only rank 0 calls barrier;
    a new group's monitored_barrier(timedelta(0)) on rank 0 alone, and one with wait_all_ranks."""
    import re
    init(rank, size, url, timeout=60)
    out = {}
    g = dist.new_group(timeout=datetime.timedelta(seconds=1))
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(g)
            out["barrier"] = ("no error", 0.0)
        except Exception as e:  # noqa: BLE001 - torch's test catches Exception
            out["barrier"] = (str(e), time.monotonic() - t0)
    dist.barrier()  # rank 1 stays until rank 0's group barrier has timed out
    g0 = dist.new_group(timeout=datetime.timedelta(seconds=60))
    if rank == 0:  # a per-call timeout of 0 is zero too, not the group's 60 s
        t0 = time.monotonic()
        try:
            dist.barrier(g0, timeout=datetime.timedelta(0))
            out["barrier0"] = ("no error", 0.0)
        except Exception as e:  # noqa: BLE001
            out["barrier0"] = (str(e), time.monotonic() - t0)
    dist.barrier()
    pg = dist.new_group(ranks=list(range(size)))
    if rank == 0:
        for wait_all in (False, True):
            t0 = time.monotonic()
            try:
                pg.monitored_barrier(datetime.timedelta(0), wait_all_ranks=wait_all)
                out[f"mb{wait_all}"] = ("no error", 0.0, "")
            except RuntimeError as e:
                out[f"mb{wait_all}"] = (str(e), time.monotonic() - t0, type(e).__name__)
    dist.barrier()
    dist.destroy_process_group()
    return out, bool(re.search(TORCH_TIMEOUT_RE, out.get("barrier", ("",))[0]))


def torch_suite(rank, size, url, tmp, names):
    """torch's own test methods, unmodified, with harp as the world's backend in gloo's place:
    distributed_test.py reads BACKEND at import and gates these tests on "gloo"; every group they
    create (dist.new_group) takes the world's backend, harp."""
    import unittest
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(size), INIT_METHOD=url, TEMP_DIR=tmp)
    from torch.testing._internal.common_utils import TestCase
    from torch.testing._internal.distributed import distributed_test as dt
    init(rank, size, url, timeout=60)

    class Suite(dt.DistributedTest._DistTestBase, TestCase):  # torch's TestCase: its assert helpers
        pass

    from torch.testing._internal.common_distributed import TEST_SKIPS
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    out = {}
    for name in names:
        case = Suite(name)
        case.rank, case.world_size = rank, size
        method = getattr(case, name)
        if getattr(method, "__unittest_skip__", False):  # unittest skips these before they start
            out[name] = (f"skipped: {method.__unittest_skip_why__}", 0.0)
            dist.barrier()
            continue
        t0 = time.monotonic()
        try:
            method()
            out[name] = ("ok", time.monotonic() - t0)
        except unittest.SkipTest as e:
            out[name] = (f"skipped: {e}", 0.0)
        except SystemExit as e:  # torch's skip decorators exit with a code naming the reason
            out[name] = (f"skipped: {skip_codes[e.code]}" if e.code in skip_codes else f"SystemExit({e.code})", 0.0)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out[name] = (f"{type(e).__name__}: {e}", time.monotonic() - t0)
        dist.barrier()
    dist.destroy_process_group()
    return out


def errors_local(rank, size, url):
    """Local argument errors: clear messages; the group stays usable."""
    init(rank, size, url)
    msgs = []
    for fn in (lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)),
               lambda: dist.all_reduce(torch.empty(2, device="meta")),
               lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=R.MAX)):
        try:
            fn()
            msgs.append("no error")
        except Exception as e:  # noqa: BLE001
            msgs.append(f"{type(e).__name__}: {e}")
    t = torch.ones(2)
    dist.all_reduce(t)
    msgs.append(bool(torch.all(t == size)))
    dist.destroy_process_group()
    return msgs


def cuda_ops(rank, size, url):
    """CUDA tensors (staged through pinned memory in stream order): allreduce, broadcast, allgather, p2p."""
    torch.cuda.set_device(0)
    init(rank, size, url, backend="cpu:harp,cuda:harp")
    bad = []
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.full((1 << 20,), float(rank + 1), device="cuda")
        t.mul_(2)  # queued on s before the collective: staging must see it
        dist.all_reduce(t)
        t.add_(1)  # after: must see the result
    s.synchronize()
    if not torch.all(t == 2 * sum(r + 1 for r in range(size)) + 1):
        bad.append(f"rank {rank}: cuda allreduce {t[:3]}")
    b = torch.full((7,), float(rank), device="cuda")
    dist.broadcast(b, 0)
    if not torch.all(b == 0):
        bad.append(f"rank {rank}: cuda broadcast {b}")
    out = torch.empty(size * 5, device="cuda")
    dist.all_gather_into_tensor(out, torch.full((5,), float(rank), device="cuda"))
    if not torch.equal(out.cpu(), torch.arange(size).float().repeat_interleave(5)):
        bad.append(f"rank {rank}: cuda all_gather {out}")
    w = dist.all_reduce(torch.ones(3, device="cuda"), async_op=True)
    v = w.get_future().wait()[0]
    if not torch.all(v == size):
        bad.append(f"rank {rank}: cuda future {v}")
    dist.destroy_process_group()
    return bad


def sparse_input(rank, dtype, shape=(13, 5, 3), sparse_dim=2):
    """Rank r's sparse COO input: overlapping indices across ranks, duplicates within a rank (so the
    input is uncoalesced), nnz differing per rank and none on rank 1; dense part of shape[sparse_dim:]."""
    g = torch.Generator().manual_seed(100 + rank)
    nnz = 0 if rank == 1 else 4 + 3 * rank
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)])
    vals = torch.randint(-5, 6, (nnz,) + tuple(shape[sparse_dim:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)


def sparse_allreduce(rank, size, url):
    """Sparse allreduce: SUM and AVG, sync and async, 4 dtypes, against the sum of the dense
    forms of every rank's input; returns (failures, every result's bytes) for the cross-rank check."""
    init(rank, size, url)
    bad, outs = [], []
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        for op in (R.SUM, R.AVG):
            for asyn in (False, True):
                t = sparse_input(rank, dtype)
                exp = sum(sparse_input(r, dtype).to_dense().double() for r in range(size))
                if op == R.AVG:
                    exp = torch.trunc(exp / size) if dtype == torch.int64 else exp / size
                w = dist.all_reduce(t, op=op, async_op=asyn)
                if asyn:
                    w.wait()
                    if not (w.result()[0] is t):
                        bad.append(f"{dtype} {op} async: result() is not the input tensor")
                tol = 0.05 if dtype == torch.bfloat16 else 1e-6
                if not t.is_sparse or not torch.allclose(t.to_dense().double(), exp, atol=tol, rtol=tol):
                    bad.append(f"{dtype} {op} async={asyn}: wrong result {t}")
                c = t.coalesce()
                outs.append((c.indices().numpy().tobytes(), c.values().view(torch.uint8).numpy().tobytes()))
    # a dense allreduce afterwards still works (same communicator, issue order kept)
    d = torch.ones(5)
    dist.all_reduce(d)
    if not torch.all(d == size):
        bad.append(f"dense allreduce after sparse: {d}")
    dist.destroy_process_group()
    return bad, outs


def sparse_mismatch(rank, size, url):
    """Ranks whose sparse tensors differ in shape: the same ValueError on every rank, then the group works."""
    init(rank, size, url)
    msgs = []
    for t in (sparse_input(0, torch.float32, shape=(13, 5, 3) if rank != size - 1 else (13, 6, 3)),
              sparse_input(0, torch.float32 if rank != size - 1 else torch.float64)):
        try:
            dist.all_reduce(t)
            msgs.append("no error")
        except ValueError as e:
            msgs.append(str(e))
    d = torch.ones(2)
    dist.all_reduce(d)
    dist.destroy_process_group()
    return msgs, bool(torch.all(d == size))


def threads_fit(rank, size, url, threads, one_core, env):
    """torch.get_num_threads() after the harp group forms (python/harp/torch/_threads.py), having
    started with `threads` on one core each (one_core) or the usual affinity; env set/unset (None)."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if one_core:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
    torch.set_num_threads(threads)
    try:
        dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=60))
    except Exception as e:  # noqa: BLE001 - the test reads the message
        return f"{type(e).__name__}: {e}"
    n = torch.get_num_threads()
    dist.destroy_process_group()
    return n


def hsdp_train(rank, size, url):
    """HSDP: fully_shard over a 2 x (size/2) DeviceMesh (replicate x shard) on harp subgroups; the
    parameters after training equal a local full-batch reference."""
    from torch.distributed.device_mesh import init_device_mesh

    init(rank, size, url)
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("replicate", "shard"))
    diff, moved = _sharded_vs_reference(rank, size, mesh)
    backend = dist.get_backend(mesh.get_group("shard"))
    dist.destroy_process_group()
    return diff, moved, backend
