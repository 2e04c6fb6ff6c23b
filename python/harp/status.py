"""harp-status — ask every HARP process of this host what it is doing, also during a hang.

Every process with a communicator serves a status socket (HARP_STATUS=1, the
default, like NCCL RAS): ``<dir>/<pid>.sock`` with ``<dir>`` = HARP_STATUS_DIR,
else ``<base>/harp-status-<uid>`` where ``<base>`` is ``$XDG_RUNTIME_DIR`` (when
set and absolute) or ``/tmp``; the folder is 0700, the socket 0600, and only
the same user (or root) is answered. A thread of its own answers
(core/observe/observer.cc), so a process whose collective hangs still answers at once.

Folders are trusted only when private: a real folder (not a symlink) owned by
this user with no group/other permissions, checked by the process and by
harp-status alike. When another user made ``harp-status-<uid>`` first, each
process makes a fresh ``harp-status-<uid>.XXXXXX`` beside it (mkdtemp, removed
at exit); harp-status asks the sockets of every private folder of those names
and reports the others ("not a private folder") without reading or removing
anything there. Everything an answer holds is printed with control characters
escaped (text) or as JSON escapes (--json).

    harp-status                 # text: per communicator, ranks, hosts, op counters, in flight, lagging
    harp-status --json          # the same as JSON
    harp-status --dump          # every process writes its flight record (HARP_FR_DUMP_PREFIX)
    harp-status --socket PATH   # one process only

Lagging ranks are those that started fewer collectives than the furthest rank
of the same communicator, among the ranks this host can see; a rank another
host runs shows as "not on this host" unless its status comes from there too.
Reads are bounded (a 16 MiB answer at most) and each socket gets --timeout
seconds (default 0.8), asked in parallel. An answer that is not the status
JSON (a field missing or of the wrong type) is reported as that process's error.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import json
import os
import socket
import stat
import sys
import time
import unicodedata

from ._version import __version__

MAX_ANSWER = 16 << 20
MAX_RANKS = 1 << 24  # a communicator's size in an answer (the "not seen" list is that long)

__all__ = ["status_dir", "status_dirs", "private_problem", "query", "parse_answer", "collect", "summarize", "escape",
           "main"]


def status_dir() -> str:
    """The folder the processes of this user use first (HARP_STATUS_DIR, else <base>/harp-status-<uid>)."""
    d = os.environ.get("HARP_STATUS_DIR", "")
    if d:
        return d
    x = os.environ.get("XDG_RUNTIME_DIR", "")
    return os.path.join(x if x.startswith("/") else "/tmp", f"harp-status-{os.getuid()}")


def private_problem(path: str) -> str:
    """'' when `path` is a folder only this user can enter (as core/observe/observer.cc requires), else why not."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):04o} (others have access)"
    return ""


def status_dirs():
    """([private folders to ask], [(folder, why it is not used)]): HARP_STATUS_DIR alone when set, else
    harp-status-<uid> and the harp-status-<uid>.XXXXXX folders processes made when that name was taken."""
    first = status_dir()
    cands = [first] if os.environ.get("HARP_STATUS_DIR") else [first] + sorted(glob.glob(glob.escape(first) + ".*"))
    good, bad = [], []
    for d in cands:
        why = private_problem(d)
        if not why:
            good.append(d)
        elif os.path.lexists(d):
            bad.append((d, why))
    return good, bad


_ESCAPE = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text) -> str:
    """`text` with control and format characters (ESC, CR, BEL, C1, bidi overrides...) as \\xNN / \\uNNNN:
    what a process answers cannot move the cursor, retitle the terminal or forge lines."""
    out = []
    for c in str(text):
        if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            n = ord(c)
            hexed = f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
            out.append(_ESCAPE.get(c, hexed))
        else:
            out.append(c)
    return "".join(out)


