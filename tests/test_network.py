"""TCP across real network paths: IPv6 loopback, interface selection
(HARP_SOCKET_IFNAME with NCCL's syntax), several hosts in network namespaces,
and the launchers' environment conventions."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import harp
import netns
from harness import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))


def _sum(rank, size):
    comm = harp.init()
    x = np.arange(1000, dtype=np.float64) + rank
    comm.allreduce(x)
    ok = np.allclose(x, size * np.arange(1000) + size * (size - 1) / 2)
    t = comm.transport((rank + 1) % size)
    comm.destroy()
    return ok, t


def test_ipv6_loopback():
    uid = harp.get_unique_id("[::1]:0")
    assert uid.address.startswith("[::1]:")
    res = run_ranks(3, _sum, env={"HARP_TRANSPORT": "tcp"}, uid=uid)
    assert all(ok and t == "tcp" for ok, t in res)


@pytest.mark.parametrize("spec", ["lo", "=lo", "l", "^eth,ifb,ens,enp,eno,wl,docker,br,veth,virbr"])
def test_ifname_selects_interface(spec):
    res = run_ranks(2, _sum, env={"HARP_TRANSPORT": "tcp", "HARP_SOCKET_IFNAME": spec})
    assert all(ok for ok, _ in res)


@pytest.mark.parametrize("spec", ["=l", "nosuchif0", "=lo0,nosuch"])
def test_ifname_matching_nothing_is_a_clear_error(spec):
    def fn(rank, size):
        try:
            harp.init()
        except harp.HarpError as e:
            return str(e)
        return "no error"

    # Exact "=l" is not "lo"; the others name no interface.
    res = run_ranks(2, fn, env={"HARP_TRANSPORT": "tcp", "HARP_SOCKET_IFNAME": spec}, timeout=60, allow_errors=True)
    msgs = [v for s, v in res if s == "ok"]
    assert any("HARP_SOCKET_IFNAME" in m and spec in m for m in msgs), res


PROG = textwrap.dedent("""
    import numpy as np, harp, os
    comm = harp.init(timeout=60)
    x = np.full(300_001, comm.rank + 1, dtype=np.float32)
    comm.allreduce(x)
    n = comm.size
    ok = bool(np.all(x == n * (n + 1) / 2))
    kinds = sorted({comm.transport(p) for p in range(n) if p != comm.rank})
    # one write(2) per line: ranks share the pipe, and short writes do not interleave
    os.write(1, f"RESULT {comm.rank} {ok} {','.join(kinds)}\\n".encode())
    comm.destroy()
""")


@pytest.mark.netns
def test_ranks_on_separate_hosts(tmp_path):
    why = netns.available()
    if why:
        pytest.skip(why)
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    with netns.netns_hosts(3) as hosts:
        # 5 ranks over 3 hosts; rank 0's host serves the bootstrap store at HARP_ADDR
        placement = [0, 0, 1, 2, 2]
        base = {k: v for k, v in os.environ.items() if not k.startswith("HARP_")}
        env = dict(base, HARP_ADDR=f"{hosts[0].addr}:29411", HARP_SECRET=os.urandom(16).hex(),
                   HARP_WORLD_SIZE="5", PYTHONPATH=os.pathsep.join(sys.path))
        procs = []
        for rank, h in enumerate(placement):
            e = dict(env, HARP_RANK=str(rank))
            procs.append(hosts[h].popen([sys.executable, str(prog)], env=e, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=120)[0] for p in procs]
    lines = [l for o in outs for l in o.splitlines() if l.startswith("RESULT")]
    assert len(lines) == 5, outs
    assert all(l.split()[2] == "True" for l in lines), outs


def test_harp_run_launcher(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(PROG)
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "3", str(prog)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    assert sorted(l.split()[1] for l in r.stdout.splitlines() if l.startswith("RESULT")) == ["0", "1", "2"]
    assert all(" True " in l for l in r.stdout.splitlines() if l.startswith("RESULT"))


def test_harp_run_reports_a_failing_rank(tmp_path):
    prog = tmp_path / "bad.py"
    prog.write_text("import os, sys\nsys.exit(3 if os.environ['HARP_RANK'] == '1' else 0)\n")
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "2", str(prog)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 3 and "rank 1 exited with status 3" in r.stderr


@pytest.mark.parametrize("style", ["torchrun", "openmpi", "slurm"])
def test_init_understands_launcher_environments(tmp_path, style):
    prog = tmp_path / "p.py"
    prog.write_text(PROG)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, secret = [], os.urandom(16).hex()
    for rank in range(3):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HARP_")}
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        env["HARP_SECRET"] = secret  # an address launch needs a shared secret
        if style == "torchrun":
            env.update(RANK=str(rank), WORLD_SIZE="3", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port - 1))
        elif style == "openmpi":
            env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="3", HARP_ADDR=f"127.0.0.1:{port}")
        else:
            env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="3", SLURM_JOB_ID="42", HARP_ADDR=f"127.0.0.1:{port}")
        procs.append(subprocess.Popen([sys.executable, str(prog)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    lines = [l for o in outs for l in o.splitlines() if l.startswith("RESULT")]
    assert len(lines) == 3 and all(" True " in l for l in lines), outs
