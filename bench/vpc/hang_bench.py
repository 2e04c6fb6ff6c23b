"""Injected hangs (the observability acceptance run): in each trial a random rank of --ranks either sleeps
before a random allreduce N (until every other rank has timed out) or skips it. Checked per trial:

  * every other rank's error names exactly that rank and N ("Missing ranks (have not started
    allreduce #N): <rank> (...)", and no other rank), within HARP_TIMEOUT + 1 s of entering op N;
  * its stall warning ("WARN stall: allreduce #N") was logged before the failure;
  * torch's fr_trace on the trial's dumps reports "missing ranks: {<rank>}" at sequence number N;
  * harp-status (harp.status.collect on the trial's status folder) answers during the hang, in
    under 1 s, with the culprit among the lagging ranks.

Ranks are local processes (tests/harness.py; real sockets / shared memory), not the arena: the
checks concern the diagnosis, not the network. Trials take the --transport list in turn. The
sleeping rank wakes when the bench has every other rank's error (and its own dump is written),
so a trial lasts about HARP_TIMEOUT plus start-up; fr_trace runs in one worker process that keeps
torch imported (--fr-subprocess: a fresh `python -m ...fr_trace` per trial). A failed trial's
folder (logs, dumps) is kept. Output: one line per trial, a summary, and a JSON record
(bench/vpc/stamp.py) with --json.

    PYTHONPATH=python python3 bench/vpc/hang_bench.py --trials 100 --ranks 8 --transport tcp,shm --json hang.json
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import harp  # noqa: E402
import harp.debug  # noqa: E402
import harp.status  # noqa: E402
from harness import start_ranks  # noqa: E402
from stamp import stamp  # noqa: E402

OPS = 6

# torch's analyser, imported once: a worker process reads "[folder, prefix]" lines and answers each
# with fr_trace's output (its logger and prints) as one JSON string line.
_FR_WORKER = r"""
import json, sys
class Sink:
    parts = []
    def write(self, s):
        self.parts.append(s)
        return len(s)
    def flush(self):
        pass
real, sink = sys.stdout, Sink()
sys.stdout = sys.stderr = sink
from torch.distributed.flight_recorder.fr_trace import main
real.write(json.dumps("ready") + "\n"); real.flush()
for line in sys.stdin:
    folder, prefix = json.loads(line)
    sink.parts.clear()
    try:
        main([folder, "--prefix", prefix])
    except BaseException as e:
        sink.parts.append(f"fr_trace raised {type(e).__name__}: {e}")
    real.write(json.dumps("".join(sink.parts)) + "\n"); real.flush()
"""


class FrTrace:
    """fr_trace on a folder of dumps, in a worker that keeps torch imported (--fr-subprocess: a fresh
    `python -m torch.distributed.flight_recorder.fr_trace` per trial, as a user would run it)."""

    def __init__(self, fresh):
        self.fresh, self.p = fresh, None

    def _start(self):
        self.p = subprocess.Popen([sys.executable, "-c", _FR_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        self._read(300)

    def _read(self, timeout):
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        line = self.p.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(f"fr_trace worker gave no answer within {timeout} s")
        return json.loads(line)

    def run(self, folder, prefix):
        if self.fresh:
            p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder,
                                "--prefix", prefix], capture_output=True, text=True, timeout=300)
            return p.stdout + p.stderr
        try:
            if self.p is None:
                self._start()
            self.p.stdin.write(json.dumps([folder, prefix]) + "\n")
            self.p.stdin.flush()
            return self._read(300)
        except (OSError, RuntimeError, ValueError) as e:
            self.close()
            return f"fr_trace worker failed: {e}"

    def close(self):
        if self.p:
            self.p.kill()
            self.p.wait()
            self.p = None


def _wait_for(path, limit_s):
    end = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)


def _rank(rank, size, folder, culprit, op, mode, timeout):
    fd = os.open(f"{folder}/stderr.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    comm = harp.init()
    x = np.ones(16, np.float32)
    for i in range(1, OPS + 1):
        if rank == culprit and i == op:
            # The hang: asleep until every other rank has failed (the bench then creates "release"),
            # then until this rank's own dump exists (asked for by the failing ranks through the
            # store; core/observe/recorder.h requestDumps), so leaving cannot change what the others saw.
            _wait_for(f"{folder}/release", timeout * 4 + 30)
            _wait_for(f"{folder}/harp_trace_rank_{rank}", 10)
            if mode == "skip":
                return ("culprit", 0.0, "")
        t = time.monotonic()
        try:
            comm.allreduce(x)
        except harp.HarpError as e:
            return ("error", time.monotonic() - t, str(e))
    return ("finished", 0.0, "")


def _status(sdir, culprit, until):
    """Ask harp-status during the hang: (answered in s, culprit lagging)."""
    best = (None, False)
    while time.monotonic() < until:
        socks = sorted(e.path for e in os.scandir(sdir) if e.name.endswith(".sock")) if os.path.isdir(sdir) else []
        t = time.monotonic()
        answers = harp.status.collect(socks, timeout=0.9)
        took = time.monotonic() - t
        comms = harp.status.summarize(answers)
        if comms and culprit in comms[0]["lagging"]:
            return took, True
        best = (took, False)
        time.sleep(0.2)
    return best


def _results(procs, q, culprit, folder, limit_s):
    """Every rank's (kind, seconds, text); "release" is created once all but the culprit reported."""
    out, end = {}, time.monotonic() + limit_s
    while len(out) < len(procs) and time.monotonic() < end:
        try:
            rank, status, val = q.get(timeout=0.5)
        except queue.Empty:
            for r, p in enumerate(procs):
                if r not in out and not p.is_alive() and p.exitcode not in (0, None):
                    out[r] = ("died", 0.0, f"exit code {p.exitcode}")
            continue
        out[rank] = val if status == "ok" else ("raised", 0.0, str(val)[:500])
        if len(out) == len(procs) - 1 and culprit not in out:
            open(f"{folder}/release", "w").close()
    open(f"{folder}/release", "w").close()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)
    return [out.get(r, ("hung", 0.0, f"no result within {limit_s} s")) for r in range(len(procs))]


