"""Fault tolerance: revoke, failure detection by keep-alive, agree,
shrink, grow, and no leaked resources afterwards.

Real processes over loopback (tests/harness.py; the unique id's store lives in
the pytest process, so it survives any rank). No timed assertions: a failure
must be explained by the keep-alive because the collective timeout is far
larger (HARP_TIMEOUT 120 s, keep-alive 2 s) and the message must say so.
"""
import os
import signal
import time

import numpy as np
import pytest

import harp
from harness import RankFailure, run_ranks, start_ranks

KA = {"HARP_KEEPALIVE_INTERVAL": "0.5", "HARP_KEEPALIVE_TIMEOUT": "2", "HARP_TIMEOUT": "120"}
TRANSPORTS = ["tcp", "shm"]


def _env(transport, **extra):
    return {**KA, "HARP_TRANSPORT": transport, **extra}


def _data(rank, n=1001):
    """Integers in float64 and int64: any summation order gives the same bits."""
    g = np.random.default_rng(1000 + rank)
    return g.integers(-1000, 1000, n).astype(np.float64), g.integers(-2**40, 2**40, n, dtype=np.int64)


def _expect(ranks, n=1001):
    f = sum(_data(r, n)[0] for r in ranks)
    i = sum(_data(r, n)[1] for r in ranks)
    return f, i


def _allreduce_checked(comm, old_rank, survivors):
    f, i = _data(old_rank)
    comm.allreduce(f)
    comm.allreduce(i)
    ef, ei = _expect(survivors)
    return bool(np.array_equal(f, ef) and np.array_equal(i, ei))


def _resources():
    """(open fds, OS threads) of this process, not counting the job view's listener: like the
    status socket it is the process's, opened with its first communicator and kept for the
    process's life (core/observe/jobview.h)."""
    fds = set(os.listdir("/proc/self/fd"))
    fds.discard(str(harp._harp.jobview_listen_fd()))
    return len(fds), len(os.listdir("/proc/self/task"))


# ---------------------------------------------------------------------------- revoke
def _revoke(rank, size):
    comm = harp.init()
    comm.allreduce(np.ones(8, np.float32))
    if rank == 0:
        time.sleep(0.5)  # the others are blocked in the allreduce below by now
        comm.revoke()
        blocked = None
    else:
        try:
            comm.allreduce(np.ones(100_000, np.float32))  # rank 0 never joins it
            blocked = ("no error", "")
        except harp.HarpError as e:
            blocked = (type(e).__name__, str(e))
    try:  # every later call raises too, on every rank
        comm.barrier()
        later = "no error"
    except harp.HarpError as e:
        later = type(e).__name__
    out = blocked, later, comm.revoked, isinstance(harp.RevokedError("x"), harp.PeerError)
    comm.destroy()
    return out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_revoke_raises_on_every_rank_also_blocked_ones(transport):
    res = run_ranks(3, _revoke, env=_env(transport), timeout=90)
    for rank, (blocked, later, revoked, subclass) in enumerate(res):
        assert subclass
        assert later == "RevokedError", (rank, later)
        assert revoked, rank
        if rank:
            assert blocked[0] == "RevokedError" and "revoked by rank 0" in blocked[1], (rank, blocked)


# ---------------------------------------------------------------------------- dead and frozen ranks
def _fail_then_recover(rank, size, victim, how, transport):
    # The observability service (2 threads, a pipe and the status socket, core/observe/observer.cc) starts
    # once per process with the first communicator and stays, like NCCL RAS; start it before the
    # baseline so the check is about what a failure, agree and shrink leave behind.
    harp._harp.obs_service()
    fd0, th0 = _resources()
    comm = harp.init()
    x = np.ones(1 << 18, np.float32)
    comm.allreduce(x)
    if rank == victim:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen: sockets stay open, the keep-alive stops
        time.sleep(600)
    try:
        for _ in range(100_000):
            comm.allreduce(x)
        err = ("no error", "")
    except harp.HarpError as e:
        err = (type(e).__name__, str(e))
    ok, failed = comm.agree(True)
    new = comm.shrink()
    survivors = [r for r in range(size) if r != victim]
    exact = _allreduce_checked(new, rank, survivors)
    info = (new.rank, new.size, new.transport((new.rank + 1) % new.size))
    new.destroy()
    comm.destroy()
    return err, ok, failed, exact, info, (fd0, th0), _resources()


