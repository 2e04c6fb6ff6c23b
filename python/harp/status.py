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
    harp-status --job           # every rank of every communicator this host runs a rank of, on every host
    harp-status --job --json    # the same as JSON
    harp-status --job --dump DIR   # every rank's flight record into DIR, and the cross-rank analysis
    harp-status --job-key       # print COMM:KEY for each local communicator (give it as HARP_JOBVIEW_KEY)
    HARP_JOBVIEW_KEY=COMM:KEY harp-status --job --rank-addr HOST:PORT   # from a host without a rank

The job view (core/observe/jobview.h): each process serves an authenticated TCP listener. The key of a
communicator and its address come from a local rank's status socket (JOBVIEW, same user only), or from
HARP_JOBVIEW_KEY (what --job-key printed on a host of the job) with --rank-addr. The rank asked answers
for the whole communicator through a tree over the ranks; a rank whose process is gone is "dead", one that
does not answer the handshake in time (stopped, frozen, cut off) "unreachable", one serving as many other
views as it takes at once "busy". Per rank also its links: by peer class (same host, other hosts) and
transport, and for tcp the lanes (connections per peer) of the pairs that are up, the pairs not connected
yet (lazy set-up) and the failed ones.

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
import hashlib
import hmac
import io
import json
import os
import pickle
import socket
import stat
import struct
import sys
import time
import unicodedata

from ._version import __version__

MAX_ANSWER = 16 << 20
MAX_RANKS = 1 << 24  # a communicator's size in an answer (the "not seen" list is that long)

__all__ = ["status_dir", "status_dirs", "private_problem", "query", "parse_answer", "collect", "summarize", "escape",
           "job_endpoints", "job_request", "job_view", "analyze", "job_dump", "analyze_dumps", "main"]


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


def _rank_line(rank, pid, where, v):
    """One rank's line: where it runs, its counters and what it is doing (v: started, completed, in_flight)."""
    return (f"  rank {rank:>4} pid {pid} on {where}: started #{v['started']} completed #{v['completed']}, "
            f"{_op(v.get('in_flight'))}")


def _text(comms, answers):
    lines = []
    errors = [(p, a["error"]) for p, a in answers if "error" in a]
    for g in comms:
        lines.append(f"communicator {g['comm']}: {g['size']} ranks, transport {g['transport']}, "
                     f"hosts {', '.join(sorted(set(g['hosts'])))}")
        for r, v in g["ranks"].items():
            lines.append(_rank_line(r, v["pid"], v["host"], v))
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


# --- the job view (core/observe/jobview.h) ----------------------------------------------------------

ENTRY_CAP = 2048  # bytes of one rank's entry (jobview::kEntryCap)
DUMP_CAP = 1 << 30
_MAGIC = b"HJV1"


def _proof(key: bytes, role: bytes, challenge: bytes, own: bytes, ctx: bytes) -> bytes:
    """bootstrap/crypto.h's proof: HMAC-SHA256(key, "HARP-AUTH1" | role | challenge | own nonce | context)."""
    return hmac.new(key, b"HARP-AUTH1" + role + challenge + own + ctx, hashlib.sha256).digest()


