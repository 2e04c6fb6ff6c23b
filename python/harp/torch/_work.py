"""torch.distributed Work objects over HARP work handles.

A HarpWork holds the core's work handles for one torch call, the staged
buffers to finish (copy-back of non-contiguous/CUDA outputs) and a
torch.futures.Future (created up front for async calls, on demand for
blocking ones, which finish inline). HARP completes async work on its own
worker thread; Completer threads (one pool per HARP communicator) wait for
works, finish them and complete their futures, so `get_future().then(...)`
chains (DDP comm hooks, PowerSGD) run without anyone calling wait().

wait() does not depend on the Completer: it waits on the HARP handles itself
(the GIL is released while it blocks) and finishes the work; finishing is
idempotent and locked, so whichever thread gets there first does it.

HARP errors become torch.distributed.DistBackendError naming the operation,
this rank and the group; the future carries the same exception. A timeout's
text holds " Timed out (collective operation timeout): ", the words torch's
own backends use and its tests match (see backend_error).
"""
from __future__ import annotations

import collections
import threading

import torch.distributed as dist
from torch.futures import Future

from ..errors import HarpError, HarpTimeoutError, InvalidArgumentError


def backend_error(op: str, pg_desc: str, err: BaseException) -> Exception:
    msg = f"harp {op} failed on {pg_desc}: {err}"
    if isinstance(err, HarpTimeoutError) or (isinstance(err, HarpError) and "timed out" in str(err)):
        # In torch's own words, as its tests match them: " (Timed out|closed|timeout) ", spaces
        # included (distributed_test.py _test_barrier_timeout; gloo says "Timed out waiting ...",
        # the NCCL watchdog "collective operation timeout"), also what elastic agents and users
        # grep for. HARP's text after it still names the operation, its number and the ranks waited for.
        msg = f"harp {op} failed on {pg_desc}: Timed out (collective operation timeout): {err}"
    if isinstance(err, InvalidArgumentError):
        return ValueError(msg)
    return dist.DistBackendError(msg)


class HarpWork(dist.Work):
    def __init__(self, op: str, pg_desc: str, handles=(), staged=(), result=None, post=None, waiters=None):
        super().__init__()
        self._op = op
        self._pg_desc = pg_desc
        self._handles = list(handles)
        self._staged = list(staged)
        self._post = post          # extra Python step after the data arrived (scatter of outputs...)
        self._waiters = waiters    # extra callables that block until their part is done (anysource thread)
        self._result = [] if result is None else result
        self._fut = None  # created on demand (blocking calls rarely ask for it): _src.then(_unwrap)
        self._src = None  # the future finish completes, always with a value
        self._lock = threading.Lock()
        self._done = False
        self._exc = None
        self._source = -1

    # -- what the backend (harp.torch._pg) sets while the work runs ----------------------------------------
    def set_source(self, rank: int) -> None:
        """The rank a receive got its message from (source_rank())."""
        self._source = rank

    def add_waiter(self, fn) -> None:
        """A callable that blocks until a part of this work that is not a HARP handle is done
        (the recv-from-any-source thread); wait() calls it first."""
        self._waiters = (self._waiters or []) + [fn]

    # -- completion ----------------------------------------------------------------------------------------
    def _block(self, timeout=None):
        """Wait for every HARP handle (GIL released). False on timeout."""
        if self._waiters:
            for w in self._waiters:
                w()
        for h in self._handles:
            if not h.wait(-1.0 if timeout is None else timeout):
                return False
        return True

    def finish(self, exc=None):
        """Copy back, run the post step, complete the future. Once."""
        with self._lock:
            if self._done:
                return
            if exc is None:
                try:
                    for s in self._staged:
                        s.finish()
                    if self._post is not None:
                        self._post()
                except Exception as e:  # noqa: BLE001 - reported through the future
                    exc = e
            if exc is not None and not isinstance(exc, (dist.DistBackendError, ValueError)):
                exc = backend_error(self._op, self._pg_desc, exc)
            self._exc = exc
            self._done = True
            self._staged = []
            src = self._src
        if src is not None:
            self._complete(src)

    def _complete(self, src):
        # The source future always gets a value; the future handed out is
        # src.then(_unwrap), which raises the work's error. Future.set_exception
        # would store the exception as a *value* with a Python-only unwrap, and
        # C++ readers (DDP's Reducer::finalize_backward) then read it as tensors
        # and crash; an error raised in a then-callback is a real future error.
        src.set_result(self._result)

    def _unwrap(self, src):
        if self._exc is not None:
            raise self._exc
        return src.value()

    def run_to_completion(self):
        try:
            self._block()
        except HarpError as e:
            self.finish(backend_error(self._op, self._pg_desc, e))
            return
        except Exception as e:  # noqa: BLE001
            self.finish(e)
            return
        self.finish()

    # -- torch.distributed.Work API ------------------------------------------------------------------------
    def wait(self, timeout=None):
        if not self._done:
            # torch's Work.wait rule: its default timeout, kNoTimeout, is 0 ms and means "no
            # limit" (the collective's own timeout still bounds the work); > 0 limits this wait.
            secs = None
            if timeout is not None and hasattr(timeout, "total_seconds") and timeout.total_seconds() > 0:
                secs = timeout.total_seconds()
            try:
                ok = self._block(secs)
            except HarpError as e:
                self.finish(backend_error(self._op, self._pg_desc, e))
                ok = True
            if not ok:
                raise dist.DistBackendError(f"harp {self._op} on {self._pg_desc}: Timed out waiting "
                                            f"{int(secs * 1000)}ms: not finished after {secs} s (the work goes on)")
            self.finish()
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self):
        if self._done:
            return True
        return all(h.test() for h in self._handles) and not self._waiters

    def is_success(self):
        return self._done and self._exc is None

    def exception(self):
        return self._exc

    def get_future(self):
        with self._lock:
            if self._fut is not None:
                return self._fut
            src = self._src = Future()
            self._fut = src.then(self._unwrap)
            done = self._done
        if done:  # finish ran without a future: complete this one now (callbacks run here)
            self._complete(src)
        return self._fut

    def result(self):
        self.wait()
        return self._result

    def synchronize(self):
        self.wait()

    def source_rank(self):
        return self._source

    def _source_rank(self):
        return self._source

    def block_current_stream(self):
        self.wait()


def completed_work(op, pg_desc, result):
    w = HarpWork(op, pg_desc, result=result)
    w.finish()
    return w


class Completer:
    """Threads that wait for works and finish them (copy-back, then the future and its callbacks).

    Future callbacks may block on later futures (PowerSGD's callback runs another allreduce and waits
    for it), so a thread busy with one work must never be the only one that can finish the next: a new
    work starts a new thread unless one is idle. Idle threads linger a few seconds and are reused.
    """

    _LINGER_S = 5.0

    def __init__(self, name: str):
        self._q = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._idle = 0
        self._threads = []
        self._name = name

    def add(self, work: HarpWork):
        with self._cv:
            self._q.append(work)
            if self._idle > len(self._q) - 1:
                self._cv.notify()
                return
            t = threading.Thread(target=self._loop, name=f"harp-torch-{self._name}", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _loop(self):
        while True:
            with self._cv:
                if not self._q and not self._stop:
                    self._idle += 1
                    self._cv.wait(self._LINGER_S)
                    self._idle -= 1
                if not self._q:
                    return
                w = self._q.popleft()
            w.run_to_completion()

    def stop(self):
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            threads = list(self._threads)
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout=30)
