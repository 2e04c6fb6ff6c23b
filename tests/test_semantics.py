"""Core semantics: descriptor agreement, p2p tags, buffer overlap,
integer avg, abort, and threads sharing a communicator.

Every test runs real ranks (forked processes, real sockets / shared memory) on
tcp and shm, with non-power-of-two rank counts where the rank count matters.

* Ranks that disagree about a rooted collective (root, count, dtype, op) raise
  MismatchError on every rank: in that very call where the rank receives data,
  at its next call or at destroy() where it only sent (broadcast/scatter root,
  reduce/gather non-root), naming the earlier call and the disagreeing ranks;
  the communicator stays broken afterwards. Many correct back-to-back rooted
  calls with varying roots never raise (no false positive from the deferral).
* p2p tags are compared in full: recv(tag=261) never takes send(tag=5).
* Send/receive buffers that partially overlap are refused locally
  (InvalidArgumentError); exact in-place aliasing still works.
* Integer avg is the exact average of the values (truncated toward zero), not
  the average of a wrapped sum.
* abort() on one rank fails the others' pending and later calls with PeerError
  naming the aborting rank.
* Two threads calling collectives on one communicator at once get
  InvalidArgumentError naming both threads and the communicator breaks on
  every rank (the calls racing just before the first overlap may still pair
  differently across ranks: the guard sees overlap, not order).
"""
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harp
from harness import outcome, outcome_and_next, run_ranks, transport_env

TRANSPORTS = ["tcp", "shm"]
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))


_env = transport_env
_outcome = outcome


# ---------------------------------------------------------------------------- rooted collectives
def _rooted(rank, size, coll, roots, counts):
    comm = harp.init(timeout=60)
    root, n = roots[rank], counts[rank]
    x = np.full(n * (size if coll == "scatter" else 1), rank + 1, np.float32)

    def call():
        if coll == "broadcast":
            comm.broadcast(x, root=root)
        elif coll == "reduce":
            comm.reduce(x, root=root)
        elif coll == "gather":
            comm.gather(x, root=root)
        elif coll == "scatter":
            comm.scatter(x if rank == root else None, np.empty(n, np.float32), root=root)
        return x.tolist()

    return outcome_and_next(comm, call)


def _only_sends(coll, rank, root):
    """Does this rank (with its own idea of the root) only send data in the call?"""
    return (rank == root) == (coll in ("broadcast", "scatter"))


def _may_learn_late(coll, rank, root, count):
    """May this rank return from the call and raise at its next one? A rank that only sends, and a
    broadcast/scatter receiver (its data, tagged with the root's exact descriptor, vouches for the
    root): neither waits for its peers' descriptors in the call (count 0 is checked in the call)."""
    return count > 0 and (_only_sends(coll, rank, root) or coll in ("broadcast", "scatter"))


def _names_the_earlier_call(msg):
    """A late rank's error names call #1: its own deferred check found it ("earlier call #1 ("), or a
    peer that found it first aborted the communicator with its own finding on call #1 (which of the
    two reaches the late rank first is a race: both say what was wrong)."""
    return "earlier call #1 (" in msg or ("aborted the communicator" in msg and "collective mismatch" in msg
                                          and ") #1 " in msg)


def _assert_every_rank_raises(coll, roots, counts, res):
    """MismatchError on every rank: in the call, or (a rank that only sent, or a receiver whose data
    agreed with its own call) at its next call, naming the earlier call; a receiver that returned
    got the data of the root it named; and the communicator stays broken."""
    for rank, (first, second) in enumerate(res):
        late = first[0] == "ok" and _may_learn_late(coll, rank, roots[rank], counts[rank])
        assert first[0] == "MismatchError" or late, (roots, counts, rank, res)
        assert second[0] == "MismatchError", (roots, counts, rank, res)
        if late:
            assert _names_the_earlier_call(second[1]), (rank, res)
        if late and coll == "broadcast":
            assert first[1] == [float(roots[rank] + 1)] * counts[rank], (rank, res)


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("coll", ["broadcast", "reduce", "gather", "scatter"])
def test_root_disagreement_raises_mismatch_on_every_rank(tr, coll):
    n = 3
    res = run_ranks(n, _rooted, coll, [0, 1, 0], [4] * n, env=_env(tr), timeout=120)
    _assert_every_rank_raises(coll, [0, 1, 0], [4] * n, res)
    assert any("root=1" in str(first[1]) + str(second[1]) for first, second in res), res