def _recv_exact(s, n: int, deadline: float, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out reading the {what}")
        s.settimeout(left)
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError(f"the rank closed the connection before the {what}")
        buf += chunk
    return bytes(buf)


def _hostport(addr: str):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {addr!r}")
    return host.strip("[]"), int(port)


def job_request(addr: str, comm: str, key: bytes, body: str, max_answer: int, timeout: float = 10.0,
                hop: float = 2.0) -> bytes:
    """One authenticated request to the job-view listener at addr ("host:port") for communicator `comm`
    (16 hex digits), keyed by `key` (32 bytes). Raises PermissionError when the rank's proof is wrong or
    the rank closes after ours (wrong key), OSError/TimeoutError on no answer, ValueError on an oversized one."""
    deadline = time.monotonic() + timeout
    cid = int(comm, 16)
    ctx = b"jobview|" + comm.encode()
    with socket.create_connection(_hostport(addr), timeout=min(hop, timeout)) as s:
        na = os.urandom(32)
        s.sendall(_MAGIC + struct.pack("<Q", cid) + na)
        got = _recv_exact(s, 64, min(deadline, time.monotonic() + hop), "handshake")
        nb, mac = got[:32], got[32:]
        if not hmac.compare_digest(mac, _proof(key, b"B", na, nb, ctx)):
            raise PermissionError(f"{addr}: refused (the rank does not prove the key of communicator {comm})")
        raw = body.encode()
        s.sendall(_proof(key, b"A", nb, na, ctx) + struct.pack("<I", len(raw)) + raw)
        try:
            (n,) = struct.unpack("<I", _recv_exact(s, 4, deadline, "answer"))
        except ConnectionError:
            raise PermissionError(f"{addr}: refused our proof (a wrong key for communicator {comm})") from None
        if n > max_answer:
            raise ValueError(f"{addr}: answer of {n} bytes, over the bound of {max_answer}")
        return _recv_exact(s, n, deadline, "answer")


def job_endpoints(paths=None, timeout=0.8):
    """[{comm, rank, size, addr, key (hex)}] from this host's status sockets (JOBVIEW), one per communicator
    (the lowest local rank), and [(socket, error)]."""
    found, errors = {}, []
    for p, a in collect(paths, "JOBVIEW", min(timeout, 0.3)):  # a stopped process must not hold the view up
        if "error" in a:
            errors.append((p, a["error"]))
            continue
        eps = a.get("endpoints")
        if not isinstance(eps, list):
            errors.append((p, "malformed JOBVIEW answer"))
            continue
        for e in eps:
            if not (isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("comm", "addr", "key"))
                    and isinstance(e.get("rank"), int) and isinstance(e.get("size"), int)):
                errors.append((p, "malformed JOBVIEW endpoint"))
                continue
            if e["comm"] not in found or e["rank"] < found[e["comm"]]["rank"]:
                found[e["comm"]] = e
    return list(found.values()), errors


def key_from_env(value: str):
    """HARP_JOBVIEW_KEY = COMM:KEY (16 hex digits, 64 hex digits) as (comm, key bytes); ValueError naming it."""
    comm, sep, key = value.strip().partition(":")
    try:
        if not sep or len(comm) != 16 or len(key) != 64:
            raise ValueError
        int(comm, 16)
        return comm.lower(), bytes.fromhex(key)
    except ValueError:
        raise ValueError("HARP_JOBVIEW_KEY must be COMM:KEY (16 and 64 hex digits), as harp-status --job-key "
                         "prints it on a host of the job") from None


def _check_entry(e, size):
    if not isinstance(e, dict) or not isinstance(e.get("rank"), int) or not 0 <= e["rank"] < size:
        raise ValueError("malformed job-view entry (no rank in range)")
    if not isinstance(e.get("state"), str):
        raise ValueError(f"malformed job-view entry for rank {e['rank']} (no state)")
    if e["state"] == "ok":
        for k in ("started", "completed"):
            if not isinstance(e.get(k), int):
                raise ValueError(f"malformed job-view entry for rank {e['rank']} ({k})")
        for k in ("in_flight", "last"):
            v = e.get(k)
            if v is not None and not (isinstance(v, dict) and isinstance(v.get("seq"), int)
                                      and isinstance(v.get("collective"), str)):
                raise ValueError(f"malformed job-view entry for rank {e['rank']} ({k})")
        links = e.get("links", [])
        if not (isinstance(links, list) and all(_link_ok(g) for g in links)):
            raise ValueError(f"malformed job-view entry for rank {e['rank']} (links)")


def _link_ok(g) -> bool:
    """One links group of an entry: {peers, transport, n[, up, not_connected, failed, lanes {count: peers}]}."""
    if not (isinstance(g, dict) and isinstance(g.get("peers"), str) and isinstance(g.get("transport"), str)
            and isinstance(g.get("n"), int)):
        return False
    if "lanes" not in g:
        return True
    return (all(isinstance(g.get(k), int) for k in ("up", "not_connected", "failed")) and isinstance(g["lanes"], dict)
            and all(k.isdigit() and isinstance(v, int) for k, v in g["lanes"].items()))


