"""harp._work — the call layer every front shares: the Work handle, the timeout rules and each
communicator's CallLayer.

harp.comm (Communicator), harp.coalesce, harp.compress and the torch backend build on this module,
and none of them on each other for it: no import circle, no reach into another module's privates.
Its public names are re-exported by harp.comm and harp.

- ``CallLayer``: what a front needs to run calls on one communicator (``Communicator.calls``): the
  compiled communicator (``core``), ``hold(work, buffers)`` to keep an async call's buffers alive
  until the core is done with them, ``settle()`` before a general-path call, and ``fusion``, the
  coalescing layer's state (harp.coalesce.FusionState, made at its first use).

- ``Work``: the handle of an asynchronous call: ``wait(timeout)`` returns the output buffer and
  drops the buffers it kept alive; ``test()`` never blocks.
- ``_seconds(timeout, what)``: a per-call or communicator timeout in seconds (None: the
  communicator's, returned as -1; otherwise a number > 0; inf or too large for a double: no limit).
- ``wait_seconds(timeout, what)``: a wait's limit (None, inf or past 1e9 s: -1, until done; 0 only
  checks; negatives and NaN refused).
Errors are InvalidArgumentError naming `what` and the value.
"""
from __future__ import annotations

import collections
import math
from typing import Optional

import numpy as np

from .errors import InvalidArgumentError


def _seconds(timeout, what: str = "timeout") -> float:
    """A per-call timeout in seconds (-1: the communicator's). HARP's rule: None means the
    communicator's timeout; any other value must be a number > 0 (0 and negatives are refused,
    not read as "unset"); values too large for a double (huge ints) and inf mean no limit
    (the core saturates them)."""
    if timeout is None:
        return -1.0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{what} must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    t = _float(timeout)
    if math.isnan(t) or t <= 0:
        raise InvalidArgumentError(f"{what} {timeout!r} is not allowed: a timeout is a number of seconds > 0 "
                                   "(None: the communicator's)")
    return t


def _float(x) -> float:
    """float(x), an int too large for a double read as +-inf (no OverflowError)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def wait_seconds(timeout, what: str) -> float:
    """A wait's limit for the core's Work.wait: None, inf or huge -> -1 (until done); seconds >= 0
    (0 only checks); negatives and NaN refused."""
    if timeout is None:
        return -1.0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{what} must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
    secs = _float(timeout)
    if math.isnan(secs) or secs < 0:
        raise InvalidArgumentError(f"{what} {timeout!r} is not allowed: a number of seconds >= 0 (None: until done)")
    return -1.0 if secs > 1e9 else secs  # past 1e9 s: no limit (such a deadline overflows the core's clock)


class CallLayer:
    """One communicator's calls as the fronts see them (harp.comm.Communicator.calls).

    Usage (harp.compress):
        calls = comm.calls
        calls.settle()                                  # retire finished async calls first
        w = _harp.compress_submit(calls.core, ...)      # the compiled communicator
        if async_op:
            calls.hold(w, (send, out))                  # buffers live until the core is done

    Lifetime: made with its Communicator; ``wait_all()`` (the Communicator's __del__) waits for
    every held call so no buffer is freed while the core may still write it. Threading: the
    communicator's submitting thread only (like the calls themselves)."""

    __slots__ = ("core", "_pending", "fusion")

    def __init__(self, core):
        self.core = core      # harp._harp.Comm
        self._pending = None  # deque of (core work, buffers), oldest first; made at the first hold
        self.fusion = None    # harp.coalesce.FusionState, made by the coalescing layer

    def hold(self, w, keep) -> None:
        """Own an async call's buffers until the core has finished with them, whether or not the
        caller keeps the Work (a dropped handle must not free a buffer the collective still
        writes). Collectives complete in issue order, so settle() costs one test() per finished call."""
        p = self._pending
        if p is None:
            p = self._pending = collections.deque()
        p.append((w, keep))

    def settle(self) -> None:
        """Drop the held calls that have finished (from the oldest)."""
        p = self._pending
        while p and p[0][0].test():
            p.popleft()

    @property
    def pending(self) -> bool:
        """Some async call may still use its buffers."""
        return bool(self._pending)

    def wait_all(self) -> None:
        """Wait for every held call (each bounded by its collective's timeout); errors were the
        callers' to fetch, only the buffers' lifetime matters here."""
        p = self._pending
        while p:
            try:
                p[0][0].wait(-1.0)
            except Exception:  # noqa: BLE001
                pass
            p.popleft()


class Work:
    """Handle of an asynchronous collective."""

    def __init__(self, work, result, keep):
        self._work = work
        self._result = result
        self._keep = keep  # buffers stay alive until the work is done (the Communicator holds them too)

    def wait(self, timeout: Optional[float] = None):
        """Block until done (raises the collective's error); returns the output buffer.

        With a timeout (seconds >= 0; 0 only checks), raises TimeoutError if not done by then (the
        work goes on). None, inf or a huge value: wait until done (the collective's own timeout bounds it)."""
        if not self._work.wait(wait_seconds(timeout, "Work.wait: timeout")):
            raise TimeoutError(f"collective not finished after {timeout} s")
        self._keep = None
        return self._result

    def test(self) -> bool:
        """True when finished (successfully or not). Never blocks."""
        return self._work.test()

    def is_completed(self) -> bool:
        return self._work.test()

    @property
    def error(self) -> str:
        return self._work.error()

    @property
    def result(self):
        return self._result
