"""harp.elastic — training that keeps going when ranks die.

The shape users know from Horovod elastic (``hvd.elastic.run``, state
commit/restore) and torchft (a per-step quorum), over HARP's fault-tolerant
core (``Communicator.revoke/agree/shrink``)::

    import numpy as np, harp, harp.elastic as elastic

    comm = harp.init()
    state = elastic.State(weights=np.zeros(1000, np.float32), step=0)

    def train(comm, state):
        while state.step < 1000:
            g = compute_gradient(state.weights)
            comm.allreduce(g, op="avg")
            state.weights -= 0.1 * g
            state.step += 1
            if state.step % 10 == 0:
                state.commit()          # what a failure rolls back to
        return state.weights

    weights = elastic.run(train, comm, state, min_workers=4)

What happens on a failure: a collective raises (a dead, frozen or cut-off rank
is named within HARP_KEEPALIVE_TIMEOUT, 2 s by default (a killed one at once); a revoke from another
rank raises RevokedError). ``run`` then revokes the communicator (so every rank
leaves its collective), agrees on the failed set (``comm.agree``), shrinks to
the survivors (``comm.shrink``), restores the last committed state, copies rank
0's committed state to everyone (``State.sync``) and calls ``train`` again with
the new communicator. What is lost: the steps since the last commit (they are
recomputed by the survivors, now fewer, so with a fixed global batch each does
more work). What must stay alive: the bootstrap store's host (the launcher, or
the process that made the unique id — rank 0 under plain ``harp.init()``), like
torchft's lighthouse; a failure of that process ends the job.

Workers: ``min_workers`` — fewer survivors than this raises the failure instead
of continuing; ``max_workers`` — a bound checked at start. Replacement workers
join with ``comm.grow(new_size, uid)`` on the survivors and
``harp.Communicator(rank, new_size, uid)`` on the new processes, at a point the
program chooses (typically right after a commit, followed by ``state.sync``);
``run`` does not start processes.

torch DDP: ``shrink_torch_group()`` is the same recovery for a "harp" process group (a failed
collective raises torch's DistBackendError): revoke and agree on the group's HARP communicator, then
``dist.shrink_group`` of the agreed failed ranks; the program rebuilds DistributedDataParallel on the
shrunken group from its last committed state_dict (bench/vpc/elastic_train.py --ddp shows the loop).

Threading: one thread drives ``run``; ``State`` is not locked.
"""
from __future__ import annotations

import copy
import time

from . import _statewire
from .errors import HarpError, InvalidArgumentError

__all__ = ["State", "run", "Reset", "shrink_to_survivors", "shrink_torch_group"]


