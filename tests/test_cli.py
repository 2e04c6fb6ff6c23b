"""harp-config and HARP_DEBUG=INFO diagnostics."""
import os
import subprocess
import sys

import harp

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def test_harp_config_lists_transports():
    r = subprocess.run([sys.executable, "-m", "harp.tools.config"], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"harp {harp.__version__}" in r.stdout
    assert "transport tcp" in r.stdout and "available" in r.stdout
    names = [t[0] for t in harp.transports()]
    assert "tcp" in names


PROG = """
import numpy as np, harp
comm = harp.init()
comm.allreduce(np.ones(10, np.float32))
comm.allreduce(np.ones(1 << 20, np.float32))
comm.destroy()
"""


def test_debug_info_names_transport_per_peer_and_algorithm(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text(PROG)
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "2", str(prog)], capture_output=True, text=True,
                       timeout=120, env=dict(ENV, HARP_DEBUG="INFO", HARP_TRANSPORT="tcp"))
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "rank 0 -> rank 1" in err and "transport tcp" in err
    assert "allreduce: algorithm recursive_doubling" in err
    assert "allreduce: algorithm ring" in err


def test_harp_config_transports_says_module_and_usability():
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", "--json"], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    import json

    table = {t["name"]: t for t in json.loads(r.stdout)["transports"]}
    assert [(n, p, w) for n, p, w in harp.transports()] == [(t["name"], t["priority"], t["why"])
                                                             for t in table.values()]
    assert table["tcp"]["provided"] == table["shm"]["provided"] == "built in"
    for name in ("verbs", "dpdk"):
        t = table[name]
        assert t["provided"] == "module" and t["module"].endswith(f"/libharp-{name}.so")
        assert t["loaded"] or t["why"], t  # not loaded always comes with a reason
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", "--transports"], capture_output=True, text=True, env=ENV,
                       timeout=60)
    lines = r.stdout.splitlines()
    assert len(lines) == len(table)
    for line, t in zip(lines, table.values()):
        assert line.split()[1] == t["name"]
        assert ("unavailable: " + t["why"]) in line if t["why"] else line.endswith("available")


def test_examples_run(tmp_path):
    """The README's first and third ways in: examples/allreduce.py under harp-run, and
    examples/nccl_allreduce.c built against HARP's nccl.h and libharp-nccl.so."""
    import shutil

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "3", os.path.join(root, "examples", "allreduce.py")],
                       capture_output=True, text=True, env=ENV, timeout=180)
    assert r.returncode == 0 and "3 ranks, sum = 3 everywhere" in r.stdout, r.stdout + r.stderr
    cc = shutil.which("cc") or shutil.which("gcc")
    libdir = os.path.dirname(harp.__file__)
    if not cc or not os.path.exists(os.path.join(libdir, "libharp-nccl.so")):
        return
    inc = subprocess.run([sys.executable, "-m", "harp.tools.config", "--nccl-include"], capture_output=True, text=True,
                         env=ENV, timeout=60).stdout.strip()
    exe = str(tmp_path / "nccl_allreduce")
    subprocess.run([cc, os.path.join(root, "examples", "nccl_allreduce.c"), f"-I{inc}", "-o", exe, f"-L{libdir}",
                    "-l:libharp-nccl.so", f"-Wl,-rpath,{libdir}"], check=True, timeout=120)
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "2", exe], capture_output=True, text=True, env=ENV,
                       timeout=180)
    assert r.returncode == 0 and "2 ranks, sum 3 everywhere" in r.stdout, r.stdout + r.stderr


FORK_PROG = """
import os, sys
from harp import _harp
_harp.log(1, "parent line")  # the parent's level is parsed (and cached) here
for level in ("NONE", "INFO"):
    pid = os.fork()
    if pid == 0:  # a launcher's forked rank: its own HARP_DEBUG, set after the fork
        os.environ["HARP_DEBUG"] = level
        _harp.log(1, "child warn " + level)
        _harp.log(2, "child info " + level)
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_a_forked_rank_reads_its_own_harp_debug(tmp_path):
    """HARP_DEBUG set in a forked child after the fork decides the child's logging: NONE silences
    WARN lines the parent's cached level would print, INFO shows INFO lines it would hide."""
    prog = tmp_path / "fork.py"
    prog.write_text(FORK_PROG)
    env = {k: v for k, v in ENV.items() if k != "HARP_DEBUG"}
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "parent line" in r.stderr
    assert "child warn NONE" not in r.stderr and "child info NONE" not in r.stderr, r.stderr
    assert "child warn INFO" in r.stderr and "child info INFO" in r.stderr, r.stderr
