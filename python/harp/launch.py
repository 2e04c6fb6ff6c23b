"""harp-run: start N local ranks of a program with HARP's environment set.

    harp-run -n 4 python train.py --epochs 3
    harp-run -n 4 train.py            (a .py file runs with this Python)

The launcher creates the job's unique id and serves the bootstrap store; each
rank gets HARP_UNIQUE_ID, HARP_RANK, HARP_WORLD_SIZE, HARP_LOCAL_RANK and
HARP_LOCAL_WORLD_SIZE (plus RANK/WORLD_SIZE/LOCAL_RANK for code written for
torchrun), and MASTER_ADDR/MASTER_PORT (127.0.0.1 and a free port, unless
already set) so `init_process_group("harp")` with env:// works unmodified, as
under torchrun. If a rank fails, the others are stopped after --grace seconds and
harp-run exits with the failing rank's status.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from . import _params


def rank_env(base, uid_hex, rank, size):
    env = dict(base)
    env.update({
        "HARP_UNIQUE_ID": uid_hex, "HARP_RANK": str(rank), "HARP_WORLD_SIZE": str(size),
        "HARP_LOCAL_RANK": str(rank), "HARP_LOCAL_WORLD_SIZE": str(size),
        "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size),
    })
    return env


def spawn(nranks, cmd, env_extra=None, grace=5.0, quiet=False):
    """Run `cmd` as nranks local ranks; returns the exit status (0 if all succeeded)."""
    from .comm import get_unique_id

    # All ranks are on this host: the bootstrap (and so the TCP transport, which
    # listens where the bootstrap is reached) stays on loopback.
    uid = get_unique_id(_params.get("HARP_LAUNCH_BIND"))
    base = dict(os.environ)
    base.update(env_extra or {})
    if "MASTER_ADDR" not in base:  # torch's env:// rendezvous, as torchrun provides it
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    _params.warn_unknown(base)  # once here; HARP_PARAMS_CHECKED tells the ranks not to repeat it
    base["HARP_PARAMS_CHECKED"] = "1"
    procs = [subprocess.Popen(cmd, env=rank_env(base, uid.hex(), r, nranks)) for r in range(nranks)]
    status = 0
    failed_at = None
    try:
        while True:
            alive = 0
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    alive += 1
                elif rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    failed_at = time.monotonic()
                    if not quiet:
                        print(f"harp-run: rank {r} exited with status {rc}", file=sys.stderr)
            if alive == 0:
                break
            if failed_at is not None and time.monotonic() - failed_at > grace:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.02)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        return 130
    return status


def main(argv=None):
    ap = argparse.ArgumentParser(prog="harp-run", description="Start N local HARP ranks of a program.")
    from ._version import __version__

    ap.add_argument("--version", action="version", version=f"harp-run (harp {__version__})")
    ap.add_argument("-n", "--nranks", type=int, required=True, help="number of local ranks")
    ap.add_argument("--transport", help="force a transport (sets HARP_TRANSPORT)")
    ap.add_argument("--grace", type=float, default=5.0, help="seconds to let other ranks finish after a failure")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="program and arguments")
    a = ap.parse_args(argv)
    if a.nranks < 1:
        ap.error("-n must be >= 1")
    if not a.cmd:
        ap.error("no program given")
    cmd = a.cmd
    if cmd[0].endswith(".py"):
        cmd = [sys.executable] + cmd
    extra = {"HARP_TRANSPORT": a.transport} if a.transport else {}
    sys.exit(spawn(a.nranks, cmd, extra, a.grace))


if __name__ == "__main__":
    main()
