"""harp.horovod.torch: Horovod's torch API on HARP, checked against local references.

Ranks are real processes (tests/harness.py) on tcp and shm, 3 ranks (not a power
of two). Every collective result is compared with what numpy/torch compute
locally from every rank's (seeded) input; the training test compares a
Horovod-style script (examples/horovod/train_convnet.py, unmodified but for its
import) with the same training under torch DDP. hvd.join runs with uneven batch
counts per rank (5/3/4 on tcp, 3/5/5 on shm) against a local reference of
Horovod's join semantics (joined ranks contribute zeros, Average divides by size).
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N = 3
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]


def _data(rank, dtype, shape=(7, 3)):
    g = torch.Generator().manual_seed(17 + rank)
    x = torch.randint(-4, 5, shape, generator=g).to(getattr(torch, dtype))
    return x if dtype.startswith("int") else x + torch.rand(shape, generator=g).to(getattr(torch, dtype)) / 4


def _ops_body(rank, size):
    import harp.horovod.torch as hvd
    hvd.init()
    out = {}
    for dt in DTYPES:
        x = _data(rank, dt)
        keep = x.clone()
        for name in ("Sum", "Min", "Max", "Product", "Average"):
            if name == "Average" and dt.startswith("int"):
                continue
            out[(dt, name)] = hvd.allreduce(x, op=getattr(hvd, name)).double().numpy()
        assert torch.equal(x, keep), "out-of-place allreduce changed its input"
        y = x.t()  # not contiguous: in place through a contiguous copy
        hvd.allreduce_(y, op=hvd.Sum)
        out[(dt, "inplace_t")] = y.double().numpy()
    x = _data(rank, "float32")
    h = hvd.allreduce_async(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    out["scaled"] = hvd.synchronize(h).double().numpy()
    with pytest.raises(ValueError, match="unknown or already synchronized"):
        hvd.synchronize(h)
    grouped = hvd.grouped_allreduce([_data(rank, "float32", (5,)), _data(rank, "int64", (4,)),
                                     _data(rank, "float32", (2, 2))], op=hvd.Sum)
    out["grouped"] = [t.double().numpy() for t in grouped]
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(x, op=hvd.Adasum)
    out["join"] = hvd.join()  # without init(join=True): every rank joins at the same point, one round
    out["after_join"] = hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()
    hvd.shutdown()
    return out


def test_allreduce_every_op_and_dtype_matches_a_local_reference():
    # tcp here; the optimizer tests below run on shm
    res = harness.run_ranks(N, _ops_body, env={"HARP_TRANSPORT": "tcp"}, timeout=240)
    for dt in DTYPES:
        xs = np.stack([_data(r, dt).double().numpy() for r in range(N)])
        refs = {"Sum": xs.sum(0), "Min": xs.min(0), "Max": xs.max(0), "Product": xs.prod(0),
                "Average": xs.mean(0), "inplace_t": xs.sum(0).T}
        tol = {"float16": 2e-2, "bfloat16": 6e-2}.get(dt, 1e-6)
        for name, ref in refs.items():
            if (dt, name) not in res[0]:
                continue
            # the reference rounded to the dtype, as every rank's contribution is
            want = torch.from_numpy(ref).to(getattr(torch, dt)).double().numpy()
            for r in range(N):
                got = res[r][(dt, name)]
                assert np.allclose(got, want, rtol=tol, atol=tol), (dt, name, r, got, want)
                assert np.array_equal(got, res[0][(dt, name)]), (dt, name, "ranks differ")
    xs = np.stack([_data(r, "float32").double().numpy() for r in range(N)])
    assert np.allclose(res[1]["scaled"], (2.0 * xs).sum(0) * 0.25, rtol=1e-6)
    gx = [np.stack([_data(r, dt, shp).double().numpy() for r in range(N)]).sum(0)
          for dt, shp in (("float32", (5,)), ("int64", (4,)), ("float32", (2, 2)))]
    for got, want in zip(res[2]["grouped"], gx):
        assert np.allclose(got, want, rtol=1e-6), (got, want)
    for r in range(N):  # all joined in the same round: the highest rank is the last joiner
        assert res[r]["join"] == N - 1 and res[r]["after_join"] == [N, N], res[r]


def _movement_body(rank, size):
    import harp
    import harp.horovod.torch as hvd
    hvd.init()
    out = {}
    out["allgather"] = hvd.allgather(torch.full((rank + 1, 2), rank, dtype=torch.bfloat16)).float().numpy()
    out["bcast"] = hvd.broadcast(torch.arange(5, dtype=torch.float64) * (rank + 1), root_rank=2).numpy()
    t = torch.arange(4, dtype=torch.int32) + 10 * rank
    hvd.broadcast_(t, root_rank=1)
    out["bcast_"] = t.numpy()
    splits = [(rank + d) % 3 for d in range(size)]  # uneven, some empty
    rows = torch.arange(sum(splits) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank
    got, rsplits = hvd.alltoall(rows, splits=splits)
    out["alltoall"] = (got.numpy(), rsplits.tolist(), splits)
    out["object"] = hvd.broadcast_object({"from": rank, "list": list(range(rank + 3))}, root_rank=1)
    out["objects"] = hvd.allgather_object(("rank", rank))
    out["local"] = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    try:  # trailing dimensions disagree: every rank is told, naming the ranks
        hvd.allgather(torch.zeros(2, 3 if rank == 1 else 4))
        out["mismatch"] = None
    except harp.HarpError as e:
        out["mismatch"] = str(e)
    hvd.shutdown()
    return out


def test_allgather_broadcast_alltoall_objects():
    res = harness.run_ranks(N, _movement_body, env={"HARP_TRANSPORT": "tcp"}, timeout=240)
    want_ag = np.concatenate([np.full((r + 1, 2), r, np.float32) for r in range(N)])
    for r in range(N):
        o = res[r]
        assert np.array_equal(o["allgather"], want_ag)
        assert np.array_equal(o["bcast"], np.arange(5) * 3.0)
        assert np.array_equal(o["bcast_"], np.arange(4) + 10)
        got, rsplits, _ = o["alltoall"]
        assert rsplits == [res[src]["alltoall"][2][r] for src in range(N)]
        want = []
        for src in range(N):
            s = res[src]["alltoall"][2]
            base = np.arange(sum(s) * 2, dtype=np.float32).reshape(-1, 2) + 100 * src
            want.append(base[sum(s[:r]):sum(s[:r + 1])])
        assert np.array_equal(got, np.concatenate(want)), (r, got)
        assert o["object"] == {"from": 1, "list": [0, 1, 2, 3]}
        assert o["objects"] == [("rank", q) for q in range(N)]
        assert o["local"] == (r, N, 0, 1)  # one host
        assert o["mismatch"] and "differ beyond the first dimension" in o["mismatch"], o["mismatch"]


class _Boom:
    """Unpickling this runs code: the MAC must refuse the payload before pickle sees it."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _tamper_body(rank, size, how, marker):
    import pickle
    import harp
    import harp.horovod.torch as hvd
    hvd.init()
    c = hvd._comm()
    out = {"ok": hvd.broadcast_object({"k": [1, 2]}, root_rank=0)}
    if rank == 1:  # an on-path injector: what rank 1 receives is replaced after the MAC was made
        real = c.broadcast

        def injected(x, root=0):
            r = real(x, root=root)
            if x.dtype == np.uint8 and x.size:
                if how == "flip":
                    x[len(x) // 3] ^= 0x40
                else:  # a whole forged pickle, of the same length, with a MAC made under a key it guessed
                    forged = pickle.dumps(_Boom(marker))
                    forged = (forged + b"." * x.size)[:x.size - 32] + bytes(32)
                    x[:] = np.frombuffer(forged, np.uint8)
            return r
        c.broadcast = injected
    try:
        out["tampered"] = ("ok", hvd.broadcast_object({"from": rank, "pad": "x" * 200}, root_rank=0))
    except harp.HarpError as e:
        out["tampered"] = (type(e).__name__, str(e))
    if rank == 1:
        c.broadcast = real
    out["after"] = hvd.allgather_object(rank * 3)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("how", ["flip", "forged"])
def test_broadcast_object_refuses_a_payload_that_fails_its_mac_before_unpickling(how, tmp_path):
    """hvd.broadcast_object and allgather_object pickle (as Horovod does), but seal the bytes with an
    HMAC under the communicator's token: a receiver refuses altered or forged bytes, naming the
    source rank, and never unpickles them (the forged pickle would run code)."""
    marker = tmp_path / "pickle-ran"
    res = harness.run_ranks(3, _tamper_body, how, str(marker), env={"HARP_TRANSPORT": "tcp"}, timeout=120)
    for r, o in enumerate(res):
        assert o["ok"] == {"k": [1, 2]}
        if r == 1:
            kind, text = o["tampered"]
            assert kind == "InvalidArgumentError", o
            assert "from rank 0 fails its MAC" in text and "nothing unpickled" in text, text
        else:
            assert o["tampered"] == ("ok", {"from": 0, "pad": "x" * 200}), o
        assert o["after"] == [0, 3, 6]
    assert not marker.exists()


def _model():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)


