"""bench/sim/schedule.py — reads the schedules harp_sched writes
(bench/sim/emit/schedule.h has the format) and runs harp_sched.

    sched = emit(algo="ring", p=64, nbytes=1 << 20)          # -> Schedule
    sched = emit(compress="fp16", p=64, nbytes=1 << 20)
    sched = emit(algo="leader", p=64, hosts=8, nbytes=8)
    sched.ranks[r]  # list of ops: ("S", id, peer, bytes, comm), ("V", ...),
                    # ("W", (ids...)), ("X", kind, bytes), ("A", job), ("E",), ("J", job)

harp_sched is built on first use (bench/sim/build_emitter.sh) and rebuilt
when a file it is built from is newer: bench/sim/emit/, core/ and base/ (it
compiles the selector, the tuning table and base/ beside the algorithms, and
includes their headers) or the build script.
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "build" / "sim" / "harp_sched"


@dataclass
class Schedule:
    header: dict
    ranks: list = field(default_factory=list)
    text: str = ""  # the file as harp_sched wrote it (replay.py hands it to its worker)

    def sent(self, r: int) -> int:
        return sum(op[3] for op in self.ranks[r] if op[0] == "S")

    def received(self, r: int) -> int:
        return sum(op[3] for op in self.ranks[r] if op[0] == "V")

    def work(self, r: int, kind: str) -> int:
        return sum(op[2] for op in self.ranks[r] if op[0] == "X" and op[1] == kind)


def parse(text: str) -> Schedule:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# harp-schedule 1 "):
        raise ValueError("not a harp-schedule 1 file (first line: %r)" % (lines[0] if lines else ""))
    header = dict(kv.split("=", 1) for kv in lines[0][len("# harp-schedule 1 "):].split())
    s = Schedule(header, text=text)
    cur = None
    for n, line in enumerate(lines[1:], 2):
        f = line.split()
        k = f[0]
        if k == "R":
            cur = []
            s.ranks.append(cur)
        elif k in ("S", "V"):
            cur.append((k, int(f[1]), int(f[2]), int(f[3]), int(f[4])))
        elif k == "W":
            cur.append(("W", tuple(int(x) for x in f[1:])))
        elif k == "X":
            cur.append(("X", f[1], int(f[2])))
        elif k in ("A", "J"):
            cur.append((k, int(f[1])))
        elif k == "E":
            cur.append(("E",))
        else:
            raise ValueError(f"schedule line {n}: unknown operation {line!r}")
    if len(s.ranks) != int(header["p"]):
        raise ValueError(f"schedule has {len(s.ranks)} ranks, its header says p={header['p']}")
    return s


_BUILD_LOCK = threading.Lock()


def build_if_stale(binary: Path, script: str, srcs: list) -> Path:
    """Runs `script` (bench/sim/build_*.sh) when a source is newer than `binary`. It builds
    beside it and renames it into place, so a replay running it meanwhile (project.py's
    threads, another process) never executes a half-written file."""
    with _BUILD_LOCK:
        if not binary.exists() or max(p.stat().st_mtime for p in srcs) > binary.stat().st_mtime:
            tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
            subprocess.run(["nice", "bash", str(ROOT / script), str(tmp)], check=True, stdout=subprocess.DEVNULL)
            os.replace(tmp, binary)
    return binary


def ensure_built() -> Path:
    # Not only core/algorithms: a change to core/select (the legs' picks, --pick) or the tuning
    # table left a stale harp_sched answering with the old selector.
    srcs = [f for d in ("bench/sim/emit", "core", "base") for f in (ROOT / d).rglob("*") if f.is_file()]
    return build_if_stale(BINARY, "bench/sim/build_emitter.sh", srcs + [ROOT / "bench/sim/build_emitter.sh"])


def emit_args(algo: str | None, p: int, nbytes: int, hosts: int = 1, compress: str | None = None,
              extra: tuple = ()) -> list:
    """harp_sched's command line (extra: e.g. ("--coll", "allgather"))."""
    args = [str(ensure_built()), "--p", str(p), "--bytes", str(nbytes), "--hosts", str(hosts)]
    args += ["--compress", compress] if compress else ["--algo", algo]
    return args + list(extra)


def emit(algo: str | None = None, p: int = 2, nbytes: int = 8, hosts: int = 1, compress: str | None = None,
         extra: tuple = ()) -> Schedule:
    out = subprocess.run(emit_args(algo, p, nbytes, hosts, compress, extra), check=True, capture_output=True,
                         text=True, timeout=600)
    return parse(out.stdout)
