"""Torch's intra-op threads on a host that the ranks oversubscribe.

    fit_threads(comm)   # once per process, when the first harp process group forms

Why: torch's CPU kernels run OpenMP parallel regions (libgomp, bundled with torch). After each
region libgomp's workers spin for GOMP_SPINCOUNT (300,000 pauses: about 7-15 ms) before they
sleep, and each region ends at a barrier where the master waits for every worker. With torch's
default thread count every rank starts as many workers as the host has cores, so 2 ranks on 2
cores run 4 spinning threads: a region's barrier then waits for a descheduled worker, and a 32 x
256 matmul takes milliseconds. A library whose collectives take microseconds keeps the workers
spinning all the time (their spin never runs out between regions); one whose collectives block
for milliseconds lets them sleep, which is why gloo looked faster with that setting
(bench/RESULTS.md, "Does HARP slow torch's compute?": harp 59-73 ms per FSDP2 step against
gloo's 33-43 ms, and 12-18 ms with GOMP_SPINCOUNT=1000). torchrun avoids it by setting
OMP_NUM_THREADS=1 for every rank; processes started otherwise (torch.multiprocessing.spawn,
mpirun, Slurm) keep torch's default.

What: HARP_TORCH_THREADS (base/params.def):
  auto (default)  when neither OMP_NUM_THREADS nor MKL_NUM_THREADS is set and this host's ranks
                  times torch.get_num_threads() exceed the cores this process may run on
                  (os.sched_getaffinity), set torch's threads to max(1, cores // local ranks); the
                  host's first rank warns once, naming what it did and how to keep the old count;
  keep            leave torch's threads alone;
  N (1, 2, ...)   set torch's threads to N.
Local ranks come from the communicator's host map (harp.topology: ranks that share a kernel and
its namespaces), not from launcher variables.

Threading: called from the thread creating the process group, which torch's CPU kernels in the
training loop run on (torch.set_num_threads applies process-wide to later parallel regions).
"""
from __future__ import annotations

import os

import torch

from .. import _harp, _params
from ..errors import InvalidArgumentError

_done_pid = None  # the process that applied it: a forked child (harness ranks, fork-started workers) applies it anew


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose(setting: str, threads: int, local: int, cores: int, environ) -> tuple[int, str]:
    """(threads to use, why) for HARP_TORCH_THREADS=setting; threads unchanged means keep. Pure."""
    s = setting.strip().lower()
    if s == "keep":
        return threads, "HARP_TORCH_THREADS=keep"
    if s not in ("", "auto"):
        try:
            n = int(s, 10)
        except ValueError:
            n = 0
        if n < 1:
            raise InvalidArgumentError(f"HARP_TORCH_THREADS={setting!r}: expected auto, keep or a thread count >= 1")
        return n, f"HARP_TORCH_THREADS={n}"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if environ.get(var):
            return threads, f"{var} is set"
    if local * threads <= cores:
        return threads, f"{local} local rank(s) x {threads} thread(s) fit {cores} core(s)"
    return max(1, cores // max(1, local)), (f"{local} ranks on this host x {threads} torch threads each "
                                            f"would exceed its {cores} cores")


def fit_threads(comm, environ=None) -> int:
    """Apply HARP_TORCH_THREADS once per process; the thread count torch now uses."""
    global _done_pid
    if _done_pid == os.getpid():
        return torch.get_num_threads()
    _done_pid = os.getpid()
    environ = os.environ if environ is None else environ
    setting = _params.get("HARP_TORCH_THREADS", environ)
    t = _harp.topology(getattr(comm, "_c", comm))
    local = len(t["hosts"][t["host_of"][t["rank"]]]["ranks"])
    before = torch.get_num_threads()
    n, why = choose(setting, before, local, _cores(), environ)
    if n != before:
        torch.set_num_threads(n)
        if setting.strip().lower() in ("", "auto") and t["local_rank"][t["rank"]] == 0:  # one line per host
            _harp.log(1, f"torch backend: torch's intra-op threads set from {before} to {n} per rank: {why} "
                         f"(spinning OpenMP workers would slow every rank's compute; torchrun sets "
                         f"OMP_NUM_THREADS=1 for the same reason); HARP_TORCH_THREADS=keep keeps {before}")
    return n