def _train_body(rank, size, passes, fp16, steps):
    import harp.horovod.torch as hvd
    hvd.init()
    torch.manual_seed(rank)  # different start on every rank
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.zeros(1, 6)).sum().backward()  # give the optimizer state on rank 0 only, to broadcast
    if rank == 0:
        opt.step()
    opt.zero_grad()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    start = [p.detach().clone() for p in model.parameters()]
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none,
                                    backward_passes_per_step=passes)
    for step in range(steps):
        dopt.zero_grad()
        for k in range(passes):
            x, y = _batch(rank, step * passes + k)
            torch.nn.functional.mse_loss(model(x), y).backward()
        dopt.step()
    hvd.shutdown()
    return [p.detach().numpy() for p in model.parameters()], [s.numpy() for s in start], [m.numpy() for m in momentum]


def _reference(start, momentum, size, passes, steps):
    """The same training, alone: each step's gradient is the mean over ranks of each rank's accumulated one."""
    model = _model()
    with torch.no_grad():
        for p, s in zip(model.parameters(), start):
            p.copy_(torch.from_numpy(s))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p, m in zip(model.parameters(), momentum):
        opt.state[p]["momentum_buffer"] = torch.from_numpy(m).clone()
    for step in range(steps):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(size):
            for k in range(passes):
                model.zero_grad()
                x, y = _batch(r, step * passes + k)
                torch.nn.functional.mse_loss(model(x), y).backward()
                for g, p in zip(grads, model.parameters()):
                    g += p.grad / size
        for g, p in zip(grads, model.parameters()):
            p.grad = g
        opt.step()
    return [p.detach().numpy() for p in model.parameters()]


