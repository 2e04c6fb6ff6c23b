"""torch.distributed over the harp backend (python/harp/torch): every op c10d calls, all dtypes,
p2p (large, both directions, any source), DDP (+ fp16/bf16/PowerSGD hooks) against gloo, FSDP,
subgroups, rendezvous methods, mixed specs, the entry point, torchrun, and the failure paths.
Multi-process over real loopback sockets; the rank bodies are in torch_check.py."""
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import torch_check as tc  # noqa: E402
from harness import run_ranks  # noqa: E402

import harp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(harp.__file__)))  # the harp these tests import


def _url(tmp_path, name="store"):
    return f"file://{tmp_path}/{name}"


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_op_every_dtype(nranks, tmp_path):
    res = run_ranks(nranks, tc.every_op, _url(tmp_path), timeout=300)
    bad = [b for r in res for b in r]
    assert not bad, "\n".join(bad[:30])


@pytest.mark.parametrize("nranks", [2, 3])
def test_p2p_large_both_directions_and_any_source(nranks, tmp_path):
    res = run_ranks(nranks, tc.p2p, _url(tmp_path), 1 << 22, timeout=300)  # 16 MiB each way
    bad = [b for r in res for b in r]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("nranks", [2, 3])
def test_ddp_matches_gloo_with_hooks(nranks, tmp_path):
    res = run_ranks(nranks, tc.ddp_vs_gloo, _url(tmp_path), timeout=400)
    # Summation order differs between HARP's and gloo's algorithms: float32 rounding for plain/PowerSGD,
    # the hooks' fp16/bf16 rounding for the compression hooks.
    tol = {"plain": 1e-5, "fp16": 5e-4, "bf16": 5e-3, "powersgd": 1e-4}
    for r in res:
        for case, t in tol.items():
            diff, moved = r[case]
            assert moved > 1e-3, f"{case}: training did not move the parameters"
            assert diff <= t, f"{case}: harp and gloo parameters differ by {diff}"
    assert all(r["plain"] == res[0]["plain"] for r in res)


@pytest.mark.parametrize("nranks", [2, 3])
def test_fsdp_fully_shard_cpu(nranks, tmp_path):
    diffs = run_ranks(nranks, tc.fsdp_train, _url(tmp_path), timeout=400)
    assert all(d < 1e-5 for d in diffs), diffs


def test_hsdp_on_a_two_by_two_mesh_matches_the_reference(tmp_path):
    """HSDP (fully_shard over a 2 x 2 DeviceMesh, replicate x shard) trains on harp subgroups."""
    res = run_ranks(4, tc.hsdp_train, _url(tmp_path), timeout=400)
    for diff, moved, backend in res:
        assert backend == "harp", backend
        assert moved > 1e-3, "training did not move the parameters"
        assert diff < 1e-5, res


def test_subgroups_destroy_and_reinit(tmp_path):
    res = run_ranks(3, tc.groups, _url(tmp_path), timeout=200)
    bad = [b for r in res for b in r]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_rendezvous_methods(method, tmp_path):
    res = run_ranks(2, tc.rendezvous, method, _port(), str(tmp_path / "fs"), timeout=200)
    assert res == [(True, "harp"), (True, "harp")]


def test_mixed_spec_routes_by_device(tmp_path):
    res = run_ranks(2, tc.mixed, _url(tmp_path), timeout=200)
    assert res == [("ProcessGroupHarp", ["cuda"], True, [], True)] * 2


@pytest.mark.skipif(dist.is_nccl_available(), reason="checks the error on a torch without NCCL")
def test_mixed_spec_without_nccl_is_a_clear_error(tmp_path):
    res = run_ranks(1, _init_spec, _url(tmp_path), "cpu:harp,cuda:nccl", timeout=100, allow_errors=True)
    status, val = res[0]
    assert status == "error" and "no NCCL" in val[1], val


def _init_spec(rank, size, url, spec):
    tc.init(rank, size, url, backend=spec)


