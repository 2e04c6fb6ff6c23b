"""Deferred descriptor checks in batches (core/engine/context.h, "Batches").

A broadcast/scatter receiver's descriptors of its deferred calls travel to each peer up to 16 in
one fixed-size message; a peer takes them before any other message from that rank. These tests
hold the contract through that path, on tcp and shm:

* a disagreement in the middle of a long loop of broadcasts (its descriptor sits inside a batch
  that is not full) is still raised on every rank, naming that call and the disagreeing rank;
* loops of broadcasts at 4 and 5 ranks (inner ranks forward data to ranks that wait for their
  batches), with roots, counts, in-place and out-of-place changing, interleaved with allreduce,
  send/recv, reduce and scatter, return the right data and raise nothing;
* a receiver that falls far behind another (its peer's batches come before it made the calls)
  raises nothing;
* a receiver that exits without destroy() after leaving its last descriptors unsent: the root's
  destroy() raises PeerError naming that rank within the timeout, it never hangs.
"""
import os
import time

import numpy as np
import pytest

import harp
from harness import outcome, run_ranks, transport_env

TRANSPORTS = ["tcp", "shm"]


def _disagree_at(rank, size, calls, bad_call, bad_rank):
    """`calls` broadcasts from root 0; in call `bad_call` (1-based) rank `bad_rank` uses count 5
    where the others use 4. Returns each call's outcome up to the first error, then the next
    allreduce's (or destroy's) outcome."""
    comm = harp.init(timeout=30)
    seen = []
    for i in range(1, calls + 1):
        x = np.full(5 if (i == bad_call and rank == bad_rank) else 4, rank + 1, np.float32)
        first = outcome(lambda: comm.broadcast(x, root=0))
        if first[0] != "ok":
            seen.append((i, first[0], first[1]))
            break
    else:
        seen.append((calls, "ok", ""))
    second = outcome(lambda: comm.allreduce(np.ones(2, np.float32)).tolist())
    seen.append(second)
    time.sleep(0.5)
    return seen


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("n,bad_rank", [(2, 1), (3, 2), (3, 0), (4, 3)])
def test_a_disagreement_inside_a_batch_is_raised_on_every_rank(tr, n, bad_rank):
    """Call #21 of 40 (its descriptor travels in a batch of 16 that is not full when the ranks
    move on): every rank raises MismatchError; a rank that returned from call #21 raises at a later
    call (at the latest at the allreduce), naming earlier call #21."""
    calls, bad = 40, 21
    res = run_ranks(n, _disagree_at, calls, bad, bad_rank, env=transport_env(tr), timeout=120)
    for rank, seen in enumerate(res):
        errors = [s for s in seen if s[0] == "MismatchError" or (len(s) == 3 and s[1] == "MismatchError")]
        assert errors, (rank, seen)
        last_call = seen[0][0] if len(seen[0]) == 3 else None
        if last_call is not None and seen[0][1] == "MismatchError":
            assert last_call >= bad, (rank, seen)
            if last_call > bad:
                assert f"earlier call #{bad + 1} (" in seen[0][2] or "collective mismatch" in seen[0][2], (rank, seen)
        else:
            assert seen[-1][0] == "MismatchError", (rank, seen)
    # someone names the disagreement itself (count 5 against 4)
    assert any("count=5" in str(seen) for seen in res), res


