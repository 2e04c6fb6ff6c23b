"""harp-status — ask every HARP process of this host what it is doing, also during a hang.

Every process with a communicator serves a status socket (HARP_STATUS=1, the
default, like NCCL RAS): ``<dir>/<pid>.sock`` with ``<dir>`` = HARP_STATUS_DIR,
else ``$XDG_RUNTIME_DIR/harp-status-<uid>`` or ``/tmp/harp-status-<uid>``; the
folder is 0700, the socket 0600, and only the same user (or root) is answered.
A thread of its own answers (core/observer.cc), so a process whose
collective hangs still answers at once.

    harp-status                 # text: per communicator, ranks, hosts, op counters, in flight, lagging
    harp-status --json          # the same as JSON
    harp-status --dump          # every process writes its flight record (HARP_FR_DUMP_PREFIX)
    harp-status --socket PATH   # one process only

Lagging ranks are those that started fewer collectives than the furthest rank
of the same communicator, among the ranks this host can see; a rank another
host runs shows as "not on this host" unless its status comes from there too.
Reads are bounded (a 16 MiB answer at most) and each socket gets --timeout
seconds (default 0.8), asked in parallel.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import json
import os
import socket
import sys
import time

from ._version import __version__

MAX_ANSWER = 16 << 20

__all__ = ["status_dir", "query", "collect", "summarize", "main"]


def status_dir() -> str:
    d = os.environ.get("HARP_STATUS_DIR", "")
    if d:
        return d
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(base, f"harp-status-{os.getuid()}")


def query(path: str, request: str = "STATUS", timeout: float = 0.8) -> dict:
    """One process's answer to STATUS or DUMP, as a dict (raises OSError/ValueError)."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(request.encode() + b"\n")
        buf = bytearray()
        while len(buf) <= MAX_ANSWER:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if buf.endswith(b"\n"):
                break
        if len(buf) > MAX_ANSWER:
            raise ValueError(f"{path}: answer over {MAX_ANSWER} bytes")
    return json.loads(buf.decode())


def collect(paths=None, request="STATUS", timeout=0.8):
    """[(socket path, answer dict or {'error': text})] for every socket, asked in parallel."""
    if paths is None:
        paths = sorted(glob.glob(os.path.join(status_dir(), "*.sock")))
    if not paths:
        return []

    def one(p):
        try:
            return p, query(p, request, timeout)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            if _stale(p):
                return p, None
            return p, {"error": f"{type(e).__name__}: {e}"}
        except (OSError, ValueError) as e:
            return p, {"error": f"{type(e).__name__}: {e}"}

    with cf.ThreadPoolExecutor(max_workers=min(32, len(paths))) as ex:
        return [(p, a) for p, a in ex.map(one, paths) if a is not None]


def _stale(path):
    """A socket left by a process that is gone (killed, or exited without atexit): removed."""
    try:
        pid = int(os.path.basename(path).split(".")[0])
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return True
    except (ValueError, PermissionError):
        return False


def summarize(answers):
    """Group the processes' communicators by communicator id: ranks seen, counters, lagging ranks."""
    comms = {}
    for path, a in answers:
        for c in a.get("comms", []):
            g = comms.setdefault(c["comm"], {"comm": c["comm"], "size": c["size"], "hosts": c["hosts"],
                                             "transport": c["transport"], "ranks": {}})
            g["ranks"][c["rank"]] = {"pid": a.get("pid"), "host": a.get("host"), "started": c["started"],
                                     "completed": c["completed"], "in_flight": c["in_flight"],
                                     "stall_view": c["stall_view"], "socket": path}
    out = []
    for g in comms.values():
        seen = g["ranks"]
        top = max(r["started"] for r in seen.values())
        g["lagging"] = sorted(r for r, v in seen.items() if v["started"] < top)
        g["not_seen"] = [r for r in range(g["size"]) if r not in seen]
        g["ranks"] = {str(k): v for k, v in sorted(seen.items())}
        out.append(g)
    return out


def _op(f):
    if not f:
        return "idle"
    name = f["collective"] + (f" #{f['seq']}" if f["seq"] else f" (p2p #{f['p2p_seq']}, peer {f['peer']})")
    return f"{name} count={f['count']} {f['dtype']} algo={f['algorithm']} running {f['running_s']:.3f} s"


def _text(comms, answers):
    lines = []
    errors = [(p, a["error"]) for p, a in answers if "error" in a]
    for g in comms:
        lines.append(f"communicator {g['comm']}: {g['size']} ranks, transport {g['transport']}, "
                     f"hosts {', '.join(sorted(set(g['hosts'])))}")
        for r, v in g["ranks"].items():
            lines.append(f"  rank {r:>4} pid {v['pid']} on {v['host']}: started #{v['started']} "
                         f"completed #{v['completed']}, {_op(v['in_flight'])}")
            if v["stall_view"]:
                lines.append(f"             {v['stall_view']}")
        if g["lagging"]:
            lines.append(f"  lagging ranks (started fewer collectives): {', '.join(map(str, g['lagging']))}")
        if g["not_seen"]:
            lines.append(f"  not on this host (or not answering): {len(g['not_seen'])} rank(s)")
    for p, e in errors:
        lines.append(f"{p}: no answer ({e})")
    if not answers:
        lines.append(f"no HARP processes found in {status_dir()}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="harp-status", description=__doc__.split("\n")[0])
    ap.add_argument("--version", action="version", version=f"harp-status (harp {__version__})")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--dump", action="store_true", help="ask every process to write its flight record")
    ap.add_argument("--socket", action="append", help="ask only this socket (repeatable)")
    ap.add_argument("--timeout", type=float, default=0.8, help="seconds per socket (default 0.8)")
    ap.add_argument("--raw", action="store_true", help="with --json: every process's answer as is")
    args = ap.parse_args(argv)
    answers = collect(args.socket, "DUMP" if args.dump else "STATUS", args.timeout)
    if args.dump:
        for p, a in answers:
            print(json.dumps({"socket": p, **a}) if args.json else f"{p}: {a.get('dump') or a.get('error')}")
        return 0 if answers and all(a.get("dump") for _, a in answers) else 1
    comms = summarize(answers)
    if args.json:
        print(json.dumps({"processes": answers, "comms": comms} if args.raw else
                         {"comms": comms, "errors": {p: a["error"] for p, a in answers if "error" in a}}))
    else:
        print(_text(comms, answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
