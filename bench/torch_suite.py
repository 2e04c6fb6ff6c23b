"""torch's own distributed suite (DistributedTest._DistTestBase, unmodified) at 4 ranks, first over
real gloo and then with harp in gloo's place; a JSON record and a table of both outcomes per test.

Usage:
    nice python bench/torch_suite.py [--only REGEX] [--limit N] [--batch 8] [--timeout 180]
                                     [--backends gloo,harp] [--out results/torch-suite/NAME.json]

How a test runs: 4 worker processes (this file with --worker) form one process group with the
backend under test (BACKEND=gloo in the environment either way: the suite reads it at import and
gates its tests on that name; "harp" as the group's backend puts harp in gloo's place, and every
group a test makes takes the world's backend). Each worker runs a batch of tests on that group the
way torch's own harness does (TestDistBackend._run / MultiProcessTestCase.run_test: the file
barrier before, the seed reset, the method itself, skip by SkipTest or by a skip exit code), and
after each test the 4 ranks agree on its outcome through a FileStore of their own (not the group,
which a failed test may have broken). A test fails if any rank fails, is skipped if any rank skips,
and is ok when all 4 pass. The batch stops at the first test that is not ok or skipped; the tests
after it go into a fresh group, and a test that failed after others in the same group is run again
alone, so that only a failure in a fresh group counts. Tests that re-create or destroy groups, or
test timeouts, run alone. A test running past --timeout has its 4 processes killed and is recorded
"timeout". Only one 4-rank group runs at a time.

Lifetime: the run's scratch (stores, the suite's TEMP_DIR) lives in a temporary folder removed at
the end. Output: the JSON record (stamped: commit, CPU, cores, load, time, command, wall time per
backend) and a Markdown table beside it (same name, .md).
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 4
# a test whose source has one of these re-creates or destroys groups, or waits for a timeout on purpose
SOLO_WORDS = ("destroy_process_group", "init_process_group", "timeout", "monitored_barrier", "_abort")


def _suite_env(tmp):
    for d in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    return dict(BACKEND="gloo", WORLD_SIZE=str(SIZE), TEMP_DIR=tmp,
                INIT_METHOD="file://" + os.path.join(tmp, "init_dir", "shared_init_file"))


def _import_suite():
    from torch.testing._internal.distributed import distributed_test as dt
    return dt


# ---------------------------------------------------------------- worker (one rank of one group)

def _skip_reasons():
    from torch.testing._internal.common_distributed import TEST_SKIPS
    return {s.exit_code: s.message for s in TEST_SKIPS.values()}


def _one(case, name, skips):
    """Runs one test method as MultiProcessTestCase.run_test does; returns (kind, detail)."""
    import traceback
    import unittest

    from torch.testing._internal import common_utils
    common_utils.set_rng_seed()
    try:
        getattr(case, name)()
        return "ok", ""
    except unittest.SkipTest as e:
        return "skipped", str(e)
    except SystemExit as e:  # torch's skip decorators exit with a code naming the reason
        code = e.code if isinstance(e.code, int) else -1
        if code in skips:
            return "skipped", skips[code]
        return "failed", f"SystemExit({e.code})"
    except BaseException as e:  # noqa: BLE001 - the outcome is the record
        tb = traceback.format_exc()
        return "failed", f"{type(e).__name__}: {e}".strip() + "\n" + tb[-3000:]


def worker(rank, work, backend, names):
    import torch.distributed as dist
    os.environ.update(_suite_env(os.path.join(work, "tmp")))
    if backend == "harp":
        import harp.torch  # noqa: F401  (registers "harp")
    dt = _import_suite()

    class Case(dt.TestDistBackend, dt.DistributedTest._DistTestBase):  # torch's own pairing
        pass

    log = open(os.path.join(work, f"rank{rank}.jsonl"), "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    agree = dist.FileStore(os.path.join(work, "agree"), SIZE)
    agree.set_timeout(datetime.timedelta(seconds=600))
    skips = _skip_reasons()
    first = Case(names[0])
    first.rank, first.file_name = rank, os.path.join(work, "store")
    timeout = dt.CUSTOM_PG_TIMEOUT.get(names[0], dt.default_pg_timeout) if len(names) == 1 else dt.default_pg_timeout
    dist.init_process_group(init_method=first.init_method, backend=backend, world_size=SIZE, rank=rank,
                            timeout=datetime.timedelta(seconds=timeout))
    first._barrier()
    for i, name in enumerate(names):
        case = first if i == 0 else Case(name)
        case.rank, case.file_name = rank, first.file_name
        log.write(json.dumps({"start": name, "t": time.time()}) + "\n")
        t0 = time.monotonic()
        kind, detail = _one(case, name, skips)
        log.write(json.dumps({"name": name, "kind": kind, "detail": detail, "secs": time.monotonic() - t0}) + "\n")
        agree.set(f"{i}/{rank}", kind)
        keys = [f"{i}/{r}" for r in range(SIZE)]
        agree.wait(keys)
        if any(agree.get(k).decode() not in ("ok", "skipped") for k in keys):
            os._exit(0)  # the group may be broken: the parent starts a fresh one for the rest
        case._barrier()
    if dist.is_initialized():
        dist.destroy_process_group()
    log.close()
    os._exit(0)


# ---------------------------------------------------------------- parent

def _read(work):
    starts, done = {}, {}
    for r in range(SIZE):
        p = os.path.join(work, f"rank{r}.jsonl")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written
                if "start" in e:
                    starts.setdefault(e["start"], e["t"])
                else:
                    done.setdefault(e["name"], {})[r] = e
    return starts, done


def _verdict(per_rank):
    """All ranks' outcomes of one test -> (kind, detail, secs)."""
    secs = max(e["secs"] for e in per_rank.values())
    for r in sorted(per_rank):
        if per_rank[r]["kind"] == "failed":
            return "failed", f"rank {r}: {per_rank[r]['detail']}", secs
    for r in sorted(per_rank):
        if per_rank[r]["kind"] == "skipped":
            return "skipped", per_rank[r]["detail"], secs
    return "ok", "", secs


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def run_group(backend, names, scratch, timeout):
    """One fresh group of 4 running `names` in order; returns ({name: result}, names not run)."""
    work = tempfile.mkdtemp(dir=scratch)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    procs = []
    for r in range(SIZE):
        err = open(os.path.join(work, f"err{r}.txt"), "w")  # noqa: SIM115 - closed by the child's exit
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), work,
                                       backend, *names], env=env, stdout=err, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        err.close()
    t_group = time.time()
    out, timed_out, died = {}, None, None
    while True:
        time.sleep(0.5)
        starts, done = _read(work)
        finished = all(p.poll() is not None for p in procs)
        running = [n for n in names if n in starts and len(done.get(n, {})) < SIZE]
        pending = running[0] if running else next((n for n in names if n not in done), None)
        since = starts.get(pending, t_group) if pending else t_group
        if finished:
            break
        if died is None and any(p.poll() not in (None, 0) for p in procs):
            died = time.time()  # a rank crashed: the others may wait for it in a collective
        if died is not None and time.time() - died > 15:
            _kill(procs)
            break
        if pending and time.time() - since > timeout:
            timed_out = pending
            _kill(procs)
            break
    starts, done = _read(work)
    for n in names:
        if len(done.get(n, {})) == SIZE:
            out[n] = _verdict(done[n])
    if timed_out:
        out[timed_out] = ("timeout", f"no result from all ranks after {timeout} s", float(timeout))
    else:
        failed = next((n for n in names if n not in out), None)
        if failed is not None and (failed in starts or failed == names[0]):  # a rank died in it
            tails = []
            for r, p in enumerate(procs):
                if p.returncode:
                    with open(os.path.join(work, f"err{r}.txt")) as f:
                        txt = [ln for ln in f.read().splitlines() if ln.strip()]
                    tails.append(f"rank {r} exited {p.returncode}: " + " | ".join(txt[-3:]))
            out[failed] = ("failed", "; ".join(tails) or "a rank stopped without a result", 0.0)
    rest = [n for n in names if n not in out]
    shutil.rmtree(work, ignore_errors=True)
    return out, rest


