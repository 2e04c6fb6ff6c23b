"""The Ray Train driver of `harp-cluster run --launcher ray`: an unmodified
training script as the train loop of a TorchTrainer.

    python -m harp_dev.cluster.ray_job --address HEAD:6379 --nodes 3 --workers 3 [--backend harp] -- script.py ARGS...

The arena's ray launcher starts one Ray node per emulated host (`ray start
--block`, each node with `harp_slot` resources = ranks per host, so Ray places
exactly that many workers on it) and this driver on host 0. The driver waits for
every node to join, then runs TorchTrainer(torch_config=TorchConfig(backend=...)):
Ray Train sets MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK in every
worker and initializes the process group with that backend itself. The script,
written for torchrun/mpirun/srun, calls init_process_group(backend, ...) again;
in the workers that call returns at once when the group Ray Train made has the
same backend (otherwise it raises as torch would), so the script runs as it is
on Ray's group. Its stdout reaches the driver through Ray's log forwarding,
prefixed with the worker's name. Exits non-zero when training fails.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
import time


def _loop(config):
    """Ray Train worker: run the script as __main__ on Ray Train's process group."""
    import torch.distributed as dist

    original = dist.init_process_group

    def init_once(backend=None, *args, **kwargs):
        if dist.is_initialized():
            have = dist.get_backend()
            if backend is None or str(backend) == have:
                return None
            raise RuntimeError(f"init_process_group({backend!r}): Ray Train already made a '{have}' group "
                               f"(harp-cluster run --launcher ray --backend {backend})")
        return original(backend, *args, **kwargs)

    dist.init_process_group = init_once
    try:
        sys.argv = list(config["argv"])
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        dist.init_process_group = original


def _connect(ray, address, runtime_env, timeout):
    """ray.init, retried while the head node is still starting (it may restart on a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        except ConnectionError as e:
            ray.shutdown()
            if time.monotonic() > deadline:
                raise SystemExit(f"harp-cluster ray driver: no Ray head at {address} within {timeout:g} s: {e}")
            time.sleep(2)


def _wait_for_nodes(ray, n, timeout):
    deadline = time.monotonic() + timeout
    while True:
        alive = [x for x in ray.nodes() if x.get("Alive")]
        if len(alive) >= n:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"harp-cluster ray driver: {len(alive)} of {n} Ray nodes joined within {timeout:g} s")
        time.sleep(0.5)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m harp_dev.cluster.ray_job")
    ap.add_argument("--address", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--backend", default="harp")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for the Ray nodes to join")
    ap.add_argument("script", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    script = a.script[1:] if a.script[:1] == ["--"] else a.script
    if script and os.path.basename(script[0]).startswith("python"):
        script = script[1:]  # the arena passes `python script.py ...`; Ray's workers are Python already
    if not script or not script[0].endswith(".py"):
        ap.error("give the training script: -- script.py [args]")
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    env = {k: os.environ[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME") if k in os.environ}
    runtime_env = {"env_vars": env}
    from importlib.metadata import entry_points
    if not any(e.name == "harp" for e in entry_points(group="torch.backends")):
        runtime_env["worker_process_setup_hook"] = "harp.torch.register"  # a source tree: no entry point
    _connect(ray, a.address, runtime_env, a.timeout)
    _wait_for_nodes(ray, a.nodes, a.timeout)
    storage = tempfile.mkdtemp(prefix="harp-ray-train-", dir="/var/tmp")
    trainer = TorchTrainer(
        _loop, train_loop_config={"argv": [os.path.abspath(script[0])] + script[1:]},
        torch_config=TorchConfig(backend=a.backend),
        scaling_config=ScalingConfig(num_workers=a.workers, use_gpu=False,
                                     resources_per_worker={"CPU": 1, "harp_slot": 1}),
        run_config=RunConfig(storage_path=storage, name="harp-cluster"))
    result = trainer.fit()
    if result.error is not None:
        print(f"harp-cluster ray driver: training failed: {result.error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
