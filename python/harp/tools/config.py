"""harp-config: where HARP is installed and what this build can do.

    harp-config               summary (version, kernels, transports and why any is unavailable)
    harp-config --version     the version (the same string as harp.__version__)
    harp-config --transports  one line per transport: how it is provided (built in, or a
                              runtime module and whether that module loaded) and whether it
                              can run here (a loaded verbs module may still find no device)
    harp-config --json        the same facts as JSON
    harp-config --nccl-lib    path of the NCCL-compatible library, for LD_PRELOAD
    harp-config --install-libnccl DIR
                              make DIR/libnccl.so.2 (a link to it): put DIR first on
                              LD_LIBRARY_PATH to replace NCCL without a preload
    harp-config --nccl-include   directory holding HARP's nccl.h (for C users)
    harp-config --libdir      directory holding libharp.so and the transport modules
    harp-config --params [--json]
                              every HARP_* parameter: type, current value and where it came
                              from (environment / default), scope and doc (base/params.def)
    harp-config --explain COLL SIZE [--ranks P] [--transport T] [--dtype D] [--op OP]
                              [--in-place] [--algo NAME] [--hosts H --ppn N|N1,N2,...]
                              every algorithm of COLL with its restrictions (ok / failed: which),
                              the cost model's predicted time and the pick with its reason (user,
                              tuning row, cost model, declared fallback), computed by the same C++
                              function the communicator uses (core/select/select.h). SIZE: bytes, 64K, 4M

Only --version works without the compiled library (it never imports harp._harp).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .. import _params
from .._version import __version__


def transport_table():
    """[{name, priority, provided, module, loaded, available, why}] for every transport.

    provided: 'built in' or 'module'; loaded: the module was dlopen-ed (always True when
    built in); available: the transport can run in this process (why says why not)."""
    import harp

    mods = {name: (path, loaded, err) for name, path, loaded, err in harp._harp.transport_modules()}
    rows = []
    for name, prio, why in harp.transports():
        path, loaded, err = mods.get(name, ("", True, ""))
        rows.append({"name": name, "priority": prio, "provided": "module" if name in mods else "built in",
                     "module": path, "loaded": bool(loaded), "available": not why, "why": why})
    return rows


def _transport_line(t):
    if t["provided"] == "built in":
        how = "built in"
    else:
        how = "module loaded" if t["loaded"] else "module not loaded"
    state = "available" if t["available"] else "unavailable: " + t["why"]
    return f"transport {t['name']:6s} {how:18s} {state}"


def _nccl(libdir, a):
    path = os.path.join(libdir, "libharp-nccl.so")
    if not os.path.exists(path):
        print(f"harp-config: {path} is not built in this installation", file=sys.stderr)
        sys.exit(1)
    if a.install_libnccl:
        os.makedirs(a.install_libnccl, exist_ok=True)
        # libharp-nccl.so finds libharp.so through $ORIGIN, which the loader takes
        # from the path it opened (the link), so link libharp.so beside it too.
        for name, target in (("libnccl.so.2", path), ("libharp.so", os.path.join(libdir, "libharp.so"))):
            link = os.path.join(a.install_libnccl, name)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
        path = os.path.join(a.install_libnccl, "libnccl.so.2")
    print(path)


def _nccl_include(libdir):
    for d in (os.path.join(libdir, "include"),
              os.path.join(os.path.dirname(os.path.dirname(libdir)), "bindings", "nccl")):
        if os.path.exists(os.path.join(d, "nccl.h")):
            print(d)
            return
    print("harp-config: nccl.h is not installed here", file=sys.stderr)
    sys.exit(1)


def _size(text):
    """'4M' / '64K' / '1G' / '4096' -> bytes (binary units, as HARP_* sizes)."""
    units = {"": 1, "B": 1, "K": 1 << 10, "k": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
             "G": 1 << 30, "GB": 1 << 30}
    num = text.rstrip("BKkMG")
    try:
        value = float(num)
        mult = units[text[len(num):]]
    except (ValueError, KeyError):
        raise SystemExit(f"harp-config: --explain: '{text}' is not a size (use e.g. 4096, 64K, 4M)") from None
    if value < 0:
        raise SystemExit(f"harp-config: --explain: size '{text}' is negative")
    return int(value * mult)


def _seconds(s):
    if s == float("inf"):
        return "no cost declared"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3f} {unit}"
    return f"{s * 1e9:.1f} ns"


def explain(coll, size, ranks=2, transport="tcp", dtype="float32", op="sum", in_place=False, algo="", ppn=None):
    """The algorithm choice for one call, as lines of text (harp-config --explain).

    ppn: ranks per host, one number per host ([2, 2]: 2 hosts x 2; [3, 1] uneven);
    None: one host. With ppn, ranks is their sum."""
    import harp

    nbytes = _size(size) if isinstance(size, str) else int(size)
    ppn = list(ppn or [ranks])
    if ppn != [ranks]:
        ranks = sum(ppn)
    e = harp._harp.explain(coll, nbytes, ranks, transport, dtype, op, in_place, algo, len(ppn), min(ppn), max(ppn))
    shape = f", {len(ppn)} hosts x {'/'.join(map(str, ppn)) if len(set(ppn)) > 1 else ppn[0]}" if len(ppn) > 1 else ""
    out = [f"{coll} {nbytes} bytes ({e['count']} x {dtype}), {ranks} ranks{shape}, transport {transport}"
           + (", in place" if in_place else ""),
           f"transport parameters: alpha {e['alpha'] * 1e6:.3g} us (per message: half a round trip, RTT "
           f"{2 * e['alpha'] * 1e6:.3g} us), beta {e['beta'] * 1e9:.3g} ns/byte, "
           f"gamma {e['gamma'] * 1e9:.3g} ns/byte, overhead {e['overhead'] * 1e6:.3g} us per further message of a "
           f"burst" + (f", host link {e['link_beta'] * 1e9:.3g} ns/byte for all flows together"
                       if e.get("link_beta") and e["link_beta"] != e["beta"] else "") + f" ({e['params_source']})",
           f"  {'algorithm':20s} {'restrictions':18s} {'predicted':>12s}  status"]
    for c in e["candidates"]:
        status = "ok" if not c["failed"] else "failed: " + c["failed"]
        if c["fallback"]:
            status += f" (fallback {c['fallback']})"
        out.append(f"  {c['name']:20s} {c['restrictions']:18s} {_seconds(c['seconds']):>12s}  {status}")
    out.append(f"pick: {e['pick']} ({e['reason']})")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="harp-config")
    ap.add_argument("--version", action="version", version=f"harp-config (harp {__version__})")
    ap.add_argument("--transports", action="store_true", help="list transports: module loaded? usable here? why not?")
    ap.add_argument("--json", action="store_true", help="print version, paths and transports as JSON")
    ap.add_argument("--nccl-lib", action="store_true", help="print the path of libharp-nccl.so (for LD_PRELOAD)")
    ap.add_argument("--install-libnccl", metavar="DIR", help="create DIR/libnccl.so.2 -> libharp-nccl.so")
    ap.add_argument("--nccl-include", action="store_true", help="print the directory of HARP's nccl.h")
    ap.add_argument("--libdir", action="store_true", help="print the directory holding HARP's libraries")
    ap.add_argument("--params", action="store_true", help="list every HARP_* parameter: value, source, doc (--json too)")
    _explain_args(ap)
    a = ap.parse_args(argv)
    if a.params:
        return _params.print_params(a.json)
    import harp

    libdir = os.path.dirname(os.path.abspath(harp.__file__))
    if a.explain:
        _explain_main(a)
    elif a.libdir:
        print(libdir)
    elif a.nccl_lib or a.install_libnccl:
        _nccl(libdir, a)
    elif a.nccl_include:
        _nccl_include(libdir)
    elif a.json:
        print(json.dumps({"version": __version__, "libdir": libdir, "reduce_kernel": harp._harp.reduce_kernel(),
                          "transports": transport_table()}, indent=1))
    elif a.transports:
        for t in transport_table():
            print(_transport_line(t))
    else:
        print(f"harp {__version__} at {libdir}")
        print(f"reduction kernels: {harp._harp.reduce_kernel()}")
        for t in transport_table():
            print(_transport_line(t))


def _explain_args(ap):
    ap.add_argument("--explain", nargs=2, metavar=("COLL", "SIZE"),
                    help="show every algorithm of COLL for SIZE bytes (4M, 64K, 4096) with restrictions, "
                         "predicted time and the pick")
    ap.add_argument("--ranks", type=int, default=2, help="--explain: rank count (default 2)")
    ap.add_argument("--transport", default="tcp", help="--explain: tcp, shm, verbs, dpdk or mixed (default tcp)")
    ap.add_argument("--dtype", default="float32", help="--explain: element type (default float32)")
    ap.add_argument("--op", default="sum", help="--explain: reduction op (default sum)")
    ap.add_argument("--in-place", action="store_true", help="--explain: send buffer == receive buffer")
    ap.add_argument("--algo", default="", help="--explain: the algorithm a caller asks for (algo=)")
    ap.add_argument("--hosts", type=int, default=0,
                    help="--explain: hosts (with --ppn; hierarchical algorithms need >= 2). Default: 1 host")
    ap.add_argument("--ppn", default="",
                    help="--explain: ranks per host, N or N1,N2,... per host (uneven); sets --ranks")


def _ppn(a):
    """--hosts/--ppn as ranks per host, or None (one host)."""
    if not a.hosts and not a.ppn:
        return None
    try:
        per = [int(x) for x in a.ppn.split(",")] if a.ppn else []
    except ValueError:
        raise SystemExit(f"harp-config: --ppn '{a.ppn}' is not N or N1,N2,...") from None
    hosts = a.hosts or max(1, len(per))
    if not per:
        per = [max(1, a.ranks // hosts)]
    if len(per) == 1:
        per = per * hosts
    if len(per) != hosts or min(per) < 1:
        raise SystemExit(f"harp-config: --ppn '{a.ppn}' needs one count >= 1 per host ({hosts} hosts)")
    return per


def _explain_main(a):
    import harp

    try:
        lines = explain(a.explain[0], a.explain[1], a.ranks, a.transport, a.dtype, a.op, a.in_place, a.algo,
                        _ppn(a))
    except harp.HarpError as e:
        raise SystemExit(f"harp-config: --explain: {e}") from None
    print("\n".join(lines))


if __name__ == "__main__":
    main()
