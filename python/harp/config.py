"""harp-config: where HARP is installed and what this build can do.

    harp-config               summary (version, transports and why any is unavailable)
    harp-config --nccl-lib    path of the NCCL-compatible library, for LD_PRELOAD
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="harp-config")
    ap.add_argument("--nccl-lib", action="store_true", help="print the path of libharp-nccl.so (for LD_PRELOAD)")
    ap.add_argument("--libdir", action="store_true", help="print the directory holding HARP's libraries")
    a = ap.parse_args(argv)
    import harp

    libdir = os.path.dirname(os.path.abspath(harp.__file__))
    if a.libdir:
        print(libdir)
        return
    if a.nccl_lib:
        path = os.path.join(libdir, "libharp-nccl.so")
        if not os.path.exists(path):
            print(f"harp-config: {path} is not built in this installation", file=sys.stderr)
            sys.exit(1)
        print(path)
        return
    print(f"harp {harp.__version__} at {libdir}")
    print(f"reduction kernels: {harp._harp.reduce_kernel()}")
    for name, prio, why in harp.transports():
        print(f"transport {name:6s} priority {prio:3d}  {'available' if not why else 'unavailable: ' + why}")


if __name__ == "__main__":
    main()
