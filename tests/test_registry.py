"""The open algorithm registry, the cost model and harp-config --explain (core/select/select.h).

What is checked, against sources independent of the thing checked:
- every HARP_REGISTER_ALGORITHM statement in the tree (read from the source files) is
  listed by harp._harp.algorithms, by --explain and by docs/algorithms.md;
- a restriction that fails is reported by --explain and never picked;
- the algorithm a communicator actually ran (Comm.last_algorithm, the selector's memo
  after a real collective) equals --explain's pick, for tuning-table and cost-model picks;
- allreduce's shm algorithm asked for on tcp (3 ranks) falls back to its declared
  fallback (ring), computes the right sum, and says so;
- a calibration file changes the cost model's pick where the tuning table is silent.
"""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import harp
from harness import run_ranks

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
COLLS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "alltoallv", "gather",
         "scatter", "barrier", "send", "recv", "p2p_batch", "allreduce_coalesced"]
CAMEL = {"kAllreduce": "allreduce", "kBroadcast": "broadcast", "kReduce": "reduce", "kAllgather": "allgather",
         "kReduceScatter": "reduce_scatter", "kAlltoall": "alltoall", "kAlltoallv": "alltoallv",
         "kGather": "gather", "kScatter": "scatter", "kBarrier": "barrier", "kSend": "send", "kRecv": "recv",
         "kP2pBatch": "p2p_batch", "kAllreduceCoalesced": "allreduce_coalesced"}


def registered_in_source():
    """{coll: {names}} from the registration statements of every .cc file under core/ and transport/."""
    found = {}
    pat = re.compile(r'HARP_REGISTER_ALGORITHM\(\{\s*\.coll\s*=\s*CollType::(\w+),\s*\.name\s*=\s*"(\w+)"')
    for d in ("core", "transport"):
        for f in (ROOT / d).rglob("*.cc"):
            for camel, name in pat.findall(f.read_text()):
                found.setdefault(CAMEL[camel], set()).add(name)
    return found


def config(*args, env=None):
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", *args], capture_output=True, text=True, timeout=120,
                       env=dict(ENV, **(env or {})))
    return r.returncode, r.stdout, r.stderr


def explain_pick(out):
    m = re.search(r"^pick: (\w+) \((.*)\)$", out, re.M)
    assert m, out
    return m.group(1), m.group(2)


def test_the_registry_has_no_problems():
    assert harp._harp.registry_problems() == ""


def test_every_registration_is_listed_by_algorithms_and_explain():
    src = registered_in_source()
    assert set(src) == set(COLLS), src
    assert "shm" in src["allreduce"] and len(src["allreduce"]) >= 4
    for coll in COLLS:
        listed = harp._harp.algorithms(coll).split(", ")
        assert listed == sorted(src[coll]), (coll, listed, src[coll])  # sorted by name = tag index order
        rc, out, err = config("--explain", coll, "64K", "--ranks", "4", "--transport", "tcp")
        assert rc == 0, err
        rows = re.findall(r"^  (\w+) ", out, re.M)
        assert set(rows) - {"algorithm"} == src[coll], (coll, out)


def test_docs_list_every_registered_algorithm():
    doc = (ROOT / "docs" / "algorithms.md").read_text()
    rows = set(re.findall(r"^\| (\w+) \| `(\w+)`", doc, re.M))
    for coll, names in registered_in_source().items():
        for name in names:
            assert (coll, name) in rows, f"docs/algorithms.md has no row for {coll} `{name}`"


@pytest.mark.parametrize("ranks", [2, 3, 8])
@pytest.mark.parametrize("size", ["8", "64K", "4M"])
def test_failed_restriction_is_reported_and_never_picked(ranks, size):
    rc, out, err = config("--explain", "allreduce", size, "--ranks", str(ranks), "--transport", "tcp")
    assert rc == 0, err
    shm = re.search(r"^  shm .*$", out, re.M).group(0)
    assert "failed: needs transport shm" in shm, out
    assert explain_pick(out)[0] != "shm"


def test_table_row_naming_a_restricted_algorithm_gets_its_fallback(tmp_path):
    table = tmp_path / "t.tsv"
    table.write_text("allreduce * * * shm\n")
    rc, out, err = config("--explain", "allreduce", "4K", "--ranks", "3", "--transport", "tcp",
                          env={"HARP_TUNING_FILE": str(table)})
    assert rc == 0, err
    pick, why = explain_pick(out)
    assert pick == "ring" and "declared fallback ring" in why and f"{table}:1" in why, out
    rc, out, err = config("--explain", "allreduce", "4K", "--ranks", "3", "--transport", "shm",
                          env={"HARP_TUNING_FILE": str(table)})
    assert explain_pick(out)[0] == "shm", out


