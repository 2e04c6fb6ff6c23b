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
