"""bench/sim/replay.py — replays a HARP schedule (schedule.py) in SimGrid.

Two replayers of one model: harp_replay (bench/sim/replay/harp_replay.cc,
SimGrid's C++ S4U, built on first use by build_replayer.sh: simulate() and
simulate_file() use it) and this file's Python one (SimGrid's Python
bindings: simulate(engine="python"), the reference the C++ one is checked
against on small schedules: tests/test_sim_schedule.py, bench/RESULTS-scale.md).
The Python replayer moves ~10^4 messages a second and replays no lanes (A/E/J
lines: rail's asynchronous legs). The model:

One s4u actor per rank executes its operations in order: S posts an
asynchronous put of <bytes> on the mailbox "<src>><dst>:<comm>" (one mailbox
per directed pair and connection set: HARP's per-pair FIFO matching), after
spending Spec.send_overhead_s of CPU (syscalls, framing); V posts an
asynchronous get on the mirror mailbox; W waits for the listed requests; X
executes <bytes> / rate on the rank's core (reduce: Spec.reduce_Bps; the
fp16/bf16 conversions at the same rate: they stream the same float32 bytes).
Every mailbox has its receiver set at start, so a send starts moving bytes
as soon as it is posted (TCP's eager socket buffers), not when the receive is
posted. Between hosts, where Spec.flow_cap_Bps is set, each connection
(directed pair and connection set) is one TCP stream: its messages share the
cap back to back, a message held until the connection's earlier ones have
had their bytes at the cap's rate (latencies overlap, as a stream's do).
The result is the time the slowest rank finishes (what the arena
benchmarks report: the slowest rank's time).

    python3 bench/sim/replay.py --algo ring --p 8 --bytes 1048576 --hosts 8 --rtt-us 1000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import platforms  # noqa: E402
import schedule  # noqa: E402

FACTORY = "thread"  # SimGrid context factory for the actors (Python bindings)
REPLAYER = schedule.ROOT / "build" / "sim" / "harp_replay"


def ensure_replayer() -> Path:
    return schedule.build_if_stale(REPLAYER, "bench/sim/build_replayer.sh",
                                   [schedule.ROOT / "bench/sim/replay/harp_replay.cc"])


def spec_arg(spec: platforms.Spec) -> str:
    """harp_replay's --spec: every field, but those of platforms.Spec.SINCE_CACHE at their default
    (fields added after the projection's cached cells, whose digests hash this text)."""
    return ",".join(f"{k}={v!r}" for k, v in dataclasses.asdict(spec).items()
                    if not (k in platforms.SINCE_CACHE and v == platforms.Spec.__dataclass_fields__[k].default))


def simulate_file(path: str, spec: platforms.Spec, timeout_s: float = 3600, iterations: int = 1,
                  extra: tuple = (), warmup: int | None = None) -> dict:
    """harp_replay on a schedule file: {"sim_seconds", "messages", "wall_seconds"}."""
    args = [str(ensure_replayer()), "--spec", spec_arg(spec), "--iterations", str(iterations),
            *(("--warmup", str(warmup)) if warmup is not None else ()), *extra, path]
    try:
        out = subprocess.run(["nice", "-n", "10", *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise TimeoutError(f"harp_replay: {path} did not finish in {timeout_s:.0f} s") from e
    vals = dict(line.split(maxsplit=1) for line in out.stdout.splitlines() if " " in line)
    if out.returncode != 0 or "sim-seconds" not in vals:
        raise RuntimeError(f"harp_replay of {path} failed (exit {out.returncode}): {out.stderr[-2000:]}")
    return {"sim_seconds": float(vals["sim-seconds"]), "messages": int(vals["messages"]),
            "wall_seconds": float(vals["wall-seconds"])}
X_RATE = {"reduce": 1.0, "narrow": 1.0, "widen": 1.0, "addwide": 1.0, "copy": 1.0}


def warmup_of(iterations: int, warmup: int | None) -> int:
    """The iterations before the timed ones (harp_replay --warmup): None gives 1 where there
    are several, else 0; it must leave at least one timed."""
    w = (1 if iterations > 1 else 0) if warmup is None else warmup
    if not 0 <= w < iterations:
        raise ValueError(f"replay: warmup {w} must be 0 .. iterations - 1 ({iterations - 1})")
    return w


def simulate(sched: schedule.Schedule, spec: platforms.Spec, timeout_s: float = 3600, iterations: int = 1,
             engine: str = "cpp", warmup: int | None = None) -> float:
    """Seconds until the last rank finishes `sched` on `spec`; with iterations > 1 the
    collective runs that many times back to back (as a benchmark loop: no barrier) and
    the result is the mean time of the iterations after the first `warmup` (None: 1),
    as a benchmark times its loop after its warm-up calls (a token bucket the loop drains
    is in the mean as far as the loop drains it).

    engine "cpp": harp_replay; "python": SimGrid allows one engine per process (and its
    Python bindings do not survive a fork), so each call replays in a child
    `python3 replay.py --worker` that reads the schedule text and the Spec from its stdin.
    """
    if engine == "cpp":
        with tempfile.NamedTemporaryFile("w", suffix=".sched") as f:
            f.write(sched.text)
            f.flush()
            return simulate_file(f.name, spec, timeout_s, iterations, warmup=warmup)["sim_seconds"]
    if engine != "python":
        raise ValueError(f"replay: engine must be cpp or python, not {engine!r}")
    if spec.cores > 0:
        raise ValueError("replay: the Python replayer has no shared cores (Spec.cores > 0); use engine='cpp'")
    if spec.rendezvous_B > 0:
        raise ValueError("replay: the Python replayer sends every message eagerly (Spec.rendezvous_B > 0); "
                         "use engine='cpp'")
    if any(op[0] in "AJ" for ops in sched.ranks for op in ops):
        raise ValueError("replay: the Python replayer has no lanes (A/E/J lines); use engine='cpp'")
    job = json.dumps({"spec": dataclasses.asdict(spec), "schedule": sched.text, "iterations": iterations,
                      "warmup": warmup})
    try:
        out = subprocess.run(["/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable, __file__,
                          "--worker"], input=job, capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise TimeoutError(f"replay: {sched.header} did not finish in {timeout_s:.0f} s") from e
    lines = [x for x in out.stdout.splitlines() if x.startswith("sim-seconds ")]
    if out.returncode != 0 or not lines:
        tail = "\n".join(x for x in out.stderr.splitlines() if not x.startswith("  ->"))[-2000:]
        raise RuntimeError(f"replay of {sched.header} failed (exit {out.returncode}): {tail}")
    return float(lines[-1].split()[1])


def _worker() -> None:
    job = json.loads(sys.stdin.read())
    sched = schedule.parse(job["schedule"])
    t = _simulate(sched, platforms.Spec(**job["spec"]), job["iterations"], job.get("warmup"))
    print(f"sim-seconds {t:.9f}", flush=True)


def _simulate(sched: schedule.Schedule, spec: platforms.Spec, iterations: int = 1, warmup: int | None = None) -> float:
    from simgrid import Actor, Engine, Mailbox, this_actor  # noqa: PLC0415

    w = warmup_of(iterations, warmup)  # checked before the replay, not after it
    p = len(sched.ranks)
    if spec.ranks != p:
        raise ValueError(f"replay: the schedule has {p} ranks, the platform {spec.hosts} x {spec.local}")
    e = Engine(["harp-sim", "--log=root.thres:critical", "--cfg=contexts/factory:" + FACTORY])
    hosts = platforms.build(e, spec)
    finish = [[0.0] * iterations for _ in range(p)]
    o_send = spec.send_overhead_s
    buckets = [[spec.burst_B, 0.0] for _ in range(2 * spec.hosts)]  # [tokens, last refill]: up h, down h
    conn_free = {}  # mailbox name: when the connection's bytes so far are all sent at the cap

    def serialised(name: str, nbytes: int, hold: float) -> float:
        """The seconds a message the buckets hold `hold` s must also wait for its connection's
        earlier messages (one stream per pair: they share the cap, back to back)."""
        now = Engine.clock
        start = max(now + hold, conn_free.get(name, 0.0))
        conn_free[name] = start + nbytes / spec.flow_cap_Bps
        return start - now

    def shaped(src: int, dst: int, nbytes: int) -> float:
        """Charges an inter-host message to both buckets; the seconds it must be held
        (0: both buckets cover it; else until they have refilled the debt at link rate)."""
        now = Engine.clock
        hold = 0.0
        for b in (buckets[src // spec.local], buckets[spec.hosts + dst // spec.local]):
            b[0] = min(spec.burst_B, b[0] + (now - b[1]) * spec.link_Bps)
            b[1] = now
            b[0] -= nbytes  # may go negative: the debt refills at link rate
            hold = max(hold, -b[0] / spec.link_Bps)
        return hold

    def held_put(mb, nbytes: int, hold: float):
        this_actor.sleep_for(hold)
        mb.put(None, nbytes)

    def rank(r: int):
        ops = sched.ranks[r]
        me = Actor.self()
        for q in range(p):
            if q != r:
                for comm in (0, 1, 2):
                    Mailbox.by_name(f"{q}>{r}:{comm}").set_receiver(me)
        reqs = {}
        for it in range(iterations):
            run_ops(r, ops, reqs)
            finish[r][it] = Engine.clock

    def run_ops(r, ops, reqs):
        for op in ops:
            k = op[0]
            if k == "S":
                if o_send > 0:
                    this_actor.sleep_for(o_send)
                name = f"{r}>{op[2]}:{op[4]}"
                mb = Mailbox.by_name(name)
                inter = r // spec.local != op[2] // spec.local
                hold = shaped(r, op[2], op[3]) if spec.burst_B > 0 and inter else 0
                if spec.flow_cap_Bps > 0 and inter:
                    hold = serialised(name, max(op[3], 1), hold)
                # done once the socket buffer took it (sndbuf_B): None, nothing to wait on
                buffered = spec.sndbuf_B > 0 and inter and not spec.flow_cap_Bps > 0 and op[3] <= spec.sndbuf_B
                if hold > 0:  # a helper actor holds it (the rank goes on), then sends
                    held = Actor.create(f"held{r}", hosts[r], held_put, mb, max(op[3], 1), hold)
                    reqs[op[1]] = None if buffered else held
                elif buffered:
                    mb.put_init(None, max(op[3], 1)).detach()
                    reqs[op[1]] = None
                else:
                    reqs[op[1]] = mb.put_async(None, max(op[3], 1))
            elif k == "V":
                reqs[op[1]] = Mailbox.by_name(f"{op[2]}>{r}:{op[4]}").get_async()  # (Comm, payload future): both kept alive
            elif k == "W":
                for i in op[1]:
                    _done(reqs.pop(i))
            else:
                this_actor.execute(op[2] * X_RATE.get(op[1], 1.0) / spec.reduce_Bps)
        for c in reqs.values():
            _done(c)
        reqs.clear()

    def _done(c):
        if c is None:  # a send done once posted (sndbuf_B)
            return
        if isinstance(c, tuple):
            c[0].wait()
        elif isinstance(c, Actor):
            c.join()
        else:
            c.wait()

    for r in range(p):
        Actor.create(f"rank{r}", hosts[r], rank, r)
    e.run()
    ends = [max(f[it] for f in finish) for it in range(iterations)]
    return (ends[-1] - (ends[w - 1] if w else 0.0)) / (iterations - w)


def main() -> None:
    if sys.argv[1:] == ["--worker"]:
        return _worker()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="ring")
    ap.add_argument("--compress", default=None)
    ap.add_argument("--p", type=int, required=True)
    ap.add_argument("--hosts", type=int, default=0, help="default: p (one rank per host)")
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--rtt-us", type=float, default=42.0)
    ap.add_argument("--link-gbit", type=float, default=0.9568)
    ap.add_argument("--flow-cap-gbit", type=float, default=0.0)
    ap.add_argument("--engine", choices=("cpp", "python"), default="cpp")
    a = ap.parse_args()
    hosts = a.hosts or a.p
    spec = platforms.Spec(hosts=hosts, local=a.p // hosts, link_Bps=a.link_gbit * 1e9 / 8, rtt_s=a.rtt_us * 1e-6,
                          flow_cap_Bps=a.flow_cap_gbit * 1e9 / 8)
    s = schedule.emit(a.algo, a.p, a.bytes, hosts, a.compress)
    print(f"{s.header['algo']} p={a.p} hosts={hosts} bytes={a.bytes}: {simulate(s, spec, engine=a.engine) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
