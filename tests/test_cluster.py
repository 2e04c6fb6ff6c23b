"""The VPC arena (harp-cluster): emulated hosts, real launchers, failures, cleanup.

A 3-host cluster (network + UTS + mount namespaces per host, 1 Gbit/s shaped
uplinks) runs the collective matrix and a DDP step under each launcher; a cut
link or killed ranks on one host make every other rank raise a HarpError
naming the lost rank; and nothing (namespaces, holders, ranks, state files,
veths) is left after failed, interrupted or SIGKILLed jobs. Needs root.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import netns

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # the installed package (CI, users), else the checkout (PYTHONPATH=python after scripts/dev-build.sh)
    import harp
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import harp
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(harp.__file__)))  # where the ranks import harp from
from harp_dev.cluster import net, slurm, topology as topo  # noqa: E402

pytestmark = pytest.mark.netns

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

JOB = textwrap.dedent("""
    import os, socket, sys
    import numpy as np
    import harp
    comm = harp.init(timeout=60)
    r, n = comm.rank, comm.size
    ok = []
    for count in (1, 7, 1000, 300_001):
        x = np.arange(count, dtype=np.float32) + r
        comm.allreduce(x)
        ok.append(np.array_equal(x, n * np.arange(count, dtype=np.float32) + n * (n - 1) / 2))
        b = np.full(count, r, dtype=np.int64)
        comm.broadcast(b, root=n - 1)
        ok.append(bool(np.all(b == n - 1)))
        g = np.empty(count * n, dtype=np.float64)
        comm.allgather(np.full(count, r + 0.5), g)
        ok.append(np.array_equal(g, np.repeat(np.arange(n) + 0.5, count)))
    kinds = sorted({comm.transport(p) for p in range(n) if p != r})
    comm.destroy()
    ddp = "skipped"
    if sys.argv[1] == "ddp":
        import torch, torch.distributed as dist
        import harp.torch  # registers the backend from a source tree
        rank, size, _ = harp._env.launch_env()
        dist.init_process_group("harp", rank=rank, world_size=size)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
        ref = [p.detach().clone() for p in model.parameters()]
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        data = [torch.Generator().manual_seed(100 + q) for q in range(size)]
        batches = [(torch.randn(8, 32, generator=g), torch.randn(8, 3, generator=g)) for g in data]
        x, y = batches[rank]
        torch.nn.functional.mse_loss(ddp_model(x), y).backward()
        # reference: the mean of every rank's local gradient, computed here alone
        check = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
        with torch.no_grad():
            for p, q in zip(check.parameters(), ref):
                p.copy_(q)
        for xb, yb in batches:
            torch.nn.functional.mse_loss(check(xb), yb).backward()
        good = all(torch.allclose(p.grad, q.grad / size, rtol=1e-4, atol=1e-6)
                   for p, q in zip(model.parameters(), check.parameters()))
        ddp = "ok" if good else "wrong"
        dist.destroy_process_group()
    os.write(1, f"RESULT {r} {n} {all(ok)} {','.join(kinds)} {socket.gethostname()} {ddp}\\n".encode())
""")

FAIL_JOB = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import harp
    comm = harp.init(timeout=float(os.environ["HARP_TIMEOUT"]))
    x = np.ones(1000, np.float32)
    comm.allreduce(x)
    open(os.path.join(sys.argv[1], f"ready{comm.rank}"), "w").close()
    t0 = None
    try:
        while True:
            if t0 is None and os.path.exists(os.path.join(sys.argv[1], "cut")):
                t0 = time.monotonic()
            comm.allreduce(x)
            time.sleep(0.01)
    except harp.HarpError as e:
        dt = time.monotonic() - (t0 or time.monotonic())
        os.write(1, ("FAILED " + repr((comm.rank, type(e).__name__, str(e), dt))).encode() + b"\\n")
""")


def _skip_reason():
    why = netns.available()
    if why:
        return why
    for tool in ("tc", "nsenter", "unshare"):
        if not subprocess.run(["which", tool], capture_output=True).returncode == 0:
            return f"{tool} is not installed"
    return ""


def _name(tag):
    return f"t{tag}{os.getpid() % 100000}"[:8]


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([PYDIR, HERE] + sys.path))


def _cli(*args, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "harp_dev.cluster", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), **kw)


