"""bench/sim/agree.py — the C++ replayer (harp_replay) against the Python reference
(replay.py's SimGrid Python bindings) on identical schedules and platforms, and what
the projection's one departure (SimGrid's cross traffic off) changes.

    python3 bench/sim/agree.py > results/sim/agree.md

Prints a markdown table: schedule, messages, both simulated times, their relative
difference and both replayers' wall times (this machine; its load in the header).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import platforms  # noqa: E402
import replay  # noqa: E402
import schedule  # noqa: E402

ARENA = dict(link_Bps=119.6e6, send_overhead_s=30e-6, burst_B=262144, burst_Bps=1.25e9)
VPC = dict(link_Bps=3.125e9, flow_cap_Bps=1.25e9, send_overhead_s=30e-6)
CASES = [  # algo, p, bytes, hosts, spec, iterations, label
    ("ring", 4, 1 << 20, 4, dict(hosts=4, rtt_s=1.042e-3, **ARENA), 3, "arena 4 x 1, RTT 1 ms, tbf, 3 iterations"),
    ("halving_doubling", 8, 1 << 16, 8, dict(hosts=8, rtt_s=42e-6, **ARENA), 3, "arena 8 x 1, RTT 42 us, tbf, 3 it."),
    ("recursive_doubling", 8, 16 << 20, 8, dict(hosts=8, rtt_s=1.042e-3, **ARENA), 3, "arena 8 x 1, RTT 1 ms"),
    ("ring", 16, 16 << 20, 2, dict(hosts=2, local=8, rtt_s=1e-4, **VPC), 1, "VPC 2 x 8, RTT 100 us"),
    ("recursive_doubling", 16, 1 << 20, 2, dict(hosts=2, local=8, rtt_s=1e-3, **VPC), 1, "VPC 2 x 8, RTT 1 ms"),
    ("leader", 32, 65536, 4, dict(hosts=4, local=8, rtt_s=1e-4, **VPC), 1, "VPC 4 x 8, RTT 100 us"),
    ("tree", 32, 4 << 20, 4, dict(hosts=4, local=8, rtt_s=1e-3, **VPC), 1, "VPC 4 x 8, RTT 1 ms"),
    ("halving_doubling", 64, 16 << 20, 8, dict(hosts=8, local=8, rtt_s=1e-4, **VPC), 1, "VPC 8 x 8, RTT 100 us"),
    ("ring", 64, 16 << 20, 8, dict(hosts=8, local=8, rtt_s=1e-4, **VPC), 1, "VPC 8 x 8, RTT 100 us"),
]


def main() -> None:
    print(f"Load at start: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores\n")
    print("| schedule | platform | messages | Python s | C++ s | C++/Python - 1 | C++ no cross traffic: - 1 "
          "| Python wall s | C++ wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for algo, p, n, hosts, spec, its, label in CASES:
        s = schedule.emit(algo, p, n, hosts)
        sp = platforms.Spec(**spec)
        t0 = time.monotonic()
        py = replay.simulate(s, sp, iterations=its, engine="python")
        t1 = time.monotonic()
        with tempfile.NamedTemporaryFile("w", suffix=".sched") as f:
            f.write(s.text)
            f.flush()
            cpp = replay.simulate_file(f.name, sp, iterations=its)
            nox = replay.simulate_file(f.name, sp, iterations=its, extra=("--cfg", "network/crosstraffic:0"))
        msgs = sum(op[0] == "S" for ops in s.ranks for op in ops)
        print(f"| {algo} p={p} {n} B | {label} | {msgs} | {py:.6g} | {cpp['sim_seconds']:.6g} | "
              f"{cpp['sim_seconds'] / py - 1:+.1e} | {nox['sim_seconds'] / py - 1:+.3f} | {t1 - t0:.2f} | "
              f"{cpp['wall_seconds']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
