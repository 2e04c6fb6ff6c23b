"""harp.dpdk — what to check before running HARP over DPDK.

Python bindings to DPDK through cffi in API mode (the compiled extension
``harp._dpdk_cffi``, built with the package when libdpdk is installed)::

    import harp.dpdk as d
    d.version()                 # 'DPDK 22.11.11'
    d.hugepages()               # hugetlbfs mounts, total/free pages per size
    d.init()                    # EAL with HARP's defaults (HARP_DPDK_HUGE, HARP_DPDK_EAL_ARGS)
    p = d.probe("af_xdp:veth0") # or memif-less specs HARP_DPDK_PORT accepts, or a vdev string
    d.start(p); d.ports()       # [{'port': 0, 'name': ..., 'link_up': True, 'ipackets': ..., ...}]

``python -m harp.dpdk [PORT_SPEC]`` prints the same report.

The EAL can be initialized once per process and is shared with HARP's DPDK
transport when both run in one process (the transport accepts an EAL that is
already up). Not thread-safe: call from one thread.
"""
from __future__ import annotations

import glob
import os
import shlex
import sys

try:
    from ._dpdk_cffi import ffi, lib  # type: ignore
    _IMPORT_ERROR = None
except ImportError as e:  # built without DPDK or cffi
    ffi = lib = None
    _IMPORT_ERROR = e

from . import _params
from .errors import UnavailableError

_eal_args = None
_keep = []  # argv buffers: the EAL keeps pointers into them


def available() -> bool:
    """True when the cffi DPDK extension was built and imports."""
    return lib is not None


def _need():
    if lib is None:
        raise UnavailableError("harp.dpdk: the DPDK bindings were not built (libdpdk-dev, pkg-config and cffi are "
                               f"needed at install time): {_IMPORT_ERROR}")


def _err(what: str, rc: int | None = None) -> UnavailableError:
    e = -rc if rc is not None and rc < 0 else (rc if rc else lib.harp_rte_errno())
    return UnavailableError(f"harp.dpdk: {what}: {ffi.string(lib.rte_strerror(e)).decode()}")


def version() -> str:
    """DPDK's version string, e.g. 'DPDK 22.11.11' (no EAL needed)."""
    _need()
    return ffi.string(lib.rte_version()).decode()


def hugepages() -> dict:
    """Hugepage status from /proc and /sys: mounts and, per page size, total/free pages."""
    mounts = []
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, typ, opts = line.split()[:4]
            if typ == "hugetlbfs":
                mounts.append({"path": mnt, "options": opts})
    sizes = {}
    for d in sorted(glob.glob("/sys/kernel/mm/hugepages/hugepages-*kB")):
        kb = int(d.rsplit("-", 1)[1][:-2])

        def rd(name, d=d):
            try:
                with open(os.path.join(d, name)) as f:
                    return int(f.read())
            except OSError:
                return 0
        sizes[kb] = {"total": rd("nr_hugepages"), "free": rd("free_hugepages")}
    default_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Hugepagesize:"):
                default_kb = int(line.split()[1])
    free_mb = sum(v["free"] * kb for kb, v in sizes.items()) // 1024
    return {"mounted": bool(mounts), "mounts": mounts, "default_page_kb": default_kb, "sizes": sizes,
            "free_mb": free_mb, "usable": bool(mounts) and free_mb > 0}


def default_eal_args(huge: bool | None = None, mem_mb: int = 128) -> list[str]:
    """EAL arguments like the transport's: own --file-prefix, no telemetry, hugepages when
    usable (or HARP_DPDK_HUGE=1/0), plus HARP_DPDK_EAL_ARGS."""
    mode = _params.get("HARP_DPDK_HUGE")
    if huge is None:
        huge = {"1": True, "yes": True, "0": False, "no": False}.get(mode)
        if huge is None:
            huge = hugepages()["usable"] and hugepages()["free_mb"] >= mem_mb
    args = ["harp-py", "--file-prefix", f"harp-py-{os.getpid()}", "--no-telemetry", "--log-level=4",
            "--lcores", "0@(" + ",".join(str(c) for c in sorted(os.sched_getaffinity(0))) + ")"]
    args += ["--in-memory"] if huge else ["--no-huge", "-m", str(mem_mb), "--no-shconf"]
    extra = shlex.split(os.environ.get("HARP_DPDK_EAL_ARGS", ""))
    if not any(a in ("-a", "--allow") or a.startswith("--allow=") for a in extra):
        args.append("--no-pci")
    return args + extra


def init(args: list[str] | None = None, huge: bool | None = None) -> list[str]:
    """Initialize DPDK's EAL in this process (once; later calls return the first arguments).
    Raises UnavailableError naming the cause (e.g. missing hugepages)."""
    global _eal_args
    _need()
    if _eal_args is not None:
        return _eal_args
    if args is None:
        if huge:
            hp = hugepages()
            if not hp["mounted"]:
                raise UnavailableError("harp.dpdk: hugepages requested but no hugetlbfs is mounted "
                                       "(mount -t hugetlbfs nodev /dev/hugepages)")
            if hp["free_mb"] == 0:
                raise UnavailableError("harp.dpdk: hugepages requested but none are free "
                                       "(echo N > /proc/sys/vm/nr_hugepages)")
        args = default_eal_args(huge)
    _keep[:] = [ffi.new("char[]", a.encode()) for a in args]
    argv = ffi.new("char *[]", _keep)
    rc = lib.rte_eal_init(len(_keep), argv)
    if rc < 0:
        e = lib.harp_rte_errno()
        if e != 114:  # EALREADY: HARP's transport already brought the EAL up in this process
            raise _err("rte_eal_init(" + " ".join(args[1:]) + ") failed", -e)
    _eal_args = list(args)
    return _eal_args