@pytest.mark.parametrize("tr", TRANSPORTS)
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_rooted_descriptor_disagreements_generated(tr, data):
    n = data.draw(st.sampled_from([2, 3, 5]))
    coll = data.draw(st.sampled_from(["broadcast", "reduce", "gather", "scatter"]))
    roots = data.draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
    counts = data.draw(st.lists(st.sampled_from([0, 1, 7]), min_size=n, max_size=n))
    res = run_ranks(n, _rooted, coll, roots, counts, env=_env(tr), timeout=120)
    agree = len(set(roots)) == 1 and len(set(counts)) == 1
    for first, second in res:
        if agree:
            assert first[0] == "ok" and second == ("ok", [float(n)] * 2), res
    if not agree:
        _assert_every_rank_raises(coll, roots, counts, res)


def _late(rank, size, coll, then):
    """Call #1 an allreduce, call #2 a rooted call (root 0) in which the last rank disagrees about
    the count; the ranks that receive data in #2 enter it 0.5 s late, so the ranks that only send
    finish #2 before anyone could object. Then `then`: the next collective or destroy()."""
    comm = harp.init(timeout=30)
    comm.allreduce(np.ones(2, np.float32))
    x = np.full(5 if rank == size - 1 else 4, rank + 1, np.float32)
    if not _only_sends(coll, rank, 0):
        time.sleep(0.5)
    first = outcome(lambda: [getattr(comm, coll)(x, root=0), None][1])
    if then == "destroy":
        second = outcome(comm.destroy)
    else:
        second = outcome(lambda: comm.allreduce(np.ones(2, np.float32)).tolist())
    if first[0] != "ok":
        time.sleep(1)
    return first, second


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("coll", ["broadcast", "reduce"])
@pytest.mark.parametrize("then", ["next call", "destroy"])
def test_a_rank_that_only_sent_learns_of_a_disagreement_at_its_next_call_or_destroy(tr, n, coll, then):
    """The broadcast root (the reduce's non-roots) returns from call #2, then raises MismatchError at
    its next collective or at destroy(), naming call #2 and the ranks that disagreed with it;
    ranks that receive data raise in call #2 itself."""
    res = run_ranks(n, _late, coll, then, env=_env(tr), timeout=120)
    last = n - 1
    for rank, (first, second) in enumerate(res):
        if rank == last and not _only_sends(coll, rank, 0):
            assert first[0] == "MismatchError", (rank, res)  # its data disagreed: in the call
            continue
        if not _only_sends(coll, rank, 0):
            # a reduce root waits for every descriptor; a broadcast receiver whose data agreed
            # raises in the call if the last rank's descriptor came while it waited, else later
            assert first[0] == "MismatchError" or (coll == "broadcast" and first[0] == "ok"), (rank, res)
            if first[0] == "MismatchError":
                continue
        assert first[0] == "ok", (rank, res)
        assert second[0] == "MismatchError", (rank, res)
        if "aborted the communicator" in second[1]:
            # A rank that raised in call #2 aborted the communicator, and its notice reached this rank
            # before this rank's own check did (seen in CI for a reduce at 3 ranks): it names the same
            # call #2 and the disagreeing descriptors.
            assert "collective mismatch" in second[1] and f"{coll}(count=5," in second[1], (rank, second)
            assert ") #2 " in second[1], (rank, second)
            continue
        disagreeing = ", ".join(str(q) for q in range(n) if q != rank) if rank == last else str(last)
        assert f"earlier call #2 ({coll}(count={5 if rank == last else 4}," in second[1], (rank, second)
        assert f"rank(s) {disagreeing} disagreed" in second[1], (rank, second)
        assert f"called {coll}(count={4 if rank == last else 5}," in second[1], (rank, second)