@pytest.mark.parametrize("nranks", [2, 3])
def test_sparse_allreduce_sums_every_ranks_entries_identically_everywhere(nranks, tmp_path):
    res = run_ranks(nranks, tc.sparse_allreduce, _url(tmp_path), timeout=200)
    for r, (bad, _) in enumerate(res):
        assert bad == [], (r, bad)
    for r in range(1, nranks):  # bitwise the same tensor on every rank, for every call
        assert res[r][1] == res[0][1]


def test_sparse_allreduce_of_different_shapes_or_dtypes_fails_on_every_rank(tmp_path):
    res = run_ranks(3, tc.sparse_mismatch, _url(tmp_path), timeout=200)
    for msgs, dense_ok in res:
        assert msgs == ["harp allreduce: sparse tensors differ across ranks: shape [13, 5, 3] on rank 0, "
                        "[13, 6, 3] on rank 2",
                        "harp allreduce: sparse tensors differ across ranks: dtype is torch.float32 on rank 0, "
                        "torch.float64 on rank 2"], msgs
        assert dense_ok


def test_local_errors_are_clear_and_group_survives(tmp_path):
    res = run_ranks(2, tc.errors_local, _url(tmp_path), timeout=200)
    for r in res:
        assert r[0].startswith("ValueError: harp all_gather_into_tensor: output has 3 elements, expected 4"), r
        assert "device 'meta' are not supported" in r[1], r
        assert "sparse" in r[2].lower(), r
        assert r[3] is True


