"""harp.debug — what every communicator of this process is doing, from Python.

HARP keeps a flight recorder per communicator (core/observe/recorder.h): a ring of the
last HARP_FR_ENTRIES operations (sequence number, collective, dtype, count,
algorithm, transport, state, start and end times), always on. It is written
to ``<HARP_FR_DUMP_PREFIX><global rank>`` (default ``<$TMPDIR or /tmp>/harp-trace-<uid>/harp_trace_rank_<r>``, a 0700 folder)
when a communicator breaks (a timeout, a mismatch, a dead peer, abort();
HARP_FR_DUMP_ON_FAILURE=0 turns that off), on SIGUSR1 (HARP_FR_SIGNAL), on
``harp-status --dump`` and by :func:`dump`. The file is the pickle torch's
flight-recorder analyser reads unchanged::

    python -m torch.distributed.flight_recorder.fr_trace /tmp/dumps   # names missing ranks

    import harp.debug
    path = harp.debug.dump()          # this process's record, all communicators
    rec = harp.debug.flight_record()  # the same, as a dict (torch's schema)
    st = harp.debug.status()          # counters, op in flight, metrics (harp-status --json)

Threading: any thread, also while a collective hangs on another thread.
"""
from __future__ import annotations

import json
import pickle

from . import _harp

__all__ = ["dump", "flight_record", "status"]


def dump(reason: str = "harp.debug.dump()") -> str:
    """Write this process's flight record; returns the file's path."""
    return _harp.fr_dump(reason)


def flight_record(reason: str = "harp.debug.flight_record()") -> dict:
    """This process's flight record as a dict: version, pg_config, pg_status, entries, harp."""
    return pickle.loads(_harp.fr_pickle(reason))


def status() -> dict:
    """{"pid", "host", "global_rank", "comms": [{comm, rank, size, hosts, started, completed,
    in_flight, stall_view, metrics, ...}]} for every live communicator of this process."""
    return json.loads(_harp.obs_status_json())