def _run_ahead(rank, size, calls):
    """The root broadcasts `calls` times at once; the receivers start 1.5 s later. Returns the
    root's seconds from its start to the end of each call (receivers: their results)."""
    comm = harp.init(timeout=60)
    comm.allreduce(np.ones(1, np.float32))
    x = np.full(2, rank + 7, np.float32)
    if rank != 0:
        time.sleep(1.5)
    t0, ends, got = time.monotonic(), [], []
    for _ in range(calls):
        comm.broadcast(x, root=0)
        ends.append(time.monotonic() - t0)
        got.append(x.tolist())
    comm.destroy()
    return ends if rank == 0 else got


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("window", [1, 3, 8])
def test_a_broadcast_root_runs_at_most_the_check_window_ahead(tr, window):
    """HARP_CHECK_WINDOW: the root's first `window` calls return without its peers (its descriptor
    checks stay open); call window+1 waits for the peers' descriptors of call 1."""
    env = {**_env(tr), "HARP_CHECK_WINDOW": str(window)}
    res = run_ranks(3, _run_ahead, window + 2, env=env, timeout=120)
    ends = res[0]
    assert ends[window - 1] < 1.0, ends          # ran ahead of receivers that were asleep
    assert ends[window] > 1.2, ends              # and no further
    for got in res[1:]:
        assert got == [[7.0, 7.0]] * (window + 2), got


def _idle_receiver(rank, size, calls, idle_s):
    """The root broadcasts `calls` times and destroys; the receivers take the broadcasts, stay idle
    `idle_s` seconds (no HARP call), then destroy. Returns the root's seconds in destroy()."""
    comm = harp.init(timeout=60)
    x = np.full(3, rank + 1, np.float32)
    for _ in range(calls):
        comm.broadcast(x, root=0)
        assert x.tolist() == [1.0] * 3, x
    if rank != 0:
        time.sleep(idle_s)
    t0 = time.monotonic()
    comm.destroy()
    return time.monotonic() - t0


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_a_root_destroy_does_not_wait_for_an_idle_receiver(tr):
    """Receivers' deferred descriptors are lazy sends (tcp: held by the transport, up to 16, until a
    wait over 1 ms or the keep-alive's flush within 0.5 s): the root's destroy() completes its
    checks without waiting for the receivers' destroy 8 s later."""
    res = run_ranks(3, _idle_receiver, 5, 8.0, env=_env(tr), timeout=120)
    assert res[0] < 4.0, res