NO_ENV = {"OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None, "HARP_TORCH_THREADS": None}


@pytest.mark.parametrize("case, threads, env, want", [
    ("auto lowers", 2, {}, 1),                        # 2 ranks x 2 threads on 1 core each: 1 thread
    ("keep", 2, {"HARP_TORCH_THREADS": "keep"}, 2),
    ("OMP_NUM_THREADS is the user's", 2, {"OMP_NUM_THREADS": "2"}, 2),
    ("a count", 1, {"HARP_TORCH_THREADS": "3"}, 3),
])
def test_torch_threads_fit_the_host_on_an_oversubscribed_host(case, threads, env, want, tmp_path):
    res = run_ranks(2, tc.threads_fit, _url(tmp_path), threads, True, {**NO_ENV, **env}, timeout=120)
    assert res == [want, want], (case, res)


def test_torch_threads_setting_that_is_not_a_count_fails_naming_it(tmp_path):
    res = run_ranks(2, tc.threads_fit, _url(tmp_path), 2, False, {**NO_ENV, "HARP_TORCH_THREADS": "x"},
                    timeout=120)
    for r in res:
        assert isinstance(r, str) and "HARP_TORCH_THREADS='x'" in r and "auto, keep or a thread count" in r, r


@pytest.mark.parametrize("setting, threads, local, cores, env, want", [
    ("auto", 2, 2, 2, {}, 1), ("auto", 8, 4, 8, {}, 2), ("auto", 4, 2, 8, {}, 4), ("auto", 2, 3, 2, {}, 1),
    ("", 16, 1, 16, {}, 16), ("auto", 2, 2, 2, {"MKL_NUM_THREADS": "2"}, 2), ("KEEP", 4, 4, 1, {}, 4),
    (" 5 ", 1, 1, 1, {}, 5),
])
def test_torch_threads_choice(setting, threads, local, cores, env, want):
    from harp.torch._threads import choose
    assert choose(setting, threads, local, cores, env)[0] == want


@pytest.mark.parametrize("bad", ["0", "-1", "x", "2.5", "1e3"])
def test_torch_threads_choice_refuses_what_is_not_a_count(bad):
    from harp.errors import InvalidArgumentError
    from harp.torch._threads import choose
    with pytest.raises(InvalidArgumentError, match="HARP_TORCH_THREADS"):
        choose(bad, 2, 2, 2, {})


def test_mismatched_collective_raises_distbackenderror(tmp_path):
    res = run_ranks(3, tc.errors_mismatch, _url(tmp_path), timeout=100)
    for rank, (msg, secs) in enumerate(res):
        assert msg.startswith(f"harp allreduce failed on rank {rank} of group"), msg
        assert re.search(r"rank [01]\b.*(mismatch|closed|aborted)", msg), msg
        assert secs < 10
    # the rank that detected it explains the mismatch (the others may see its abort or its exit first)
    assert any("collective mismatch between rank" in m for m, _ in res), res


def test_dead_rank_raises_distbackenderror_within_timeout(tmp_path):
    res = run_ranks(3, tc.errors_dead, _url(tmp_path), timeout=100, allow_errors=True)
    assert res[2] == ("died", 3)
    for rank in (0, 1):
        status, (msg, secs) = res[rank]
        assert status == "ok" and msg.startswith(f"harp allreduce failed on rank {rank}"), msg
        assert "rank 2" in msg, msg
        assert secs < 8 + 2


def test_monitored_barrier_names_the_missing_rank(tmp_path):
    res = run_ranks(3, tc.errors_monitored, _url(tmp_path), timeout=100)
    assert "rank(s) [1] did not reach monitored_barrier" in res[0], res[0]
    assert "rank(s) [1] did not reach" in res[2], res[2]


def test_timeouts_in_torch_words_and_zero_is_zero(tmp_path):
    """A group barrier's timeout carries " Timed out " as torch's test matches it, after the group's
    1 s; monitored_barrier(timedelta(0)) fails at once in gloo's words, without waiting for the
    group's default timeout."""
    res = run_ranks(2, tc.timeouts_torch_words, _url(tmp_path), timeout=150)
    out, matched = res[0]
    msg, secs = out["barrier"]
    assert matched, msg
    assert secs >= 1.0 - 0.1 and secs < 10, secs  # torch: assertGreaterAlmostEqual(now, start + 1 s, delta=0.1)
    assert "harp barrier failed on rank 0" in msg and "waiting for rank(s) 1" in msg, msg  # HARP's naming kept
    msg, secs = out["barrier0"]
    assert re.search(tc.TORCH_TIMEOUT_RE, msg) and secs < 5, (msg, secs)
    msg, secs, kind = out["mbFalse"]
    assert re.search(tc.TORCH_MB_RANK0_RE, msg), msg
    assert kind == "DistBackendError" and secs < 2, (kind, secs)
    assert "after 0 ms" in msg and "rank(s) [1]" in msg, msg
    msg, secs, kind = out["mbTrue"]
    assert re.search("Rank 1 failed to pass monitoredBarrier in 0 ms", msg) and secs < 2, (msg, secs)


def test_torch_own_timeout_tests_with_harp_in_gloos_place(tmp_path):
    """torch's test_barrier_timeout_full_group and test_monitored_barrier_gloo_rank_0_timeout,
    their own code, with harp as the backend."""
    pytest.importorskip("expecttest")  # torch's test modules import it (a test-only package)
    names = ["test_barrier_timeout_full_group", "test_monitored_barrier_gloo_rank_0_timeout"]
    res = run_ranks(2, tc.torch_suite, _url(tmp_path), str(tmp_path), names, timeout=200)
    for rank, out in enumerate(res):
        for name in names:
            status, secs = out[name]
            assert status == "ok", f"rank {rank} {name}: {status}"
            assert secs < 30, f"rank {rank} {name} took {secs:.1f} s"


def test_torch_subgroup_tests_at_four_ranks_with_harp_in_gloos_place(tmp_path):
    """torch's test_new_subgroups_with_group_param: new_subgroups(group_size=1, group=sub) under
    subgroups [0,2] and [1,3] gives groups that torch names alike ([0] and [1] both '4'); harp keeps
    groups with different members apart (their global ranks are in the store prefix)."""
    pytest.importorskip("expecttest")
    names = ["test_new_subgroups_with_group_param"]
    res = run_ranks(4, tc.torch_suite, _url(tmp_path), str(tmp_path), names, timeout=200)
    for rank, out in enumerate(res):
        for name in names:
            assert out[name][0] == "ok", f"rank {rank} {name}: {out[name][0]}"


def test_torch_suite_skips_as_torchs_harness_does(tmp_path):
    """torch_suite skips what torch's own runner skips: a method marked by skip_but_pass_in_sandcastle_if
    (NCCL-only; run anyway it fails with IndexError on a CPU machine) and a decorator's skip exit
    code (skip_if_lt_x_gpu), so a harp result is never a test torch would not have run."""
    pytest.importorskip("expecttest")
    names = ["test_batch_isend_irecv_op_err", "test_ddp_zero_output_features"]
    res = run_ranks(2, tc.torch_suite, _url(tmp_path), str(tmp_path), names, timeout=200)
    for rank, out in enumerate(res):
        assert out[names[0]][0] == "skipped: NCCL Batch Send Recv Only", f"rank {rank}: {out[names[0]][0]}"
        assert out[names[1]][0].startswith("skipped: Need at least"), f"rank {rank}: {out[names[1]][0]}"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_entry_point_registers_without_import(tmp_path):
    """torch loads `torch.backends` entry points at import: init_process_group("harp") with no harp import."""
    dist_info = tmp_path / "harp_entrypoint_test-0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: harp-entrypoint-test\nVersion: 0.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[torch.backends]\nharp = harp_torch_plugin:load\n")
    prog = textwrap.dedent(f"""
        import datetime, sys, torch, torch.distributed as dist
        assert "harp" in dist.Backend.backend_list, dist.Backend.backend_list
        dist.init_process_group("harp", init_method="file://{tmp_path}/s", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        t = torch.ones(3); dist.all_reduce(t)
        print(type(dist.group.WORLD).__name__, dist.get_backend(), t.tolist())
        dist.destroy_process_group()
    """)
    env = _env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ProcessGroupHarp harp [1.0, 1.0, 1.0]" in out.stdout


