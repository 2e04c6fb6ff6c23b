"""The shared-memory transport (transport/shm) and the intra-host allreduce.

* The foundation suites (test_collectives.py, test_failures.py) again, with every
  HARP_TRANSPORT=tcp they ask for turned into shm (tests that are about TCP or
  the tcp tuning rows are listed in _TCP_ONLY and replaced by shm versions here).
* The full collective matrix on shm with every registered allreduce algorithm
  (the `shm` one included), and
  sizes that cross its small/sliced threshold and its chunk boundary.
* Mixed communicators: ranks in two network namespaces (created here, removed
  after): shm inside each namespace, tcp across.
* kill -9 of a rank: the others fail fast naming it, and /dev/shm is unchanged
  (memfd and the shm_open fallback). A tiny /dev/shm: memfd does not care; the
  fallback's error names /dev/shm and the fix.
* The C++ transport gtest (tests/cpp/test_shm_transport.cc) runs from
  tests/test_cpp.py (test_cpp_shm_transport_gtest), which builds it.
"""
import functools
import inspect
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import harp
import harness
import test_collectives as _tc
import test_failures as _tf
from collectives_check import ALLREDUCE_ALGOS, check_everything
from harness import first_error, run_ranks

SHM = {"HARP_TRANSPORT": "shm"}
# Where the harp under test lives (the installed package in CI, python/ in a dev tree).
HARP_PATH = os.path.dirname(os.path.dirname(os.path.abspath(harp.__file__)))

# ------------------------------------------------------------------ foundation suites on shm
_orig_start = harness.start_ranks


def _start_on_shm(n, fn, *args, env=None, **kw):
    e = dict(env or {})
    if e.get("HARP_TRANSPORT") == "tcp":
        e["HARP_TRANSPORT"] = "shm"
    return _orig_start(n, fn, *args, env=e, **kw)


def _on_shm(f):
    @functools.wraps(f)
    def wrapper(*a, **k):
        harness.start_ranks = _start_on_shm
        try:
            return f(*a, **k)
        finally:
            harness.start_ranks = _orig_start
    return wrapper


# About TCP itself, or asserting the tcp rows of the tuning table.
_TCP_ONLY = {"test_multiple_sockets_per_peer", "test_tuning_table_and_override"}
for _mod in (_tc, _tf):
    for _name, _f in list(vars(_mod).items()):
        if not (_name.startswith("test_") and callable(_f)) or _name in _TCP_ONLY:
            continue
        if "TCP" not in inspect.getsource(_f) and '"tcp"' not in inspect.getsource(_f):
            continue  # not transport-dependent (bootstrap, argument checks)
        globals()[f"{_name}__shm"] = _on_shm(_f)
del _mod, _name, _f


def test_harness_really_switches_to_shm():
    def fn(rank, size):
        comm = harp.init()
        return [comm.transport(p) for p in range(size) if p != rank]

    harness.start_ranks = _start_on_shm
    try:
        res = run_ranks(3, fn, env={"HARP_TRANSPORT": "tcp"})
    finally:
        harness.start_ranks = _orig_start
    assert res == [["shm", "shm"]] * 3


# ------------------------------------------------------------------ automatic choice + tuning
def _choice(rank, size):
    comm = harp.init()
    out = ([comm.transport(p) for p in range(size) if p != rank],
           comm.algorithm("allreduce", 2), comm.algorithm("allreduce", 16 << 20))
    comm.destroy()
    return out


def test_shm_is_chosen_automatically_on_one_host():
    res = run_ranks(3, _choice)  # no HARP_TRANSPORT
    for peers, small, large in res:
        assert peers == ["shm", "shm"]
        assert small == "shm" and large == "shm"


def test_forced_tcp_still_works_and_uses_tcp_rows():
    res = run_ranks(2, _choice, env={"HARP_TRANSPORT": "tcp"})
    assert res[0][0] == ["tcp"] and res[0][1] != "shm"


# ------------------------------------------------------------------ collective matrix on shm
def _matrix(rank, size, sizes):
    comm = harp.init()
    failures, calls = check_everything(comm, sizes, ALLREDUCE_ALGOS)
    comm.destroy()
    return failures, calls


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 8])
def test_every_collective_with_shm_algorithm(nranks):
    assert "shm" in ALLREDUCE_ALGOS, ALLREDUCE_ALGOS
    # 5000 float32 = 20 KB: past the 16 KB direct threshold (sliced path).
    res = run_ranks(nranks, _matrix, (0, 1, 7, 1031, 5000), env=SHM, timeout=900)
    failures = [f for fs, _ in res for f in fs]
    assert sum(c for _, c in res) > 500 * nranks
    assert not failures, "\n".join(failures[:30])


