"""Injected hangs (issue 19's acceptance run): in each trial a random rank of --ranks either sleeps
before a random allreduce N (longer than HARP_TIMEOUT) or skips it. Checked per trial:

  * every other rank's error names exactly that rank and N ("Missing ranks (have not started
    allreduce #N): <rank> (...)", and no other rank), within HARP_TIMEOUT + 1 s of entering op N;
  * its stall warning ("WARN stall: allreduce #N") was logged before the failure;
  * torch's fr_trace on the trial's dumps reports "missing ranks: {<rank>}" at sequence number N;
  * harp-status (harp.status.collect on the trial's status folder) answers during the hang, in
    under 1 s, with the culprit among the lagging ranks.

Ranks are local processes (tests/harness.py; real sockets / shared memory), not the arena: the
checks concern the diagnosis, not the network. Output: one line per trial, a summary, and a JSON
record (bench/vpc/stamp.py) with --json.

    PYTHONPATH=python python3 bench/vpc/hang_bench.py --trials 100 --ranks 8 --transport tcp --json hang.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
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
from harness import collect, start_ranks  # noqa: E402
from stamp import stamp  # noqa: E402

OPS = 6


def _rank(rank, size, folder, culprit, op, mode, timeout):
    fd = os.open(f"{folder}/stderr.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    comm = harp.init()
    x = np.ones(16, np.float32)
    for i in range(1, OPS + 1):
        if rank == culprit and i == op:
            time.sleep(timeout + 2)  # its dump comes from the others' request (core/recorder.h)
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


def trial(i, args, rng):
    culprit, op, mode = rng.randrange(args.ranks), rng.randint(2, OPS), rng.choice(["sleep", "skip"])
    folder = tempfile.mkdtemp(prefix=f"hang{i}_")
    sdir = os.path.join(folder, "status")
    env = {"HARP_TRANSPORT": args.transport, "HARP_TIMEOUT": str(args.timeout),
           "HARP_STALL_WARNING_S": str(args.warn), "HARP_OBS_PUBLISH_S": "0.2",
           "HARP_FR_DUMP_PREFIX": f"{folder}/harp_trace_rank_", "HARP_STATUS_DIR": sdir}
    procs, q = start_ranks(args.ranks, _rank, folder, culprit, op, mode, args.timeout, env=env)
    st_took, st_lag = _status(sdir, culprit, time.monotonic() + args.timeout + 5)
    res = collect(procs, q, timeout=args.timeout * 4 + 60, allow_errors=True)
    bad = []
    for r, rv in enumerate(res):
        if r == culprit:
            continue
        if isinstance(rv, tuple) and len(rv) == 2 and rv[0] == "ok":
            rv = rv[1]  # harness.collect: (status, value)
        kind, took, text = rv if isinstance(rv, tuple) and len(rv) == 3 else ("?", 0, str(rv))
        named = re.findall(r"Missing ranks \(have not started allreduce #(\d+)\): (.*)$", text)
        if kind != "error" or not named:
            bad.append(f"rank {r}: {kind}: {text[:300]}")
            continue
        n, who = named[0]
        ranks = re.findall(r"(\d+) \(", who)
        if int(n) != op or ranks != [str(culprit)]:
            bad.append(f"rank {r}: named #{n} ranks {ranks}")
        if took > args.timeout + 1:
            bad.append(f"rank {r}: error after {took:.2f} s")
        log = open(f"{folder}/stderr.{r}").read()
        w, b = log.find(f"WARN stall: allreduce #{op}"), log.find("WARN communicator broken")
        if not 0 <= w < b:
            bad.append(f"rank {r}: no stall warning before the failure")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder,
                        "--prefix", "harp_trace_rank_"], capture_output=True, text=True, timeout=300)
    fr = p.stdout + p.stderr
    fr_ok = f"sequence number: {op}" in fr and f"missing ranks: {{{culprit}}}" in fr
    if not fr_ok:
        bad.append("fr_trace: " + " | ".join(l for l in fr.splitlines() if "missing" in l or "sequence" in l)[:300])
    if st_took is None or st_took >= 1.0 or not st_lag:
        bad.append(f"harp-status: answered in {st_took} s, culprit lagging: {st_lag}")
    return {"trial": i, "culprit": culprit, "op": op, "mode": mode, "ok": not bad, "problems": bad,
            "status_s": st_took}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--timeout", type=float, default=4.0)
    ap.add_argument("--warn", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    out = []
    for i in range(a.trials):
        r = trial(i, a, rng)
        out.append(r)
        print(f"trial {i}: rank {r['culprit']} {r['mode']}s op #{r['op']}: "
              f"{'ok' if r['ok'] else 'FAIL ' + '; '.join(r['problems'])} (status {r['status_s']})", flush=True)
    ok = sum(r["ok"] for r in out)
    print(f"{ok}/{len(out)} trials passed every check ({a.ranks} ranks, {a.transport}, HARP_TIMEOUT={a.timeout}, "
          f"HARP_STALL_WARNING_S={a.warn}); load {os.getloadavg()[0]:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"stamp": stamp(), "command": " ".join([sys.executable] + sys.argv), "passed": ok,
                       "trials": out}, f, indent=1)
    return 0 if ok == len(out) else 1


if __name__ == "__main__":
    sys.exit(main())
