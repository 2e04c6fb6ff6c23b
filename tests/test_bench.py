"""harp-bench end to end: launches its own ranks, prints nccl-tests columns, checks
results (#wrong), writes JSON, and runs the gloo/MPI peers side by side."""
import json
import os
import subprocess
import sys

import pytest

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def bench(*args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "harp.bench.cli", *args, "--no-progress"], capture_output=True,
                       text=True, timeout=timeout, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def rows(out):
    return [l.split() for l in out.splitlines() if l.strip() and not l.startswith("#")]


@pytest.mark.parametrize("coll", ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"])
def test_every_collective_sweeps_and_checks(coll, tmp_path):
    js = tmp_path / "r.json"
    out = bench(coll, "-np", "3", "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "--json", str(js))
    assert "time   algbw   busbw #wrong" in out
    rs = rows(out)
    assert [int(r[0]) for r in rs] == [8, 64, 512, 4096, 32768, 262144]
    for r in rs:
        assert r[8] == "0" and r[12] == "0", r  # #wrong, out-of-place and in-place
    assert "Out of bounds values : 0 OK" in out
    data = json.loads(js.read_text())
    assert data["results"]["harp"]["nranks"] == 3


def test_datatype_op_root_and_algo_flags():
    out = bench("reduce", "-np", "2", "-b", "1K", "-e", "4K", "-f", "2", "-n", "2", "-w", "1", "-d", "double", "-o",
                "max", "-r", "1")
    r = rows(out)[0]
    assert r[2] == "double" and r[3] == "max" and r[4] == "1"
    out = bench("allreduce", "-np", "3", "-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "--algo", "ring", "-d", "half")
    assert rows(out)[0][8] == "0"


def test_compare_prints_peer_ratios():
    out = bench("allreduce", "-np", "2", "-b", "8", "-e", "64K", "-f", "64", "-n", "3", "-w", "1", "--compare",
                "gloo,mpi", timeout=600)
    assert "# Comparison, allreduce, 2 ranks" in out
    head = [l for l in out.splitlines() if "harp_us" in l][0]
    assert "gloo_us" in head and "xgloo" in head and "mpi_us" in head
    assert "# gloo allreduce" in out and "# mpi allreduce" in out


def test_bad_flags_are_reported():
    r = subprocess.run([sys.executable, "-m", "harp.bench.cli", "allreduce", "-d", "complex"], capture_output=True,
                       text=True, env=ENV)
    assert r.returncode != 0 and "unknown datatype 'complex'" in r.stderr


def test_table_and_json_record_transport_and_algorithm_used(tmp_path):
    js = tmp_path / "r.json"
    env_transport = {"tcp": "tcp", "shm": "shm"}
    for tp in env_transport:
        out = bench("allreduce", "-np", "3", "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "--transport", tp,
                    "--json", str(js))
        assert "transport algorithm" in out
        data = json.loads(js.read_text())["results"]["harp"]
        assert data["transport"] == tp
        known = set(__import__("harp")._harp.algorithms("allreduce").split(", "))
        for r, row in zip(rows(out), data["rows"]):
            assert row["transport"] == tp and r[13] == tp, (row, r)
            assert row["algo"] in known and r[14] == row["algo"], (row, known)
    out = bench("allreduce", "-np", "3", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--algo", "ring", "--transport",
                "tcp")
    assert rows(out)[0][13:] == ["tcp", "ring"]


def test_progress_is_plain_lines_when_output_is_not_a_terminal():
    r = subprocess.run([sys.executable, "-m", "harp.bench.cli", "allreduce", "-np", "2", "-b", "8", "-e", "64", "-f", "2",
                        "-n", "2", "-w", "1"], capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr
    assert "[harp] 4/4 sizes" in r.stderr


def test_every_console_script_answers_version():
    """Each [project.scripts] entry of pyproject.toml (harp-cluster too, once it is there)."""
    import tomllib

    import harp

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    scripts = tomllib.load(open(os.path.join(root, "pyproject.toml"), "rb"))["project"]["scripts"]
    assert {"harp-bench", "harp-run", "harp-config"} <= set(scripts)
    for name, target in scripts.items():
        mod, fn = target.split(":")
        code = f"import sys; sys.argv = [{name!r}, '--version']; from {mod} import {fn}; {fn}()"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
        assert r.returncode == 0 and f"harp {harp.__version__}" in r.stdout, (name, r.stdout, r.stderr)