def _loop(rank, size, iters, seed):
    comm = harp.init(timeout=60)
    rng = np.random.default_rng(seed)  # same sequence on every rank
    wrong = []
    for i in range(iters):
        kind = rng.integers(0, 10)
        root = int(rng.integers(0, size))
        n = int(rng.integers(1, 9))
        if kind < 6:  # broadcast, in place or out of place through a fresh array
            x = np.full(n, i * 100 + rank if rank == root else -1, np.int64)
            comm.broadcast(x, root=root)
            if x.tolist() != [i * 100 + root] * n:
                wrong.append(("broadcast", i, x.tolist()))
        elif kind == 6:
            r = comm.allreduce(np.full(n, rank + i, np.int64))
            if r.tolist() != [size * i + sum(range(size))] * n:
                wrong.append(("allreduce", i, r.tolist()))
        elif kind == 7:
            r = comm.reduce(np.full(n, rank, np.int64), root=root)
            if rank == root and r.tolist() != [sum(range(size))] * n:
                wrong.append(("reduce", i, r.tolist()))
        elif kind == 8:
            s = np.empty(n, np.int32)
            comm.scatter(np.repeat(np.arange(size, dtype=np.int32), n) if rank == root else None, s, root=root)
            if s.tolist() != [rank] * n:
                wrong.append(("scatter", i, s.tolist()))
        else:  # a ring of send/recv
            right, left = (rank + 1) % size, (rank - 1) % size
            got = np.empty(n, np.int64)
            if rank % 2 == 0:
                comm.send(np.full(n, rank, np.int64), right, tag=i)
                comm.recv(got, left, tag=i)
            else:
                comm.recv(got, left, tag=i)
                comm.send(np.full(n, rank, np.int64), right, tag=i)
            if got.tolist() != [left] * n:
                wrong.append(("sendrecv", i, got.tolist()))
    comm.destroy()
    return wrong


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("n", [3, 4, 5])
def test_mixed_loops_with_batched_descriptors_raise_nothing_and_return_the_data(tr, n):
    """400 calls, mostly small broadcasts with changing roots, mixed with allreduce, reduce,
    scatter and send/recv: batches flushed at every kind of boundary, never a false mismatch."""
    for rank, wrong in enumerate(run_ranks(n, _loop, 400, 7 + n, env=transport_env(tr), timeout=300)):
        assert wrong == [], (rank, wrong[:5])


def _lagging_receiver(rank, size, calls):
    """Root 0 and rank 1 run `calls` broadcasts at once; rank 2 starts 1 s later, so rank 1's
    batches reach rank 2 before rank 2 made those calls."""
    comm = harp.init(timeout=60)
    comm.allreduce(np.ones(1, np.float32))
    if rank == size - 1:
        time.sleep(1.0)
    got = []
    for i in range(calls):
        x = np.full(3, i if rank == 0 else -1, np.float32)
        comm.broadcast(x, root=0)
        got.append(x[0] == i)
    comm.destroy()
    return all(got)


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_a_lagging_receiver_takes_batches_that_came_early(tr):
    env = {**transport_env(tr), "HARP_CHECK_WINDOW": "64"}
    assert run_ranks(3, _lagging_receiver, 60, env=env, timeout=120) == [True] * 3


def _exits_without_destroy(rank, size, calls):
    comm = harp.init(timeout=10)
    x = np.full(2, rank, np.float32)
    for _ in range(calls):
        res = outcome(lambda: comm.broadcast(x, root=0))
        if res[0] != "ok":  # the other receiver may find the connection gone while it waits
            return res[0], res[1], 0.0
    if rank == size - 1:
        os._exit(3)  # no destroy(): its partial batch goes with it (exit code 3: the harness counts it)
    t0 = time.monotonic()
    res = outcome(comm.destroy)
    return res[0], res[1], time.monotonic() - t0


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_a_receiver_that_exits_without_destroy_fails_the_roots_destroy_it_does_not_hang(tr):
    """HARP_KEEPALIVE=0: nothing sends the last rank's 3 descriptors. The root's destroy() (and the
    other receiver's) raises PeerError naming that rank and the first call whose check it could not
    complete, as soon as the connection ends (shm: when the peer is found gone), within the timeout."""
    from harness import collect, start_ranks

    env = {**transport_env(tr), "HARP_KEEPALIVE": "0"}
    procs, q = start_ranks(3, _exits_without_destroy, 3, env=env)
    res = collect(procs, q, timeout=60, allow_errors=True)
    assert res[2] == ("died", 3), res
    for rank in (0, 1):  # the root, and the other receiver (which also waits for rank 2's batch)
        kind, text, took = res[rank][1]
        assert kind == "PeerError", res[rank]
        assert "rank 2" in text and ("closed" in text or "reset" in text), text
        if rank == 0:  # the root only sent: its destroy() names the call whose check failed
            assert "earlier call #1 (broadcast(" in text, text
        assert took < 12, took
