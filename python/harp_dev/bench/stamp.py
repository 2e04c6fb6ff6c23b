"""Provenance stamp for harp-bench JSON: which code ran where, under what load.

    stamp(argv, transport, algos) -> {"commit", "dirty", "harp_version", "cpu",
    "cores", "loadavg", "time", "command", "transport", "algorithms"}

commit/dirty come from the git checkout the harp package was imported from
(None when it is an installed package, not a checkout). loadavg is the 1, 5
and 15 minute load average when the run ended; time is UTC, ISO 8601.
"""
from __future__ import annotations

import datetime
import os
import shlex
import subprocess

from harp._version import __version__


def _git(root, *args):
    try:
        r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def stamp(argv, transport=None, algos=None):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    commit = _git(root, "rev-parse", "HEAD")
    dirty = None
    if commit:
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit, "dirty": dirty, "harp_version": __version__, "cpu": _cpu_model(),
            "cores": os.cpu_count(), "loadavg": list(os.getloadavg()),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "harp-bench " + " ".join(shlex.quote(x) for x in argv),
            "transport": transport, "algorithms": sorted(algos or [])}