def _solo(dt, name):
    if name in dt.CUSTOM_PG_TIMEOUT:
        return True
    try:
        src = inspect.getsource(getattr(dt.DistributedTest._DistTestBase, name))
    except (OSError, TypeError):
        return True
    return any(w in src for w in SOLO_WORDS)


def unittest_skips(dt, names):
    """Tests that unittest skips before they start (skip_but_pass_in_sandcastle_if and unittest.skip
    mark the method; TestCase.run honours the mark without spawning the ranks): {name: reason}."""
    base = dt.DistributedTest._DistTestBase
    return {n: getattr(base, n).__unittest_skip_why__ for n in names
            if getattr(getattr(base, n), "__unittest_skip__", False)}


def run_backend(backend, names, solo, batch, timeout, scratch, progress, marked):
    results = {n: ("skipped", why, 0.0) for n, why in marked.items()}
    for n in marked:
        progress(backend, n, results[n])
    queue, alone = [n for n in names if n not in results], set()
    while queue:
        if queue[0] in solo or queue[0] in alone:
            group = [queue[0]]
        else:
            group = []
            for n in queue:
                if n in solo or n in alone or len(group) == batch:
                    break
                group.append(n)
        out, _ = run_group(backend, group, scratch, timeout)
        for i, n in enumerate(group):
            if n not in out:
                continue
            kind = out[n][0]
            if kind in ("failed", "timeout") and i > 0 and n not in alone:
                alone.add(n)  # failed after other tests in its group: count it only from a fresh group
                continue
            results[n] = out[n]
            progress(backend, n, out[n])
        queue = [n for n in queue if n not in results]
    return results