def _run_with_victim(n, fn, victim, *args, env, timeout=120):
    """Like run_ranks, but a rank stopped with SIGSTOP never reports: once the others have,
    kill it and report it as died."""
    procs, q = start_ranks(n, fn, victim, *args, env=env)
    deadline = time.monotonic() + timeout
    out = {}
    while len(out) < n - 1 and time.monotonic() < deadline:
        try:
            r, status, val = q.get(timeout=0.5)
            out[r] = (status, val)
        except Exception:  # queue.Empty
            pass
    for p in procs:
        if p.is_alive():
            p.kill()  # the stopped victim (and, after a failure, anything left)
        p.join(5)
    missing = [r for r in range(n) if r != victim and r not in out]
    if missing:
        raise RankFailure(f"ranks {missing} did not report")
    errs = {r: v for r, (s, v) in out.items() if s != "ok"}
    if errs:
        raise RankFailure("\n".join(f"rank {r}: {v}" for r, v in errs.items()))
    return {r: v for r, (s, v) in out.items()}


@pytest.mark.parametrize("transport,how", [("tcp", "kill"), ("shm", "kill"), ("tcp", "stop")])
def test_failed_rank_is_named_then_agree_shrink_and_a_bit_exact_allreduce(transport, how):
    n, victim = 4, 2
    shm_before = set(os.listdir("/dev/shm"))
    res = _run_with_victim(n, _fail_then_recover, victim, how, transport, env=_env(transport))
    assert sorted(res) == [0, 1, 3]
    new_ranks = []
    for r, (err, ok, failed, exact, info, before, after) in res.items():
        cls, msg = err
        assert cls == "PeerError", (r, err)
        assert "rank 2" in msg, (r, msg)  # every survivor names the dead rank
        if how == "stop":
            # frozen: no EOF, no reset; only the keep-alive (2 s << HARP_TIMEOUT 120 s) can tell
            assert "keep-alive" in msg and "timed out" not in msg, (r, msg)
        assert ok is True and failed == [victim], (r, ok, failed)
        assert exact, r
        new_ranks.append(info[:2])
        assert info[2] == transport
        assert after == before, f"rank {r}: (fds, threads) before {before}, after {after}"
    assert sorted(new_ranks) == [(0, 3), (1, 3), (2, 3)]
    assert {r: info[0] for r, (_, _, _, _, info, _, _) in res.items()} == {0: 0, 1: 1, 3: 2}
    time.sleep(0.2)
    leaked = set(os.listdir("/dev/shm")) - shm_before
    assert not [f for f in leaked if "harp" in f.lower()], leaked


# ---------------------------------------------------------------------------- agree semantics
def _first_leaves(rank, size):
    comm = harp.init()
    if rank == 0:
        comm.destroy()  # leaves cleanly: a bye, then its keep-alive port is closed
        return []
    # Several keep-alive timeouts out of HARP: only the heartbeat thread speaks for us.
    time.sleep(3 * float(KA["HARP_KEEPALIVE_TIMEOUT"]))
    right, left = rank % (size - 1) + 1, (rank - 2) % (size - 1) + 1  # a ring over ranks 1..size-1
    got = np.zeros(3)
    if rank == 1:  # the token goes 1 -> 2 -> ... -> size-1 -> 1 (operations run in issue order)
        comm.send(np.full(3, float(rank)), peer=right)
        comm.recv(got, peer=left)
    else:
        comm.recv(got, peer=left)
        comm.send(np.full(3, float(rank)), peer=right)
    failed = comm.failed_ranks()
    comm.destroy()
    return failed, got.tolist(), left


