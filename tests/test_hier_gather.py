"""Hierarchical allgather and reduce-scatter (allgather_leader.cc, reduce_scatter_leader.cc).

What is checked, against sources independent of the thing checked:
- allgather leader and reduce_scatter leader agree with numpy (collectives_check.reference) and with
  the flat ring on the same inputs, on fake hosts (HARP_HOSTID per rank, as tests/test_hierarchy.py):
  2x2, 2x3, 3x2, uneven (3+1, 2+3) and interleaved placement (ranks of a host not consecutive);
  every dtype (and every op for reduce_scatter) on 2x2 and on one uneven / interleaved layout,
  odd counts, count 0, in place and out of place, sendbuf elsewhere inside recvbuf (allgather),
  reduce_scatter's input untouched;
- restrictions: on one host, or one rank per host, the algorithm asked for (HARP_ALGO, which the
  selector's memo records) runs its declared fallback, ring, and the result is right; on uneven
  hosts the leader runs itself; with no override the runtime pick on 2x2 equals --explain's;
- async calls (the legs run from the communicator's worker thread) give the same results;
- a dead rank (host 1's leader or non-leader) makes every other rank raise, not hang.
"""
import os

import numpy as np
import pytest

import harp
from collectives_check import DTYPES, Checker, data, hosts_env, init_as, ops_for, reference, same
from harness import run_ranks


