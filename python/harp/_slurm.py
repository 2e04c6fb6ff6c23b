"""Slurm job steps: the rendezvous address harp.init() derives without MASTER_ADDR.

    expand_hostlist("node[01-03,7],gpu-a5")  # -> ["node01", "node02", "node03", "node7", "gpu-a5"]
    step_address(os.environ)                 # -> "node01:24817" under srun, else None

Under `srun`, rank 0 (SLURM_PROCID 0) runs on the first node of the step's node
list (SLURM_STEP_NODELIST; SLURM_JOB_NODELIST outside a step) for every task
distribution Slurm offers, so every task can name rank 0's host without any
exchange. The port is derived from the job and step ids (SLURM_JOB_ID,
SLURM_STEP_ID), so two steps of one job, or two jobs sharing a node, do not pick
the same port unless their ids collide modulo PORT_SPAN; HARP_PORT overrides it.
The address is public: the job still needs HARP_SECRET (harp.init() says so).

Node lists use Slurm's hostlist syntax: comma-separated names, each with zero
or more bracketed lists of numbers and ranges; several brackets in one name
expand left to right ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2), and zero padding
is kept ("[08-10]" -> 08 09 10). Expansion
is bounded (MAX_HOSTS) so a malformed variable cannot exhaust memory.
"""
from __future__ import annotations

import re

from .errors import InvalidArgumentError

PORT_BASE = 20000
PORT_SPAN = 20000
MAX_HOSTS = 1 << 17
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(s):
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidArgumentError(f"Slurm node list {s!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise InvalidArgumentError(f"Slurm node list {s!r}: unbalanced '['")
    out.append(cur)
    return [x for x in out if x]


def _range_items(spec, whole):
    items = []
    for part in spec.split(","):
        m = _RANGE.match(part)
        if not m:
            raise InvalidArgumentError(f"Slurm node list {whole!r}: bad range {part!r}")
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(hi) < int(lo):
            raise InvalidArgumentError(f"Slurm node list {whole!r}: range {part!r} runs backwards")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise InvalidArgumentError(f"Slurm node list {whole!r}: range {part!r} has more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        items.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return items


def _expand_one(name, whole):
    i = name.find("[")
    if i < 0:
        if "]" in name:
            raise InvalidArgumentError(f"Slurm node list {whole!r}: unbalanced ']'")
        return [name]
    j = name.find("]", i)
    if j < 0:
        raise InvalidArgumentError(f"Slurm node list {whole!r}: unbalanced '['")
    head, spec, tail = name[:i], name[i + 1:j], name[j + 1:]
    rest = _expand_one(tail, whole)
    out = []
    for item in _range_items(spec, whole):
        for r in rest:
            out.append(head + item + r)
            if len(out) > MAX_HOSTS:
                raise InvalidArgumentError(f"Slurm node list {whole!r}: more than {MAX_HOSTS} hosts")
    return out


def expand_hostlist(s):
    """Every host name of a Slurm node list, in order."""
    hosts = []
    for name in _split_top(s.strip()):
        hosts.extend(_expand_one(name, s))
        if len(hosts) > MAX_HOSTS:
            raise InvalidArgumentError(f"Slurm node list {s!r}: more than {MAX_HOSTS} hosts")
    if not hosts:
        raise InvalidArgumentError(f"Slurm node list {s!r} is empty")
    return hosts


def _int(env, name, default=None):
    v = env.get(name)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise InvalidArgumentError(f"{name}={v!r} is not an integer") from None


def step_address(env):
    """'host:port' of rank 0 for a Slurm step (see module doc), or None outside Slurm."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodes or "SLURM_PROCID" not in env:
        return None
    host = expand_hostlist(nodes)[0]
    port = _int(env, "HARP_PORT")
    if port is None:
        job = _int(env, "SLURM_JOB_ID", 0)
        step = env.get("SLURM_STEP_ID", "0")
        step = int(step) if step.isdigit() else 0  # "batch"/"extern" steps: one per job
        port = PORT_BASE + (job * 64 + step) % PORT_SPAN
    if not 1 <= port <= 65535:
        raise InvalidArgumentError(f"HARP_PORT={port}: not a TCP port")
    return f"{host}:{port}"
