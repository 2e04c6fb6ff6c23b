"""Adapter from torch.distributed's c10d Store to harp's Store interface.

HARP's bootstrap (bootstrap/bootstrap.cc) needs set/get/add on a key-value store.
torch hands every process-group backend a PrefixStore over the job's store
(TCPStore for env:// and tcp://, FileStore for file://), so HARP rendezvous
rides on whatever init_method the user chose, with no extra port.

Secrets: no job secret is needed or derived here. Rank 0 of each communicator
draws its data-plane token at random (core/engine/communicator.cc) and publishes it
through this store, so the token is as private as the torch store (torch's
TCPStore has no authentication: see SECURITY.md). The adapter implements only
set/get/add, so the rendezvous diagnostics of bootstrap/rendezvous.h degrade to
the plain get() timeout here.

Threading: the core calls these methods from the thread that creates the
communicator (with the GIL re-acquired by the binding); c10d stores are
thread-safe.
"""
from __future__ import annotations

import datetime

from .. import _harp
from ..errors import HarpTimeoutError


class TorchStore(_harp.Store):
    """harp._harp.Store over a torch.distributed.Store."""

    def __init__(self, store):
        super().__init__()
        self._store = store

    def set(self, key, value):
        self._store.set(key, bytes(value))

    def get(self, key, timeout_s):
        t = datetime.timedelta(seconds=max(float(timeout_s), 0.001))
        try:
            self._store.wait([key], t)
        except Exception as e:  # c10d raises DistStoreError (a RuntimeError) on timeout
            raise HarpTimeoutError(
                f"rendezvous key '{key}' not set within {timeout_s:.1f} s (a rank did not join): {e}") from None
        return bytes(self._store.get(key))

    def add(self, key, delta):
        return int(self._store.add(key, int(delta)))
