"""hvd.join: ranks that run out of data stand in for the others' allreduces with zeros.

    hvd.init(join=True)                  # every rank: collectives carry a join control header
    for x, y in my_batches:              # the number of batches may differ between ranks
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    last = hvd.join()                    # blocks until every rank has joined; the rank that joined last

Semantics (Horovod's: horovod/common/controller.cc, tensor_queue.cc, operations.cc):
a rank that calls join() has finished its data. Until every rank has joined,
the others keep training: every allreduce they start (hvd.allreduce/_async/_,
grouped_allreduce, DistributedOptimizer) also runs on each joined rank, which
contributes zeros of the same count and dtype with the same op. Average
divides by size() -- every rank, joined or not -- as Horovod's postscale
1/size does, so a step where k of n ranks ran data averages their sum over n;
Min, Max and Product see the zeros too (Horovod's behaviour; use Sum or
Average under join). join() returns, on every rank, the rank that joined last
(of several that joined in the same round, the highest, which is what
Horovod's coordinator reports when it reads their requests in rank order);
afterwards no rank is joined and the job may go on (e.g. broadcast_parameters
from that rank: a joined rank's model stopped at its last step). allgather,
broadcast, alltoall, barrier and the object calls raise InvalidArgumentError
on the ranks that call them while any rank is joined (Horovod raises too); the
joined ranks go on waiting.

Protocol: HARP pairs collectives by issue order, with no negotiation thread,
so with join=True every collective of this front is preceded by a control
allreduce (op max) of _F int64 words: [joined, joining rank or -1, -(joined
rank), kind, count, dtype, op, -kind, -count, -dtype, -op], where a joined
rank fills the last eight with _SENT and a rank with data fills the joined
words with 0 / -1 / _SENT. Max gives every rank the same picture: the header
of the ranks with data (and, from max(-x), whether they disagree: then every
rank that sees it aborts the communicator, so nobody waits for a partner that
will never come), whether any rank has joined, which joined this round. A
joined rank loops: control round, then zeros into the allreduce named, until a
round has no rank with data (all have joined). A rank with data never waits
for its control round before the data (both are posted back to back; the
control result is checked when the operation is synchronized), except before
the calls that are refused under join.

Cost (join=True only): one 88-byte allreduce per collective, issued just
before it; no waits added for allreduce, but it runs in line, so a small
allreduce pays about one more small-allreduce latency. Measured
(examples/horovod/join_overhead.py, 3 ranks on one 2-core VM, tcp/shm as
harp-run picks, load 11-12, two runs of 5 alternated rounds, medians): 1 and
4K float32 hvd.allreduce 1.6-2.4x (+280 to +470 us on 340-470 us), 1M float32
not resolvable in the noise (0.5-0.75x), a DistributedOptimizer step of the
8-tensor convnet 1.11-1.12x. That is why it is opt-in. Without join=True
nothing is added to any call; join() still works if every rank calls it at the same point (one
control round) and otherwise ends in MismatchError on every rank (the others'
data collectives meet the control round), never in a hang.

Waits: each control round and zero allreduce of a joined rank waits at most
the communicator's timeout (HARP_TIMEOUT), so a gap between the others'
collectives longer than that ends join() with HorovodInternalError.

Threading: the caller's thread, like the rest of harp.horovod.
"""
from __future__ import annotations

import numpy as np
import torch

from harp._buffers import torch_cpu_view
from harp.errors import HarpError, InvalidArgumentError, MismatchError

from ._names import _OP_NAME, HorovodInternalError

_F = 11
_SENT = -(1 << 62)
_MAX_COUNT = 1 << 40  # a joined rank allocates count zeros: refuse a header beyond any real tensor
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "barrier", "broadcast_object", "allgather_object")
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_CODE = {dt: i + 1 for i, dt in enumerate(_DTYPES)}
_MAX_PENDING = 32  # zero allreduces a joined rank keeps in flight

_mode = {"on": False}


def enable(on):
    _mode["on"] = bool(on)


def enabled():
    return _mode["on"]


def _header(rank, joined=False, joining=False, kind=0, count=0, dtype=0, op=0):
    h = np.full(_F, _SENT, np.int64)
    if joined or joining:
        h[0], h[1], h[2] = 1, rank if joining else -1, -rank
    else:
        h[0], h[1] = 0, -1
        h[3:7] = (kind, count, dtype, op)
        h[7:11] = -h[3:7]
    return h