def test_explain_rejects_bad_input_clearly():
    rc, out, err = config("--explain", "allreduce", "4Q")
    assert rc != 0 and "'4Q' is not a size" in err
    rc, out, err = config("--explain", "allsum", "4K")
    assert rc != 0 and "unknown collective 'allsum'" in err
    rc, out, err = config("--explain", "allreduce", "4K", "--algo", "bogus")
    assert rc != 0 and "unknown allreduce algorithm 'bogus'" in err and "halving_doubling" in err


def test_explain_sizes_parse_like_harp_sizes():
    from harp.tools.config import explain
    assert explain("allreduce", "4M")[0].startswith("allreduce 4194304 bytes (1048576 x float32)")
    assert explain("allreduce", "64K")[0].startswith("allreduce 65536 bytes")
    assert explain("allreduce", "4096", dtype="float64")[0].startswith("allreduce 4096 bytes (512 x float64)")


# ---- runtime pick == --explain pick --------------------------------------------------

CASES = [  # (coll, bytes, ranks, transport)
    ("allreduce", 8, 3, "tcp"), ("allreduce", 1 << 20, 3, "tcp"), ("allreduce", 40000, 4, "tcp"),
    ("allreduce", 4096, 3, "shm"), ("broadcast", 1 << 20, 3, "tcp"), ("allgather", 4096, 3, "shm"),
    ("allgather", 4096, 3, "tcp"), ("reduce", 4000, 3, "tcp"),
]


def _run_and_report(rank, size, cases):
    comm = harp.init()
    out = []
    for coll, nbytes in cases:
        n = nbytes // 4
        x = np.full(n, rank + 1, np.float32)
        if coll == "allreduce":
            y = comm.allreduce(x)
            assert np.all(y == size * (size + 1) / 2)
        elif coll == "broadcast":
            comm.broadcast(x, root=1)
            assert np.all(x == 2)
        elif coll == "allgather":
            comm.allgather(x)
        elif coll == "reduce":
            comm.reduce(x, root=0)
        out.append(comm._c.last_algorithm(int(harp._types.Coll[coll])))
    comm.destroy()
    return out


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_runtime_pick_equals_explain_pick(transport):
    for ranks in sorted({r for _, _, r, t in CASES if t == transport}):
        cases = [(c, b) for c, b, r, t in CASES if t == transport and r == ranks]
        got = run_ranks(ranks, _run_and_report, cases, env={"HARP_TRANSPORT": transport}, timeout=300)
        for (coll, nbytes), *picks in zip(cases, *got):
            rc, out, err = config("--explain", coll, str(nbytes), "--ranks", str(ranks), "--transport", transport)
            assert rc == 0, err
            expected = explain_pick(out)[0]
            assert set(picks) == {expected}, (coll, nbytes, ranks, transport, picks, out)


def _shm_on_tcp(rank, size):
    comm = harp.init()
    x = np.arange(1001, dtype=np.float64) * (rank + 1)
    y = comm.allreduce(x, algo="shm")  # per-call choice: falls back (logged)
    ok1 = bool(np.array_equal(y, np.arange(1001) * size * (size + 1) / 2))
    z = comm.allreduce(x)  # HARP_ALGO=allreduce:shm, memoised like any table pick
    ok2 = bool(np.array_equal(z, y))
    last = comm._c.last_algorithm(int(harp._types.Coll.allreduce))
    chosen = comm.algorithm("allreduce", 1001, "float64")
    tr = comm.transport((rank + 1) % size)
    comm.destroy()
    return ok1, ok2, last, chosen, tr


def test_shm_algorithm_requested_on_tcp_falls_back_to_ring_on_3_ranks():
    got = run_ranks(3, _shm_on_tcp, env={"HARP_TRANSPORT": "tcp", "HARP_ALGO": "allreduce:shm"}, timeout=300)
    for ok1, ok2, last, chosen, tr in got:
        assert tr == "tcp"
        assert ok1 and ok2
        assert last == "ring" and chosen == "ring"



