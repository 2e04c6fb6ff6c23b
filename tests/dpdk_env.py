"""Test fixtures for the DPDK transport: availability, the self-test binary, and
(re-exported from harp_dev.cluster.veth_hosts, where harp-bench --veth also finds
them) hugepages and namespace hosts with a control and a data network.

    with dpdk_hosts(3, netem=["loss", "2%"]) as hosts:   # hosts[i].ns, .addr, .data
        hosts[0].popen([...], env=...)
"""
from __future__ import annotations

import glob
import os

import harp
from harp_dev.cluster.veth_hosts import Host, dpdk_hosts, dpdk_unavailable, hugepages  # noqa: F401 (re-exported)

HERE = os.path.dirname(os.path.abspath(__file__))


def selftest_binary() -> str | None:
    """harp_dpdk_selftest: installed next to libharp.so (a wheel), else the one
    scripts/dev-build.sh built (build/dev) when harp is this checkout's python/harp."""
    d = os.path.dirname(harp.__file__)
    p = os.path.join(d, "harp_dpdk_selftest")
    if os.path.exists(p):
        return p
    root = os.path.dirname(HERE)
    if os.path.realpath(d) == os.path.realpath(os.path.join(root, "python", "harp")):
        p = os.path.join(root, os.environ.get("BUILD_DIR", "build/dev"), "transport", "dpdk", "harp_dpdk_selftest")
        if os.path.exists(p):
            return p
    return None


def leftover_memif_sockets() -> list[str]:
    """memif socket files left behind under the default HARP_DPDK_MEMIF_DIR (/tmp): in
    this user's private folder, or (before it existed) in /tmp itself."""
    return glob.glob(f"/tmp/harp-memif-{os.geteuid()}/*.sock") + glob.glob("/tmp/harp-memif-*.sock")