def links_text(links) -> str:
    """An entry's links in words: per peer class and transport, the peers, and where the transport reports
    them, how many are up with how many lanes, not connected yet (lazy set-up) or failed."""
    parts = []
    for g in links or []:
        t = f"{g['peers']}: {g['transport']} x{g['n']}"
        if "lanes" in g:
            lanes = ", ".join(f"{v} with {k} lane{'s' if k != '1' else ''}"
                              for k, v in sorted(g["lanes"].items(), key=lambda kv: int(kv[0])))
            more = [f"{g['up']} up" + (f" ({lanes})" if lanes else "")]
            if g["not_connected"]:
                more.append(f"{g['not_connected']} not connected yet")
            if g["failed"]:
                more.append(f"{g['failed']} failed")
            t += " [" + "; ".join(more) + "]"
        parts.append(t)
    return "; ".join(parts) if parts else "none (a communicator of one rank)"


def job_view(addr: str, comm: str, key: bytes, size: int, timeout: float = 10.0) -> dict:
    """The whole communicator through the tree rooted at the rank at addr: {comm, size, asked, seconds,
    ranks: [entry by rank], analysis}. A rank the tree did not cover shows as "not reached"."""
    t0 = time.monotonic()
    budget_ms = max(1, int(timeout * 1000 * 0.8))
    raw = job_request(addr, comm, key, f"STATUS -1 0 {size} {budget_ms}", size * ENTRY_CAP + 64, timeout)
    try:
        got = json.loads(b"[" + raw + b"]")
    except (UnicodeDecodeError, ValueError, RecursionError):
        err = json.loads(raw) if raw.startswith(b'{"error"') else None
        raise ValueError(f"{addr}: {err['error'] if err else 'not a job-view answer'}") from None
    if len(got) == 1 and isinstance(got[0], dict) and "error" in got[0] and "rank" not in got[0]:
        raise ValueError(f"{addr}: {got[0]['error']}")
    ranks = {}
    for e in got:
        _check_entry(e, size)
        ranks[e["rank"]] = e
    for r in range(size):
        ranks.setdefault(r, {"rank": r, "state": "not reached", "error": "no entry in the answer"})
    out = {"comm": comm, "size": size, "asked": addr, "seconds": round(time.monotonic() - t0, 3),
           "ranks": [ranks[r] for r in range(size)]}
    out["analysis"] = analyze(out["ranks"])
    return out


def analyze(ranks) -> dict:
    """What the entries say: dead and unreachable ranks, lagging ranks (started fewer collectives than the
    furthest), the collective each waiting rank is in and on whom it waits, and the first sequence number at
    which ranks called different collectives (a mismatch) with the ranks to blame (the minority)."""
    ok = [e for e in ranks if e["state"] == "ok"]
    dead = [e["rank"] for e in ranks if e["state"] == "dead"]
    busy = [e["rank"] for e in ranks if e["state"] == "busy"]  # serving other views: alive, not to blame
    gone = [e["rank"] for e in ranks if e["state"] not in ("ok", "dead", "busy")]
    top = max((e["started"] for e in ok), default=0)
    lagging = [e["rank"] for e in ok if e["started"] < top]
    calls = {}  # seq -> collective -> ranks
    for e in ok:
        for k in ("in_flight", "last"):
            f = e.get(k)
            if f and f["seq"]:
                calls.setdefault(f["seq"], {}).setdefault(f["collective"], set()).add(e["rank"])
    mismatch = None
    for seq in sorted(calls):
        by = calls[seq]
        if len(by) > 1:
            minority = min(by, key=lambda c: (len(by[c]), c))
            mismatch = {"seq": seq, "by_collective": {c: sorted(v) for c, v in sorted(by.items())},
                        "blame": sorted(by[minority])}
            break
    waiting = []
    for e in ok:
        f = e.get("in_flight")
        if f and f["seq"]:
            on = sorted(set(gone + dead + [o["rank"] for o in ok if o["started"] < f["seq"]]))
            waiting.append({"rank": e["rank"], "collective": f["collective"], "seq": f["seq"],
                            "waited_s": f.get("running_s", 0.0), "on": on})
    # A lagging rank still inside an earlier collective waits too: the blame goes to the ranks that stopped,
    # died or called another collective; only without them to the lagging ranks (idle ones first).
    blame = sorted(set(dead + gone + (mismatch["blame"] if mismatch else [])))
    if not blame and waiting:
        idle = [r for r in lagging if not next(e for e in ok if e["rank"] == r).get("in_flight")]
        blame = idle or lagging
    return {"dead": dead, "unreachable": gone, "busy": busy, "lagging": lagging, "furthest_started": top,
            "waiting": waiting, "mismatch": mismatch, "blame": blame}