def test_a_rank_that_leaves_cleanly_does_not_silence_the_others_heartbeats():
    # A departed rank's closed port answers every beat sent to it with an ICMP
    # error, which IP_RECVERR also leaves pending on the socket: the next send
    # to a live peer then fails. Beats to a rank that said bye must stop, and
    # a pending error must not eat the beat meant for another rank.
    res = run_ranks(4, _first_leaves, env=_env("tcp"), timeout=120)
    assert res[0] == []
    for r in (1, 2, 3):
        failed, got, left = res[r]
        assert failed == [], f"rank {r} reported {failed} dead"
        assert got == [float(left)] * 3, res


def _agree_flags(rank, size):
    comm = harp.init()
    a = comm.agree(rank != 1)  # rank 1 votes False
    b = comm.agree(True)
    comm.destroy()
    return a, b


def test_agree_is_the_and_of_the_flags_and_repeats():
    res = run_ranks(3, _agree_flags, env=_env("tcp"), timeout=60)
    assert all(a == (False, []) and b == (True, []) for a, b in res), res


# ---------------------------------------------------------------------------- shrink with exclude, grow
def _exclude(rank, size, transport):
    comm = harp.init()
    if rank == 2:
        try:
            comm.shrink([2])
            own = "no error"
        except harp.InvalidArgumentError as e:
            own = str(e)
        comm.destroy()
        return own, None
    try:
        comm.shrink([size])
        bad = "no error"
    except harp.InvalidArgumentError as e:
        bad = str(e)
    new = comm.shrink([2])
    exact = _allreduce_checked(new, rank, [0, 1, 3, 4])
    out = (new.rank, new.size, exact, bad)
    new.destroy()
    comm.destroy()
    return None, out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_shrink_with_explicit_exclude_on_a_healthy_communicator(transport):
    res = run_ranks(5, _exclude, transport, env=_env(transport), timeout=90)
    assert "excluded" in res[2][0], res[2]
    got = {r: res[r][1] for r in (0, 1, 3, 4)}
    for r, (nr, ns, exact, bad) in got.items():
        assert ns == 4 and exact, (r, got[r])
        assert "out of range" in bad, bad
    assert [got[r][0] for r in (0, 1, 3, 4)] == [0, 1, 2, 3]


def _grow_member(rank, size, uid_a, uid_b):
    if rank < 2:
        comm = harp.Communicator(rank, 2, harp.UniqueId.from_hex(uid_a))
        comm.allreduce(np.ones(4, np.float32))
        big = comm.grow(3, harp.UniqueId.from_hex(uid_b) if rank == 0 else None)
    else:
        comm = None
        big = harp.Communicator(2, 3, harp.UniqueId.from_hex(uid_b))
    exact = _allreduce_checked(big, rank, [0, 1, 2])
    out = (big.rank, big.size, exact)
    big.destroy()
    if comm is not None:
        comm.destroy()
    return out


def test_grow_adds_a_joining_rank_with_a_fresh_unique_id():
    a, b = harp.get_unique_id("127.0.0.1:0"), harp.get_unique_id("127.0.0.1:0")
    res = run_ranks(3, _grow_member, a.hex(), b.hex(), env=_env("tcp"), timeout=90)
    assert res == [(0, 3, True), (1, 3, True), (2, 3, True)], res