def _leftovers(name, hosts, marker=None):
    """Everything of cluster `name` still present: namespaces, state, processes (holders, and
    any whose command line holds `marker`, e.g. the job's script path), veth ends."""
    left = []
    ns_list = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [l.split()[0] for l in ns_list.splitlines() if l.startswith(f"hc-{name}-")]
    left += [f for f in os.listdir(topo.STATE_DIR) if f.startswith(name + ".")] if os.path.isdir(topo.STATE_DIR) else []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if (marker and marker.encode() in cmd) or f"hc-{name}-".encode() in cmd or f"--hostname {name}-node".replace(" ", "\0").encode() in cmd:
                left.append(f"process {d}: {cmd[:80]!r}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [l for l in links.splitlines() if f"hc-{name}" in l]
    return left


# Every test on the shared cluster runs twice: on the ideal arena (zero RTT) and at 1 ms RTT
# (harp-delayline, --delay 500us one way), so what works on ideal links keeps working on a VPC's.
@pytest.fixture(scope="module", params=["ideal", "rtt1ms"])
def cluster(request):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name("c" if request.param == "ideal" else "r")
    st = net.up(name, 3, rate="1gbit", delay=None if request.param == "ideal" else "500us")
    try:
        yield st
    finally:
        net.down(st)
        assert _leftovers(name, 3) == []


def _results(out, n):
    # Ray forwards worker output prefixed "(RayTrainWorker pid=.., ip=..) ", and may repeat a line
    lines = list(dict.fromkeys(l[l.index("RESULT "):] for l in out.splitlines() if "RESULT " in l))
    lines = [l.split() for l in lines]
    assert len(lines) == n, out
    return sorted(lines, key=lambda l: int(l[1]))


@pytest.mark.parametrize("launcher", ["harp", "torchrun", "mpirun", "slurm", "ray"])
def test_three_hosts_run_the_collectives_and_a_ddp_step(cluster, launcher, tmp_path):
    if launcher in ("torchrun", "ray") and not HAVE_TORCH:
        pytest.skip("torch is not installed")
    if launcher == "ray":
        pytest.importorskip("ray.train.torch")
    if launcher == "mpirun" and subprocess.run(["which", "mpirun"], capture_output=True).returncode:
        pytest.skip("Open MPI (mpirun) is not installed")
    if launcher == "slurm" and slurm.available():
        pytest.skip(slurm.available())
    prog = tmp_path / "job.py"
    prog.write_text(JOB)
    ppn = 2 if launcher in ("harp", "slurm", "ray") else 1
    r = _cli("run", "--name", cluster["name"], "--hosts", "3", "--ppn", str(ppn), "--launcher", launcher,
             "--timeout", "400" if launcher == "ray" else "180", "--", sys.executable, str(prog), "ddp" if HAVE_TORCH else "no",
             timeout=460 if launcher == "ray" else 240)
    assert r.returncode == 0, r.stdout + r.stderr
    res = _results(r.stdout, 3 * ppn)
    for line in res:
        rank, size, ok, kinds, host, ddp = line[1:]
        assert size == str(3 * ppn) and ok == "True", line
        assert ddp == ("ok" if HAVE_TORCH else "skipped"), line
        # ranks on other emulated hosts are reached over tcp, never shm; hostnames differ per host
        assert "tcp" in kinds.split(","), line
        if launcher != "ray":  # Ray Train numbers its workers in its own node order
            assert host == topo.hostname(cluster["name"], int(rank) // ppn), line
    # ppn ranks on every host (under Ray: its harp_slot resources placed them)
    hosts_seen = [line[5] for line in res]
    assert sorted(hosts_seen) == sorted(topo.hostname(cluster["name"], h) for h in range(3) for _ in range(ppn)), res
    if ppn > 1:
        assert all("shm" in l[4].split(",") for l in res), res


SLURM_JOB = textwrap.dedent("""
    import os, socket
    import numpy as np
    for k in ("HARP_ADDR", "MASTER_ADDR", "MASTER_PORT", "HARP_UNIQUE_ID"):
        os.environ.pop(k, None)
    import harp
    comm = harp.init(timeout=60)
    x = np.full(1001, comm.rank + 1, np.float64)
    comm.allreduce(x)
    n = comm.size
    os.write(1, f"RESULT {comm.rank} {n} {bool(np.all(x == n * (n + 1) / 2))} {socket.gethostname()} "
                f"{os.environ['SLURM_STEP_NODELIST']}\\n".encode())
""")


def test_slurm_step_without_an_address(cluster, tmp_path):
    """srun -N 3 --ntasks-per-node 2 with only HARP_SECRET: harp.init() finds rank 0 from the node list."""
    if slurm.available():
        pytest.skip(slurm.available())
    prog = tmp_path / "job.py"
    prog.write_text(SLURM_JOB)
    r = _cli("run", "--name", cluster["name"], "--hosts", "3", "--ppn", "2", "--launcher", "slurm",
             "--timeout", "150", "--", sys.executable, str(prog))
    assert r.returncode == 0, r.stdout + r.stderr
    res = _results(r.stdout, 6)
    for rank, size, ok, host, nodes in (l[1:] for l in res):
        assert size == "6" and ok == "True", res
        assert host == topo.hostname(cluster["name"], int(rank) // 2), res
        assert nodes == f"{cluster['name']}-node[0-2]", res


def test_torchrun_inside_srun(cluster, tmp_path):
    """The usual Slurm + torchrun recipe: one srun task per node starts torchrun (c10d rendezvous at the
    first node, found with scontrol), torchrun starts 2 ranks; harp.init() and init_process_group("harp")
    work unmodified (rank from RANK, rendezvous at MASTER_ADDR:MASTER_PORT+1 with HARP_SECRET)."""
    if slurm.available():
        pytest.skip(slurm.available())
    if not HAVE_TORCH:
        pytest.skip("torch is not installed")
    prog = tmp_path / "job.py"
    prog.write_text(JOB)
    script = tmp_path / "node.sh"
    script.write_text(
        "#!/bin/sh\n"
        "unset HARP_ADDR\n"
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        f'exec "{sys.executable}" -m torch.distributed.run --nnodes "$SLURM_NNODES" --nproc-per-node 2 '
        '--rdzv-backend c10d --rdzv-endpoint "$head:29400" --rdzv-id "$SLURM_JOB_ID" --max-restarts 0 '
        f'--no-python "{sys.executable}" "{prog}" ddp\n')
    script.chmod(0o755)
    r = _cli("run", "--name", cluster["name"], "--hosts", "3", "--ppn", "1", "--launcher", "slurm",
             "--timeout", "240", "--", str(script), timeout=360)
    assert r.returncode == 0, r.stdout + r.stderr
    res = _results(r.stdout, 6)
    for line in res:
        rank, size, ok, kinds, host, ddp = line[1:]
        assert size == "6" and ok == "True" and ddp == "ok", line
    # c10d orders the nodes by arrival, so which host holds which ranks varies; two ranks per host
    hosts = sorted(line[5] for line in res)
    assert hosts == sorted(topo.hostname(cluster["name"], h) for h in range(3) for _ in range(2)), hosts


def _failing_job(cluster, tmp_path, cut):
    prog = tmp_path / "fail.py"
    prog.write_text(FAIL_JOB)
    env = dict(_env(), HARP_TIMEOUT="5", HARP_TRANSPORT="tcp")
    p = subprocess.Popen([sys.executable, "-m", "harp_dev.cluster", "run", "--name", cluster["name"], "--hosts", "3",
                          "--grace", "60", "--timeout", "150", "--", sys.executable, str(prog), str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{r}").exists() for r in range(3)):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    (tmp_path / "cut").touch()
    cut()
    out, err = p.communicate(timeout=200)
    fails = [eval(l[len("FAILED "):]) for l in out.splitlines() if l.startswith("FAILED ")]
    return {f[0]: f[1:] for f in fails}, out + err


def test_cut_link_makes_the_other_ranks_fail_naming_the_lost_rank(cluster, tmp_path):
    ns = topo.host_ns(cluster["name"], 2)
    try:
        fails, log = _failing_job(cluster, tmp_path,
                                  lambda: subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True))
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
    # A silent link cannot be told from a slow peer by the data path alone; the keep-alive
    # (UDP heartbeats, HARP_KEEPALIVE_TIMEOUT 3 s < HARP_TIMEOUT 5 s) hears nothing
    # from rank 2 and every survivor's error names rank 2, not the neighbour it was blocked on.
    _assert_lost_rank_named(fails, log, classes=("PeerError", "HarpTimeoutError"))


def _assert_lost_rank_named(fails, log, classes=("PeerError",)):
    for r in (0, 1):
        assert r in fails, log
        cls, msg, dt = fails[r]
        assert cls in classes, fails
        assert "rank 2" in msg or "rank(s) 2" in msg, fails
        assert dt < 5 + 30, fails   # HARP_TIMEOUT=5, generous slack for a loaded machine


def test_killed_ranks_make_the_other_ranks_raise_peer_error(cluster, tmp_path):
    ns = topo.host_ns(cluster["name"], 2)

    def kill():
        victims = [p for p in net.ns_pids(ns) if p not in cluster["holders"]]
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    fails, log = _failing_job(cluster, tmp_path, kill)
    _assert_lost_rank_named(fails, log)


def test_failed_job_leaves_nothing_behind(tmp_path):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name("f")
    prog = tmp_path / "bad.py"
    prog.write_text("import os, sys, time\n"
                    "os.makedirs('/dev/shm/arena-test', exist_ok=True)\n"
                    "if os.environ['HARP_RANK'] == '1': sys.exit(3)\n"
                    "time.sleep(120)\n")
    r = _cli("run", "--name", name, "--hosts", "2", "--grace", "1", "--timeout", "100", "--", sys.executable, str(prog))
    assert r.returncode == 3 and "rank 1 exited with status 3" in r.stderr, r.stderr
    assert _leftovers(name, 2, str(prog)) == []
    # the private /dev/shm of the emulated hosts was never the machine's
    assert not os.path.exists("/dev/shm/arena-test")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_or_killed_run_leaves_nothing_behind(tmp_path, sig):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name({signal.SIGINT: "i", signal.SIGTERM: "t", signal.SIGKILL: "k"}[sig])
    flag = tmp_path / "started"
    p = subprocess.Popen([sys.executable, "-m", "harp_dev.cluster", "run", "--name", name, "--hosts", "2", "--timeout",
                          "100", "--", sys.executable, "-c",
                          f"import time; open({str(flag)!r}, 'a').close(); time.sleep(100)"],
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # as at a terminal: a shell's background job inherits SIGINT ignored, and
                         # Python then installs no KeyboardInterrupt handler (the test would wait 60 s)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    assert topo.load(name) is not None
    p.send_signal(sig)
    p.communicate(timeout=60)
    deadline = time.monotonic() + 30   # SIGKILL: the detached reaper notices within a second
    while _leftovers(name, 2, str(flag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leftovers(name, 2, str(flag)) == []


def test_up_status_down_from_other_processes():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name("s")
    r = _cli("up", "--name", name, "--hosts", "2", "--rate", "500mbit", "--nics", "2", "--congestion", "bbr")
    try:
        assert r.returncode == 0, r.stderr
        st = json.loads(_cli("status", "--json").stdout)
        mine = [c for c in st if c["name"] == name]
        assert mine and mine[0]["rate"] == "500mbit" and len(mine[0]["hosts_detail"]) == 2
        assert len(mine[0]["hosts_detail"][1]["addrs"]) == 2
        ns = topo.host_ns(name, 1)
        q = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "eth1"], capture_output=True, text=True).stdout
        assert "tbf" in q and "500Mbit" in q, q
        cc = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                            capture_output=True, text=True).stdout.strip()
        assert cc == "bbr"
        again = _cli("up", "--name", name, "--hosts", "2")
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        d = _cli("down", "--name", name)
    assert d.returncode == 0, d.stderr
    assert _leftovers(name, 2) == []


def test_flow_cap_and_jumbo_mtu_are_configured():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name("m")
    st = net.up(name, 3, rate="2gbit", mtu=9000, flow_cap="300mbit")
    try:
        ns = topo.host_ns(name, 0)
        link = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "eth0"], capture_output=True, text=True).stdout
        assert "mtu 9000" in link, link
        classes = subprocess.run(["tc", "-n", ns, "class", "show", "dev", "eth0"], capture_output=True,
                                 text=True).stdout
        # per-TCP-flow cap: net.FLOW_BUCKETS classes at 300 Mbit/s under the 2 Gbit/s uplink,
        # fed by u32 hash tables on the ports
        assert classes.count("ceil 300Mbit") == net.FLOW_BUCKETS and "rate 2Gbit" in classes, classes
        filters = subprocess.run(["tc", "-n", ns, "filter", "show", "dev", "eth0"], capture_output=True,
                                 text=True).stdout
        assert "link 100:" in filters and "hash mask 000f0000 at 20" in filters, filters
        down_q = subprocess.run(["tc", "-n", topo.switch_ns(name), "qdisc", "show", "dev", "h0n0"],
                                capture_output=True, text=True).stdout
        assert "tbf" in down_q and "2Gbit" in down_q, down_q
    finally:
        net.down(st)
    assert _leftovers(name, 3) == []
    with pytest.raises(ValueError, match="rate"):
        net.up(name, 2, rate="fast")
    assert _leftovers(name, 2) == []