def _ranks_text(rs):
    return ", ".join(map(str, rs)) if rs else "none"


def job_text(views, errors) -> str:
    lines = []
    for v in views:
        a = v["analysis"]
        lines.append(f"communicator {v['comm']}: {v['size']} ranks, asked {v['asked']}, answered in {v['seconds']:.3f} s")
        for e in v["ranks"]:
            where = f"{e.get('host', '?')}" + (f" ({e['hostid']})" if e.get("hostid") not in (None, e.get("host")) else "")
            if e["state"] != "ok":
                lines.append(f"  rank {e['rank']:>4} pid {e.get('pid')} on {where}: {e['state'].upper()} ({e.get('error', '')})")
                continue
            lines.append(_rank_line(e["rank"], e["pid"], f"{where} [{e.get('transport')}]", e))
            if "links" in e:
                lines.append(f"             links: {links_text(e['links'])}")
        labels = {"dead": "dead ranks", "unreachable": "unreachable ranks (stopped, frozen or cut off)",
                  "busy": "busy ranks (serving other job views; not asked)",
                  "lagging": f"lagging ranks (started fewer than #{a['furthest_started']})"}
        lines += [f"  {label}: {_ranks_text(a[k])}" for k, label in labels.items() if a[k]]
        if a["mismatch"]:
            m = a["mismatch"]
            by = "; ".join(f"{c} on ranks {_ranks_text(r)}" for c, r in m["by_collective"].items())
            lines.append(f"  collective mismatch at #{m['seq']}: {by}")
        for w in a["waiting"][:8]:
            lines.append(f"  rank {w['rank']} waits in {w['collective']} #{w['seq']} for {w['waited_s']:.3f} s "
                         f"on ranks {_ranks_text(w['on'])}")
        if len(a["waiting"]) > 8:
            lines.append(f"  ... and {len(a['waiting']) - 8} more ranks waiting")
        lines.append(f"  to blame: {_ranks_text(a['blame'])}")
    for where, e in errors:
        lines.append(f"{where}: no job view ({e})")
    if not views and not errors:
        lines.append("no communicator with a job view found on this host (give --rank-addr and HARP_JOBVIEW_KEY)")
    return "\n".join(escape(line) for line in lines)