def _check_rank(r, rv, op, culprit, timeout, folder):
    kind, took, text = rv
    named = re.findall(r"Missing ranks \(have not started allreduce #(\d+)\): (.*)$", text)
    if kind != "error" or not named:
        return [f"rank {r}: {kind}: {text[:300]}"]
    bad = []
    n, who = named[0]
    ranks = re.findall(r"(\d+) \(", who)
    if int(n) != op or ranks != [str(culprit)]:
        bad.append(f"rank {r}: named #{n} ranks {ranks}")
    if took > timeout + 1:
        bad.append(f"rank {r}: error after {took:.2f} s")
    with open(f"{folder}/stderr.{r}") as f:
        log = f.read()
    w, b = log.find(f"WARN stall: allreduce #{op} "), log.find("WARN communicator broken")
    if not 0 <= w < b:
        bad.append(f"rank {r}: no stall warning before the failure")
    return bad


def trial(i, args, rng, fr):
    culprit, op, mode = rng.randrange(args.ranks), rng.randint(2, OPS), rng.choice(["sleep", "skip"])
    transport = args.transports[i % len(args.transports)]
    t0 = time.monotonic()
    folder = tempfile.mkdtemp(prefix=f"hang{i}_")
    sdir = os.path.join(folder, "status")
    env = {"HARP_TRANSPORT": transport, "HARP_TIMEOUT": str(args.timeout),
           "HARP_STALL_WARNING_S": str(args.warn), "HARP_OBS_PUBLISH_S": "0.2",
           "HARP_FR_DUMP_PREFIX": f"{folder}/harp_trace_rank_", "HARP_STATUS_DIR": sdir}
    procs, q = start_ranks(args.ranks, _rank, folder, culprit, op, mode, args.timeout, env=env)
    st_took, st_lag = _status(sdir, culprit, time.monotonic() + args.timeout + 5)
    res = _results(procs, q, culprit, folder, args.timeout * 4 + 60)
    bad, took = [], []
    for r, rv in enumerate(res):
        if r != culprit:
            bad += _check_rank(r, rv, op, culprit, args.timeout, folder)
            took.append(rv[1])
    fr_out = fr.run(folder, "harp_trace_rank_")
    fr_ok = bool(re.search(rf"sequence number: {op}\b", fr_out)) and f"missing ranks: {{{culprit}}}" in fr_out
    if not fr_ok:
        bad.append("fr_trace: " + " | ".join(l for l in fr_out.splitlines()
                                              if "missing" in l or "sequence" in l or "fr_trace" in l)[:300])
    if st_took is None or st_took >= 1.0 or not st_lag:
        bad.append(f"harp-status: answered in {st_took} s, culprit lagging: {st_lag}")
    if not bad and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return {"trial": i, "transport": transport, "culprit": culprit, "op": op, "mode": mode, "ok": not bad,
            "problems": bad, "status_s": st_took, "error_after_s_max": max(took) if took else None,
            "trial_s": time.monotonic() - t0, "folder": folder if bad or args.keep else ""}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--transport", default="tcp,shm", help="comma-separated; trials take them in turn")
    ap.add_argument("--timeout", type=float, default=4.0, help="HARP_TIMEOUT of the ranks")
    ap.add_argument("--warn", type=float, default=1.0, help="HARP_STALL_WARNING_S of the ranks")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--fr-subprocess", action="store_true", help="a fresh fr_trace process per trial")
    ap.add_argument("--keep", action="store_true", help="keep every trial's folder (failed ones are always kept)")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    a.transports = [t for t in a.transport.split(",") if t]
    rng = random.Random(a.seed)
    out, fr, t0, load0 = [], FrTrace(a.fr_subprocess), time.monotonic(), os.getloadavg()
    try:
        for i in range(a.trials):
            r = trial(i, a, rng, fr)
            out.append(r)
            print(f"trial {i} ({r['transport']}): rank {r['culprit']} {r['mode']}s op #{r['op']}: "
                  f"{'ok' if r['ok'] else 'FAIL ' + '; '.join(r['problems'])} (errors after <= "
                  f"{r['error_after_s_max'] or 0:.2f} s, status {r['status_s'] or 0:.3f} s, trial "
                  f"{r['trial_s']:.1f} s{', kept ' + r['folder'] if r['folder'] else ''}; load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
    finally:
        fr.close()
    ok = sum(r["ok"] for r in out)
    status = [r["status_s"] for r in out if r["status_s"] is not None]
    errs = [r["error_after_s_max"] for r in out if r["error_after_s_max"] is not None]
    summary = (f"{ok}/{len(out)} trials passed every check ({a.ranks} ranks, {'/'.join(a.transports)}, "
               f"HARP_TIMEOUT={a.timeout}, HARP_STALL_WARNING_S={a.warn}) in {time.monotonic() - t0:.0f} s; "
               f"latest error {max(errs, default=0):.2f} s after entering op N; harp-status "
               f"{min(status, default=0):.3f}-{max(status, default=0):.3f} s; load {load0[0]:.1f} -> "
               f"{os.getloadavg()[0]:.1f}")
    print(summary)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"stamp": stamp(), "command": " ".join([sys.executable] + sys.argv), "passed": ok,
                       "summary": summary, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                       "trials": out}, f, indent=1)
    return 0 if ok == len(out) else 1


if __name__ == "__main__":
    sys.exit(main())
