"""bench/sim/platforms.py — SimGrid platforms for HARP's replayer (replay.py).

A platform is hosts x ranks per host. Every rank is a SimGrid host (one core
whose speed is 1 "flop" per byte: local work is executed as bytes / rate, see
replay.py). A shm message between ranks of one host crosses the receiver's
memory link (shm bandwidth, shm latency: the receiver copies); ranks of different hosts leave
through their own ports (no limit; half the shm latency each) and go up the
sender host's NIC (split-duplex: each direction its own capacity), through a
per-flow cap (a FATPIPE link: every flow gets at most the cap, flows do not
share it) and down the receiver host's NIC. The NIC links carry half of the
one-way latency each, so a message between hosts sees latency = rtt / 2.

Usage:
    spec = Spec(hosts=8, local=1, link_Bps=119.6e6, rtt_s=1e-3, ...)
    build(engine, spec)        # before creating actors; host names "r<rank>"

ARENA and VPC are the two families bench/sim/project.py uses (the arena's
defaults come from bench/vpc: 1 Gbit/s veths through one switch, measured
119.6 MB/s per stream); calibrate.py fits the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


# Fields added after results/sim/projection-cells.jsonl was replayed: replay.spec_arg leaves
# them out at their default, so the cached cells' input digests hold.
SINCE_CACHE = ("sndbuf_B", "runq", "spin_s", "spin_bytes", "rendezvous_B")


@dataclass(frozen=True)
class Spec:
    hosts: int
    local: int = 1
    link_Bps: float = 119.6e6       # NIC rate, bytes/s, each direction
    rtt_s: float = 42e-6            # round trip between hosts (wire + kernel)
    flow_cap_Bps: float = 0.0       # per-flow cap (0: none)
    shm_Bps: float = 8e9            # a rank's memory link inside a host: what it receives (copies) at once
    shm_lat_s: float = 1e-6
    reduce_Bps: float = 3e9         # local reduction rate (bytes of input per second)
    send_overhead_s: float = 5e-6   # CPU time a rank spends posting one message
    tcp_window_B: float = 4 * 1024 * 1024  # SimGrid's TCP-gamma: one flow <= window / (2 latency)
    # Token-bucket shaping (the arena's tbf on both ends of every veth): 0 = none. With a
    # bucket, the NIC links run at burst_Bps and replay.py charges each inter-host message
    # to the sender's and the receiver's buckets (link_Bps refill, burst_B deep).
    burst_B: float = 0.0
    burst_Bps: float = 0.0
    # > 0: every rank's CPU work (each message's send overhead, every X line) runs on one shared
    # host of this many cores (the arena: all emulated hosts on one machine), so ranks busy at
    # once queue for them; 0: each rank has its own core. harp_replay only.
    cores: int = 0
    # With cores > 0 and more ranks than cores: a wait that blocks ends wake_s x (ranks - cores)
    # / cores after its data arrived (the woken rank queues for a core). harp_replay only.
    wake_s: float = 0.0
    # > 0 with cores > 0: the cores are a run queue instead. A rank holds one while it runs (its
    # send overheads and X lines at the core's rate) and gives it up when a wait blocks; woken,
    # it waits in line for a core (first come first served) and spends wake_s on it. harp_replay only.
    runq: int = 0
    # > 0 with runq: a wait first polls on the rank's core for up to spin_s; what arrives
    # meanwhile costs no wake-up, and the core stays taken from the ranks in line.
    spin_s: float = 0.0
    spin_bytes: float = 0.0  # > 0: a wait on more pending bytes than this does not spin (HARP_SPIN_BYTES)
    # > 0: a send between hosts of at most sndbuf_B bytes is done once posted (TCP: once the
    # socket buffer took it; HARP's tcp isend completes when its bytes are written), not when
    # they arrive. Without a per-flow cap only.
    sndbuf_B: float = 0.0
    # > 0: a message of more bytes moves only once its receive is posted (a TCP sender stalls
    # once the socket buffers hold what the receiver has not asked for); 0: every message is
    # eager. harp_replay only.
    rendezvous_B: float = 0.0

    @property
    def nic_Bps(self) -> float:
        return self.burst_Bps if self.burst_B > 0 else self.link_Bps

    @property
    def ranks(self) -> int:
        return self.hosts * self.local

    def but(self, **kw) -> Spec:
        return replace(self, **kw)


PORT_BPS = 1e13  # a rank's port to its host's router: no limit of its own


def build(engine, spec: Spec) -> list:
    """Creates the platform in `engine`; returns the rank hosts, by rank.

    The root zone is a star of hosts (O(hosts) routes); each host's zone routes
    every pair of its ranks over their memory links and each rank to the host's
    router over a port of its own (O(local^2) routes per host).
    """
    from simgrid import Link, LinkInRoute, NetZone  # noqa: PLC0415  (system python3-simgrid)

    if spec.hosts < 1 or spec.local < 1:
        raise ValueError(f"platform: hosts and ranks per host must be >= 1, got {spec.hosts} x {spec.local}")
    type(engine).set_config("network/model:CM02")  # no hidden latency or bandwidth factors
    type(engine).set_config(f"network/TCP-gamma:{spec.tcp_window_B:.0f}")
    up, down = LinkInRoute.Direction.UP, LinkInRoute.Direction.DOWN
    root = NetZone.create_star_zone("arena")
    cap = None
    if spec.flow_cap_Bps > 0:
        cap = root.create_link("flowcap", spec.flow_cap_Bps).set_sharing_policy(Link.SharingPolicy.FATPIPE, None)
        cap.seal()
    ranks = []
    for h in range(spec.hosts):
        # Each rank: a memory link for the host's shm traffic and a port to the host's router for
        # its network traffic, so that the two never share a link (CM02 shares a link in inverse
        # proportion to each flow's latency: a 50 us network flow beside 1 us shm flows got a
        # fiftieth of the rank's memory link). A full zone: routes per pair of the host's ranks.
        # A shm message crosses its receiver's memory link only: the receiver copies (out of the
        # ring, or from the sender's memory by process_vm_readv above HARP_SHM_CMA_BYTES), so a
        # rank's concurrent sends do not share a rate of the sender's; its concurrent receives do.
        zone = NetZone.create_full_zone(f"host{h}")
        zone.set_parent(root)
        gw = zone.create_router(f"gw{h}")
        hosts, mems = [], []
        for i in range(spec.local):
            r = h * spec.local + i
            host = zone.create_host(f"r{r}", 1.0).seal()
            mems.append(zone.create_link(f"memin{r}", spec.shm_Bps).set_latency(spec.shm_lat_s).seal())
            port = zone.create_split_duplex_link(f"port{r}", PORT_BPS).set_latency(spec.shm_lat_s / 2).seal()
            zone.add_route(host.netpoint, gw, None, None, [LinkInRoute(port, up)], False)
            zone.add_route(gw, host.netpoint, None, None, [LinkInRoute(port, down)], False)
            hosts.append(host)
            ranks.append(host)
        for i in range(spec.local):
            for j in range(spec.local):
                if i != j:
                    zone.add_route(hosts[i].netpoint, hosts[j].netpoint, None, None,
                                   [LinkInRoute(mems[j])], False)
        zone.seal()
        nic = root.create_split_duplex_link(f"nic{h}", spec.nic_Bps).set_latency(spec.rtt_s / 4).seal()
        extra = [LinkInRoute(cap)] if cap is not None else []
        root.add_route(zone.netpoint, None, gw, None, [LinkInRoute(nic, up)] + extra, False)
        root.add_route(None, zone.netpoint, None, gw, [LinkInRoute(nic, down)], False)
    root.seal()
    return ranks