def _allreduce_sizes(rank, size, counts, dtype):
    comm = harp.init()
    bad = []
    for n in counts:
        x = ((np.arange(n, dtype=np.int64) * 7 + rank) % 251).astype(dtype)
        exp = sum(((np.arange(n, dtype=np.int64) * 7 + r) % 251) for r in range(size)).astype(dtype)
        out = np.empty_like(x)
        comm.allreduce(x, out, algo="shm")
        if not np.array_equal(out, exp):
            bad.append(("out", n))
        comm.allreduce(x, algo="shm")
        if not np.array_equal(x, exp):
            bad.append(("inplace", n))
    # Results are bitwise identical on every rank (float sums in a fixed order).
    y = np.random.default_rng(rank).standard_normal(300_001).astype(np.float32)
    comm.allreduce(y, algo="shm")
    comm.destroy()
    return bad, y.tobytes()


@pytest.mark.parametrize("nranks", [2, 3, 4, 7])
def test_shm_allreduce_chunk_boundaries(nranks):
    # HARP_SHM_COLL_BYTES=64K: 16384 float32 per chunk; sizes around it, many chunks.
    counts = [16383, 16384, 16385, 3 * 16384 + 5, 1_000_003]
    res = run_ranks(nranks, _allreduce_sizes, counts, np.float32,
                    env={**SHM, "HARP_SHM_COLL_BYTES": "64K"}, timeout=300)
    assert all(not bad for bad, _ in res), [bad for bad, _ in res]
    assert len({y for _, y in res}) == 1, "ranks got different float results"


def _late_checker(rank, size, count, rounds):
    if rank == 1:  # widens the race: its shm waits sleep between "not yet" and the stray-message check
        os.environ["HARP_SHM_FAULT_CHECK_DELAY_US"] = "4000"
    comm = harp.init()
    ok = 0
    for i in range(rounds):
        if rank != 1:
            time.sleep(0.003)  # rank 1 arrives first and waits; the others complete before its check runs
        x = np.full(count, float(rank + i), np.float32)
        comm.allreduce(x, algo="shm")
        ok += bool((x == size * i + size * (size - 1) / 2).all())
        comm.barrier()  # message-based: rank 0's first barrier message reaches rank 1 while it may still wait
    comm.destroy()
    return ok


@pytest.mark.parametrize("count", [2, 4099])  # tiny slot; a chunk reduced slice by slice
def test_next_collectives_message_during_a_shm_wait_is_not_a_mismatch(count):
    # A peer that saw the shm allreduce complete goes on to the barrier and sends
    # to a rank still inside its wait: that message belongs to the next
    # collective, not to a mismatch (CI once failed harp-bench on this race).
    rounds = 12
    res = run_ranks(3, _late_checker, count, rounds, env=SHM, timeout=120)
    assert res == [rounds] * 3, res


@pytest.mark.slow
def test_shm_allreduce_64MB_eight_ranks():
    res = run_ranks(8, _allreduce_sizes, [16 * 1024 * 1024 + 3], np.float32, env=SHM, timeout=600)
    assert all(not bad for bad, _ in res)


# ------------------------------------------------------------------ p2p sizes (ring and CMA paths)
def _p2p(rank, size):
    comm = harp.init()
    bad = []
    for n in (0, 1, 8, 16352, 16353, 65536, 65537, 1 << 20, 3 << 20):
        if rank == 0:
            comm.send(np.arange(n, dtype=np.uint8) ^ 0x5A, peer=1)
        else:
            x = np.empty(n, np.uint8)
            comm.recv(x, peer=0)
            if not np.array_equal(x, np.arange(n, dtype=np.uint8) ^ 0x5A):
                bad.append(n)
    comm.destroy()
    return bad


@pytest.mark.parametrize("cma", ["1", "0"])
def test_send_recv_every_size_class(cma):
    assert run_ranks(2, _p2p, env={**SHM, "HARP_SHM_CMA": cma}) == [[], []]


# ------------------------------------------------------------------ kill -9, leaks, /dev/shm
def _devshm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _victim(rank, size, big):
    comm = harp.init(timeout=60)
    x = np.ones(big, np.float32)
    comm.allreduce(x)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return first_error(lambda: comm.allreduce(x), 100)


@pytest.mark.parametrize("memfd", ["memfd", "shm_open"])
@pytest.mark.parametrize("big", [2, 1 << 20])
def test_kill_nine_is_detected_and_leaves_nothing(memfd, big):
    before = _devshm()
    env = {**SHM, "HARP_SHM_NO_MEMFD": "1" if memfd == "shm_open" else "0"}
    res = run_ranks(4, _victim, big, env=env, timeout=120, allow_errors=True)
    assert res[-1][0] == "died"
    for status, val in res[:-1]:
        assert status == "ok", val
        cls, msg, dt = val
        assert cls == "PeerError", (cls, msg)
        assert "rank 3" in msg, msg
        assert dt < 10, f"detection took {dt:.1f} s"
    time.sleep(0.2)
    assert _devshm() == before, f"left in /dev/shm: {_devshm() - before}"


