"""TCP pairs connected on first use (HARP_SOCKET_CONNECT=lazy, the default from
HARP_SOCKET_LAZY_RANKS ranks): a rank holds sockets only to the peers its collectives
used, every collective stays correct, and a peer that is gone before anyone connected to
it is reported within seconds, naming it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

import harp
from collectives_check import check_everything
from harness import own_tcp_peers, run_ranks

LAZY = {"HARP_TRANSPORT": "tcp", "HARP_SOCKET_CONNECT": "lazy"}


def _tcp_peers():
    """This process's connected TCP sockets but the one to the bootstrap store."""
    store_port = int(harp.UniqueId.from_hex(os.environ["HARP_UNIQUE_ID"]).address.rsplit(":", 1)[1])
    return sum(1 for _, port in own_tcp_peers() if port != store_port)


def _counts(rank, size, barrier):
    """Connections after init, after a ring allreduce and after a recursive-doubling one; every
    rank counts between two barriers (outside HARP), so no rank's next call dials one that counts."""
    pre = _tcp_peers()  # what the forked process inherited
    c = harp.init()

    def count():
        barrier.wait()
        n = _tcp_peers()
        barrier.wait()
        return n

    base = count()
    x = np.full(1001, c.rank + 1.0, np.float32)
    c.allreduce(x, algo="ring")
    after_ring = count()
    ok_ring = bool(np.all(x == size * (size + 1) / 2))
    y = np.full(7, c.rank + 1, np.int64)
    c.allreduce(y, algo="recursive_doubling")
    after_rd = count()
    ok_rd = bool(np.all(y == size * (size + 1) // 2))
    c.destroy()
    return base - pre, after_ring - pre, after_rd - pre, ok_ring, ok_rd


def _run_counts(p, env):
    return run_ranks(p, _counts, mp.get_context("fork").Barrier(p), env=env, timeout=120)


def test_a_rank_connects_only_to_the_peers_its_collectives_use():
    p = 8
    lazy = _run_counts(p, LAZY)
    eager = _run_counts(p, {"HARP_TRANSPORT": "tcp", "HARP_SOCKET_CONNECT": "eager"})
    for r in range(p):
        base, ring, rd, ok1, ok2 = lazy[r]
        assert ok1 and ok2, lazy[r]
        # ring: the two neighbours; recursive doubling at 8 ranks: r^1, r^2, r^4, of which
        # r^1 is a ring neighbour (r-1 or r+1), so two more.
        assert ring - base == 2, (r, lazy[r])
        assert rd - ring == 2, (r, lazy[r])
        e_base, e_ring, e_rd, _, _ = eager[r]
        assert e_ring == e_base and e_rd == e_base, (r, eager[r])  # eager: all up at init
        assert base == 0 and e_base == p - 1, (r, lazy[r], eager[r])


def _everything(rank, size):
    c = harp.init()
    failures, calls = check_everything(c)
    c.destroy()
    return failures, calls


@pytest.mark.parametrize("p", [3, 5, 8])
def test_every_collective_is_correct_on_lazy_pairs(p):
    res = run_ranks(p, _everything, env=LAZY, timeout=300)
    for r, (failures, calls) in enumerate(res):
        assert calls > 0 and not failures, (r, failures[:10])


def test_lazy_is_the_default_from_the_lazy_rank_count():
    res = _run_counts(4, {"HARP_TRANSPORT": "tcp", "HARP_SOCKET_LAZY_RANKS": "4"})
    assert all(r[1] - r[0] == 2 for r in res), res  # lazy without HARP_SOCKET_CONNECT
    res = _run_counts(4, {"HARP_TRANSPORT": "tcp", "HARP_SOCKET_LAZY_RANKS": "5"})
    assert all(r[1] == r[0] for r in res), res  # 4 < 5: eager


def _gone_before_connected(rank, size, victim):
    import signal
    c = harp.init()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)  # never connected to anyone: no goodbye
    time.sleep(0.5)
    t = time.monotonic()
    try:
        c.send(np.ones(4, np.float32), victim)
        out = ("no error", "")
    except harp.HarpError as e:
        out = (type(e).__name__, str(e))
    took = time.monotonic() - t
    try:
        c.destroy()
    except harp.HarpError:
        pass
    return out, took


@pytest.mark.parametrize("victim,keepalive", [(0, "0"), (2, "1")])
def test_a_peer_gone_before_anyone_connected_is_named_within_seconds(victim, keepalive):
    # victim 0: both others dial it and are refused (keep-alive off: the dial alone must tell);
    # victim 2: rank 1 waits for its dial, rank 0 too; the keep-alive names it.
    env = LAZY | {"HARP_HANDSHAKE_REFUSED_S": "1", "HARP_KEEPALIVE": keepalive}
    res = run_ranks(3, _gone_before_connected, victim, env=env, timeout=60, allow_errors=True)
    assert res[victim][0] == "died", res
    for r in range(3):
        if r == victim:
            continue
        status, ((kind, text), took) = res[r]
        assert status == "ok" and kind != "no error", res[r]
        assert f"rank {victim}" in text, res[r]
        assert took < 10, res[r]


def test_start_up_records_through_rank_0_at_many_ranks():
    # HARP_STORE_GATHER_RANKS: from this many ranks each start-up exchange goes through rank 0
    # (3p store requests instead of p^2); with lazy pairs, the path a 64+ rank job takes.
    env = LAZY | {"HARP_STORE_GATHER_RANKS": "2"}
    res = run_ranks(6, _everything, env=env, timeout=300)
    for r, (failures, calls) in enumerate(res):
        assert calls > 0 and not failures, (r, failures[:10])
