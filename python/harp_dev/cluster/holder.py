"""The per-host holder: keeps an emulated host's UTS and mount namespaces alive.

Started by net.start_holder as
    ip netns exec hc-<name>-h<i> unshare --uts --mount --propagation private \\
        python3 -m harp_dev.cluster.holder --hostname H --hosts FILE
so it runs inside the host's network namespace (`ip netns exec` has already
mounted that namespace's /sys) and in fresh UTS and mount namespaces. It sets
the hostname, mounts a private tmpfs on /dev/shm, bind-mounts FILE over
/etc/hosts, prints "READY <pid>" and then sleeps until SIGTERM. Launched ranks
enter it with `nsenter -t <pid> -n -u -m`. When it and every process that
entered it have exited, the kernel frees the mount namespace and with it the
private /dev/shm, so no shared memory outlives the host.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys


def _mount(*args):
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"harp-cluster holder: mount {' '.join(args)}: {r.stderr.strip()}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="harp-cluster-holder")
    ap.add_argument("--hostname", required=True)
    ap.add_argument("--hosts", required=True, help="file bind-mounted over /etc/hosts")
    ap.add_argument("--shm-size", default="50%")
    a = ap.parse_args(argv)
    socket.sethostname(a.hostname)
    _mount("-t", "tmpfs", "-o", f"mode=1777,size={a.shm_size}", "harp-cluster-shm", "/dev/shm")
    _mount("--bind", a.hosts, "/etc/hosts")
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stdout.write(f"READY {os.getpid()}\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
