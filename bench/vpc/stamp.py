"""Provenance stamp for bench/vpc results: commit, CPU model, cores, load average, UTC time.

    from stamp import stamp; record = {"stamp": stamp(), ...}
"""
from __future__ import annotations

import datetime
import os
import subprocess


def stamp():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"commit": commit, "dirty": dirty, "cpu": cpu, "cores": os.cpu_count(),
            "loadavg": list(os.getloadavg()), "time": datetime.datetime.now(datetime.timezone.utc).isoformat()}


def write_record(path, record):
    """Stamp `record` ("stamp_after"), write it to `path` as indented JSON (folders made), say where."""
    import json
    record["stamp_after"] = stamp()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"# wrote {path}")
