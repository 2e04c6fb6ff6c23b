"""Which transport the automatic choice picks between ranks on *different hosts*.

On one machine every rank shares a host, so shared memory (priority 30) wins
the automatic choice and "verbs (20) / dpdk (15) is preferred to tcp (10)" is
never exercised. HARP's host identity is boot id + network namespace + IPC
namespace (bootstrap/bootstrap.cc thisHost(), compared by the shm transport's
`reachable`). A rank that moves into its own IPC namespace before harp.init()
is therefore, to HARP, a rank on another host: shm cannot reach it, while its
network (loopback TCP, the rxe device, memif's unix socket and memfd) is
unchanged. Nothing in the library is faked or overridden.

    res = run_ranks(2, chosen_transports, True, env={...})   # True: own hosts
    assert choice_problem(res, "verbs") is None, choice_problem(res, "verbs")

`choice_problem` returns None when every rank reached every peer with the
wanted transport and the ranks really had distinct host ids; otherwise a
message naming the rank, the peer and what was chosen (e.g. tcp). Needs root
(CAP_SYS_ADMIN) for unshare(CLONE_NEWIPC).
"""
from __future__ import annotations

import ctypes
import os

import harp

CLONE_NEWIPC = 0x08000000


def own_host() -> str:
    """Put this process in a private IPC namespace; returns HARP's host id for it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWIPC) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare(CLONE_NEWIPC): {os.strerror(e)} (root needed to look like another host)")
    return harp._harp.host_id()


def chosen_transports(rank, size, separate_hosts):
    """Rank body: (host id, [transport to each other rank, in rank order])."""
    hid = own_host() if separate_hosts else harp._harp.host_id()
    comm = harp.init()
    names = [comm.transport(p) for p in range(size) if p != rank]
    comm.barrier()
    comm.destroy()
    return hid, names


def choice_problem(results, want):
    """None when every peer of every rank uses `want` and all host ids differ; else what went wrong."""
    hosts = [hid for hid, _ in results]
    if len(set(hosts)) != len(hosts):
        return f"ranks share a host id, so shm could reach them: {hosts}"
    for rank, (_, names) in enumerate(results):
        peers = [p for p in range(len(results)) if p != rank]
        for peer, name in zip(peers, names):
            if name != want:
                return f"rank {rank} reaches rank {peer} with {name}, not {want} (all: {[n for _, n in results]})"
    return None
