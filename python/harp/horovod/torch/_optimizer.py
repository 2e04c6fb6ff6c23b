"""hvd.DistributedOptimizer: average gradients across ranks inside optimizer.step().

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=1, op=hvd.Average,
                                   compression=hvd.Compression.none, gradient_predivide_factor=1.0)
    loss.backward(); opt.step()            # step() waits for the allreduces, then steps

As in Horovod, the result is a new optimizer of the wrapped optimizer's class
over the same parameter groups. Each parameter gets a post-accumulate-grad hook;
after `backward_passes_per_step` backward passes its (compressed) gradient is
allreduced asynchronously while backward goes on. HARP pairs collectives by
issue order, not by name, so launches follow one fixed order on every rank: the
reverse of the parameters' registration order (the order backward usually
produces them, as DDP's buckets do). A gradient that is ready early waits until
every gradient before it in that order has been launched; step() (through
synchronize()) launches whatever is left, with zeros for a parameter that got no
gradient on this rank, so ranks whose graphs differ still agree.

gradient_predivide_factor f with op=Average scales by 1/f before the sum and by
f/size after it (Horovod's split of the averaging). Threading: the caller's
thread only (hooks run on the thread that calls backward for CPU tensors).
"""
from __future__ import annotations

import contextlib

import torch

from ._api import Average, Sum, _cpu, _resolve_op, allreduce_async_, synchronize as _sync
from ._compression import Compression


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._passes = int(backward_passes_per_step)
        if self._passes < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._op = _resolve_op(None, op, "DistributedOptimizer")
        if gradient_predivide_factor != 1.0 and self._op != Average:
            raise ValueError("gradient_predivide_factor needs op=hvd.Average")
        self._pre, self._post = 1.0 / gradient_predivide_factor, gradient_predivide_factor
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = {id(p): n for n, p in named}
            missing = [p for p in all_params if id(p) not in names]
            if missing:
                raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's parameters")
            if len({n for n, _ in named}) != len(named):
                raise ValueError("named_parameters has duplicate names")
        self._order = [p for p in reversed(all_params) if p.requires_grad]
        for p in self._order:
            _cpu(p, "DistributedOptimizer")
        self._delay = {p: self._passes for p in self._order}
        self._ready: set = set()
        self._next = 0                # index in _order of the next gradient to launch
        self._handles: dict = {}      # param -> (handle, compression ctx, compressed tensor)
        self._should_sync = True
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in self._order]

    def _hook(self, p):
        if p in self._handles:
            raise AssertionError("gradients were computed more than backward_passes_per_step times before "
                                 "optimizer.step(); raise backward_passes_per_step")
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._ready.add(p)
            self._launch_ready()

    def _launch(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        compressed, ctx = self._compression.compress(p.grad)
        h = allreduce_async_(compressed, op=self._op, prescale_factor=self._pre,
                             postscale_factor=self._post if self._op == Average else 1.0)
        self._handles[p] = (h, ctx, compressed)

    def _launch_ready(self):
        while self._next < len(self._order) and self._order[self._next] in self._ready:
            self._launch(self._order[self._next])
            self._next += 1

    def synchronize(self):
        """Launch every gradient not yet launched (in the fixed order) and wait for all of them."""
        while self._next < len(self._order):
            self._launch(self._order[self._next])
            self._next += 1
        for p in self._order:
            h, ctx, compressed = self._handles.pop(p)
            out = self._compression.decompress(_sync(h), ctx)
            if out is not p.grad:
                p.grad.copy_(out)
        self._ready.clear()
        self._next = 0
        self._delay = {p: self._passes for p in self._order}

    def _reset(self):
        """Forget the allreduces of a step that failed (hvd.elastic restores the state after a lost worker;
        their handles belong to the communicator that was replaced)."""
        self._handles.clear()
        self._ready.clear()
        self._next = 0
        self._delay = {p: self._passes for p in self._order}

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() without synchronize(), after calling synchronize() yourself (e.g. to clip gradients)."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        if self._should_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize()")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None):
    """Wrap `optimizer` so step() averages (op) gradients across ranks first. See the module doc."""
    if num_groups or groups:
        raise NotImplementedError("DistributedOptimizer: num_groups/groups are not provided (HARP fuses per call)")
    if op not in (Average, Sum):
        _resolve_op(None, op, "DistributedOptimizer")  # names Adasum / unknown ops
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
              gradient_predivide_factor)
    if optimizer.state:
        opt.load_state_dict(optimizer.state_dict())
    return opt


def reset_pending(optimizer) -> None:
    """Forget the allreduces a failed step left on `optimizer` (a hvd.DistributedOptimizer; any other
    optimizer has none): hvd.elastic's restore calls this before it loads the saved state."""
    reset = getattr(optimizer, "_reset", None)
    if reset is not None:
        reset()
