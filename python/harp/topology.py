"""harp.topology(comm): which ranks share a host, as the communicator decided it.

    import harp
    comm = harp.init()
    t = harp.topology(comm)
    t["hosts"]       # [{"host": 0, "hostname": "h0", "key": "...", "ranks": [0, 1], "nics": [...]}, ...]
    t["host_of"]     # host index of every rank
    t["local_rank"]  # every rank's position on its host
    t["rails"]       # rail i: the i-th rank of every host (rail 0 = the leaders)
    print(t["text"]) # the same, as HARP_DEBUG=INFO logs it once per communicator

Hosts are ordered by their lowest rank. A host key is the kernel's boot id with
the network, IPC and mount namespace inodes (so containers and harp-cluster
hosts on one kernel are different hosts), or HARP_HOSTID when set; ranks that
claim one key are confirmed by a shared-memory probe when the communicator is
created (bootstrap/bootstrap.h). Hosts may hold different numbers of ranks.
`nics` lists each rank's interfaces, "name=address,...", for display.

Local: no communication (the map was exchanged when the communicator formed).
"""
from __future__ import annotations


def topology(comm) -> dict:
    """The host map of `comm` (a harp.Communicator) as a dict; see the module doc."""
    from . import _harp

    impl = getattr(comm, "_c", comm)
    t = _harp.topology(impl)
    t["ranks_per_host"] = [len(h["ranks"]) for h in t["hosts"]]
    return t
