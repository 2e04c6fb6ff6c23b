"""harp-config: where HARP is installed and what this build can do.

    harp-config               summary (version, transports and why any is unavailable)
    harp-config --nccl-lib    path of the NCCL-compatible library, for LD_PRELOAD
    harp-config --install-libnccl DIR
                              make DIR/libnccl.so.2 (a link to it): put DIR first on
                              LD_LIBRARY_PATH to replace NCCL without a preload
    harp-config --nccl-include   directory holding HARP's nccl.h (for C users)
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="harp-config")
    ap.add_argument("--nccl-lib", action="store_true", help="print the path of libharp-nccl.so (for LD_PRELOAD)")
    ap.add_argument("--install-libnccl", metavar="DIR", help="create DIR/libnccl.so.2 -> libharp-nccl.so")
    ap.add_argument("--nccl-include", action="store_true", help="print the directory of HARP's nccl.h")
    ap.add_argument("--libdir", action="store_true", help="print the directory holding HARP's libraries")
    a = ap.parse_args(argv)
    import harp

    libdir = os.path.dirname(os.path.abspath(harp.__file__))
    if a.libdir:
        print(libdir)
        return
    if a.nccl_lib or a.install_libnccl:
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
        return
    if a.nccl_include:
        for d in (os.path.join(libdir, "include"),
                  os.path.join(os.path.dirname(os.path.dirname(libdir)), "bindings", "nccl")):
            if os.path.exists(os.path.join(d, "nccl.h")):
                print(d)
                return
        print("harp-config: nccl.h is not installed here", file=sys.stderr)
        sys.exit(1)
    print(f"harp {harp.__version__} at {libdir}")
    print(f"reduction kernels: {harp._harp.reduce_kernel()}")
    for name, prio, why in harp.transports():
        print(f"transport {name:6s} priority {prio:3d}  {'available' if not why else 'unavailable: ' + why}")


if __name__ == "__main__":
    main()