def _devargs(spec: str) -> str:
    def tag(iface):
        return "".join(c if c.isalnum() else "_" for c in iface)
    if spec.startswith("af_packet:"):
        return f"net_af_packet_py_{tag(spec[10:])},iface={spec[10:]},qpairs=1"
    if spec.startswith("af_xdp:"):
        return f"net_af_xdp_py_{tag(spec[7:])},iface={spec[7:]},start_queue=0,queue_count=1"
    return spec


def probe(spec: str) -> int:
    """Open a port: 'af_packet:IFACE', 'af_xdp:IFACE' or a vdev string 'net_memif0,role=server,...'.
    Returns the DPDK port id. Raises UnavailableError when the device cannot be opened."""
    init()
    if spec.split(":")[0] in ("af_packet", "af_xdp"):
        iface = spec.split(":", 1)[1]
        if not os.path.exists(f"/sys/class/net/{iface}"):
            raise UnavailableError(f"harp.dpdk: no network interface '{iface}' in this network namespace")
    dev = _devargs(spec)
    name = dev.split(",")[0]
    pid = ffi.new("uint16_t *")
    if lib.rte_eth_dev_get_port_by_name(name.encode(), pid) == 0:
        return pid[0]
    rc = lib.rte_dev_probe(dev.encode())
    if rc != 0:
        raise _err(f"cannot open port {spec!r} (rte_dev_probe({dev!r}))", rc)
    if lib.rte_eth_dev_get_port_by_name(name.encode(), pid) != 0:
        raise UnavailableError(f"harp.dpdk: {dev!r} probed but no ethdev named {name!r} appeared")
    return pid[0]


def start(port: int, mbufs: int = 2047) -> None:
    """Configure one rx/tx queue and start the port (so link state and counters are live)."""
    _need()
    rc = lib.harp_port_start(port, mbufs)
    if rc != 0:
        raise _err(f"cannot start port {port}", rc)


def rx_drain(port: int, max_frames: int = 1 << 20) -> int:
    """Receive and free whatever frames are waiting on queue 0 (rte_eth_rx_burst); returns the count."""
    _need()
    return lib.harp_port_rx_drain(port, max_frames)


def tx_frames(port: int, n: int, length: int = 64, dst: str = "ff:ff:ff:ff:ff:ff", ethertype: int = 0x88B6) -> int:
    """Send n test frames of `length` bytes (rte_eth_tx_burst); returns how many the port took."""
    _need()
    mac = bytes(int(x, 16) for x in dst.split(":"))
    return lib.harp_port_tx_frames(port, n, length, mac, ethertype)


def port_info(port: int) -> dict:
    _need()
    info = ffi.new("struct harp_port_info *")
    rc = lib.harp_port_info(port, info)
    if rc != 0:
        raise _err(f"port {port}", rc)
    name = ffi.new("char[]", 128)
    lib.rte_eth_dev_get_name_by_port(port, name)
    return {
        "port": port, "name": ffi.string(name).decode(), "driver": ffi.string(info.driver).decode(),
        "mac": ":".join(f"{b:02x}" for b in bytes(ffi.buffer(info.mac, 6))), "mtu": info.mtu,
        "max_mtu": info.max_mtu, "max_rx_pktlen": info.max_rx_pktlen, "link_up": bool(info.link_up),
        "link_speed_mbps": info.link_speed, "full_duplex": bool(info.link_full_duplex),
        "started": bool(info.started),
        **{k: getattr(info, k) for k in ("ipackets", "opackets", "ibytes", "obytes", "imissed", "ierrors",
                                         "oerrors", "rx_nombuf")},
    }


def ports() -> list[dict]:
    """Every DPDK port of this process with link state and counters."""
    init()
    return [port_info(p) for p in range(64) if lib.rte_eth_dev_is_valid_port(p)]


def report(spec: str | None = None) -> dict:
    """Everything above in one dict: version, hugepages, EAL arguments, ports (opening `spec`
    or HARP_DPDK_PORT when it names an af_packet/af_xdp/vdev port)."""
    out = {"version": version(), "hugepages": hugepages()}
    out["eal_args"] = init()
    spec = spec or _params.get("HARP_DPDK_PORT")
    if spec and spec != "memif":
        out["port_spec"] = spec
        p = probe(spec)
        try:
            start(p)
        except UnavailableError as e:
            out["port_error"] = str(e)
    out["ports"] = ports()
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        r = report(argv[0] if argv else None)
    except UnavailableError as e:
        print(e, file=sys.stderr)
        return 1
    print(r["version"])
    hp = r["hugepages"]
    print(f"hugepages: mounted={hp['mounted']} free={hp['free_mb']} MB sizes={hp['sizes']}")
    print("EAL:", " ".join(r["eal_args"][1:]))
    for p in r["ports"]:
        print(f"port {p['port']} {p['name']} ({p['driver']}) mac {p['mac']} mtu {p['mtu']} "
              f"link {'up' if p['link_up'] else 'down'} {p['link_speed_mbps']} Mb/s "
              f"rx {p['ipackets']} pkts tx {p['opackets']} pkts missed {p['imissed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
