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
                              from (environment / default), scope and doc (core/base/params.def)

Only --version works without the compiled library (it never imports harp._harp).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import _params
from ._version import __version__


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
    a = ap.parse_args(argv)
    if a.params:
        return _params.print_params(a.json)
    import harp

    libdir = os.path.dirname(os.path.abspath(harp.__file__))
    if a.libdir:
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


if __name__ == "__main__":
    main()