_TINY_DEVSHM = textwrap.dedent("""
    import sys
    sys.path[:0] = [{tests!r}]
    import harp
    from harness import run_ranks
    def fn(rank, size):
        try:
            c = harp.init(timeout=20)
            import numpy as np
            x = np.ones(1000, np.float32)
            c.allreduce(x)
            return "ok", c.transport(1 - rank), float(x[0])
        except harp.HarpError as e:
            return "error", type(e).__name__, str(e)
    print(repr(run_ranks(2, fn, env={{"HARP_TRANSPORT": "shm", "HARP_SHM_NO_MEMFD": {nomemfd!r}}}, timeout=60)))
""")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
@pytest.mark.parametrize("nomemfd", ["0", "1"])
def test_tiny_dev_shm(nomemfd):
    """A 64 KB /dev/shm (private mount namespace): memfd segments do not live
    there, so shm works; the shm_open fallback fails with an error naming
    /dev/shm and how to fix it."""
    code = _TINY_DEVSHM.format(tests=os.path.dirname(os.path.abspath(__file__)), nomemfd=nomemfd)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HARP_PATH] + sys.path))
    out = subprocess.run(["unshare", "-m", "sh", "-c",
                          "mount -t tmpfs -o size=64k tmpfs /dev/shm && exec \"$0\" -c \"$1\"", sys.executable, code],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    res = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    if nomemfd == "0":
        assert res == [("ok", "shm", 2.0)] * 2, res
    else:
        for status, cls, msg in res:
            assert status == "error", res
            assert "/dev/shm is too small" in msg and "--shm-size" in msg, msg


# ------------------------------------------------------------------ mixed shm + tcp (two netns)
_MIXED = textwrap.dedent("""
    import sys, json
    sys.path[:0] = [{python!r}]
    import numpy as np, harp
    c = harp.init(timeout=60)
    r, n = c.rank, c.size
    tr = [c.transport(p) for p in range(n) if p != r]
    ok = []
    for count in (1, 1031, 300_000):
        x = ((np.arange(count) * 3 + r) % 101).astype(np.float32)
        exp = sum(((np.arange(count) * 3 + q) % 101) for q in range(n)).astype(np.float32)
        c.allreduce(x)
        ok.append(bool(np.array_equal(x, exp)))
        b = np.full(count, r, np.int32)
        c.broadcast(b, root=n - 1)
        ok.append(bool((b == n - 1).all()))
        g = c.allgather(np.full(count, r, np.int64)).reshape(-1)
        ok.append(bool(all((g[q * count:(q + 1) * count] == q).all() for q in range(n))))
    c.barrier()
    algo = c.algorithm("allreduce", 1 << 20)
    c.destroy()
    print(json.dumps({{"rank": r, "transports": tr, "ok": ok, "algo": algo}}))
""")


@pytest.fixture
def two_netns():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    tag = f"{os.getpid() % 100000}"
    a, b = f"harp-shm-a{tag}", f"harp-shm-b{tag}"
    va, vb = f"hsa{tag}", f"hsb{tag}"
    cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
            ["ip", "link", "add", va, "type", "veth", "peer", "name", vb],
            ["ip", "link", "set", va, "netns", a], ["ip", "link", "set", vb, "netns", b],
            ["ip", "-n", a, "addr", "add", "10.213.7.1/24", "dev", va],
            ["ip", "-n", b, "addr", "add", "10.213.7.2/24", "dev", vb],
            ["ip", "-n", a, "link", "set", va, "up"], ["ip", "-n", b, "link", "set", vb, "up"],
            ["ip", "-n", a, "link", "set", "lo", "up"], ["ip", "-n", b, "link", "set", "lo", "up"]]
    try:
        for c in cmds:
            subprocess.run(c, check=True, capture_output=True)
        yield a, b
    finally:
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)
        assert a not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_mixed_shm_and_tcp_across_two_network_namespaces(two_netns):
    import json
    a, b = two_netns
    n = 4
    code = _MIXED.format(python=HARP_PATH)
    procs, secret = [], os.urandom(16).hex()
    for r in range(n):
        ns = a if r < 2 else b
        env = dict(os.environ, HARP_ADDR="10.213.7.1:29555", HARP_RANK=str(r), HARP_WORLD_SIZE=str(n),
                   HARP_SECRET=secret, HARP_TRANSPORT="auto")
        env.pop("HARP_UNIQUE_ID", None)
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, e
        outs.append(json.loads(o.strip().splitlines()[-1]))
    for res in outs:
        r = res["rank"]
        others = [p for p in range(n) if p != r]
        want = ["shm" if (p < 2) == (r < 2) else "tcp" for p in others]
        assert res["transports"] == want, res
        assert all(res["ok"]), res
        assert res["algo"] != "shm"  # "mixed" rows: not every peer is on shm