class _Round:
    """What one control allreduce's max says (the same on every rank)."""

    def __init__(self, h):
        self.any_joined = bool(h[0])
        self.last_joiner = int(h[1])
        self.first_joined = -int(h[2]) if h[2] != _SENT else -1
        self.active = h[3] != _SENT
        self.kind, self.count, self.dtype, self.op = (int(v) for v in h[3:7])
        self.mismatch = self.active and not np.array_equal(h[3:7], -h[7:11])


def _fail(c, h, what):
    """Ranks with data disagree (or a header is out of range): abort so every rank hears it, then raise."""
    lo = (-h[7:11]).tolist()
    msg = (f"hvd.{what}: ranks disagree about the next collective under hvd.join, or sent an out-of-range "
           f"header (kind, count, dtype, op: highest {h[3:7].tolist()}, lowest {lo}; kinds {list(KINDS)}); "
           f"every rank must start the same collectives in the same order")
    try:
        c.abort(msg)
    except HarpError:
        pass
    raise MismatchError(msg)


def _control(c, h, what):
    try:
        c.allreduce(h, op="max")
    except HarpError as e:
        raise _internal(e, what) from e
    r = _Round(h)
    if r.mismatch:
        _fail(c, h, what)
    return r


def _internal(e, what):
    hint = "" if enabled() else (" (hvd.join() without hvd.init(join=True) works only when every rank calls it "
                                 "at the same point; start every rank with hvd.init(join=True))")
    return HorovodInternalError(f"hvd.{what}: {e}{hint}")


class _Checked:
    """A data allreduce posted right after its control round: done when both are; wait() checks the round."""

    def __init__(self, c, h, ctrl, data):
        self._c, self._h, self._ctrl, self._data = c, h, ctrl, data

    def test(self):
        return self._ctrl.test() and self._data.test()

    def wait(self):
        self._ctrl.wait()
        if _Round(self._h).mismatch:
            _fail(self._c, self._h, "allreduce")
        self._data.wait()


def allreduce(c, arr, opname, dt, tensor, op):
    """Post arr's allreduce (async); under join mode its control round first."""
    if not _mode["on"]:
        return c.allreduce(arr, op=opname, dtype=dt, async_op=True)
    code = _CODE.get(tensor.dtype)
    if code is None:
        raise InvalidArgumentError(f"allreduce: dtype {tensor.dtype} cannot run under hvd.init(join=True)")
    h = _header(c.rank, kind=1, count=tensor.numel(), dtype=code, op=op)
    ctrl = c.allreduce(h, op="max", async_op=True)
    return _Checked(c, h, ctrl, c.allreduce(arr, op=opname, dtype=dt, async_op=True))


def guard(c, what):
    """Before a collective other than allreduce: refuse it on every calling rank while a rank is joined."""
    if not _mode["on"]:
        return
    r = _control(c, _header(c.rank, kind=KINDS.index(what) + 1), what)
    if r.any_joined:
        raise InvalidArgumentError(
            f"hvd.{what}: rank {r.first_joined} (and maybe others) has called hvd.join(); while any rank has "
            f"joined only allreduce runs (allreduce, grouped_allreduce, DistributedOptimizer), as in Horovod")


def _zeros_for(c, r, h):
    if not (0 <= r.count <= _MAX_COUNT and 1 <= r.dtype <= len(_DTYPES) and r.op in _OP_NAME):
        _fail(c, h, "join")
    z = torch.zeros(r.count, dtype=_DTYPES[r.dtype - 1])
    arr, dt = torch_cpu_view(z)
    return c.allreduce(arr, op=_OP_NAME[r.op], dtype=dt, async_op=True)


def join(c):
    """Stand in with zeros for every allreduce the others start, until all have joined; the last joiner."""
    pending, joining = [], True
    while True:
        h = _header(c.rank, joined=True, joining=joining)
        joining = False
        r = _control(c, h, "join")
        if not r.active:
            break
        if r.kind == 1:
            pending.append(_zeros_for(c, r, h))
            if len(pending) > _MAX_PENDING:
                _wait(pending.pop(0))
    for w in pending:
        _wait(w)
    return r.last_joiner


def _wait(w):
    try:
        w.wait()
    except HarpError as e:
        raise _internal(e, "join") from e
