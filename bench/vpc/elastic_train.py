"""Elastic data-parallel training on the arena: ranks killed at random times, training goes on.

    python3 bench/vpc/elastic_train.py --hosts 4 --ppn 2 --kills 3 --out results/arena/elastic.json

One run = two arena jobs on the same cluster: undisturbed (--kills 0), then with --kills K. The model is a
two-layer MLP (numpy, float64) fit to a fixed synthetic regression set; every step takes the same global
batch (--batch samples), split evenly over the current workers, gradients averaged with one allreduce per
step (data parallel, as DDP does). Because the global batch does not depend on the number of workers, the
loss curve of a run that loses workers should match the undisturbed one up to summation order.

harp.elastic.run drives the loop: State(w1, w2, step) committed every --commit steps; at K random (step,
victim) points drawn from --seed (victim never rank 0, which hosts nothing special here: the harp
launcher's store is outside every host), the victim SIGKILLs itself a random fraction into that step;
the survivors agree, shrink, restore the last commit, re-sync from rank 0 and go on (no replacement).

--ddp: the same run with torch DDP over the "harp" backend (init_process_group("harp"), env:// with the
store on rank 0, which is never a victim). The model is the same MLP shape in torch (float64), SGD with
momentum; DDP averages gradients, so each rank's loss is its shard's summed squared error x size / batch and
the step's gradient is the global batch's whatever the number of workers. The committed state is
(model.state_dict(), optimizer.state_dict(), step). On a failure (DistBackendError from backward or an
allreduce) the survivors call harp.elastic.shrink_torch_group (revoke + agree on the group's HARP
communicator: the lost ranks; dist.shrink_group of them), drop the old DDP, restore the commit into the same
model and optimizer, rebuild DDP on the shrunken default group (its constructor broadcasts the parameters
from the lowest survivor) and broadcast the optimizer's momentum and the step from it too.

Reports final loss (both runs and their ratio), wall time of both runs, and per failure: the recovery
time (from the error to the restored state, harp.elastic.Reset.seconds) and the steps recomputed; time
lost per failure = (disturbed - undisturbed wall time) / K. JSON stamped (stamp.py), command and load.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "..", "python")
sys.path.insert(0, os.path.abspath(PYDIR))
sys.path.insert(0, HERE)


def _data(n, d_in, seed=7):
    import numpy as np

    g = np.random.default_rng(seed)
    x = g.standard_normal((n, d_in))
    w = g.standard_normal((d_in, 1)) / np.sqrt(d_in)
    return x, np.tanh(x @ w) + 0.05 * g.standard_normal((n, 1))


def _plan(a, size):
    rng = random.Random(a["seed"])
    steps = sorted(rng.sample(range(a["commit"] + 1, a["steps"] - 1), a["kills"]))
    return [(s, rng.randrange(1, size - i), rng.random()) for i, s in enumerate(steps)]


def worker(a):
    import numpy as np

    import harp
    import harp.elastic as elastic

    comm = harp.init()
    x, y = _data(a["samples"], a["d_in"])
    g = np.random.default_rng(1)
    state = elastic.State(w1=g.standard_normal((a["d_in"], a["hidden"])) / np.sqrt(a["d_in"]),
                          w2=np.zeros((a["hidden"], 1)), step=0)
    plan = {s: (v, frac) for s, v, frac in _plan(a, comm.size)}
    resets, step_s, losses, reached = [], [], {}, [0]

    def train(c, st):
        while st.step < a["steps"]:
            t0 = time.monotonic()
            reached[0] = max(reached[0], st.step)
            lo = (st.step * a["batch"]) % a["samples"]
            idx = np.arange(lo, lo + a["batch"]) % a["samples"]
            mine = np.array_split(idx, c.size)[c.rank]
            h = np.tanh(x[mine] @ st.w1)
            err = h @ st.w2 - y[mine]
            grad = np.concatenate([(x[mine].T @ ((err @ st.w2.T) * (1 - h * h))).ravel(), (h.T @ err).ravel(),
                                   [float((err * err).sum())]]) * (2.0 / a["batch"])
            if st.step in plan and c.rank == plan[st.step][0]:
                threading.Timer(plan[st.step][1] * 0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
                time.sleep(0.06)  # dies in (or right before) this step's allreduce
            c.allreduce(grad)  # sum of the shards' parts = the global batch's gradient
            n1 = st.w1.size
            st.w1 = st.w1 - a["lr"] * grad[:n1].reshape(st.w1.shape)
            st.w2 = st.w2 - a["lr"] * grad[n1:-1].reshape(st.w2.shape)
            losses[st.step] = grad[-1] / 2.0  # mean squared error of the batch, before the update
            st.step += 1
            step_s.append(time.monotonic() - t0)
            if st.step % a["commit"] == 0:
                st.commit()
        return c

    def on_reset(r):
        for s in [s for s in plan if s <= reached[0]]:  # a kill happens once, not again when its step is redone
            del plan[s]
        resets.append({"failed": r.failed, "old_size": r.old_size, "new_size": r.comm.size, "seconds": r.seconds,
                       "resumed_at_step": state.step, "reached": reached[0]})

    t0 = time.monotonic()
    last = elastic.run(train, comm, state, min_workers=2, on_reset=on_reset)
    wall = time.monotonic() - t0
    final = float(np.mean([losses[s] for s in range(a["steps"] - 10, a["steps"])]))
    if last.rank == 0:
        with open(os.path.join(a["outdir"], "result.json"), "w") as f:
            json.dump({"wall_s": wall, "final_loss": final, "resets": resets, "final_size": last.size,
                       "step_s_median": sorted(step_s)[len(step_s) // 2]}, f)
    if last is not comm:
        last.destroy()
    comm.destroy()


def _torch_model(d_in, hidden):
    import torch

    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)).double()


def _ddp(model):
    """Plain DDP (its own C++ allreduce path). The figures in bench/RESULTS-vpc.md from before commit
    8a058c3 were taken with torch's Python allreduce_hook registered instead (same sum / world size),
    because a failed "harp" allreduce then crashed DDP's C++ path (SIGSEGV in backward); 8a058c3 fixed
    that in python/harp/torch/_work.py (tests/test_ft.py's DDP test covers it)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, broadcast_buffers=False)


def _resync(model, opt, step):
    """Collective on the default group: every rank takes the lowest survivor's (new rank 0's) state."""
    import torch
    import torch.distributed as dist

    for p in model.parameters():
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            dist.broadcast(buf, 0)
    s = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(s, 0)
    return int(s[0])


def worker_ddp(a):
    """--ddp: torch DDP on the "harp" backend, shrunk with dist.shrink_group on each failure."""
    import copy
    import datetime
    import gc

    import numpy as np
    import torch
    import torch.distributed as dist
    import harp._env
    import harp.elastic as elastic
    import harp.torch  # noqa: F401  registers "harp"

    torch.set_num_threads(1)
    rank, size, _ = harp._env.launch_env()
    dist.init_process_group("harp", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=120))
    xn, yn = _data(a["samples"], a["d_in"])
    x, y = torch.from_numpy(xn), torch.from_numpy(yn)
    model = _torch_model(a["d_in"], a["hidden"])
    opt = torch.optim.SGD(model.parameters(), lr=a["lr"], momentum=a["momentum"])
    ddp = _ddp(model)
    plan = {s: (v, frac) for s, v, frac in _plan(a, size)}
    resets, step_s, losses, reached, step = [], [], {}, 0, 0
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), 0)
    t_start = time.monotonic()
    while step < a["steps"]:
        err = None
        try:
            t0 = time.monotonic()
            reached = max(reached, step)
            w, r = dist.get_world_size(), dist.get_rank()
            lo = (step * a["batch"]) % a["samples"]
            mine = torch.from_numpy(np.array_split(np.arange(lo, lo + a["batch"]) % a["samples"], w)[r])
            sse = ((ddp(x[mine]) - y[mine]) ** 2).sum()
            if step in plan and r == plan[step][0]:
                threading.Timer(plan[step][1] * 0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
                time.sleep(0.06)  # dies in (or right before) this step's gradient allreduce
            opt.zero_grad(set_to_none=True)
            (sse * (w / a["batch"])).backward()  # DDP's average of these = the global batch's gradient
            if step >= a["steps"] - 10:
                tot = sse.detach().clone()
                dist.all_reduce(tot)
                losses[step] = float(tot) / a["batch"]
            opt.step()
            step += 1
            step_s.append(time.monotonic() - t0)
            if step % a["commit"] == 0:
                saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), step)
        except (RuntimeError, harp.HarpError) as e:  # dist.DistBackendError is a RuntimeError
            err = f"{type(e).__name__}: {e}"  # not `e`: its traceback's frames would keep the old DDP alive
        if err is None:
            continue
        t0, old, sse = time.monotonic(), dist.get_world_size(), None
        del ddp
        gc.collect()  # the old reducer's autograd hooks go with it
        _, failed = elastic.shrink_torch_group(min_workers=2, err=harp.HarpError(err))
        t_shrunk = time.monotonic()
        model.load_state_dict(saved[0])
        opt.load_state_dict(copy.deepcopy(saved[1]))  # load_state_dict adopts the tensors: SGD would
        # then update the commit's momentum in place, and a second restore of the same commit would be wrong
        ddp = _ddp(model)  # broadcasts the parameters from the lowest survivor
        step = _resync(model, opt, saved[2])
        for s in [s for s in plan if s <= reached]:  # a kill happens once, not again when its step is redone
            del plan[s]
        resets.append({"failed": failed, "old_size": old, "new_size": dist.get_world_size(),
                       "seconds": time.monotonic() - t0, "shrink_s": t_shrunk - t0, "resumed_at_step": step,
                       "reached": reached,
                       "error": err[:300]})
    wall = time.monotonic() - t_start
    if dist.get_rank() == 0:
        with open(os.path.join(a["outdir"], "result.json"), "w") as f:
            json.dump({"wall_s": wall, "final_loss": float(np.mean([losses[s] for s in sorted(losses)[-10:]])),
                       "resets": resets, "final_size": dist.get_world_size(), "mode": "ddp",
                       "step_s_median": sorted(step_s)[len(step_s) // 2]}, f)
    del ddp
    dist.destroy_process_group()


def main():
    from harp_dev.cluster import net, runner, topology as topo
    from stamp import stamp

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="elastic")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ppn", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--commit", type=int, default=10)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--d-in", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--ddp", action="store_true", help="torch DDP on the 'harp' backend (dist.shrink_group)")
    ap.add_argument("--momentum", type=float, default=0.9, help="--ddp: SGD momentum (in the committed state)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, a.hosts, rate=a.rate)
    record = {"command": " ".join(sys.argv), "stamp_before": stamp(),
              "keepalive": {k: os.environ.get(k) for k in ("HARP_KEEPALIVE_INTERVAL", "HARP_KEEPALIVE_TIMEOUT")},
              "cluster": {k: st[k] for k in ("hosts", "rate", "mtu", "congestion")}, "runs": {}}
    try:
        for label, kills in (("undisturbed", 0), ("killed", a.kills)):
            outdir = tempfile.mkdtemp(prefix="elastic-", dir="/tmp")
            args = {"kills": kills, "steps": a.steps, "commit": a.commit, "batch": a.batch, "samples": a.samples,
                    "d_in": a.d_in, "hidden": a.hidden, "lr": a.lr, "seed": a.seed, "outdir": outdir,
                    "ddp": a.ddp, "momentum": a.momentum}
            env = dict(os.environ, PYTHONPATH=os.path.abspath(PYDIR), HARP_TIMEOUT="120", OMP_NUM_THREADS="1")
            rc = runner.run(st, "harp", a.hosts, a.ppn, [sys.executable, os.path.abspath(__file__), "_worker",
                                                         json.dumps(args)], timeout=a.timeout, grace=1e9, env=env)
            res = json.load(open(os.path.join(outdir, "result.json"))) if os.path.exists(
                os.path.join(outdir, "result.json")) else None
            record["runs"][label] = {"job_rc": rc, "plan": _plan(args, a.hosts * a.ppn) if kills else [],
                                     "result": res}
    finally:
        if made:
            net.down(st)
    u, k = record["runs"]["undisturbed"]["result"], record["runs"]["killed"]["result"]
    if u and k:
        record["summary"] = {
            "final_loss_undisturbed": u["final_loss"], "final_loss_killed": k["final_loss"],
            "loss_ratio": k["final_loss"] / u["final_loss"], "wall_undisturbed_s": u["wall_s"],
            "wall_killed_s": k["wall_s"], "final_size": k["final_size"], "resets": len(k["resets"]),
            "recovery_s": [r["seconds"] for r in k["resets"]],
            "shrink_s": [r["shrink_s"] for r in k["resets"] if "shrink_s" in r],
            "time_lost_per_failure_s": (k["wall_s"] - u["wall_s"]) / max(1, len(k["resets"])),
            "step_s_median_undisturbed": u["step_s_median"], "mode": "ddp" if a.ddp else "numpy",
            # completed steps rolled back per failure (the step in flight is redone as well)
            "steps_redone": [r["reached"] - r["resumed_at_step"] for r in k["resets"] if "reached" in r]}
    record["stamp_after"] = stamp()
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record.get("summary", record["runs"]), indent=1))
    return 0 if record.get("summary", {}).get("resets") == a.kills else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        args = json.loads(sys.argv[2])
        (worker_ddp if args.get("ddp") else worker)(args)
    else:
        sys.exit(main())