@pytest.mark.parametrize("passes,fp16", [(1, False), (2, False), (1, True)], ids=["plain", "2passes", "fp16"])
def test_distributed_optimizer_equals_training_on_the_mean_gradient(passes, fp16):
    steps = 4
    res = harness.run_ranks(N, _train_body, passes, fp16, steps, env={"HARP_TRANSPORT": "shm"}, timeout=300)
    params0, start0, mom0 = res[0]
    for r in range(N):  # broadcast_parameters / broadcast_optimizer_state gave every rank rank 0's start
        assert all(np.array_equal(a, b) for a, b in zip(res[r][1], start0))
        assert all(np.array_equal(a, b) for a, b in zip(res[r][2], mom0))
        assert all(np.array_equal(a, b) for a, b in zip(res[r][0], params0)), "ranks diverged"
    ref = _reference(start0, mom0, N, passes, steps)
    tol = 2e-3 if fp16 else 1e-5
    for got, want in zip(params0, ref):
        assert np.allclose(got, want, rtol=tol, atol=tol), np.abs(got - want).max()
    assert not all(np.allclose(a, b) for a, b in zip(params0, start0)), "training did not move the parameters"


def _unused_body(rank, size):
    import harp.horovod.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    params = list(a.parameters()) + list(b.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=
                                   [(f"p{i}", p) for i, p in enumerate(params)])
    x = torch.ones(1, 4)
    out = a(x) if rank != 1 else a(x) + b(x)  # only rank 1 uses b
    out.sum().backward()
    opt.step()
    hvd.shutdown()
    return [p.detach().numpy() for p in params]