def _json_out(obj) -> str:
    # ensure_ascii escapes every control character but DEL.
    return json.dumps(obj, ensure_ascii=True).replace("\x7f", "\\u007f")


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
    return parse_answer(bytes(buf), request)


def parse_answer(buf: bytes, request: str = "STATUS") -> dict:
    """A socket's answer as a dict, its shape checked (ValueError naming what is wrong)."""
    try:
        answer = json.loads(buf.decode())
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not JSON ({type(e).__name__})") from None
    if request == "STATUS":
        _check_status(answer)
    elif not isinstance(answer, dict):
        raise ValueError("malformed answer: not a JSON object")
    return answer


_INT = (int,)
_NUM = (int, float)
_COMM_FIELDS = {"comm": str, "rank": _INT, "size": _INT, "hosts": list, "transport": str, "started": _INT,
                "completed": _INT, "stall_view": str}
_OP_FIELDS = {"collective": str, "seq": _INT, "p2p_seq": _INT, "peer": _INT, "count": _INT, "dtype": str,
              "algorithm": str, "running_s": _NUM}


def _fields(obj, spec, where):
    if not isinstance(obj, dict):
        raise ValueError(f"malformed answer: {where} is not an object")
    for k, t in spec.items():
        v = obj.get(k)
        if not isinstance(v, t) or isinstance(v, bool):
            raise ValueError(f"malformed answer: {where}.{k} missing or not {getattr(t, '__name__', 'a number')}")


def _check_status(a):
    """The fields summarize() and the text output read, with their types: else ValueError naming the field."""
    if not isinstance(a, dict):
        raise ValueError("malformed answer: not a JSON object")
    comms = a.get("comms", [])
    if not isinstance(comms, list):
        raise ValueError("malformed answer: comms is not a list")
    for i, c in enumerate(comms):
        _fields(c, _COMM_FIELDS, f"comms[{i}]")
        if not 0 <= c["rank"] < c["size"] <= MAX_RANKS:
            raise ValueError(f"malformed answer: comms[{i}]: rank {c['rank']} of size {c['size']}")
        if not all(isinstance(h, str) for h in c["hosts"]):
            raise ValueError(f"malformed answer: comms[{i}].hosts holds a non-string")
        if "in_flight" not in c:
            raise ValueError(f"malformed answer: comms[{i}].in_flight missing")
        if c["in_flight"] is not None:
            _fields(c["in_flight"], _OP_FIELDS, f"comms[{i}].in_flight")


def collect(paths=None, request="STATUS", timeout=0.8):
    """[(socket path, answer dict or {'error': text})] for every socket of the private status folders
    (status_dirs), asked in parallel; a folder that is not private is one entry with its error."""
    refused = []
    if paths is None:
        good, bad = status_dirs()
        refused = [(d, {"error": f"not a private folder of this user ({why}): not asked"}) for d, why in bad]
        paths = [p for d in good for p in sorted(glob.glob(os.path.join(glob.escape(d), "*.sock"))) if _is_socket(p)]
    if not paths:
        return refused

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
        return refused + [(p, a) for p, a in ex.map(one, paths) if a is not None]


def _is_socket(path):
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:  # gone since the listing
        return False


def _stale(path):
    """A socket left by a process that is gone (killed, or exited without atexit): removed, only from
    a private folder of this user."""
    if private_problem(os.path.dirname(os.path.abspath(path))):
        return False
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
        if "error" in a:
            continue
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
    return "\n".join(escape(line) for line in lines)


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
            print(_json_out({"socket": p, **a}) if args.json else escape(f"{p}: {a.get('dump') or a.get('error')}"))
        return 0 if answers and all(a.get("dump") for _, a in answers) else 1
    comms = summarize(answers)
    if args.json:
        print(_json_out({"processes": answers, "comms": comms} if args.raw else
                         {"comms": comms, "errors": {p: a["error"] for p, a in answers if "error" in a}}))
    else:
        print(_text(comms, answers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