def test_torchrun_example_three_ranks():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
           "--master-port", str(_port()), os.path.join(ROOT, "examples", "train_ddp.py"), "--steps", "10"]
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = re.findall(r"rank (\d)/3 backend harp: mean loss ([\d.]+) param checksum ([-\d.]+)", out.stdout)
    assert sorted(r for r, _, _ in lines) == ["0", "1", "2"], out.stdout
    assert len({(l, c) for _, l, c in lines}) == 1, lines  # every rank ends with the same model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_staged(tmp_path):
    res = run_ranks(2, tc.cuda_ops, _url(tmp_path), timeout=300)
    bad = [b for r in res for b in r]
    assert not bad, "\n".join(bad)


def test_gpu_torch_check_skips_cleanly_without_cuda():
    """tests/gpu/torch_cuda_check.py (run on a GPU by scripts/gpu-check.sh) exits 0 with a clear SKIP
    line where there is no CUDA, and 2 with --require-cuda."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: scripts/gpu-check.sh runs the real check")
    script = os.path.join(ROOT, "tests", "gpu", "torch_cuda_check.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("SKIP: no CUDA"), out.stdout + out.stderr
    out = subprocess.run([sys.executable, script, "--require-cuda"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "SKIP: no CUDA" in out.stdout, out.stdout + out.stderr


def test_cuda_absent_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from harp.torch._tensors import UnsupportedError, check_device

    class FakeCuda:
        is_cpu = False

        class device:
            type = "cuda"

    with pytest.raises(UnsupportedError, match="CUDA tensor given but CUDA is not available"):
        check_device(FakeCuda(), "allreduce")


def test_sparse_entry_counts_from_peers_are_bounded_by_the_shape():
    """A peer's announced nnz sizes this rank's receive buffers: negative or more than the shape's
    sparse positions is refused, naming the rank (harp/torch/_sparse.py)."""
    from harp.torch._sparse import _bad_nnz

    assert _bad_nnz([3, 0, 65], [13, 5]) is None
    assert _bad_nnz([3, 66, 1], [13, 5]) == 1
    assert _bad_nnz([-1, 2], [13, 5]) == 0
    assert _bad_nnz([0, 2 ** 62], [1 << 20, 1 << 20]) == 1