def _check(rank, size, ids, sizes, dtypes, all_ops):
    comm = init_as(rank, ids)
    ch = Checker(comm)
    p = size
    for dt in dtypes:
        for n in sizes:
            # allgather: out of place, in place (NCCL rule), sendbuf elsewhere inside recvbuf
            allin = np.stack([data(r, n, dt) for r in range(p)])
            got = comm.allgather(data(rank, n, dt), algo="leader")
            ch.expect(f"allgather leader {dt} n={n}", got, allin, dt)
            flat = comm.allgather(data(rank, n, dt), algo="ring")
            ch.expect(f"allgather leader {dt} n={n} == ring", got, flat, dt)
            buf = np.zeros(p * n, dtype=dt)
            buf[rank * n:(rank + 1) * n] = data(rank, n, dt)
            comm.allgather(buf[rank * n:(rank + 1) * n], buf, algo="leader")
            ch.expect(f"allgather leader in-place {dt} n={n}", buf, allin.ravel(), dt)
            if n:
                other = (rank + 1) % p
                buf = np.zeros(p * n, dtype=dt)
                buf[other * n:(other + 1) * n] = data(rank, n, dt)
                comm.allgather(buf[other * n:(other + 1) * n], buf, algo="leader")
                ch.expect(f"allgather leader input in block {other} {dt} n={n}", buf, allin.ravel(), dt)
            # reduce_scatter: every op (or sum only), out of place and in place
            for op in (ops_for(dt) if all_ops else ["sum"]):
                inputs = [data(r, p * n, dt, salt=3) for r in range(p)]
                exp = np.asarray(reference(inputs, dt, op, p))[rank * n:(rank + 1) * n]
                x = inputs[rank].copy()
                got = comm.reduce_scatter(x, None, op, algo="leader")
                ch.expect(f"reduce_scatter leader {dt} {op} n={n}", got, exp, dt, p)
                ch.expect(f"reduce_scatter leader {dt} {op} n={n} input untouched", x, inputs[rank], dt)
                flat = comm.reduce_scatter(inputs[rank].copy(), None, op, algo="ring")
                if not same(got, flat, dt, p):
                    ch.failures.append(f"rank {rank}: reduce_scatter leader {dt} {op} n={n} != ring: "
                                       f"{got[:6]} vs {flat[:6]}")
                ip = inputs[rank].copy()
                comm.reduce_scatter(ip, ip[rank * n:(rank + 1) * n], op, algo="leader")
                ch.expect(f"reduce_scatter leader in-place {dt} {op} n={n}", ip[rank * n:(rank + 1) * n], exp, dt, p)
    # a large odd count: several segments in every leg
    n = 50001
    got = comm.allgather(np.arange(n, dtype=np.float32) + rank, algo="leader")
    ok = all(np.array_equal(got[r], np.arange(n, dtype=np.float32) + r) for r in range(p))
    x = np.tile(np.arange(n, dtype=np.int64), p) * (rank + 1)
    rs = comm.reduce_scatter(x, None, "sum", algo="leader")
    ok = ok and np.array_equal(rs, np.arange(n, dtype=np.int64) * (p * (p + 1) // 2))
    # async: the legs run on the worker thread
    g = np.empty((p, 1031), np.int32)
    w1 = comm.allgather(np.full(1031, rank, np.int32), g, async_op=True, algo="leader")
    w2 = comm.reduce_scatter(np.full(1031 * p, rank + 1, np.int32), None, "max", async_op=True, algo="leader")
    w1.wait()
    ok = ok and all((g[r] == r).all() for r in range(p))
    ok = ok and np.array_equal(w2.wait(), np.full(1031, p, np.int32))
    comm.destroy()
    return ch.failures, ch.calls, ok


SMALL = (0, 1, 3, 7, 1031)
FEW = [np.dtype(np.int8), np.dtype(np.float64), np.dtype(np.int32)]
INTERLEAVED = ["h0", "h1", "h0", "h1", "h1"]  # hosts {0, 2} and {1, 3, 4}


@pytest.mark.parametrize("ids,everything", [
    (hosts_env([2, 2]), True),
    (hosts_env([3, 3]), False),
    (hosts_env([2, 2, 2]), False),
    (hosts_env([3, 1]), False),
    (hosts_env([2, 3]), True),
    (INTERLEAVED, True),
    (["h0", "h1", "h1", "h0"], False),
], ids=["2x2-all", "2x3", "3x2", "3+1", "2+3-all", "interleaved-2+3-all", "interleaved-2+2"])
def test_leader_allgather_and_reduce_scatter_match_numpy_and_ring(ids, everything):
    dtypes = DTYPES if everything else FEW
    res = run_ranks(len(ids), _check, ids, SMALL, dtypes, everything, timeout=600)
    for failures, calls, big_ok in res:
        assert not failures, failures[:10]
        assert calls > 50 and big_ok


def _picks(rank, size, ids, env):
    os.environ.update(env)
    comm = init_as(rank, ids)
    out = {}
    for n in (1, 1001):
        ag = comm.allgather(np.full(n, rank, dtype=np.int32))
        rs = comm.reduce_scatter(np.full(n * size, rank + 1, dtype=np.int64))
        assert all((ag[r] == r).all() for r in range(size)) and (rs == size * (size + 1) // 2).all()
        out[n] = (comm._c.last_algorithm(int(harp.comm.Coll["allgather"])),
                  comm._c.last_algorithm(int(harp.comm.Coll["reduce_scatter"])))
    comm.destroy()
    return out


@pytest.mark.parametrize("ids", [None, hosts_env([1, 1, 1, 1])], ids=["one-host", "1-per-host"])
def test_restriction_failing_runs_the_ring_fallback(ids):
    res = run_ranks(4, _picks, ids, {"HARP_ALGO": "allgather:leader,reduce_scatter:leader"}, timeout=120)
    assert all(r == {1: ("ring", "ring"), 1001: ("ring", "ring")} for r in res), res


def test_uneven_hosts_leader_runs_itself():
    res = run_ranks(4, _picks, hosts_env([3, 1]), {"HARP_ALGO": "allgather:leader,reduce_scatter:leader"},
                    timeout=120)
    assert all(r == {1: ("leader", "leader"), 1001: ("leader", "leader")} for r in res), res


def _explain_pick(coll, size, ppn):
    """In-process harp-config --explain (the same C++ selector); ppn: ranks per host."""
    import re
    from harp.tools.config import explain
    out = "\n".join(explain(coll, size, sum(ppn), "mixed", ppn=ppn))
    return re.search(r"^pick: (\w+) ", out, re.M).group(1)


def test_runtime_pick_on_fake_hosts_equals_explain_and_is_right():
    """No override: whatever the selector picks on 2x2 (the model prefers leader for small blocks),
    every rank picks alike, it equals --explain's pick, and _picks checked the results."""
    res = run_ranks(4, _picks, hosts_env([2, 2]), {}, timeout=120)
    assert all(r == res[0] for r in res), res
    for n in (1, 1001):
        ag, rs = res[0][n]
        assert ag == _explain_pick("allgather", str(4 * n), [2, 2]), (n, ag)
        assert rs == _explain_pick("reduce_scatter", str(8 * n), [2, 2]), (n, rs)


def _dies(rank, size, ids, coll, victim):
    comm = init_as(rank, ids)
    n = 1 << 14

    def call():
        if coll == "allgather":
            comm.allgather(np.ones(n, np.float32), algo="leader")
        else:
            comm.reduce_scatter(np.ones(n * size, np.float32), None, "sum", algo="leader")
    call()  # the sub-communicators exist now
    comm.barrier()
    if rank == victim:
        os._exit(3)
    try:
        for _ in range(3):
            call()
    except harp.HarpError as e:
        return type(e).__name__, str(e)[:300]
    return "no error", ""


@pytest.mark.parametrize("victim", [3, 2], ids=["non-leader", "leader"])
@pytest.mark.parametrize("coll", ["allgather", "reduce_scatter"])
def test_a_dead_rank_raises_on_every_rank_not_a_hang(coll, victim):
    """A rank of 2x2 (host 1's non-leader 3 or its leader 2) exits after the legs exist; the others
    raise a HARP error well before HARP_TIMEOUT (the harness would report a hang)."""
    res = run_ranks(4, _dies, hosts_env([2, 2]), coll, victim, env={"HARP_TIMEOUT": "600"}, timeout=150,
                    allow_errors=True)
    assert res[victim][0] == "died"
    for rank in (r for r in range(4) if r != victim):
        status, (kind, msg) = res[rank]
        assert status == "ok" and kind in ("PeerError", "MismatchError"), (rank, kind, msg)