class _DataOnly(pickle.Unpickler):
    """Flight records come from other processes: plain data only, never a class or a function."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"flight record refers to {module}.{name}: refused")


def job_dump(addr: str, comm: str, key: bytes, folder: str, timeout: float = 30.0, workers: int = 32):
    """Every rank's flight record (DUMP, asked of each rank directly) into folder/harp_trace_rank_<rank>
    (0600); returns ({rank: path}, {rank: error})."""
    info = json.loads(job_request(addr, comm, key, "ADDRS", 64 << 20, timeout))
    addrs = info.get("addrs")
    if not isinstance(addrs, list) or not all(isinstance(x, str) for x in addrs):
        raise ValueError(f"{addr}: malformed ADDRS answer")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    done, failed = {}, {}
    # A process holding several ranks writes one record of all of them: ask each address once.
    first = {}
    for r, a in enumerate(addrs):
        first.setdefault(a, r)

    def one(item):
        a, r = item
        if not a:
            return r, None, "serves no job view"
        try:
            blob = job_request(a, comm, key, "DUMP", DUMP_CAP, timeout)
            path = os.path.join(folder, f"harp_trace_rank_{r}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            return r, path, None
        except (OSError, ValueError) as e:
            return r, None, f"{type(e).__name__}: {e}"

    with cf.ThreadPoolExecutor(max_workers=max(1, min(workers, len(first)))) as ex:
        for r, path, err in ex.map(one, first.items()):
            if path:
                done[r] = path
            else:
                failed[r] = err
    return done, failed


def analyze_dumps(paths) -> dict:
    """The cross-rank analysis of flight records ({rank: path}, fr_trace's question): per process group, the
    first collective sequence number where the ranks' records disagree (another collective) or stop (a rank
    has no record of it, or never completed it), and the ranks to blame."""
    groups = {}  # pg name -> rank -> seq -> (profiling name, state)
    bad = {}
    for rank, path in sorted(paths.items()):
        try:
            with open(path, "rb") as f:
                d = _DataOnly(io.BytesIO(f.read(DUMP_CAP + 1))).load()
            entries = d["entries"]
        except Exception as e:  # noqa: BLE001 - a record that cannot be read is reported, not fatal
            bad[rank] = f"{type(e).__name__}: {e}"
            continue
        for en in entries if isinstance(entries, list) else []:
            try:
                pg, seq = en["process_group"][0], en["collective_seq_id"]
            except (KeyError, TypeError, IndexError):
                continue
            if isinstance(seq, int) and seq > 0:
                groups.setdefault(pg, {}).setdefault(rank, {})[seq] = (en.get("profiling_name"), en.get("state"))
    out = {}
    for pg, by_rank in groups.items():
        ranks = sorted(by_rank)
        first = None
        for seq in sorted({s for v in by_rank.values() for s in v}):
            have = {r: by_rank[r].get(seq) for r in ranks}
            names = {}
            for r, v in have.items():
                if v:
                    names.setdefault(v[0], []).append(r)
            missing = [r for r, v in have.items() if v is None and max(by_rank[r], default=0) < seq]
            unfinished = [r for r, v in have.items() if v and v[1] != "completed"]
            if len(names) > 1:
                minority = min(names, key=lambda n: (len(names[n]), str(n)))
                first = {"seq": seq, "kind": "mismatch", "by_collective": names, "blame": names[minority]}
            elif missing:
                first = {"seq": seq, "kind": "stopped", "collective": next(iter(names), None), "blame": missing,
                         "unfinished": unfinished}
            elif unfinished:
                # Every rank with a record called it and some never finished it: they wait (on a rank
                # without a record, which the caller adds to the blame).
                first = {"seq": seq, "kind": "unfinished", "collective": next(iter(names), None), "blame": [],
                         "unfinished": unfinished}
            if first:
                break
        out[pg] = {"ranks": ranks, "first": first}
    return {"groups": out, "unreadable": bad}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="harp-status", description=__doc__.split("\n")[0])
    ap.add_argument("--version", action="version", version=f"harp-status (harp {__version__})")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--dump", nargs="?", const=True, default=False, metavar="DIR",
                    help="ask every process to write its flight record; with --job: gather every rank's into DIR "
                         "and analyse them")
    ap.add_argument("--job", action="store_true", help="the whole job: every rank of each communicator, on every host")
    ap.add_argument("--rank-addr", metavar="HOST:PORT", help="with --job: ask this rank (key from HARP_JOBVIEW_KEY)")
    ap.add_argument("--job-key", action="store_true", help="print COMM:KEY ADDR for each local communicator")
    ap.add_argument("--socket", action="append", help="ask only this socket (repeatable)")
    ap.add_argument("--timeout", type=float, default=0.8, help="seconds per socket (default 0.8)")
    ap.add_argument("--raw", action="store_true", help="with --json: every process's answer as is")
    args = ap.parse_args(argv)
    if args.job or args.job_key:
        return _job_main(args)
    if args.dump not in (True, False):
        ap.error("--dump DIR needs --job (without it, --dump asks each local process to write its own record)")
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


def _job_targets(args):
    """[(addr, comm, key, size)] and [(where, error)]: --rank-addr with HARP_JOBVIEW_KEY, else this host's ranks."""
    if args.rank_addr:
        comm, key = key_from_env(os.environ.get("HARP_JOBVIEW_KEY", ""))
        info = json.loads(job_request(args.rank_addr, comm, key, "ADDRS", 64 << 20, args.timeout * 4))
        if not isinstance(info.get("size"), int) or not 0 < info["size"] <= MAX_RANKS:
            raise ValueError(f"{args.rank_addr}: malformed ADDRS answer")
        return [(args.rank_addr, comm, key, info["size"])], []
    eps, errors = job_endpoints(args.socket, args.timeout)
    return [(e["addr"], e["comm"], bytes.fromhex(e["key"]), e["size"]) for e in eps], errors