# ---------------------------------------------------------------------------- torch dist.shrink_group
def _torch_shrink(rank, size, url, victim):
    import datetime

    import torch
    import torch.distributed as dist

    import harp.torch  # noqa: F401  registers "harp"

    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    pg = dist.group.WORLD
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == victim:
        os._exit(3)  # an excluded rank terminates (torch's contract): no goodbye, no destroy
    checks = []
    for bad in ([], [size], [victim, victim]):
        try:
            dist.shrink_group(bad)
            checks.append("no error")
        except ValueError:
            checks.append("ValueError")
    new = dist.shrink_group([victim])
    t = torch.full((7,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(t)  # on the new default group
    out = (dist.get_world_size(), dist.get_rank(), new.size(), float(t[0]), checks,
           dist.get_backend(new), pg is not new)
    dist.destroy_process_group()
    # an aborted group can be destroyed and a new one created afterwards
    return out


def test_torch_shrink_group_on_harp(tmp_path):
    pytest.importorskip("torch")
    n, victim = 4, 1
    res = run_ranks(n, _torch_shrink, f"file://{tmp_path}/store", victim, env=_env("tcp"), timeout=200,
                    allow_errors=True)
    want = float(sum(r + 1 for r in range(n) if r != victim))
    new_ranks = []
    for r, (status, val) in enumerate(res):
        if r == victim:
            continue
        assert status == "ok", val
        world, grank, gsize, total, checks, backend, fresh = val
        assert (world, gsize, total) == (3, 3, want), val
        assert checks == ["ValueError"] * 3, checks
        assert backend == "harp" and fresh
        new_ranks.append(grank)
    assert sorted(new_ranks) == [0, 1, 2]


def _torch_abort_recreate(rank, size, url):
    import datetime

    import torch
    import torch.distributed as dist

    import harp.torch  # noqa: F401

    dist.init_process_group("harp", init_method=url + "1", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    if rank == 0:
        dist.group.WORLD.abort()  # ProcessGroupHarp.abort: every rank's pending and later calls fail
    err = None
    try:
        dist.all_reduce(torch.ones(3))
    except Exception as e:  # noqa: BLE001
        err = type(e).__name__
    dist.destroy_process_group()
    dist.init_process_group("harp", init_method=url + "2", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return err, float(t[0])


def test_torch_aborted_group_raises_distbackenderror_and_can_be_recreated(tmp_path):
    pytest.importorskip("torch")
    res = run_ranks(2, _torch_abort_recreate, f"file://{tmp_path}/s", env=_env("tcp"), timeout=120)
    assert all(v[1] == 2.0 for v in res), res
    assert res[1][0] == "DistBackendError", res


# ---------------------------------------------------------------------------- NCCL API (ctypes)
def _nccl_ft(rank, size, uid_grow_hex):
    from harp import nccl

    comm = nccl.NcclCommunicator(size, bytes.fromhex(os.environ["HARP_UNIQUE_ID"]), rank)
    x = np.ones(5, np.float32)
    comm.allReduce(x, x, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    out = {}
    if rank == 3:  # excluded: does not call shrink; leaves
        comm.destroy()
        return {"excluded": True}
    try:
        comm.shrink([7])
        out["bad"] = "no error"
    except nccl.NcclError as e:
        out["bad"] = e.status
    small = comm.shrink([3], nccl.NCCL_SHRINK_ABORT)
    y = np.full(5, rank + 1.0, np.float32)
    small.allReduce(y, y, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    out["shrunk"] = (small.rank_id(), small.size(), float(y[0]))
    uid = small.get_unique_id() if small.rank_id() == 0 else None
    if uid is not None:
        with open(uid_grow_hex, "wb") as f:  # to the joiner, out of band (a file here)
            f.write(bytes((b + 256) % 256 for b in uid))
    small.revoke()
    try:
        small.allReduce(y, y, 5, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
        out["after_revoke"] = "no error"
    except nccl.NcclError as e:
        out["after_revoke"] = e.status
    small.destroy()
    comm.destroy()
    return out


def test_nccl_shrink_revoke_and_get_unique_id(tmp_path):
    from harp import nccl

    try:
        nccl._L()
    except (ImportError, OSError) as e:
        pytest.skip(f"no libharp-nccl.so: {e}")
    res = run_ranks(4, _nccl_ft, str(tmp_path / "uid"), env=_env("tcp"), timeout=120)
    assert res[3] == {"excluded": True}
    assert sorted(r["shrunk"] for r in res[:3]) == [(0, 3, 6.0), (1, 3, 6.0), (2, 3, 6.0)], res
    for r in res[:3]:
        assert r["bad"] == nccl.NCCL_INVALID_ARGUMENT, r
        assert r["after_revoke"] == nccl.NCCL_REMOTE_ERROR, r
    assert len((tmp_path / "uid").read_bytes()) == 128


# ---------------------------------------------------------------------------- harp.elastic
def _elastic(rank, size, victim, die_at):
    import harp.elastic as elastic

    comm = harp.init()
    state = elastic.State(w=np.zeros(64, np.float64), step=0)
    resets = []

    def train(c, st):
        while st.step < 30:
            if rank == victim and st.step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            g = np.ones(64, np.float64)
            c.allreduce(g)
            st.w += g / c.size  # exactly +1 per step whatever the size
            st.step += 1
            if st.step % 5 == 0:
                st.commit()
        return c.size

    final_size = elastic.run(train, comm, state, min_workers=2, on_reset=lambda r: resets.append((r.failed, r.comm.size)))
    return final_size, state.step, bool(np.all(state.w == 30.0)), resets, state.commits


def test_elastic_run_survives_a_killed_rank_and_finishes_every_step():
    res = run_ranks(4, _elastic, 2, 12, env=_env("tcp"), timeout=150, allow_errors=True)
    assert res[2][0] == "died"
    for r in (0, 1, 3):
        status, (size, step, exact, resets, commits) = res[r]
        assert status == "ok"
        assert (size, step, exact) == (3, 30, True), res[r]
        assert resets == [([2], 3)], resets


# ---------------------------------------------------------------------------- many kill/shrink/grow cycles
# Regression (ft_bench stopped at its 7th trial): the same process group goes through
# CYCLES rounds of "a rank is SIGKILLed inside a 256 KB allreduce; the survivors revoke, agree,
# shrink, check a bit-exact allreduce; rank 0 (always the same process) makes a fresh unique id,
# whose store server runs in its own process, and starts a replacement process that joins
# through grow(); everyone checks a bit-exact allreduce on the grown communicator". Ranks claim
# two emulated hosts (HARP_HOSTID) so shm and tcp pairs both carry the collectives. Replacements run
# _cycle_joiner (below) in a fresh interpreter and take part in later cycles (and may be killed).
CYCLES = 9
_HERE = os.path.dirname(os.path.abspath(__file__))


def _cycle_victim(c, size):
    return 1 + (3 * c + c // 3) % (size - 1)


def _cycle_rounds(comm, first, outdir, env):
    import random
    import subprocess
    import sys
    import threading

    records, joiners = [], []
    for c in range(first, CYCLES):
        victim = _cycle_victim(c, comm.size)
        x = np.ones(1 << 16, np.float32)
        comm.barrier()
        if comm.rank == victim:
            delay = random.Random(c).uniform(0.02, 0.2)
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            for _ in range(1_000_000):
                comm.allreduce(x)
            err = "no error"
        except harp.HarpError as e:
            err = str(e)
        comm.revoke()
        ok, failed = comm.agree(True)
        new = comm.shrink(failed)
        exact = _allreduce_checked(new, comm.rank, [r for r in range(comm.size) if r != victim])
        full = comm.size
        comm.destroy()
        uid = harp.get_unique_id("127.0.0.1:0") if new.rank == 0 else None
        if uid is not None:
            code = (f"import sys; sys.path[:0] = [{_HERE!r}]; import test_ft; "
                    f"test_ft._cycle_joiner({uid.hex()!r}, {full - 1}, {full}, {c + 1}, {outdir!r})")
            joiners.append(subprocess.Popen([sys.executable, "-c", code],
                                            env=dict(os.environ, HARP_HOSTID=f"h{c % 2}", **env)))
        big = new.grow(full, uid)
        new.destroy()
        grown = _allreduce_checked(big, big.rank, range(full))
        records.append((c, victim, f"rank {victim}" in err, ok, failed, exact, grown))
        comm = big
    comm.destroy()
    return records, [p.wait(timeout=300) for p in joiners]


def _cycle_joiner(uid_hex, rank, size, first, outdir):
    comm = harp.Communicator(rank, size, harp.UniqueId.from_hex(uid_hex))
    ok = _allreduce_checked(comm, rank, range(size))
    records, _ = _cycle_rounds(comm, first, outdir, {})
    with open(os.path.join(outdir, f"joiner-{first}"), "w") as f:
        f.write(repr((ok, records)))


def _cycle_member(rank, size, outdir, env):
    os.environ["HARP_HOSTID"] = f"h{rank % 2}"
    harp._harp.obs_service()
    before = _resources()
    records, codes = _cycle_rounds(harp.init(), 0, outdir, env)
    deadline = time.monotonic() + 30  # the last store server retires once every client has left
    while time.monotonic() < deadline and (harp._harp.store_servers_running() or _resources() != before):
        time.sleep(0.1)
    return records, codes, harp._harp.store_servers_running(), before, _resources()


def test_repeated_kill_shrink_grow_cycles_in_one_process_group(tmp_path):
    n, env = 4, _env("tcp")
    env.pop("HARP_TRANSPORT")  # shm inside an emulated host, tcp between them
    res = run_ranks(n, _cycle_member, str(tmp_path), env, env=env, timeout=600, allow_errors=True)
    status, val = res[0]
    assert status == "ok", val  # rank 0 is never a victim: it sees every cycle
    records, codes, servers, before, after = val
    assert [r[0] for r in records] == list(range(CYCLES)), records
    for c, victim, named, ok, failed, exact, grown in records:
        assert named and ok and failed == [victim] and exact and grown, (c, victim, named, ok, failed, exact, grown)
    # Who is killed when: replacements that are later victims end with SIGKILL, the others cleanly.
    procs, fate = [f"o{r}" for r in range(n)], {}
    for c in range(CYCLES):
        fate[procs.pop(_cycle_victim(c, n))] = -signal.SIGKILL
        procs.append(f"j{c + 1}")
    assert codes == [fate.get(f"j{c + 1}", 0) for c in range(CYCLES)], codes
    assert servers == 0 and after == before, (servers, before, after)
    for c in range(CYCLES):
        if fate.get(f"j{c + 1}") is None and c + 1 < CYCLES:
            ok, recs = eval(open(tmp_path / f"joiner-{c + 1}").read())  # noqa: S307 - our own repr
            assert ok and all(r[2:] == (True, True, [r[1]], True, True) for r in recs), (c, ok, recs)


# ---------------------------------------------------------------------------- a rank dies inside agree()
def _die_in_agree(rank, size):
    import threading

    comm = harp.init()
    comm.allreduce(np.ones(8, np.float32))
    if rank == 3:  # votes, then dies while agree() still waits for rank 2's vote
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    if rank == 2:  # late: by then every survivor's keep-alive has reported rank 3
        time.sleep(2 * float(KA["HARP_KEEPALIVE_TIMEOUT"]))
    a = comm.agree(rank != 3)  # rank 3's vote is False: an agreed True flag shows it was not counted
    new = comm.shrink(a[1])
    exact = _allreduce_checked(new, rank, [0, 1, 2])
    out = a, (new.rank, new.size, exact)
    new.destroy()
    comm.destroy()
    return out


def test_a_rank_killed_inside_agree_is_agreed_failed_and_shrink_continues():
    res = run_ranks(4, _die_in_agree, env=_env("tcp"), timeout=120, allow_errors=True)
    assert res[3][0] == "died", res[3]
    got = [res[r] for r in (0, 1, 2)]
    assert all(s == "ok" for s, _ in got), got
    assert [v[0] for _, v in got] == [(True, [3])] * 3, got
    assert sorted(v[1] for _, v in got) == [(0, 3, True), (1, 3, True), (2, 3, True)], got


# ---------------------------------------------------------------------------- torch DDP on a shrunken group
# Elastic DDP (bench/vpc/elastic_train.py --ddp in small): 3 ranks train a float64 MLP with DDP on "harp",
# global batch split over the current ranks; rank 2 is SIGKILLed inside step KILL's backward; the survivors
# learn it (harp.elastic.shrink_torch_group: revoke + agree, dist.shrink_group), restore the last commit into
# the same model and optimizer (SGD momentum), rebuild DDP on the shrunken group and finish every step.
DDP_STEPS, DDP_COMMIT, DDP_KILL, DDP_BATCH = 12, 4, 6, 13


def _ddp_model():
    import torch

    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def _ddp_batch(step):
    import torch

    x = torch.randn(DDP_BATCH, 6, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
    return x, torch.sin(x.sum(1, keepdim=True))


def _ddp_step(model, opt, x, y, scale):
    opt.zero_grad(set_to_none=True)
    (((model(x) - y) ** 2).sum() * scale).backward()
    opt.step()


def _ddp_elastic(rank, size, url, victim):
    import copy
    import datetime
    import gc
    import threading

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import harp.elastic as elastic
    import harp.torch  # noqa: F401

    # DDP's own C++ allreduce path, no Python hook: a failed harp allreduce must reach it as a future
    # error (a RuntimeError from backward), not as an exception object it reads as tensors (SIGSEGV)
    DDP = DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    model = _ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp, step, resets = DDP(model, broadcast_buffers=False), 0, []
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), 0)
    while step < DDP_STEPS:
        err = None
        try:
            w, r = dist.get_world_size(), dist.get_rank()
            x, y = (t.tensor_split(w)[r] for t in _ddp_batch(step))
            if step == DDP_KILL and rank == victim:
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
                time.sleep(1)  # killed before its gradient allreduce: the others wait there for it
            _ddp_step(ddp, opt, x, y, w / DDP_BATCH)  # DDP averages: the global batch's mean-error gradient
            step += 1
            if step % DDP_COMMIT == 0:
                saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), step)
        except RuntimeError as e:  # torch's DistBackendError
            err = f"{type(e).__name__}: {e}"  # not `e`: its traceback would keep the old DDP (and its hooks) alive
        if err is None:
            continue
        del ddp
        gc.collect()
        _, failed = elastic.shrink_torch_group(min_workers=2, err=harp.HarpError(err))
        model.load_state_dict(saved[0])
        opt.load_state_dict(copy.deepcopy(saved[1]))  # load_state_dict adopts the tensors: SGD would
        # then update the commit's momentum in place, and a second restore of the same commit would be wrong
        ddp = DDP(model, broadcast_buffers=False)  # parameters from the lowest survivor
        resets.append((failed, dist.get_world_size(), dist.get_rank(), saved[2], step))
        step = saved[2]
    out = (step, resets, [p.detach().numpy().copy() for p in model.parameters()])
    del ddp
    dist.destroy_process_group()
    return out


def test_torch_ddp_continues_on_the_shrunken_group_after_a_kill(tmp_path):
    torch = pytest.importorskip("torch")
    res = run_ranks(3, _ddp_elastic, f"file://{tmp_path}/store", 2, env=_env("tcp"), timeout=150,
                    allow_errors=True)
    assert res[2][0] == "died", res[2]
    got = [res[0], res[1]]
    assert all(s == "ok" for s, _ in got), got
    for new_rank, (_, (step, resets, _params)) in enumerate(got):
        assert step == DDP_STEPS
        assert resets == [([2], 2, new_rank, DDP_KILL - DDP_KILL % DDP_COMMIT, DDP_KILL)], resets
    p0, p1 = got[0][1][2], got[1][1][2]
    assert all(np.array_equal(a, b) for a, b in zip(p0, p1)), "survivors' parameters differ"
    # the undisturbed single-process run on the whole global batch: equal up to summation order
    model = _ddp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(DDP_STEPS):
        _ddp_step(model, opt, *_ddp_batch(step), 1.0 / DDP_BATCH)
    ref = [p.detach().numpy() for p in model.parameters()]
    assert all(np.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(p0, ref)), "not the global batch's run"
    init = [p.detach().numpy() for p in _ddp_model().parameters()]
    assert not all(np.allclose(a, b, rtol=1e-3) for a, b in zip(p0, init)), "training did not move the parameters"