def _stamp(argv):
    def sh(*c):
        try:
            return subprocess.run(c, cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    import torch
    return {"commit": sh("git", "rev-parse", "HEAD"), "dirty": bool(sh("git", "status", "--porcelain", "--",
                                                                       "python", "bench", "tests")),
            "cpu": cpu, "cores": os.cpu_count(), "load": os.getloadavg(),
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", os.path.relpath(os.path.abspath(argv[0]), ROOT), *argv[1:]]),
            "torch": torch.__version__, "python": platform.python_version(), "ranks": SIZE}


def _cell(res):
    if res is None:
        return "not run"
    kind, detail = res[0], res[1]
    first = (detail.splitlines() or [""])[0].replace("|", "\\|")
    if kind == "ok":
        return "ok"
    if kind == "skipped":
        return f"skipped({first[:90]})"
    return f"{kind}({first[:140]})"


def table(rec):
    lines = ["| test | gloo | harp |", "|---|---|---|"]
    for n in rec["tests"]:
        lines.append(f"| {n} | {_cell(rec['results'].get('gloo', {}).get(n))} | "
                     f"{_cell(rec['results'].get('harp', {}).get(n))} |")
    return "\n".join(lines) + "\n"


def summary(rec):
    g, h = rec["results"].get("gloo", {}), rec["results"].get("harp", {})
    k = lambda d, n: d.get(n, ("not run",))[0]  # noqa: E731
    ts = rec["tests"]
    return {"tests": len(ts),
            "gloo_ok": sum(k(g, n) == "ok" for n in ts), "harp_ok": sum(k(h, n) == "ok" for n in ts),
            "both_ok": sum(k(g, n) == "ok" and k(h, n) == "ok" for n in ts),
            "both_skipped": sum(k(g, n) == "skipped" and k(h, n) == "skipped" for n in ts),
            "gloo_ok_harp_not": [n for n in ts if k(g, n) == "ok" and k(h, n) != "ok"],
            "harp_ok_gloo_not": [n for n in ts if k(h, n) == "ok" and k(g, n) != "ok"],
            "other_differences": [n for n in ts if k(g, n) != "ok" and k(h, n) != "ok" and k(g, n) != k(h, n)]}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="regex: run the tests whose name matches")
    ap.add_argument("--limit", type=int, default=0, help="run the first N tests (after --only)")
    ap.add_argument("--batch", type=int, default=8, help="tests per process group where that is safe")
    ap.add_argument("--timeout", type=float, default=180, help="seconds one test may take on 4 ranks")
    ap.add_argument("--backends", default="gloo,harp")
    ap.add_argument("--reuse", default="", help="a record whose results stand for the backends not in "
                    "--backends (its stamp is kept under 'reused')")
    ap.add_argument("--out", default="", help="JSON record (default results/torch-suite/suite-<time>.json)")
    a = ap.parse_args(argv[1:])
    for b in a.backends.split(","):
        if b not in ("gloo", "harp"):
            ap.error(f"--backends: {b!r} is neither gloo nor harp")
    scratch = tempfile.mkdtemp(prefix="torch-suite-")
    os.environ.update(_suite_env(os.path.join(scratch, "enum")))
    dt = _import_suite()
    names = sorted(n for n in dir(dt.DistributedTest._DistTestBase) if n.startswith("test"))
    if a.only:
        names = [n for n in names if re.search(a.only, n)]
    if a.limit:
        names = names[:a.limit]
    if not names:
        ap.error("no test matches --only/--limit")
    solo = {n for n in names if _solo(dt, n)}
    marked = unittest_skips(dt, names)
    rec = {"stamp": _stamp(argv), "tests": names, "solo": sorted(solo), "results": {}, "wall_s": {},
           "batch": a.batch, "timeout_s": a.timeout}
    if a.reuse:
        with open(a.reuse) as f:
            old = json.load(f)
        for b, res in old["results"].items():
            if b not in a.backends.split(","):
                rec["results"][b] = {n: tuple(v) for n, v in res.items() if n in names}
                rec["wall_s"][b] = old["wall_s"].get(b)
                rec.setdefault("reused", {})[b] = {"record": os.path.relpath(os.path.abspath(a.reuse), ROOT),
                                                   "stamp": old["stamp"]}
    out = a.out or os.path.join(ROOT, "results", "torch-suite",
                                f"suite-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    def progress(backend, n, res):
        print(f"[{backend}] {n}: {_cell(res)} ({res[2]:.1f} s)", flush=True)

    def save():
        rec["stamp"]["load_end"] = os.getloadavg()
        rec["stamp"]["time_end"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        rec["summary"] = summary(rec)
        with open(out, "w") as f:
            json.dump(rec, f, indent=1)
        with open(out[:-5] + ".md" if out.endswith(".json") else out + ".md", "w") as f:
            f.write(f"command: `{rec['stamp']['command']}` at {rec['stamp']['commit'][:9]}, wall s {rec['wall_s']}\n\n")
            f.write(table(rec))

    try:
        for b in a.backends.split(","):
            t0 = time.monotonic()
            rec["results"][b] = {}
            res = run_backend(b, names, solo, a.batch, a.timeout, scratch, progress, marked)
            rec["results"][b] = res
            rec["wall_s"][b] = round(time.monotonic() - t0, 1)
            save()
    finally:
        save()
        shutil.rmtree(scratch, ignore_errors=True)
    s = rec["summary"]
    print(json.dumps({k: v for k, v in s.items()}, indent=1))
    print(f"wall s: {rec['wall_s']}; record: {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
    sys.exit(main(sys.argv))