def test_fallback_of_a_user_choice_is_logged(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("import numpy as np, harp\ncomm = harp.init()\n"
                    "comm.allreduce(np.ones(100, np.float32), algo='shm')\ncomm.destroy()\n")
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "3", str(prog)], capture_output=True, text=True,
                       timeout=300, env=dict(ENV, HARP_TRANSPORT="tcp"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("names shm, which fails: needs transport shm") == 3, r.stderr
    assert "declared fallback ring" in r.stderr


# ---- calibration -----------------------------------------------------------------------

LATENCY = "tcp 1e-3 1e-12 1e-12\n"      # messages dominate: fewest rounds wins
BANDWIDTH = "tcp 1e-9 1e-6 1e-12\n"     # bytes dominate: least data wins


def _silent_table(tmp_path):
    t = tmp_path / "silent.tsv"
    t.write_text("broadcast * * * binomial\n")  # says nothing about allreduce
    return t


def test_calibration_file_changes_the_cost_model_pick(tmp_path):
    table = _silent_table(tmp_path)
    picks = {}
    for name, text in (("latency", LATENCY), ("bandwidth", BANDWIDTH)):
        cal = tmp_path / f"{name}.txt"
        cal.write_text(f"# test\n{text}")
        rc, out, err = config("--explain", "allreduce", "1M", "--ranks", "8", "--transport", "tcp",
                              env={"HARP_TUNING_FILE": str(table), "HARP_CALIBRATION_FILE": str(cal)})
        assert rc == 0, err
        assert f"({cal}:2)" in out, out
        picks[name], why = explain_pick(out)
        assert why.startswith("cost model"), out
    assert picks["latency"] == "recursive_doubling"
    assert picks["bandwidth"] in ("halving_doubling", "ring")


def _pick_with_calibration(rank, size):
    comm = harp.init()
    y = comm.allreduce(np.ones(1 << 16, np.float32))
    assert np.all(y == size)
    last = comm._c.last_algorithm(int(harp._types.Coll.allreduce))
    comm.destroy()
    return last


def test_runtime_follows_the_calibration_where_the_table_is_silent(tmp_path):
    table = _silent_table(tmp_path)
    seen = set()
    for name, text in (("latency", LATENCY), ("bandwidth", BANDWIDTH)):
        cal = tmp_path / f"{name}.txt"
        cal.write_text(text)
        env = {"HARP_TRANSPORT": "tcp", "HARP_TUNING_FILE": str(table), "HARP_CALIBRATION_FILE": str(cal)}
        got = run_ranks(4, _pick_with_calibration, env=env, timeout=300)
        rc, out, err = config("--explain", "allreduce", str(4 << 16), "--ranks", "4", "--transport", "tcp", env=env)
        assert set(got) == {explain_pick(out)[0]}, (name, got, out)
        seen.add(got[0])
    assert len(seen) == 2, seen


def _init_only(rank, size):
    try:
        harp.init().destroy()
        return "ok"
    except harp.HarpError as e:
        return str(e)


def test_bad_calibration_file_is_an_error_naming_the_line(tmp_path):
    cal = tmp_path / "bad.txt"
    cal.write_text("tcp 1e-6 2e-10 1e-10\nshm fast 1 1\n")
    rc, out, err = config("--explain", "allreduce", "4K", env={"HARP_CALIBRATION_FILE": str(cal)})
    assert rc != 0 and f"{cal}:2" in err and "alpha 'fast'" in err, err
    got = run_ranks(2, _init_only, env={"HARP_CALIBRATION_FILE": str(cal), "HARP_TRANSPORT": "tcp"}, timeout=120)
    for g in got:
        assert f"{cal}:2" in g, got
    missing = tmp_path / "none.txt"
    rc, out, err = config("--explain", "allreduce", "4K", env={"HARP_CALIBRATION_FILE": str(missing)})
    assert rc != 0 and "cannot be read" in err


def _disagree(rank, size):
    comm = harp.init()
    algos = harp._harp.algorithms("allreduce").split(", ")
    mine = ["ring", "recursive_doubling", "halving_doubling"][rank % 3]
    try:
        comm.allreduce(np.ones(1000, np.float32), algo=mine)
        return "completed", algos.index(mine)
    except harp.MismatchError as e:
        return "mismatch", str(e)
    finally:
        comm.destroy()


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_running_different_algorithms_get_a_mismatch_naming_the_index(ranks):
    got = run_ranks(ranks, _disagree, env={"HARP_TRANSPORT": "tcp"}, timeout=300)
    for kind, text in got:
        assert kind == "mismatch", got
        assert "algorithm #" in text, text
    # The indices in the text are the registry's (position by name), not a hand-kept table.
    idx = {n: i for i, n in enumerate(harp._harp.algorithms("allreduce").split(", "))}
    assert any(f"algorithm #{idx['ring']}" in t for _, t in got), got
