"""Observability: the flight recorder (bounded ring, dumps on timeout / SIGUSR1 /
harp.debug.dump(), read by torch's fr_trace), the stall warning and op-count view, harp-status
during a hang, Prometheus output, HARP_DEBUG_SUBSYS, torch.profiler spans and torch-style timeout
text. Multi-process over real sockets and shared memory (tests/harness.py); timeouts are small
and nothing asserts a duration."""
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import harp
import harp.debug
import harp.status
from harness import collect, run_ranks, start_ranks


def _stderr_to(path):
    """Send this rank's fd 2 (HARP's log lines) to a file the test reads afterwards."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


# -- the ring ------------------------------------------------------------------------------------------------

def _ring(rank, size, n):
    comm = harp.init()
    x = np.ones(3, np.float64)
    for _ in range(n):
        comm.allreduce(x)
    rec = harp.debug.flight_record()
    return rec["entries"], rec["pg_status"], rec["pg_config"], comm.rank


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_ring_is_bounded_and_wraps(transport):
    res = run_ranks(3, _ring, 45, env={"HARP_TRANSPORT": transport, "HARP_FR_ENTRIES": "16"}, timeout=120)
    for entries, status, config, rank in res:
        assert len(entries) == 16, "the ring keeps exactly HARP_FR_ENTRIES operations"
        assert [e["collective_seq_id"] for e in entries] == list(range(30, 46)), "the newest 16, oldest first"
        assert [e["record_id"] for e in entries] == list(range(29, 45))
        assert all(e["state"] == "completed" and e["profiling_name"] == "nccl:all_reduce" for e in entries)
        assert all(e["input_sizes"] == [[3]] and e["input_dtypes"] == ["Double"] for e in entries)
        assert all(e["harp_transport"] == transport and e["harp_algorithm"] for e in entries)
        (st,) = status.values()
        assert st["last_completed_collective"] == 45
        (cfg,) = config.values()
        assert cfg["ranks"] == "[0, 1, 2]"


def _off(rank, size):
    from harp import _harp
    comm = harp.init()
    comm.allreduce(np.ones(4, np.float32))
    try:
        _harp.obs_pause(comm._c, True)
        paused = "no error"
    except harp.HarpError as e:
        paused = str(e)
    return harp.debug.status()["comms"], harp.debug.flight_record()["entries"], paused


def test_fr_entries_zero_turns_the_recorder_off():
    for comms, entries, paused in run_ranks(2, _off, env={"HARP_FR_ENTRIES": "0"}, timeout=60):
        assert comms == [] and entries == []
        assert "no flight recorder (HARP_FR_ENTRIES=0)" in paused, paused


def _paused(rank, size):
    from harp import _harp
    comm = harp.init()
    comm.allreduce(np.ones(3, np.int32))
    _harp.obs_pause(comm._c, True)  # bench/recorder_overhead.py's "off" rounds
    for _ in range(5):
        comm.allreduce(np.ones(3, np.int32))
    _harp.obs_pause(comm._c, False)
    out = comm.allreduce(np.ones(3, np.int32))
    (st,) = harp.debug.status()["comms"]
    seqs = [e["collective_seq_id"] for e in harp.debug.flight_record()["entries"]]
    calls = sum(m["count"] for m in st["metrics"])
    return seqs, st["ops"], calls, out.tolist()


def test_paused_recorder_records_nothing_and_resumes():
    # The benchmark's on/off switch: paused calls run (and keep their sequence numbers) but leave
    # no record, count or metric; resumed calls are recorded again.
    for seqs, ops, calls, out in run_ranks(2, _paused, timeout=60):
        assert out == [2, 2, 2]
        assert seqs == [1, 7] and ops == 2 and calls == 2, (seqs, ops, calls)


# -- a rank that skips an operation: stall warning, timeout text, dumps, fr_trace ----------------------------

def _skipper(rank, size, tmp, skip_rank, skip_op):
    _stderr_to(f"{tmp}/stderr.{rank}")
    comm = harp.init()
    x = np.ones(5, np.float32)
    for i in range(1, 7):
        if rank == skip_rank and i == skip_op:
            time.sleep(float(os.environ["HARP_TIMEOUT"]) + 2)  # the others time out meanwhile
            return "skipped", harp.debug.dump("skipped")
        try:
            comm.allreduce(x)
        except harp.HarpError as e:
            return "error", str(e)
    return "finished", ""


def _fr_trace(folder):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout + p.stderr


@pytest.mark.parametrize("transport,n", [("tcp", 3), ("shm", 4)])
def test_skipped_op_named_by_warning_error_dump_and_fr_trace(transport, n, tmp_path):
    pytest.importorskip("torch")
    skip_rank, skip_op = n - 2, 4
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = {"HARP_TRANSPORT": transport, "HARP_TIMEOUT": "3", "HARP_STALL_WARNING_S": "0.5",
           "HARP_OBS_PUBLISH_S": "0.2", "HARP_FR_DUMP_PREFIX": f"{dumps}/harp_trace_rank_"}
    res = run_ranks(n, _skipper, str(tmp_path), skip_rank, skip_op, env=env, timeout=120)
    for r, (kind, text) in enumerate(res):
        if r == skip_rank:
            assert kind == "skipped" and text.endswith(f"harp_trace_rank_{r}")
            continue
        assert kind == "error", text
        # HARP's error: this op, and the op-count view naming the rank that never started it.
        assert f"#{skip_op}" in text and "timed out" in text
        assert f"Missing ranks (have not started allreduce #{skip_op}): {skip_rank} " \
               f"(last started #{skip_op - 1}, last completed #{skip_op - 1})" in text, text
        log = (tmp_path / f"stderr.{r}").read_text()
        warn = log.find("WARN stall: allreduce #%d" % skip_op)
        broken = log.find("WARN communicator broken")
        assert 0 <= warn < broken, f"rank {r}: the stall warning must come before the failure:\n{log}"
        assert f"Missing ranks (have not started allreduce #{skip_op}): {skip_rank} " in log[warn:broken]
        assert "flight record written to" in log
    files = sorted(os.listdir(dumps))
    assert files == sorted(f"harp_trace_rank_{r}" for r in range(n))
    with open(dumps / f"harp_trace_rank_{skip_rank}", "rb") as f:
        d = pickle.load(f)
    assert max(e["collective_seq_id"] for e in d["entries"]) == skip_op - 1
    out = _fr_trace(str(dumps))
    assert f"Not all ranks joining collective, sequence number: {skip_op}" in out, out
    assert f"missing ranks: {{{skip_rank}}}" in out, out


# -- SIGUSR1 and harp.debug.dump -----------------------------------------------------------------------------

def _sigusr1(rank, size, folder):
    comm = harp.init()
    for _ in range(3):
        comm.allreduce(np.ones(2, np.int32))
    path = f"{folder}/harp_trace_rank_{rank}"
    os.kill(os.getpid(), signal.SIGUSR1)  # the handler only wakes the dumper thread
    for _ in range(600):
        if os.path.exists(path):
            break
        time.sleep(0.05)
    with open(path, "rb") as f:
        by_signal = pickle.load(f)
    os.unlink(path)
    by_call = harp.debug.dump("test")
    with open(by_call, "rb") as f:
        by_dump = pickle.load(f)
    comm.allreduce(np.ones(2, np.int32))
    return by_signal["harp"]["reason"], len(by_signal["entries"]), by_call, by_dump["harp"]["reason"]


def test_dump_on_sigusr1_and_by_harp_debug_dump(tmp_path):
    env = {"HARP_FR_DUMP_PREFIX": f"{tmp_path}/harp_trace_rank_"}
    for r, (why, n, path, why2) in enumerate(run_ranks(2, _sigusr1, str(tmp_path), env=env, timeout=120)):
        assert why == "SIGUSR1" and n == 3
        assert path == f"{tmp_path}/harp_trace_rank_{r}" and why2 == "test"


# -- harp-status during a hang -------------------------------------------------------------------------------

def _hang(rank, size):
    comm = harp.init()
    comm.allreduce(np.ones(4, np.float32))
    if rank == 1:
        time.sleep(float(os.environ["HARP_TIMEOUT"]) + 1)
        return "slept"
    try:
        comm.allreduce(np.ones(4, np.float32))
    except harp.HarpError as e:
        return str(e)
    return "no error"


def test_harp_status_answers_during_a_hang(tmp_path):
    sdir = tmp_path / "status"
    env = {"HARP_STATUS_DIR": str(sdir), "HARP_TIMEOUT": "20", "HARP_STALL_WARNING_S": "0.5",
           "HARP_TRANSPORT": "tcp"}
    procs, q = start_ranks(2, _hang, env=env)
    try:
        seen = None
        for _ in range(300):  # until rank 0 is inside the second allreduce
            time.sleep(0.1)
            if not sdir.exists():
                continue
            answers = harp.status.collect([str(p) for p in sdir.glob("*.sock")])
            comms = harp.status.summarize(answers)
            if comms and len(comms[0]["ranks"]) == 2 and comms[0]["ranks"]["0"]["in_flight"]:
                seen = comms[0]
                break
        assert seen, "harp-status never saw rank 0 waiting in its second allreduce"
        assert seen["lagging"] == [1] and seen["ranks"]["1"]["in_flight"] is None
        assert seen["ranks"]["0"]["in_flight"]["collective"] == "allreduce"
        assert seen["ranks"]["0"]["in_flight"]["seq"] == 2 and seen["ranks"]["1"]["completed"] == 1
        assert oct(sdir.stat().st_mode & 0o777) == "0o700"
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in sdir.glob("*.sock"))
        # The console script, text and JSON, during the same hang.
        envp = dict(os.environ, HARP_STATUS_DIR=str(sdir), PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-m", "harp.status"], env=envp, capture_output=True, text=True,
                             timeout=60).stdout
        assert "lagging ranks (started fewer collectives): 1" in out and "allreduce #2" in out, out
        js = json.loads(subprocess.run([sys.executable, "-m", "harp.status", "--json"], env=envp,
                                       capture_output=True, text=True, timeout=60).stdout)
        assert js["comms"][0]["lagging"] == [1]
    finally:
        for p in procs:
            p.kill()
        collect(procs, q, timeout=30, allow_errors=True)


# -- metrics -------------------------------------------------------------------------------------------------

def _metrics(rank, size):
    import harp.metrics
    os.environ["HARP_FR_TIME_EVERY"] = "1"  # every call timed: the histogram counts every call
    comm = harp.init()
    for n in (1, 1000, 70000):
        comm.allreduce(np.ones(n, np.float32))
    comm.allgather(np.ones(10, np.int64), np.zeros(10 * size, np.int64))
    return harp.metrics.generate()


def test_prometheus_output_parses_and_counts():
    parser = pytest.importorskip("prometheus_client.parser")
    for text in run_ranks(3, _metrics, timeout=120):
        fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
        calls = {(s.labels["collective"], s.labels["algorithm"]): s.value
                 for s in fams["harp_collective_calls"].samples if s.name.endswith("_total")}
        assert sum(v for (c, _), v in calls.items() if c == "allreduce") == 3
        assert sum(v for (c, _), v in calls.items() if c == "allgather") == 1
        nbytes = sum(s.value for s in fams["harp_collective_bytes"].samples
                     if s.name.endswith("_total") and s.labels["collective"] == "allreduce")
        assert nbytes == 4 * (1 + 1000 + 70000)
        counts = [s for s in fams["harp_collective_latency_seconds"].samples if s.name.endswith("_count")]
        assert sum(s.value for s in counts if s.labels["collective"] == "allreduce") == 3
        inf = [s for s in fams["harp_collective_latency_seconds"].samples
               if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
        assert sum(s.value for s in inf) == 4
        assert all(s.value > 0 for s in fams["harp_collective_busbw_bytes_per_second"].samples)
        assert {s.labels["transport"] for s in counts} <= {"tcp", "shm", "mixed"}


def _sampled_metrics(rank, size):
    import harp.metrics
    os.environ["HARP_FR_TIME_EVERY"] = "6"  # rounded up to 8
    comm = harp.init()
    for _ in range(64):
        comm.allreduce(np.ones(4, np.float32))  # 16 bytes: one in 8 timed
    for _ in range(3):
        comm.allreduce(np.ones(16384, np.float32))  # 64K = HARP_FR_TIME_BYTES: always timed
    path = harp.debug.dump(reason="test")
    return harp.metrics.generate(), path


def test_latency_is_timed_for_every_large_call_and_one_in_n_small_ones(tmp_path, monkeypatch):
    """The recorder's timing rule (core/observe/recorder.h): calls of >= HARP_FR_TIME_BYTES always, one in
    HARP_FR_TIME_EVERY (a power of two) of the smaller ones by record id; the rest carry no duration.
    Counts and bytes stay exact."""
    parser = pytest.importorskip("prometheus_client.parser")
    monkeypatch.setenv("HARP_FR_DUMP_PREFIX", str(tmp_path / "fr_"))
    for text, path in run_ranks(2, _sampled_metrics, timeout=120):
        fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
        ar = lambda fam, suffix: sum(s.value for s in fams[fam].samples  # noqa: E731
                                     if s.name.endswith(suffix) and s.labels["collective"] == "allreduce")
        assert ar("harp_collective_calls", "_total") == 67
        assert ar("harp_collective_bytes", "_total") == 64 * 16 + 3 * 65536
        assert ar("harp_collective_latency_seconds", "_count") == 64 // 8 + 3
        inf = sum(s.value for s in fams["harp_collective_latency_seconds"].samples
                  if s.name.endswith("_bucket") and s.labels["le"] == "+Inf" and s.labels["collective"] == "allreduce")
        assert inf == 64 // 8 + 3
        with open(path, "rb") as f:
            entries = [e for e in pickle.load(f)["entries"] if e["profiling_name"].startswith("nccl:all_reduce")]
        assert len(entries) == 67
        timed = [e for e in entries if e["duration_ms"] is not None]
        assert len(timed) == 64 // 8 + 3
        assert all(e["duration_ms"] is not None for e in entries[-3:])  # the 64K calls
        assert all(e["time_discovered_completed_ns"] >= e["time_created_ns"] > 0 for e in entries)


# -- HARP_DEBUG_SUBSYS ---------------------------------------------------------------------------------------

_SUBSYS_JOB = """
import numpy as np, harp
from harness import run_ranks
def one(rank, size):
    harp.init().allreduce(np.ones(4, np.float32))