def test_a_parameter_unused_on_some_ranks_does_not_hang_or_mispair():
    res = harness.run_ranks(N, _unused_body, env={"HARP_TRANSPORT": "tcp"}, timeout=120)
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    # a's gradient is the same on every rank; b's exists on rank 1 only: averaged, it is 1/3 of rank 1's
    want = [a.weight - 1.0, a.bias - 1.0, b.weight - 1.0 / N, b.bias - 1.0 / N]
    for r in range(N):
        for got, w in zip(res[r], want):
            assert np.allclose(got, w.detach().numpy(), atol=1e-6), (r, got, w)


def _run(script, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", str(N), os.path.join(ROOT, "examples", "horovod",
                        script), *args], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"FINAL loss (\S+) checksum (\S+) size (\d+)", r.stdout)
    assert m and int(m.group(3)) == N, r.stdout
    return float(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("args", [[], ["--batches-per-allreduce", "2"]], ids=["1pass", "2passes"])
def test_horovod_style_script_matches_ddp(args):
    loss_h, sum_h = _run("train_convnet.py", *args)
    loss_d, sum_d = _run("train_convnet_ddp.py", *args)
    assert abs(loss_h - loss_d) <= 1e-5 * abs(loss_d), (loss_h, loss_d)
    assert abs(sum_h - sum_d) <= 1e-5 * max(1.0, abs(sum_d)), (sum_h, sum_d)


def _run_elastic(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", HARP_TIMEOUT="120")
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "3", "--grace", "240",
                        os.path.join(ROOT, "examples", "horovod", "train_convnet_elastic.py"), "--steps", "6", *args],
                       capture_output=True, text=True, timeout=300, env=env)
    finals = re.findall(r"FINAL rank (\d+) size (\d+) steps (\d+) resets (\d+) loss ([-0-9.]+) checksum ([-0-9.]+)", r.stdout)
    return r, finals


def test_elastic_script_survives_a_lost_worker_and_finishes_every_step():
    """hvd.elastic: rank 2 of 3 kills itself at step 3; the two others shrink, roll back to the last commit
    and finish all 6 steps with identical parameters. Undisturbed, all three finish with no reset."""
    r, finals = _run_elastic()
    assert r.returncode == 0 and len(finals) == 3, r.stdout + r.stderr
    assert {(f[1], f[2], f[3]) for f in finals} == {("3", "6", "0")}, finals
    r, finals = _run_elastic("--die-rank", "2", "--die-at-step", "3")
    assert r.returncode != 0, "harp-run reports the rank that died"
    assert sorted(f[0] for f in finals) == ["0", "1"], r.stdout + r.stderr
    assert {(f[1], f[2], f[3]) for f in finals} == {("2", "6", "1")}, finals
    assert len({f[5] for f in finals}) == 1, finals  # the survivors hold the same parameters
    assert "lost rank(s) [2]" in r.stdout, r.stdout


# -- hvd.join: uneven batch counts per rank ------------------------------------------------------
def _join_body(rank, size, counts):
    import harp.horovod.torch as hvd
    hvd.init(join=True)
    torch.manual_seed(0)  # the same start on every rank
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    out = {"loss": [], "grouped": [], "avg": []}
    for step in range(counts[rank]):
        opt.zero_grad()
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        out["loss"].append(hvd.allreduce(loss.detach(), op=hvd.Sum).item())
        h = hvd.allreduce_async(torch.ones(4), op=hvd.Average)
        ints, floats = hvd.grouped_allreduce([torch.ones(2, dtype=torch.int64),
                                              torch.full((3,), rank + 1.0, dtype=torch.float64)], op=hvd.Sum)
        out["grouped"].append((ints.tolist(), floats.tolist()))
        out["avg"].append(hvd.synchronize(h).tolist())
    out["last"] = hvd.join()
    out["params"] = [p.detach().clone().numpy() for p in model.parameters()]
    out["after"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).item()
    hvd.broadcast_parameters(model.state_dict(), root_rank=out["last"])
    out["synced"] = [p.detach().numpy() for p in model.parameters()]
    hvd.shutdown()
    return out