def _job_main(args) -> int:
    if args.job_key:
        eps, errors = job_endpoints(args.socket, args.timeout)
        for e in eps:
            print(escape(f"{e['comm']}:{e['key']} {e['addr']} (rank {e['rank']} of {e['size']})"))
        for p, e in errors:
            print(escape(f"{p}: {e}"), file=sys.stderr)
        return 0 if eps else 1
    try:
        targets, errors = _job_targets(args)
    except (OSError, ValueError) as e:
        print(escape(f"harp-status --job: {type(e).__name__}: {e}"), file=sys.stderr)
        return 2
    budget = max(args.timeout * 4, 2.0)
    if args.dump not in (True, False):
        results = []
        for addr, comm, key, size in targets:
            folder = os.path.join(args.dump, comm)
            try:
                done, failed = job_dump(addr, comm, key, folder, budget)
            except (OSError, ValueError) as e:
                errors.append((addr, f"{type(e).__name__}: {e}"))
                continue
            res = analyze_dumps(done)
            res.update(comm=comm, folder=folder, written=sorted(done), no_record=failed)
            for g in res["groups"].values():  # a rank that gave no record is to blame with the others
                if g["first"]:
                    g["first"]["blame"] = sorted(set(g["first"]["blame"]) | set(failed))
            results.append(res)
        if args.json:
            print(_json_out({"dumps": results, "errors": dict(errors)}))
        else:
            print(_dump_text(results, errors))
        return 0 if results else 1
    views = []
    for addr, comm, key, size in targets:
        try:
            views.append(job_view(addr, comm, key, size, budget))
        except (OSError, ValueError) as e:
            errors.append((addr, f"{type(e).__name__}: {e}"))
    if args.json:
        print(_json_out({"comms": views, "errors": dict(errors)}))
    else:
        print(job_text(views, errors))
    return 0 if views else 1


def _dump_text(results, errors) -> str:
    lines = []
    for r in results:
        lines.append(f"communicator {r['comm']}: {len(r['written'])} flight record(s) in {r['folder']}")
        for rank, e in sorted(r["no_record"].items()):
            lines.append(f"  rank {rank}: no record ({e})")
        for pg, g in r["groups"].items():
            f = g["first"]
            if not f:
                lines.append(f"  {pg}: the records agree" + (f"; no record from ranks {_ranks_text(sorted(r['no_record']))}"
                                                              if r["no_record"] else ""))
            elif f["kind"] == "mismatch":
                by = "; ".join(f"{n} on ranks {_ranks_text(v)}" for n, v in f["by_collective"].items())
                lines.append(f"  {pg}: first disagreement at collective #{f['seq']}: {by}; to blame: "
                             f"{_ranks_text(f['blame'])}")
            else:
                lines.append(f"  {pg}: collective #{f['seq']} ({f['collective']}): {f['kind']}, unfinished on "
                             f"{len(f['unfinished'])} rank(s); to blame: {_ranks_text(f['blame'])}")
    for where, e in errors:
        lines.append(f"{where}: {e}")
    return "\n".join(escape(line) for line in lines)


if __name__ == "__main__":
    sys.exit(main())