run_ranks(2, one, timeout=60)
"""


@pytest.mark.parametrize("subsys,want,not_want", [("INIT", "INFO INIT ", "INFO TUNING "),
                                                  ("^INIT", "INFO TUNING ", "INFO INIT ")])
def test_debug_subsys_filters_info_lines(subsys, want, not_want):
    # A fresh interpreter: the log level and subsystems are read once per process.
    env = dict(os.environ, HARP_DEBUG="INFO", HARP_DEBUG_SUBSYS=subsys, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", _SUBSYS_JOB], env=env, capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert p.returncode == 0, p.stderr[-2000:]
    assert want in p.stderr and not_want not in p.stderr, p.stderr


# -- torch backend: timeout wording, profiler spans ----------------------------------------------------------

def _torch_timeout(rank, size, url):
    import datetime
    import torch
    import torch.distributed as dist
    import harp.torch  # noqa: F401 - registers the backend
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=2))
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(4)
        return ""
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the text is what is tested
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_torch_timeout_reads_like_torch(tmp_path):
    pytest.importorskip("torch")
    res = run_ranks(2, _torch_timeout, f"file://{tmp_path}/store", timeout=120)
    msg = res[0]
    assert re.search(r"Timed out|closed|timeout", msg), msg  # what torch's tests and users match
    assert msg.startswith("DistBackendError: harp allreduce failed on rank 0") and " Timed out " in msg, msg
    assert "waiting for rank(s) 1" in msg and "#2" in msg, msg  # HARP's naming kept


def _ddp_spans(rank, size, url, trace):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.nn.parallel import DistributedDataParallel as DDP
    import harp.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ddp = DDP(model, bucket_cap_mb=0.005)  # several buckets
    buckets, bucket_objs = [], []

    def counting(state, bucket):
        buckets.append(bucket.index())
        bucket_objs.append(bucket)
        return dh.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    torch.nn.functional.mse_loss(ddp(x), y).backward()  # the first step builds the buckets
    buckets.clear()
    bucket_objs.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
    prof.export_chrome_trace(f"{trace}.{rank}.json")
    with open(f"{trace}.{rank}.json") as f:
        events = json.load(f)["traceEvents"]
    spans = [e["name"] for e in events if e.get("name", "").split(" ")[0] == "harp:all_reduce" and e.get("ph") == "X"]
    sizes = sorted(b.buffer().numel() * b.buffer().element_size() for b in bucket_objs)
    dist.destroy_process_group()
    return len(buckets), spans, sizes


def test_ddp_profiler_trace_has_one_harp_span_per_bucket(tmp_path):
    pytest.importorskip("torch")
    for nbuckets, spans, sizes in run_ranks(2, _ddp_spans, f"file://{tmp_path}/store", str(tmp_path / "trace"),
                                            timeout=180):
        assert nbuckets >= 2, "the model should make several buckets"
        assert len(spans) == nbuckets, (nbuckets, spans)
        assert sorted(int(s.split("bytes=")[1]) for s in spans) == sizes, (spans, sizes)