def _join_reference(counts, size):
    """Horovod's join semantics, alone: at step s the ranks with a batch left contribute their gradients,
    the joined ones zeros, and Average divides by size. Parameters after each step and the step losses."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params, losses = [], []
    for step in range(max(counts)):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        total = 0.0
        for r in range(size):
            if counts[r] <= step:
                continue
            model.zero_grad()
            x, y = _batch(r, step)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            total += loss.item()
            for g, p in zip(grads, model.parameters()):
                g += p.grad / size
        for g, p in zip(grads, model.parameters()):
            p.grad = g
        opt.step()
        losses.append(total)
        params.append([p.detach().clone().numpy() for p in model.parameters()])
    return params, losses


@pytest.mark.parametrize("transport,counts", [("tcp", [5, 3, 4]), ("shm", [3, 5, 5])],
                         ids=["tcp-5-3-4", "shm-3-5-5"])
def test_join_uneven_batches_equal_horovods_zero_contributions(transport, counts):
    """Ranks with fewer batches call hvd.join(); the others keep training with DistributedOptimizer,
    allreduce, allreduce_async and grouped_allreduce, the joined ranks standing in with zeros."""
    res = harness.run_ranks(N, _join_body, counts, env={"HARP_TRANSPORT": transport}, timeout=300)
    ref_params, ref_losses = _join_reference(counts, N)
    last = max(r for r in range(N) if counts[r] == max(counts))  # of the final round's joiners, the highest
    for r in range(N):
        o = res[r]
        assert o["last"] == last, (r, o["last"])
        for s in range(counts[r]):
            active = [q for q in range(N) if counts[q] > s]
            assert o["grouped"][s] == ([len(active)] * 2, [float(sum(q + 1 for q in active))] * 3), (r, s)
            assert np.allclose(o["avg"][s], [len(active) / N] * 4, rtol=1e-6), (r, s, o["avg"][s])  # over size
            assert abs(o["loss"][s] - ref_losses[s]) <= 1e-5 * max(1.0, ref_losses[s]), (r, s)
        # a joined rank's model stopped at its own last step
        for got, want in zip(o["params"], ref_params[counts[r] - 1]):
            assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (r, np.abs(got - want).max())
        assert o["after"] == sum(range(N)), o["after"]  # a normal allreduce after everyone joined
        for got, want in zip(o["synced"], res[last]["params"]):
            assert np.array_equal(got, want), r
    assert not np.allclose(ref_params[-1][0], ref_params[min(counts) - 1][0]), "the extra steps moved nothing"


def _join_refuses_body(rank, size):
    import harp
    import harp.horovod.torch as hvd
    hvd.init(join=True)
    out = {}
    if rank == 1:
        out["last"] = hvd.join()
    else:
        try:
            hvd.broadcast(torch.ones(2), root_rank=0)
            out["bcast"] = None
        except harp.InvalidArgumentError as e:
            out["bcast"] = str(e)
        x = torch.full((3,), rank + 1.0)
        out["sum"] = hvd.allreduce(x, op=hvd.Sum).tolist()
        out["max"] = hvd.allreduce(-x, op=hvd.Max).tolist()  # the joined rank's zeros count, as in Horovod
        out["last"] = hvd.join()
    out["after"] = hvd.allgather(torch.full((1,), rank)).tolist()  # allowed again once all have joined
    hvd.shutdown()
    return out


def test_join_refuses_other_collectives_while_a_rank_is_joined():
    res = harness.run_ranks(N, _join_refuses_body, env={"HARP_TRANSPORT": "tcp"}, timeout=120)
    for r in range(N):
        assert res[r]["last"] == 2 and res[r]["after"] == [0, 1, 2], res[r]  # ranks 0 and 2 joined together
    for r in (0, 2):
        assert res[r]["bcast"] and "rank 1" in res[r]["bcast"] and "join" in res[r]["bcast"], res[r]["bcast"]
        assert res[r]["sum"] == [4.0] * 3 and res[r]["max"] == [0.0] * 3, res[r]


def _join_without_mode_body(rank, size):
    import harp
    import harp.horovod.torch as hvd
    hvd.init()
    try:
        if rank == 0:
            hvd.join()
        else:
            hvd.allreduce(torch.ones(3), op=hvd.Sum)
        return None
    except harp.HarpError as e:
        return str(e)


def test_join_without_join_mode_while_others_train_errors_everywhere_not_hangs():
    res = harness.run_ranks(N, _join_without_mode_body, env={"HARP_TRANSPORT": "tcp", "HARP_TIMEOUT": "60"},
                            timeout=120)
    assert all(res[r] and "mismatch" in res[r].lower() for r in range(N)), res
    assert "hvd.init(join=True)" in res[0], res[0]