def _many_rooted(rank, size, iters):
    comm = harp.init(timeout=60)
    wrong = []
    for i in range(iters):
        root, n = (i * 5 + i // 7) % size, 1 + i % 6
        x = np.full(n, i * 10 + rank if rank == root else -1, np.int64)
        comm.broadcast(x, root=root)
        if x.tolist() != [i * 10 + root] * n:
            wrong.append(("broadcast", i, x.tolist()))
        red_root = (root + 1 + i % 2) % size
        r = comm.reduce(np.full(n, i + rank, np.int64), root=red_root)
        if rank == red_root and r.tolist() != [i * size + sum(range(size))] * n:
            wrong.append(("reduce", i, r.tolist()))
        if i % 5 == 0:
            g = comm.gather(np.full(n, rank, np.int32), root=root)
            s = np.empty(n, np.int32)
            comm.scatter(np.repeat(np.arange(size, dtype=np.int32), n) if rank == root else None, s, root=root)
            if s.tolist() != [rank] * n or (rank == root and np.asarray(g).ravel().tolist() !=
                                            [q for q in range(size) for _ in range(n)]):
                wrong.append(("gather/scatter", i))
        if i % 9 == 0:
            comm.allreduce(np.ones(3, np.float32))
    comm.destroy()
    return wrong


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
def test_back_to_back_rooted_calls_with_varying_roots_raise_nothing(tr, n):
    """No false positive from the deferred check: 600 rounds of broadcast and reduce (and some
    gather, scatter, allreduce) with roots and counts changing every call, then destroy()."""
    for rank, wrong in enumerate(run_ranks(n, _many_rooted, 600, env=_env(tr), timeout=300)):
        assert wrong == [], (rank, wrong[:5])


def _rooted_ok(rank, size, root):
    comm = harp.init(timeout=60)
    x = np.full(5, rank, np.int32)
    comm.broadcast(x, root=root)
    g = comm.gather(np.full(2, rank, np.int32), root=root)
    s = np.empty(2, np.int32)
    comm.scatter(np.arange(2 * size, dtype=np.int32) if rank == root else None, s, root=root)
    r = comm.reduce(np.full(3, rank, np.int64), root=root)
    return x.tolist(), None if g is None else np.asarray(g).ravel().tolist(), s.tolist(), \
        (r.tolist() if rank == root else None)


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("n", [3, 5])
def test_rooted_collectives_still_work_with_the_check(tr, n):
    root = n - 2
    res = run_ranks(n, _rooted_ok, root, env=_env(tr), timeout=120)
    for rank, (b, g, s, r) in enumerate(res):
        assert b == [root] * 5
        assert s == [2 * rank, 2 * rank + 1]
        if rank == root:
            assert g == [q for q in range(n) for _ in range(2)]
            assert r == [sum(range(n))] * 3


def _count_zero(rank, size):
    comm = harp.init(timeout=60)
    n = 0 if rank == 0 else 5
    return _outcome(lambda: comm.allreduce(np.ones(n, np.float32)).tolist())


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_zero_count_against_nonzero_count_is_a_mismatch_not_a_hang(tr):
    res = run_ranks(3, _count_zero, env=_env(tr), timeout=120)
    assert all(cls == "MismatchError" for cls, _ in res), res


# ---------------------------------------------------------------------------- p2p tags
def _p2p(rank, size, send_tags, recv_tags):
    comm = harp.init(timeout=60)
    out = []
    for st_, rt in zip(send_tags, recv_tags):
        if rank == 0:
            out.append(_outcome(lambda: comm.send(np.full(3, st_ % 1000, np.int32), peer=1, tag=st_)))
        else:
            buf = np.full(3, -1, np.int32)
            out.append(_outcome(lambda: (comm.recv(buf, peer=0, tag=rt), buf.tolist())[1]))
        if out[-1][0] != "ok":
            break
    return out


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("a,b", [(5, 261), (261, 5), (7, 7 + (1 << 16)), (1, 1 + (1 << 24)), ((1 << 31) - 1, 2 ** 31 - 1 - 256)])
def test_p2p_tags_are_compared_in_full(tr, a, b):
    res = run_ranks(2, _p2p, [a], [b], env=_env(tr), timeout=60)
    got = res[1][0]
    assert got[0] == "MismatchError", res
    assert f"tag={a}" in got[1] and f"tag={b}" in got[1], got


@pytest.mark.parametrize("tr", TRANSPORTS)
@SETTINGS
@given(tags=st.lists(st.integers(0, 2 ** 31 - 1), min_size=1, max_size=8))
def test_p2p_equal_tags_of_any_size_deliver(tr, tags):
    res = run_ranks(2, _p2p, tags, tags, env=_env(tr), timeout=60)
    assert [r[1] for r in res[1]] == [[t % 1000] * 3 for t in tags], res


# ---------------------------------------------------------------------------- overlap
def _overlap(rank, size):
    comm = harp.init(timeout=60)
    out = {}
    base = np.arange(16, dtype=np.float32)
    out["allreduce_partial"] = _outcome(lambda: comm.allreduce(base[0:8], base[4:12]))
    big = np.arange(size * 4 + 4, dtype=np.float32)
    out["reduce_scatter_partial"] = _outcome(lambda: comm.reduce_scatter(big[: size * 4], big[1:5]))
    out["alltoall_partial"] = _outcome(lambda: comm.alltoall(big[: size * 2], big[2: size * 2 + 2]))
    # exact in-place aliasing is fine, and the communicator is still usable
    x = np.full(8, rank + 1, np.float32)
    comm.allreduce(x, x)
    y = np.arange(size * 3, dtype=np.float32)
    comm.reduce_scatter(y, y[rank * 3: rank * 3 + 3])
    g = np.zeros(size * 2, np.float32)
    g[rank * 2: rank * 2 + 2] = rank
    comm.allgather(g[rank * 2: rank * 2 + 2], g)
    return out, x.tolist(), y[rank * 3: rank * 3 + 3].tolist(), g.tolist()


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_partially_overlapping_buffers_are_refused_in_place_works(tr):
    n = 3
    res = run_ranks(n, _overlap, env=_env(tr), timeout=120)
    for rank, (out, x, rs, g) in enumerate(res):
        for k, (cls, msg) in out.items():
            assert cls == "InvalidArgumentError" and "overlap" in msg, (k, cls, msg)
        assert x == [sum(range(1, n + 1))] * 8
        assert rs == [float(n * (rank * 3 + i)) for i in range(3)]
        assert g == [float(q) for q in range(n) for _ in range(2)]


# ---------------------------------------------------------------------------- integer avg
def _avg(rank, size, dtype, values, coll):
    comm = harp.init(timeout=60)
    x = np.array(values[rank], dtype=dtype)
    if coll == "allreduce":
        return comm.allreduce(x, op="avg").tolist()
    if coll == "reduce":
        r = comm.reduce(x, op="avg", root=size - 1)
        return r.tolist() if rank == size - 1 else None
    out = comm.reduce_scatter(np.tile(x, size), op="avg")
    return out.tolist()


def _exact_avg(vals, n):
    s = sum(vals)
    q = abs(s) // n
    return q if s >= 0 else -q


INT_TYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("coll", ["allreduce", "reduce", "reduce_scatter"])
@SETTINGS
@given(data=st.data())
def test_integer_avg_is_exact(tr, coll, data):
    n = data.draw(st.sampled_from([2, 3]))
    dtype = data.draw(st.sampled_from(INT_TYPES))
    info = np.iinfo(dtype)
    elems = st.integers(int(info.min), int(info.max))
    k = data.draw(st.integers(1, 5))
    values = [data.draw(st.lists(elems, min_size=k, max_size=k)) for _ in range(n)]
    res = run_ranks(n, _avg, dtype, values, coll, env=_env(tr), timeout=120)
    want = [_exact_avg([values[r][i] for r in range(n)], n) for i in range(k)]
    for rank, got in enumerate(res):
        if coll == "reduce" and rank != n - 1:
            continue
        assert got == want, (dtype, values, got, want)


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_integer_avg_of_large_values_does_not_wrap(tr):
    values = [[120, -128, 2**7 - 1]] * 3
    res = run_ranks(3, _avg, np.int8, values, "allreduce", env=_env(tr), timeout=60)
    assert all(r == [120, -128, 127] for r in res), res
    big = [[2**63 - 1, -(2**63), 2**63 - 2]] * 3
    res = run_ranks(3, _avg, np.int64, big, "allreduce", env=_env(tr), timeout=60)
    assert all(r == big[0] for r in res), res


# ---------------------------------------------------------------------------- abort
def _abort_idle(rank, size):
    comm = harp.init(timeout=60)
    comm.barrier()
    if rank == 0:
        comm.abort("rank zero gave up")
        time.sleep(3)  # the others call while this process still lives
        return "aborted", ""
    time.sleep(1)
    return _outcome(lambda: comm.allreduce(np.ones(3, np.float32)).tolist())


def _abort_mid(rank, size):
    """Rank 0 is blocked in an allreduce (its data already sent) when another
    of its threads aborts; the others only call afterwards."""
    comm = harp.init(timeout=60)
    comm.barrier()
    if rank == 0:
        threading.Timer(0.5, lambda: comm.abort("watchdog fired")).start()
        got = _outcome(lambda: comm.allreduce(np.ones(3, np.float32)).tolist())
        time.sleep(3)
        return got
    time.sleep(1.5)
    return _outcome(lambda: comm.allreduce(np.ones(3, np.float32)).tolist())


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("when", ["idle", "mid"])
def test_abort_fails_the_peers_next_call(tr, n, when):
    res = run_ranks(n, _abort_idle if when == "idle" else _abort_mid, env=_env(tr), timeout=120)
    if when == "mid":
        assert res[0][0] == "PeerError", res
    for cls, msg in res[1:]:
        assert cls == "PeerError", res
        assert "rank 0" in msg, res
    # nobody finished the interrupted collective
    assert all(r[0] != "ok" for r in res), res


# ---------------------------------------------------------------------------- threads
def _threads(rank, size, iters, distinct_counts=False):
    """Two threads per rank race allreduces on one communicator; with distinct_counts each
    thread's calls carry their own descriptor (count 16 + thread id). (wrong, errors, late):
    late = calls that returned without an error although they started after this rank's first
    error (the communicator was already broken)."""
    comm = harp.init(timeout=60)
    wrong, errors, done = [], [], []

    def work(tid):
        n = 16 + tid if distinct_counts else 16
        for i in range(iters):
            v = tid * 100000 + i
            x = np.full(n, v, np.float64)
            t = time.monotonic()
            try:
                comm.allreduce(x)
            except harp.HarpError as e:
                errors.append((type(e).__name__, str(e), time.monotonic()))
                return
            done.append((tid, i, t))
            if not np.all(x == size * v):
                wrong.append((tid, i, float(x[0])))

    ts = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    first = min((e[2] for e in errors), default=float("inf"))
    late = [(tid, i) for tid, i, t in done if t > first]
    return wrong, [e[:2] for e in errors], late


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_threads_sharing_a_communicator_are_stopped_at_the_first_overlap(tr):
    """Overlapping calls are detected and break the communicator on every rank, so the silent
    mixing stops there: no call that starts after a rank's first error returns as if it
    succeeded, and both threads stop with an error naming the overlap (before the guard: about
    half of 1200 calls wrong, and no error). Known limit: the guard sees overlap, not order, so
    racing calls that take turns without overlapping, before the first overlap, can still be
    paired differently on two ranks: full CI runs saw 5, 25 and 114 such calls of 1200 (the
    count depends on how the threads are scheduled), so it is reported, not bounded."""
    res = run_ranks(2, _threads, 600, env=_env(tr), timeout=180)
    named = False
    for wrong, errors, late in res:
        assert not late, (late[:12], len(wrong))
        assert len(errors) == 2, errors  # both threads stopped with an error
        for cls, msg in errors:
            assert cls in ("InvalidArgumentError", "PeerError", "MismatchError"), (cls, msg)
            named |= cls == "InvalidArgumentError" and msg.count("thread") >= 2
    assert named, res


def _sequential_threads(rank, size):
    comm = harp.init(timeout=60)
    out = []
    for i in range(6):
        t = threading.Thread(target=lambda: out.append(comm.allreduce(np.full(2, i, np.int32)).tolist()))
        t.start()
        t.join()
    return out


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_sequential_calls_from_different_threads_are_fine(tr):
    res = run_ranks(3, _sequential_threads, env=_env(tr), timeout=120)
    assert all(r == [[3 * i] * 2 for i in range(6)] for r in res), res
