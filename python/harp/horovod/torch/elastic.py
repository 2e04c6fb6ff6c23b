"""hvd.elastic on HARP: Horovod's elastic training API over HARP's revoke/agree/shrink.

    import harp.horovod.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: adjust_lr(hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                step(...)
                if state.batch % 10 == 0:
                    state.commit()          # what a failure rolls back to
            state.batch = 0
    train(state)

What run() does, as in Horovod: sync the state from rank 0, call the function;
when a collective fails because ranks were lost (a HARP error other than a bad
argument: a dead, frozen or cut-off rank is named within the keep-alive bound,
harp.elastic), the survivors revoke the communicator, agree on the failed set,
shrink to a communicator of the survivors (hvd.rank()/size() change), restore
the last committed state, sync it from the new rank 0, call the reset callbacks
and call the function again. HostsUpdatedInterrupt raised in the function
(Horovod raises it from commit() when its driver sees new hosts) re-syncs and
restarts the same way without losing anyone.

What differs from Horovod: no driver discovers hosts, so workers are only lost,
never added, during run() (replacement ranks join with harp's Communicator.grow,
harp.elastic); what is lost on a failure is the work since the last commit();
the job needs the bootstrap store's host alive (the launcher, or rank 0's
process under plain harp.init(), see harp.elastic). run(min_workers=) sets the
floor (default 1); no environment variable does.
"""
from __future__ import annotations

import copy
import functools

from harp.elastic import shrink_to_survivors
from harp.errors import HarpError, InvalidArgumentError

from harp import _statewire

from . import _join
from ._api import _comm, _state, broadcast_parameters, rank
from ._optimizer import reset_pending

__all__ = ["State", "ObjectState", "TorchState", "HostsUpdatedInterrupt", "run"]


class HostsUpdatedInterrupt(RuntimeError):
    """Raise inside an elastic function to re-sync and restart it (Horovod's signal that hosts changed)."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class State:
    """Horovod's elastic state: commit/restore/sync and reset callbacks."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def check_host_updates(self):
        """No host discovery in HARP: nothing ever changes between commits."""

    def commit(self):
        self.save()
        self.check_host_updates()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


def _broadcast_data(obj, what):
    """Rank 0's obj on every rank, as data (hvd.broadcast_object pickles; this never unpickles)."""
    c = _comm()
    _join.guard(c, "broadcast_object")
    return _statewire.broadcast(c, obj, 0, what)


class ObjectState(State):
    """Attributes given as keyword arguments (state.epoch, state.batch, ...): data that sync sends
    without pickling (None, bool, int, float, str, bytes, lists, tuples, dicts, numpy arrays, tensors)."""

    def __init__(self, **kwargs):
        super().__init__()
        self._names = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._saved = {}
        ObjectState.save(self)

    def save(self):
        self._saved = {k: copy.deepcopy(getattr(self, k)) for k in self._names}

    def restore(self):
        for k, v in self._saved.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self):
        if self._names:  # as data, never pickled (harp._statewire; State.sync of harp.elastic)
            self._saved = _broadcast_data(self._saved, "hvd.elastic.ObjectState")
            ObjectState.restore(self)


class TorchState(ObjectState):
    """A model and an optimizer (their state_dicts are committed) plus keyword attributes."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        self._model_saved = self._opt_saved = None
        super().__init__(**kwargs)

    def save(self):
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._opt_saved = copy.deepcopy(self.optimizer.state_dict())
        super().save()

    def restore(self):
        reset_pending(self.optimizer)  # hvd.DistributedOptimizer: drop the failed step's allreduces
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._opt_saved is not None:
            self.optimizer.load_state_dict(self._opt_saved)
        super().restore()

    def sync(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:  # hvd.broadcast_optimizer_state, but as data
            sd = _broadcast_data(self.optimizer.state_dict() if rank() == 0 else None,
                                 "hvd.elastic.TorchState optimizer")
            if rank() != 0:
                self.optimizer.load_state_dict(sd)
        super().sync()
        self.save()


def _recover(err, min_workers):
    """Revoke, agree, shrink: the survivors' communicator becomes hvd's."""
    comm = _state["comm"]
    new, failed = shrink_to_survivors(comm, err, min_workers, who="hvd.elastic")
    if _state["owned"]:
        comm.destroy()
    _state["comm"], _state["owned"] = new, True
    return failed


def run(func=None, *, min_workers=1):
    """Decorator: run func(state, ...) and keep it going when workers are lost (see the module doc)."""
    if func is None:
        return functools.partial(run, min_workers=min_workers)

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise InvalidArgumentError("hvd.elastic.run: the first argument must be an hvd.elastic State")
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            except HarpError as err:
                if isinstance(err, InvalidArgumentError):
                    raise
                failed = _recover(err, min_workers)
                state.restore()
                skip_sync = False
                if rank() == 0:
                    print(f"hvd.elastic: lost rank(s) {failed}; continuing with the survivors from the last "
                          f"commit", flush=True)
            state.on_reset()

    return wrapper

