"""harp-bench end to end: launches its own ranks, prints nccl-tests columns, checks
results (#wrong) independently of the library measured and fails (exit 1) on a
wrong value under its own spawn and under harp-run, torchrun and mpirun (proved
with a deliberately broken reduction, tests/bench_broken_reduce.c, LD_PRELOADed),
writes stamped JSON, draws --plot, and runs the gloo/MPI/torch peers side by side."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
HERE = os.path.dirname(os.path.abspath(__file__))


def run_bench(*args, timeout=300, env=None, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "harp_dev.bench.cli", *args, "--no-progress"],
                          capture_output=True, text=True, timeout=timeout, env=env or ENV)


def bench(*args, timeout=300):
    r = run_bench(*args, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def broken_env(tmp_path_factory):
    """ENV with LD_PRELOAD of the test-only broken reduction (one wrong value per reduce() call)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build tests/bench_broken_reduce.c")
    so = tmp_path_factory.mktemp("broken") / "broken_reduce.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), os.path.join(HERE, "bench_broken_reduce.c")], check=True)
    return dict(ENV, LD_PRELOAD=str(so))


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
    r = subprocess.run([sys.executable, "-m", "harp_dev.bench.cli", "allreduce", "-d", "complex"], capture_output=True,
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
    r = subprocess.run([sys.executable, "-m", "harp_dev.bench.cli", "allreduce", "-np", "2", "-b", "8", "-e", "64", "-f", "2",
                        "-n", "2", "-w", "1"], capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr
    assert "[harp] 4/4 sizes" in r.stderr


def test_every_console_script_answers_version():
    """Each [project.scripts] entry of the runtime (pyproject.toml) and of harp-dev (python/pyproject.toml):
    the developer tools are harp-dev's only."""
    import tomllib

    import harp

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runtime = tomllib.load(open(os.path.join(root, "pyproject.toml"), "rb"))["project"]["scripts"]
    dev = tomllib.load(open(os.path.join(root, "python", "pyproject.toml"), "rb"))["project"]["scripts"]
    assert {"harp-run", "harp-config", "harp-status"} <= set(runtime) and set(dev) == {"harp-bench", "harp-cluster"}
    assert not set(runtime) & set(dev)
    for name, target in {**runtime, **dev}.items():
        mod, fn = target.split(":")
        code = f"import sys; sys.argv = [{name!r}, '--version']; from {mod} import {fn}; {fn}()"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
        assert r.returncode == 0 and f"harp {harp.__version__}" in r.stdout, (name, r.stdout, r.stderr)


SMALL = ("allreduce", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_broken_reduction_fails_naming_library_size_and_form(broken_env, transport):
    r = run_bench(*SMALL, "-np", "3", "--transport", transport, env=broken_env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED (summed over ranks" in r.stdout
    for size in (8, 64, 512, 4096):
        for form in ("out-of-place", "in-place"):
            assert f"harp-bench: FAILED harp: {size} B {form}:" in r.stderr, r.stderr
    # The same run without the hook passes: the failure is the broken reduction, nothing else.
    r = run_bench(*SMALL, "-np", "3", "--transport", transport)
    assert r.returncode == 0 and "Out of bounds values : 0 OK" in r.stdout, r.stdout + r.stderr


def test_broken_reduction_only_fails_harp_not_its_peers(broken_env, tmp_path):
    pytest.importorskip("torch")
    js = tmp_path / "r.json"
    r = run_bench(*SMALL, "-np", "2", "--compare", "gloo", "--json", str(js), env=broken_env, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED harp: 8 B" in r.stderr and "FAILED gloo" not in r.stderr, r.stderr
    res = json.loads(js.read_text())["results"]
    assert all(row["ip_wrong"] > 0 for row in res["harp"]["rows"])
    assert all(row["ip_wrong"] == 0 for row in res["gloo"]["rows"])


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launchers():
    """(name, command prefix, extra environment) of every launcher installed here."""
    secret = {"HARP_SECRET": "test-bench-" + os.urandom(8).hex()}
    out = [("harp-run", [sys.executable, "-m", "harp.launch", "-n", "2"], {})]
    try:
        import torch  # noqa: F401

        # harp.init() under torchrun: HARP's store on MASTER_PORT + 1, the job secret from the environment.
        out.append(("torchrun", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                 "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "--no-python"], secret))
    except ImportError:
        pass
    if shutil.which("mpirun"):
        out.append(("mpirun", ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"],
                    dict(secret, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                         HARP_ADDR=f"127.0.0.1:{_free_port()}")))
    return out


@pytest.mark.parametrize("launcher", ["harp-run", "torchrun", "mpirun"])
def test_under_every_launcher_a_wrong_value_fails_the_job(broken_env, launcher):
    found = {name: (prefix, extra) for name, prefix, extra in _launchers()}
    if launcher not in found:
        pytest.skip(f"{launcher} is not installed")
    prefix, extra = found[launcher]
    good = run_bench(*SMALL, prefix=prefix, env=dict(ENV, **extra), timeout=600)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "Out of bounds values : 0 OK" in good.stdout
    bad = run_bench(*SMALL, prefix=prefix, env=dict(broken_env, **extra), timeout=600)
    assert bad.returncode != 0, bad.stdout[-3000:] + bad.stderr[-3000:]
    for rank in (0, 1):
        assert f"harp-bench: rank {rank}: FAILED harp: 8 B in-place:" in bad.stderr, bad.stderr[-3000:]


class _WrongLib:
    """A stand-in library whose every call leaves one wrong value: the worker's check must see it
    whatever the library (the check is numpy on each rank, not the library's own reduction)."""

    name = "wrong"

    def __init__(self, rank, size, form):
        self.rank, self.size, self.form = rank, size, form

    def supports(self, coll, in_place):
        return True

    def describe(self, coll, count, dtype):
        return {}

    def run(self, coll, send, recv, in_place, op, root, ns, nr):
        from harp_dev.bench import check

        out = send if in_place else recv
        exp = check.expected(coll, self.size, self.rank, out.dtype, ns, nr, op, root)
        if exp is None:  # reduce on a non-root rank: no output to produce
            return out
        out[: exp.size] = exp
        if ("ip" if in_place else "oop") == self.form:
            out[exp.size - 1] += 1
        return out


@pytest.mark.parametrize("coll", ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"])
@pytest.mark.parametrize("form", ["oop", "ip"])
def test_worker_check_counts_wrong_values_of_any_library(coll, form, tmp_path):
    from harp_dev.bench import check, workers

    args = {"coll": coll, "minbytes": 96, "maxbytes": 96, "factor": 2, "step": 0, "iters": 1, "warmup": 0,
            "check": 1, "dtype": "float32", "op": "sum", "root": 0, "progress": "none"}
    out = str(tmp_path / "w.json")
    for rank in range(3):
        rows = workers.run_sweep(_WrongLib(rank, 3, form), args, rank, 3, lambda: None, lambda x: x)
        check.write_rank(out, "wrong", rank, 3, rows)
    merged = check.merge(out, "wrong", 3)
    row = merged["rows"][0]
    other = "ip" if form == "oop" else "oop"
    per_rank = 1 if coll != "reduce" else None  # reduce: only the root has an output to check
    assert row[f"{other}_wrong"] == 0
    assert row[f"{form}_wrong"] == (3 if per_rank else 1), row
    lines = check.failures({"wrong": merged})
    assert len(lines) == 1 and lines[0].startswith(f"wrong: 96 B {'in-place' if form == 'ip' else 'out-of-place'}:")


def _reference(coll, nranks, rank, dtype, ns, nr, op, root):
    """The whole-buffer expected output, written independently of check.py's chunked one."""
    from harp_dev.bench import sweep

    ins = []
    for r in range(nranks):
        v = np.empty(ns, dtype=dtype)
        sweep.fill(v, r)
        ins.append(v.astype(np.float64))
    st = np.stack(ins)
    red = {"sum": st.sum(0), "prod": st.prod(0), "min": st.min(0), "max": st.max(0),
           "avg": np.trunc(st.sum(0) / nranks) if np.issubdtype(dtype, np.integer) else st.sum(0) / nranks}[op]
    return {"allreduce": red, "reduce": red if rank == root else None,
            "reduce_scatter": red[rank * nr:(rank + 1) * nr], "broadcast": ins[root],
            "allgather": np.concatenate(ins),
            "alltoall": np.concatenate([ins[q][rank * (ns // nranks):(rank + 1) * (ns // nranks)]
                                        for q in range(nranks)])}[coll]


@pytest.mark.parametrize("coll", ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_chunked_check_matches_the_whole_buffer_reference_across_chunk_edges(coll, op, monkeypatch):
    from harp_dev.bench import check

    monkeypatch.setattr(check, "CHUNK", 7)  # many chunk edges, inside and across rank blocks
    n, nr = 3, 17
    ns = nr * n if coll in ("reduce_scatter", "alltoall") else 19
    for dtype in (np.float32, np.int32, np.float16):
        for rank in range(n):
            ref = _reference(coll, n, rank, np.dtype(dtype), ns, nr, op, 2)
            exp = check.expected(coll, n, rank, np.dtype(dtype), ns, nr, op, 2)
            if ref is None:
                assert exp is None
                assert check.count_wrong(np.zeros(1), coll, n, rank, dtype, ns, nr, op, 2) == (0, "")
                continue
            np.testing.assert_array_equal(exp, ref)
            out = ref.astype(dtype)
            assert check.count_wrong(out, coll, n, rank, dtype, ns, nr, op, 2) == (0, "")
            out[[1, ref.size - 1]] += 3  # two wrong values, one in the last chunk
            k, note = check.count_wrong(out, coll, n, rank, dtype, ns, nr, op, 2)
            assert k == 2 and note.startswith("first wrong: [1] ="), (k, note)
            assert check.count_wrong(out[:-1], coll, n, rank, dtype, ns, nr, op, 2)[1].startswith("output has")


def test_the_check_of_a_large_many_rank_call_holds_little_memory():
    """A 16-rank check of 4 MB of float32 must not hold every rank's input (16 x 8 MB as float64):
    the 8 x 2 hierarchy bench was OOM-killed by a check that did."""
    import tracemalloc

    from harp_dev.bench import check, sweep

    n, count = 16, 1 << 20
    out = np.zeros(count, np.float32)
    for r in range(n):
        out += sweep.fill_values(0, count, r, np.float32)
    tracemalloc.start()
    try:
        assert check.count_wrong(out, "allreduce", n, 3, np.float32, count, count, "sum", 0) == (0, "")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * check.CHUNK * 8, f"the check held {peak / 1e6:.1f} MB"


def test_a_rank_that_reports_nothing_is_a_failure(tmp_path):
    from harp_dev.bench import check

    out = str(tmp_path / "w.json")
    check.write_rank(out, "harp", 0, 2, [{"size": 8, "count": 2, "oop_us": 1.0, "ip_us": 1.0, "oop_wrong": 0,
                                          "ip_wrong": 0}])
    with pytest.raises(RuntimeError, match="rank 1 reported no results"):
        check.merge(out, "harp", 2)


def test_json_is_stamped_and_plot_draws_one_line_per_library(tmp_path):
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    bench("allreduce", "-np", "2", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "--transport", "tcp",
          "--json", str(js), "--plot", str(png))
    st = json.loads(js.read_text())["stamp"]
    assert st["cores"] == os.cpu_count() and len(st["loadavg"]) == 3 and st["cpu"]
    assert st["command"].startswith("harp-bench allreduce -np 2") and st["transport"] == "tcp"
    assert st["algorithms"] and set(st["algorithms"]) <= set(__import__("harp")._harp.algorithms("allreduce")
                                                             .split(", "))
    assert st["time"].endswith("+00:00")
    if shutil.which("git") and os.path.isdir(os.path.join(HERE, "..", ".git")) or \
            os.path.isfile(os.path.join(HERE, "..", ".git")):
        assert len(st["commit"]) == 40
    from harp_dev.bench import plot

    res = json.loads(js.read_text())["results"]
    pts = plot.series("allreduce", res["harp"])
    assert [p[0] for p in pts] == [8, 64, 512, 4096, 32768] and all(p[1] > 0 for p in pts)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


def test_veth_mode_checks_dpdk_tcp_and_gloo_on_every_rank(tmp_path):
    """harp-bench --veth (was bench/dpdk_veth.py): two namespaces, HARP over DPDK and over TCP on the
    same veth, and gloo; both forms checked for HARP, gloo's form checked, all in the JSON."""
    sys.path.insert(0, HERE)
    import dpdk_env

    if os.geteuid() != 0 or dpdk_env.dpdk_unavailable():
        pytest.skip("needs root and the dpdk transport: " + (dpdk_env.dpdk_unavailable() or "not root"))
    pytest.importorskip("torch")
    js = tmp_path / "v.json"
    out = bench("allreduce", "--veth", "--compare", "gloo", "-b", "8", "-e", "4K", "-f", "512", "-n", "2", "-w", "1",
                "--rounds", "1", "--json", str(js), timeout=900)
    assert "harp-dpdk_us" in out and "xharp-tcp" in out and "xgloo" in out
    res = json.loads(js.read_text())["results"]
    for lib, tp in (("harp-dpdk", "dpdk"), ("harp-tcp", "tcp")):
        assert [r["size"] for r in res[lib]["rows"]] == [8, 4096]
        for r in res[lib]["rows"]:
            assert r["transport"] == tp and r["oop_wrong"] == 0 and r["ip_wrong"] == 0, r
    assert all(r["ip_wrong"] == 0 for r in res["gloo"]["rows"])


@pytest.mark.parametrize("mode", ["interleave", "torch-overhead"])
def test_interleaved_modes_check_every_library_in_the_same_ranks(mode, tmp_path):
    """--compare gloo,mpi --interleave (was bench/shm_compare.py) and --torch-overhead (was
    bench/torch_overhead.py): every library in the same rank processes, each result checked."""
    pytest.importorskip("torch")
    if mode == "interleave":
        pytest.importorskip("mpi4py")
        if not shutil.which("mpirun"):
            pytest.skip("Open MPI (mpirun) is not installed")
        flags, libs = ["--compare", "gloo,mpi", "--interleave", "3"], ["harp", "gloo", "mpi"]
    else:
        flags, libs = ["--torch-overhead", "--rounds", "2"], ["harp", "gloo", "torch+harp"]
    js = tmp_path / "i.json"
    out = bench("allreduce", "-np", "3", "-b", "8", "-e", "64K", "-f", "64", "-n", "3", "-w", "1", *flags, "--json",
                str(js), timeout=900)
    assert "# Comparison, allreduce, 3 ranks" in out
    res = json.loads(js.read_text())["results"]
    assert sorted(res) == sorted(libs)
    for lib in libs:
        rows = res[lib]["rows"]
        assert [r["size"] for r in rows] == [8, 512, 32768]
        for r in rows:
            assert r["ip_us"] > 0 and r["ip_wrong"] == 0, (lib, r)
            if lib in ("harp", "mpi"):
                assert r["oop_wrong"] == 0, (lib, r)  # out-of-place checked too where the library has it
            assert r["turns"] == (3 if mode == "interleave" else 3 * 2)
