"""harp._work — the call layer every front shares: the Work handle and the timeout rules.

harp.comm (Communicator), harp.coalesce and harp.compress build on this module, and none of them on
each other for it: no import circle. Its names are re-exported by harp.comm and harp.

- ``Work``: the handle of an asynchronous call: ``wait(timeout)`` returns the output buffer and
  drops the buffers it kept alive; ``test()`` never blocks.
- ``_seconds(timeout, what)``: a per-call or communicator timeout in seconds (None: the
  communicator's, returned as -1; otherwise a number > 0; inf or too large for a double: no limit).
- ``wait_seconds(timeout, what)``: a wait's limit (None, inf or past 1e9 s: -1, until done; 0 only
  checks; negatives and NaN refused).
Errors are InvalidArgumentError naming `what` and the value.
"""
from __future__ import annotations

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