class State:
    """Named training state (numpy arrays, torch tensors, numbers, strings, lists/tuples/dicts of them)
    with commit/restore/sync.

    Attributes read and write the live values (``state.step += 1``); ``commit()`` takes a copy,
    ``restore()`` puts the copy back, ``sync(comm)`` makes every rank's committed and live state
    equal to rank ``root``'s committed state."""

    def __init__(self, **items):
        object.__setattr__(self, "_live", dict(items))
        object.__setattr__(self, "_saved", copy.deepcopy(items))
        object.__setattr__(self, "commits", 0)

    def __getattr__(self, name):
        try:
            return self._live[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        if name == "commits":
            object.__setattr__(self, name, value)
        else:
            self._live[name] = value

    def commit(self):
        """Save the live state: a later failure rolls back to here."""
        object.__setattr__(self, "_saved", copy.deepcopy(self._live))
        self.commits += 1

    def restore(self):
        """Put the last committed state back (the live values since are lost)."""
        object.__setattr__(self, "_live", copy.deepcopy(self._saved))

    def sync(self, comm, root: int = 0):
        """Collective: every rank takes rank ``root``'s committed state (then live = committed).

        Sent as data, never pickled (harp._statewire): values are None, bool, int, float, str, bytes,
        lists, tuples, dicts, numpy arrays and scalars, torch tensors. Anything else raises
        InvalidArgumentError naming it (on root; the other ranks raise too), and received bytes that
        are not such a payload raise InvalidArgumentError instead of running anything."""
        saved = _statewire.broadcast(comm, self._saved, root, "harp.elastic.State")
        object.__setattr__(self, "_saved", saved)
        self.restore()


class Reset:
    """What ``run`` passes to ``on_reset`` after each recovery."""

    def __init__(self, failed, old_size, new_comm, seconds):
        self.failed = list(failed)   # old ranks that were lost
        self.old_size = old_size
        self.comm = new_comm
        self.seconds = seconds       # from the error to the restored, synced state

    def __repr__(self):
        return f"<harp.elastic.Reset lost {self.failed} of {self.old_size}, now {self.comm.size}, {self.seconds:.2f} s>"


def shrink_to_survivors(comm, err, min_workers: int = 1, who: str = "harp.elastic"):
    """After ``err`` (a HARP failure) on ``comm``: revoke it (every rank leaves whatever collective it is
    in), agree on the failed ranks and shrink to the survivors. Returns (new communicator, failed ranks);
    raises HarpError from ``err`` when fewer than ``min_workers`` survive. ``comm`` is left to the caller."""
    comm.revoke()
    _, failed = comm.agree(True)
    if comm.size - len(failed) < min_workers:
        raise HarpError(f"{who}: {comm.size - len(failed)} workers left after losing ranks {failed}, fewer than "
                        f"min_workers={min_workers}: {err}") from err
    return comm.shrink(failed), failed


def shrink_torch_group(group=None, min_workers: int = 1, err=None):
    """torch: after a failed collective on a "harp" process group (default: the default group), learn the lost
    ranks on every survivor (revoke + agree on the group's HARP communicator) and shrink the group to the
    survivors with ``dist.shrink_group`` (for the default group, the new group becomes the default one; the old
    one is destroyed). Returns (new group, failed ranks of the old group). Raises HarpError (from ``err``) when
    no rank is agreed failed or fewer than ``min_workers`` survive. Every survivor must call it."""
    import torch.distributed as dist

    from .torch._pg import ProcessGroupHarp

    pg = dist.group.WORLD if group is None else group
    if not isinstance(pg, ProcessGroupHarp):
        raise InvalidArgumentError(f"harp.elastic.shrink_torch_group: {pg!r} is not a 'harp' process group")
    comm = pg.communicator
    comm.revoke()
    _, failed = comm.agree(True)
    left = pg.size() - len(failed)
    if not failed or left < min_workers:
        why = "no rank was agreed failed" if not failed else f"{left} workers left, fewer than min_workers={min_workers}"
        raise HarpError(f"harp.elastic.shrink_torch_group: {why} (lost ranks {failed}): {err}") from err
    new = dist.shrink_group(list(failed), group=group, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    return new, list(failed)


def run(train, comm, state: State, *, min_workers: int = 1, max_workers: int | None = None, on_reset=None,
        max_resets: int | None = None):
    """Call ``train(comm, state)``; on a HARP failure, recover (revoke, agree, shrink, restore, sync) and call it
    again with the survivors' communicator. Returns what ``train`` returns. ``on_reset(Reset)`` is called after
    each recovery (e.g. to rebuild objects bound to the old communicator). The caller owns ``comm``; the
    communicators ``run`` makes are destroyed by it on the next recovery, the last one is left to the caller
    (``Reset.comm``, also passed to ``train``)."""
    if max_workers is not None and comm.size > max_workers:
        raise InvalidArgumentError(f"harp.elastic.run: {comm.size} workers exceed max_workers={max_workers}")
    if state.commits == 0:
        state.commit()
    resets, current = 0, comm
    while True:
        try:
            return train(current, state)
        except HarpError as err:
            if isinstance(err, InvalidArgumentError):
                raise
            t0 = time.monotonic()
            new, failed = shrink_to_survivors(current, err, min_workers)
            if current is not comm:
                current.destroy()
            old_size, current = current.size, new
            state.restore()
            state.sync(current)
            resets += 1
            if on_reset is not None:
                on_reset(Reset(failed, old_size, current, time.monotonic() - t0))
            if max_resets is not None and resets > max_resets:
                raise
