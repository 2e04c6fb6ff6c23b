"""Namespace hosts joined by two networks: a control network with addresses
(for the bootstrap) and a data network without (the interface a kernel-bypass
transport, DPDK's af_packet / af_xdp, takes over). harp-bench --veth and the
DPDK tests run on them; the VPC arena (harp_dev.cluster.net) is the shaped,
multi-NIC cousin for TCP.

    with dpdk_hosts(3, netem=["loss", "2%"]) as hosts:   # hosts[i].ns, .addr, .data
        hosts[0].popen([...], env=...)
    with hugepages(400): ...                            # 2 MB pages free and hugetlbfs mounted

Everything made here is removed on exit, also on errors. Needs root and
iproute2 (tc and sch_netem for `netem`).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile


def dpdk_unavailable() -> str:
    """'' when the dpdk transport is available in this harp, else why not."""
    import harp

    for name, _prio, why in harp.transports():
        if name == "dpdk":
            return why
    return "this harp build has no dpdk transport (libdpdk-dev missing at build time)"


def _run(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
FREE_2M = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"


def _read_int(path):
    with open(path) as f:
        return int(f.read())


@contextlib.contextmanager
def hugepages(pages: int = 400):
    """Make `pages` 2 MB hugepages free and hugetlbfs mounted for the duration; restore after.
    Raises RuntimeError (with the reason) when that is impossible here.

    A mount this makes goes on a fresh tempfile.mkdtemp folder (0700, a name nobody could
    plant a symlink at beforehand). nr_hugepages is put back first on the way out, whatever
    fails later (unmounting, removing the folder), and a failed cleanup is raised naming the
    mount left behind."""
    before = _read_int(NR_HUGEPAGES)
    mounted_by_us = None
    try:
        with open("/proc/mounts") as f:
            have_mount = any(len(l.split()) > 2 and l.split()[2] == "hugetlbfs" for l in f)
        free = _read_int(FREE_2M)
        if free < pages:
            with open(NR_HUGEPAGES, "w") as f:
                f.write(str(before + pages - free))
        free = _read_int(FREE_2M)
        if free < pages:
            raise RuntimeError(f"could reserve only {free} of {pages} hugepages")
        if not have_mount:
            mounted_by_us = tempfile.mkdtemp(prefix="harp-hugetlbfs-")
            _run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "nodev", mounted_by_us])
        yield
    finally:
        try:
            with open(NR_HUGEPAGES, "w") as f:
                f.write(str(before))
        finally:
            if mounted_by_us:
                _unmount(mounted_by_us)


def _unmount(folder):
    """umount and remove our mount folder; RuntimeError naming it when that fails."""
    r = subprocess.run(["umount", folder], capture_output=True, text=True)
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise RuntimeError(f"hugetlbfs left mounted on {folder}: umount: {(r.stderr or '').strip() or r.returncode}; "
                           f"rmdir: {e.strerror}") from None


class Host:
    def __init__(self, ns, addr, ctl, data):
        self.ns, self.addr, self.ctl, self.data = ns, addr, ctl, data

    def cmd(self, argv):
        return ["ip", "netns", "exec", self.ns] + list(argv)

    def popen(self, argv, **kw):
        return subprocess.Popen(self.cmd(argv), **kw)


@contextlib.contextmanager
def dpdk_hosts(n: int, netem: list[str] | None = None, data_mtu: int = 1500):
    """n namespaces, each with a control veth (10.233.k.i/24 on bridge br0) and a data
    veth without IP (on bridge br1), in a private bridge namespace. netem: `tc netem`
    arguments applied to the bridge-side egress of every data link (so frames towards
    every host are lossy/reordered whatever PMD the host uses)."""
    tag = f"d{os.getpid() % 100000}"
    k = 10 + os.getpid() % 200
    br = f"harp-{tag}-br"
    made, hosts = [], []

    def ip(*args, ns=None):
        _run((["ip", "netns", "exec", ns] if ns else []) + ["ip", *args])

    try:
        _run(["ip", "netns", "add", br])
        made.append(br)
        for b in ("br0", "br1"):
            ip("link", "add", b, "type", "bridge", ns=br)
            ip("link", "set", b, "up", ns=br)
        ip("link", "set", "br1", "mtu", str(data_mtu), ns=br)
        for i in range(n):
            ns = f"harp-{tag}-{i}"
            _run(["ip", "netns", "add", ns])
            made.append(ns)
            for kind, bridge in (("c", "br0"), ("d", "br1")):
                a, b = f"h{tag}{kind}{i}a"[:15], f"h{tag}{kind}{i}b"[:15]
                ip("link", "add", a, "type", "veth", "peer", "name", b)
                ip("link", "set", a, "netns", ns)
                ip("link", "set", b, "netns", br)
                if kind == "d":
                    ip("link", "set", b, "mtu", str(data_mtu), ns=br)
                    ip("link", "set", a, "mtu", str(data_mtu), ns=ns)
                ip("link", "set", b, "master", bridge, ns=br)
                ip("link", "set", b, "up", ns=br)
                ip("link", "set", a, "up", ns=ns)
                if kind == "d" and netem:
                    _run(["ip", "netns", "exec", br, "tc", "qdisc", "add", "dev", b, "root", "netem", *netem])
            addr = f"10.233.{k}.{i + 1}"
            ip("addr", "add", f"{addr}/24", "dev", f"h{tag}c{i}a"[:15], ns=ns)
            ip("link", "set", "lo", "up", ns=ns)
            # Keep the kernel quiet on the data link (no IPv6 autoconf chatter).
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                            f"net.ipv6.conf.{f'h{tag}d{i}a'[:15]}.disable_ipv6=1"], capture_output=True)
            hosts.append(Host(ns, addr, f"h{tag}c{i}a"[:15], f"h{tag}d{i}a"[:15]))
        yield hosts
    finally:
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
