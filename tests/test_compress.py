"""Wire compression (core/compress/compress.h, harp.compress): fp16/bf16 wire allreduce within
the derived rounding bound, top-k with error feedback, the gate, mismatches, and the switches
reaching the Python API, the torch backend and the NCCL API. Ranks are forked processes over real
sockets (tests/harness.py); every rank count includes odd ones.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from harness import run_ranks

import harp
from harp import _harp
from harp import compress as hc

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BF16 = None

TCP = {"HARP_TRANSPORT": "tcp", "HARP_COMPRESS_MIN_BYTES": "0"}
SLOW_LINK = "tcp 50e-6 8e-9 1e-10\n"  # 1 Gbit/s


def _digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


# --- kernels ---------------------------------------------------------------------------------------

def _edge_floats():
    rng = np.random.default_rng(5)
    spec = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 70000.0, 2.0 ** -14, 2.0 ** -24,
                     2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 1e-30, np.inf, -np.inf, np.nan,
                     1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 3.4e38],
                    dtype=np.float32)
    scales = rng.choice([1e-8, 1e-5, 1e-2, 1, 1e3, 1e5, 1e30], size=20000)
    rnd = (rng.standard_normal(20000) * scales).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, size=20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([spec, -spec, rnd, bits])


def _kernel(kind, what, src, isa, b=None):
    if what == "narrow":
        out = np.empty(src.size, dtype=np.uint16)
    else:
        out = np.empty(src.size, dtype=np.float32)
    bb = b if b is not None else src
    used = _harp.compress_kernel(kind, what, out.ctypes.data, src.ctypes.data, bb.ctypes.data, src.size, isa)
    return out, used


@pytest.mark.parametrize("isa", ["auto", "scalar"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_kernels_round_to_nearest_even_like_numpy(isa):
    x = _edge_floats()
    got, _ = _kernel("fp16", "narrow", x, isa)
    want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(got[nan].view(np.float16)))
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    wide, _ = _kernel("fp16", "widen", halves, isa)
    ref = halves.view(np.float16).astype(np.float32)
    finite = ~np.isnan(ref)
    assert np.array_equal(wide[finite].view(np.uint32), ref[finite].view(np.uint32))
    a = np.linspace(-3, 3, halves.size, dtype=np.float32)
    added, _ = _kernel("fp16", "add", a, isa, b=halves)
    assert np.array_equal(added[finite], (a + ref)[finite])
    if BF16 is not None:
        gotb, _ = _kernel("bf16", "narrow", x, isa)
        wantb = x.astype(BF16).view(np.uint16)
        assert np.array_equal(gotb[~nan], wantb[~nan])
        wideb, _ = _kernel("bf16", "widen", halves, isa)
        refb = halves.view(BF16).astype(np.float32)
        fb = ~np.isnan(refb)
        assert np.array_equal(wideb[fb].view(np.uint32), refb[fb].view(np.uint32))


def test_spec_parsing():
    assert hc.spec_text("fp16") == "fp16"
    assert hc.spec_text("bf16!") == "bf16!"
    assert hc.spec_text("topk:0.01,ef") == "topk:0.01,ef"
    assert hc.spec_text("topk:1000") == "topk:1000"
    assert hc.spec_text("none") == "none"
    for bad in ["fp8", "topk", "topk:0", "topk:-1", "topk:1.5", "fp16,ef", "topk:0.1,xx"]:
        with pytest.raises(harp.InvalidArgumentError, match="not a compression spec"):
            hc.spec_text(bad)
    assert hc.topk_bytes(1000, 4, "topk:0.01") == 3 * 8 * 10


# --- fp16 / bf16 -----------------------------------------------------------------------------------

def _inputs(rank, n, seed):
    rng = np.random.default_rng(seed * 1000 + rank)
    return (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 100.0], size=n)).astype(np.float32)


def _narrow_body(rank, size, kinds, counts):
    comm = harp.init()
    out = {}
    for kind in kinds:
        for n in counts:
            xs = [_inputs(r, n, n) for r in range(size)]
            exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
            bound = hc.error_bound(np.sum(np.abs(np.stack(xs).astype(np.float64)), axis=0), size, kind)
            x = xs[rank].copy()
            got = comm.allreduce(x, np.empty_like(x), compress=kind + "!")
            inplace = comm.allreduce(x.copy(), compress=kind + "!")
            avg = comm.allreduce(x, np.empty_like(x), "avg", compress=kind + "!")
            err = np.abs(got.astype(np.float64) - exact)
            out[(kind, n)] = (_digest(got), _digest(inplace), _digest(avg), bool(np.all(err <= bound)),
                              float(np.max(err / np.maximum(bound, 1e-300))))
    stats = hc.stats(comm)
    comm.destroy()
    return out, stats


@pytest.mark.parametrize("nranks", [2, 3, 4, 5])
def test_fp16_bf16_within_bound_identical_and_reproducible(nranks):
    counts = [1, 2, 7, 1001, 20011]
    env = dict(TCP, HARP_SEGMENT_BYTES="4096")  # several segments per chunk
    runs = [run_ranks(nranks, _narrow_body, ["fp16", "bf16"], counts, env=env, timeout=300) for _ in range(2)]
    for res in runs:
        ref = res[0][0]
        for key, (d, dip, davg, ok, worst) in ref.items():
            assert ok, f"{key}: error {worst:.3g} x the bound"
            assert d == dip, f"{key}: in-place result differs from out-of-place"
            for r in range(1, nranks):
                assert res[r][0][key][:3] == (d, dip, davg), f"{key}: rank {r} differs from rank 0"
        st = res[0][1]
        assert st["compressed_calls"] == 3 * 2 * len(counts) and st["dense_calls"] == 0
    assert runs[0][0][0] == runs[1][0][0], "results differ between two runs"


def _narrow_is_lossy(rank, size):
    # 1 + 2^-20 is not an fp16 (nor bf16) value: a compressed sum shows the rounding, a dense one not.
    comm = harp.init()
    x = np.full(4096, 1 + 2.0 ** -20, dtype=np.float32)
    a = comm.allreduce(x, np.empty_like(x), compress="fp16!")
    b = comm.allreduce(x, np.empty_like(x), compress="none")
    return float(a[0]), float(b[0]), hc.stats(comm)["bytes_sent"]


def test_fp16_wire_carries_half_the_bytes():
    res = run_ranks(3, _narrow_is_lossy, env=TCP)
    for a, b, sent in res:
        assert a == 3.0 and b == np.float32(3 * (1 + 2.0 ** -20))
        # ring: 2(p-1) chunk sends of n/p elements, 2 bytes each
        assert abs(sent - 2 * 2 * 4096 * 2 / 3) <= 8, sent  # chunk sizes differ by <= 1 element


# --- top-k -----------------------------------------------------------------------------------------

def _topk_expected(xs, k):
    out = np.zeros(xs[0].size, dtype=np.float32)
    for x in xs:
        order = np.lexsort((np.arange(x.size), -np.abs(x.astype(np.float64))))[:k]
        for i in np.sort(order):
            out[i] += x[i]
    return out


def _topk_body(rank, size, n, spec, ties=True):
    comm = harp.init()
    rng = np.random.default_rng(77 + rank)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    if ties:
        x = np.round(x)  # many ties in |x|
    got = comm.allreduce(x, np.empty_like(x), compress=spec)
    again = comm.allreduce(x.copy(), compress=spec)  # in place
    st = hc.stats(comm)
    comm.destroy()
    return x, got, again, st


# n >= 262144 with k <= n/16 takes the sampled-threshold path of the selection (core/algorithms/compressed/compress_topk.cc).
@pytest.mark.parametrize("nranks,n,spec,ties", [(2, 1000, "topk:0.05!", True), (3, 997, "topk:13!", True),
                                                (4, 1, "topk:0.5!", True), (5, 50000, "topk:0.01!", True),
                                                (3, 300001, "topk:0.001!", True), (2, 300001, "topk:0.01!", False)])
def test_topk_selection_sum_and_bytes(nranks, n, spec, ties):
    res = run_ranks(nranks, _topk_body, n, spec, ties, env=TCP)
    xs = [r[0] for r in res]
    k = hc.topk_bytes(n, 2, spec) // 8
    want = _topk_expected(xs, k)
    for r, (_, got, again, st) in enumerate(res):
        assert np.array_equal(got, want), f"rank {r}: top-k sum differs from the reference"
        assert np.array_equal(again, want)
        assert st["bytes_sent"] == 2 * (nranks - 1) * 8 * k  # two calls, formula (p-1)*8k each
        assert st["compressed_calls"] == 2


def _regions(n, p):
    return [(i * (n // p) + min(i, n % p), n // p + (1 if i < n % p else 0)) for i in range(p)]


@pytest.mark.parametrize("nranks", [3, 4])
def test_topk_reduce_scatter_form_for_large_k(nranks):
    # k(p-1) > n/2: the gate's cost model takes the balanced sparse reduce-scatter + dense allgather;
    # same sums in the same order as the allgather form, so the reference is the same.
    n, spec = 200003, "topk:0.5!"
    res = run_ranks(nranks, _topk_body, n, spec, False, env=TCP)
    xs = [r[0] for r in res]
    k = int(round(0.5 * n))
    want = _topk_expected(xs, k)
    regions = _regions(n, nranks)
    for r, (x, got, again, st) in enumerate(res):
        assert np.array_equal(got, want) and np.array_equal(again, want), f"rank {r}"
        top = np.lexsort((np.arange(n), -np.abs(x.astype(np.float64))))[:k]
        lo, size = regions[r]
        outside = int(np.sum((top < lo) | (top >= lo + size)))
        ag = sum(regions[(r - s) % nranks][1] for s in range(nranks - 1)) * 4
        assert st["bytes_sent"] == 2 * (8 * (nranks - 1) + 8 * outside + ag), (r, st["bytes_sent"])


def _ef_body(rank, size, steps, n):
    comm = harp.init()
    rng = np.random.default_rng(rank)
    sent_total = np.zeros(n, dtype=np.float64)
    in_total = np.zeros(n, dtype=np.float64)
    for s in range(steps):
        x = rng.integers(-8, 9, size=n).astype(np.float32)
        in_total += x
        out = comm.allreduce(x, np.empty_like(x), compress="topk:0.1,ef!", key="w")
        sent_total += out
        # a second key with another size does not disturb the first
        comm.allreduce(np.ones(11, dtype=np.float32), compress="topk:2,ef!", key="bias")
    res = hc.residual(comm, "w").astype(np.float64)
    all_in = comm.allreduce(in_total.copy())
    all_res = comm.allreduce(res.copy())
    st = hc.stats(comm)
    hc.clear(comm, "w")
    cleared = hc.residual(comm, "w").size
    after = hc.stats(comm)["residual_bytes"]
    comm.destroy()
    return sent_total, all_in, all_res, st, cleared, after


@pytest.mark.parametrize("nranks", [2, 3])
def test_topk_error_feedback_bookkeeping(nranks):
    n, steps = 300, 6
    res = run_ranks(nranks, _ef_body, steps, n, env=TCP)
    for sent_total, all_in, all_res, st, cleared, after in res:
        # what the allreduces delivered + what stays in every rank's residual == every input
        assert np.array_equal(sent_total + all_res, all_in)
        assert np.any(all_res != 0)  # the residual really carried something
        assert st["residual_bytes"] == (n + 11) * 4
        assert cleared == 0 and after == 11 * 4
    assert all(np.array_equal(r[0], res[0][0]) for r in res)


def _bound_body(rank, size):
    comm = harp.init()
    x = np.arange(200, dtype=np.float32) - 100
    comm.allreduce(x, np.empty_like(x), compress="topk:10,ef!", key="a")
    first = hc.stats(comm)["residual_bytes"]
    comm.allreduce(x, np.empty_like(x), compress="topk:10,ef!", key="b")  # a no longer fits: dropped
    return first, hc.stats(comm)["residual_bytes"], hc.residual(comm, "a").size, hc.residual(comm, "b").size


def test_residual_memory_is_bounded():
    env = dict(TCP, HARP_COMPRESS_RESIDUAL_BYTES="1K")
    assert run_ranks(2, _bound_body, env=env) == [(800, 800, 0, 200)] * 2


# --- gate, dtypes, mismatch ------------------------------------------------------------------------

def _gate_body(rank, size):
    comm = harp.init()
    x = np.full(1 << 16, 1 + 2.0 ** -20, dtype=np.float32)
    got = comm.allreduce(x, np.empty_like(x), compress="fp16")
    st = hc.stats(comm)
    return float(got[0]), st["compressed_calls"], st["dense_calls"]


def test_gate_off_on_loopback_on_for_a_slow_link(tmp_path):
    exact = float(np.float32(3 * (1 + 2.0 ** -20)))
    # Every rank on this host: no compression (HARP_COMPRESS_INTRA=none).
    for got, c, d in run_ranks(3, _gate_body, env=TCP):
        assert (got, c, d) == (exact, 0, 1)
    slow = tmp_path / "slow.cal"
    slow.write_text(SLOW_LINK)
    env = dict(TCP, HARP_COMPRESS_INTRA="same", HARP_CALIBRATION_FILE=str(slow))
    for got, c, d in run_ranks(3, _gate_body, env=env):
        assert (got, c, d) == (3.0, 1, 0)
    # A link so fast and conversions so slow that compression cannot win.
    fast = tmp_path / "fast.cal"
    fast.write_text("tcp 1e-6 1e-12 1e-9\n")
    env = dict(TCP, HARP_COMPRESS_INTRA="same", HARP_CALIBRATION_FILE=str(fast))
    for got, c, d in run_ranks(3, _gate_body, env=env):
        assert (got, c, d) == (exact, 0, 1)
    # Below HARP_COMPRESS_MIN_BYTES: dense even on the slow link.
    env = dict(TCP, HARP_COMPRESS_INTRA="same", HARP_CALIBRATION_FILE=str(slow), HARP_COMPRESS_MIN_BYTES="1M")
    for got, c, d in run_ranks(3, _gate_body, env=env):
        assert (got, c, d) == (exact, 0, 1)


def _dense_dtypes_body(rank, size):
    comm = harp.init()
    bad = []
    for dt in [np.float64, np.int32, np.float16]:
        x = (np.arange(999) % 7 + rank).astype(dt)
        got = comm.allreduce(x, np.empty_like(x))
        if not np.array_equal(got, sum((np.arange(999) % 7 + r).astype(dt) for r in range(size))):
            bad.append(str(dt))
    y = np.full(999, 1 + 2.0 ** -20 + rank, dtype=np.float32)
    if not np.array_equal(comm.allreduce(y, np.empty_like(y), "max"), np.full(999, y[0] + size - 1 - rank)):
        bad.append("float32 max")
    st = hc.stats(comm)
    return bad, st["compressed_calls"]


def test_other_dtypes_and_ops_pass_through_dense():
    for bad, compressed in run_ranks(3, _dense_dtypes_body, env=dict(TCP, HARP_COMPRESS="fp16!")):
        assert bad == [] and compressed == 0


def _mismatch_body(rank, size, specs):
    comm = harp.init(timeout=60)
    x = np.ones(5000, dtype=np.float32)
    try:
        comm.allreduce(x, compress=specs[rank % len(specs)])
    except harp.MismatchError as e:
        return "mismatch", str(e)
    except harp.HarpError as e:
        return type(e).__name__, str(e)
    return "ok", ""


@pytest.mark.parametrize("specs", [["fp16!", "none"], ["fp16!", "bf16!"], ["topk:10!", "topk:20!"],
                                   ["topk:0.01!", "fp16!", "fp16!"]])
def test_ranks_that_disagree_get_mismatch_error(specs):
    res = run_ranks(len(specs) if len(specs) > 2 else 2, _mismatch_body, specs, env=TCP, timeout=120)
    assert all(kind == "mismatch" for kind, _ in res), res


# --- the switches reach torch and the NCCL API -----------------------------------------------------

def _nccl_body(rank, size):
    from harp import nccl
    c = nccl.NcclCommunicator(size, bytes.fromhex(os.environ["HARP_UNIQUE_ID"]), rank)
    x = np.full(4096, 1 + 2.0 ** -20, dtype=np.float32)
    out = np.empty_like(x)
    c.allReduce(x.ctypes.data, out.ctypes.data, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    d = np.full(4096, 1 + 2.0 ** -20, dtype=np.float64)
    dout = np.empty_like(d)
    c.allReduce(d.ctypes.data, dout.ctypes.data, d.size, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, 0)
    return float(out[0]), float(dout[0])


@pytest.mark.parametrize("switch,want", [("fp16!", 3.0), ("none", float(np.float32(3 * (1 + 2.0 ** -20))))])
def test_env_switch_reaches_the_nccl_api(switch, want):
    res = run_ranks(3, _nccl_body, env=dict(TCP, HARP_COMPRESS=switch))
    assert all(r == (want, 3 * (1 + 2.0 ** -20)) for r in res), res


def _python_default_body(rank, size):
    comm = harp.init()
    x = np.full(4096, 1 + 2.0 ** -20, dtype=np.float32)
    return float(comm.allreduce(x.copy())[0]), float(comm.allreduce(x.copy(), compress="none")[0])


def test_env_switch_reaches_the_python_api_and_none_overrides_it():
    exact = float(np.float32(3 * (1 + 2.0 ** -20)))
    assert run_ranks(3, _python_default_body, env=dict(TCP, HARP_COMPRESS="bf16!")) == [(3.0, exact)] * 3


def _train(model, rank, steps=8):
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    xb = torch.randn(64, 16, generator=g)
    yb = xb[:, :4] * 2 - 1
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, [p.detach().numpy().tobytes() for p in model.parameters()]


def _torch_body(rank, size, url):
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP

    import harp.torch  # noqa: F401
    from harp.torch import hooks

    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    t = torch.full((4096,), 1 + 2.0 ** -20, dtype=torch.float32)
    dist.all_reduce(t)
    comm = hooks._harp_communicator(None)
    out = {"env": float(t[0])}
    for hook in ["dense", "fp16", "bf16", "topk", "torch_fp16", "powersgd"]:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)))
        if hook == "fp16":
            model.register_comm_hook(hooks.HookState(force=True), hooks.fp16_wire_hook)
        elif hook == "bf16":
            model.register_comm_hook(hooks.HookState(force=True), hooks.bf16_wire_hook)
        elif hook == "topk":
            model.register_comm_hook(hooks.HookState(compress="topk:0.2,ef", force=True), hooks.topk_hook)
        elif hook == "torch_fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif hook == "powersgd":
            model.register_comm_hook(ps.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                                      start_powerSGD_iter=2), ps.powerSGD_hook)
        before = hc.stats(comm)["compressed_calls"]
        out[hook] = _train(model, rank) + (hc.stats(comm)["compressed_calls"] - before,)
    dist.destroy_process_group()
    return out


def test_torch_backend_env_switch_and_ddp_hooks(tmp_path):
    pytest.importorskip("torch")
    url = "file://" + str(tmp_path / "store")
    # HARP_COMPRESS reaches dist.all_reduce; the "dense" model then runs with compression off.
    res = run_ranks(3, _torch_body, url, env=dict(TCP, HARP_COMPRESS="fp16!"), timeout=300)
    for out in res:
        assert out["env"] == 3.0
        dense = out["dense"][0]
        for hook in ["fp16", "bf16", "topk", "torch_fp16", "powersgd", "dense"]:
            losses, _, compressed = out[hook]
            assert all(np.isfinite(losses)) and losses[-1] < 0.9 * losses[0], (hook, losses)
            if hook in ("fp16", "bf16", "topk"):
                assert compressed >= 8, (hook, compressed)  # every step's bucket went through the hook
        for hook in ["fp16", "bf16"]:  # a narrow wire with float32 sums tracks the dense run closely
            assert np.allclose(out[hook][0], dense, rtol=2e-2), (hook, out[hook][0], dense)
    for hook in ["dense", "fp16", "bf16", "topk", "torch_fp16", "powersgd"]:
        # DDP keeps the replicas identical only if every rank got the same averaged gradients
        assert all(r[hook][1] == res[0][hook][1] for r in res), hook
