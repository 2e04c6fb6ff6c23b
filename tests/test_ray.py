"""harp.ray: HARP under a real local Ray cluster (the `ray` package), 4 CPU actors.

ray.util.collective with backend="harp": every collective checked against values each actor
computes itself; and Ray Train's TorchTrainer with TorchConfig(backend="harp") trains a DDP
model to the parameters that stepping one model with both workers' mean gradient gives.
"""
import os
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

import harp  # noqa: E402

PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(harp.__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
N = 4


@pytest.fixture(scope="module")
def ray_cluster():
    env = {"PYTHONPATH": os.pathsep.join([PYDIR, HERE] + [p for p in sys.path if p]), "OMP_NUM_THREADS": "1"}
    runtime_env = {"env_vars": env}
    from importlib.metadata import entry_points
    if not any(e.name == "harp" for e in entry_points(group="torch.backends")):
        # a source tree (PYTHONPATH=python), not an installed wheel: no entry point to load the backend
        # in Ray Train's workers, so register it there as `import harp.torch` would
        runtime_env["worker_process_setup_hook"] = "harp.torch.register"
    ray.init(num_cpus=N, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env,
             _temp_dir="/var/tmp/harp-ray")
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(num_cpus=1)
class Worker:
    def __init__(self, rank):
        import harp.ray
        harp.ray.register()
        self.rank = rank

    def setup(self, world):
        import ray.util.collective as col
        col.init_collective_group(world_size=world, rank=self.rank, backend="harp", group_name="g")
        return col.get_collective_group_size("g")

    def run(self):
        import ray.util.collective as col
        from ray.util.collective.types import ReduceOp
        r, out = self.rank, {}
        a = np.arange(1001, dtype=np.float64) * (r + 1)
        col.allreduce(a, group_name="g")
        out["allreduce_np"] = a
        t = torch.full((7,), float(r + 1), dtype=torch.bfloat16)
        col.allreduce(t, group_name="g", op=ReduceOp.MAX)
        out["allreduce_bf16_max"] = t.float().numpy()
        m = torch.tensor([r + 2], dtype=torch.int64)
        col.allreduce(m, group_name="g", op=ReduceOp.PRODUCT)
        out["allreduce_prod"] = m.numpy()
        b = np.full(5, r, np.int32)
        col.broadcast(b, src_rank=2, group_name="g")
        out["broadcast"] = b
        outs = [torch.zeros(3) for _ in range(N)]
        col.allgather(outs, torch.full((3,), float(r)), group_name="g")
        out["allgather"] = np.stack([o.numpy() for o in outs])
        rs = torch.zeros(2)
        col.reducescatter(rs, [torch.full((2,), float(r * 10 + j)) for j in range(N)], group_name="g")
        out["reducescatter"] = rs.numpy()
        red = np.full(3, float(r), np.float32)
        col.reduce(red, dst_rank=1, group_name="g")
        out["reduce"] = red
        col.barrier(group_name="g")
        # a ring of send/recv: even ranks send first
        nxt, prv = (r + 1) % N, (r - 1) % N
        got = np.zeros(4, np.float32)
        if r % 2 == 0:
            col.send(np.full(4, r, np.float32), nxt, group_name="g")
            col.recv(got, prv, group_name="g")
        else:
            col.recv(got, prv, group_name="g")
            col.send(np.full(4, r, np.float32), nxt, group_name="g")
        out["ring"] = got
        col.destroy_collective_group("g")
        return out


def test_ray_collective_with_the_harp_backend(ray_cluster):
    workers = [Worker.remote(r) for r in range(N)]
    assert ray.get([w.setup.remote(N) for w in workers], timeout=300) == [N] * N
    res = ray.get([w.run.remote() for w in workers], timeout=300)
    total = sum(range(1, N + 1))
    for r, o in enumerate(res):
        assert np.array_equal(o["allreduce_np"], np.arange(1001) * float(total))
        assert np.array_equal(o["allreduce_bf16_max"], np.full(7, float(N)))
        assert o["allreduce_prod"][0] == np.prod([q + 2 for q in range(N)])
        assert np.array_equal(o["broadcast"], np.full(5, 2))
        assert np.array_equal(o["allgather"], np.repeat(np.arange(N, dtype=np.float32)[:, None], 3, 1))
        assert np.array_equal(o["reducescatter"], np.full(2, sum(q * 10 + r for q in range(N)), np.float32))
        if r == 1:
            assert np.array_equal(o["reduce"], np.full(3, float(sum(range(N)))))
        assert np.array_equal(o["ring"], np.full(4, (r - 1) % N, np.float32))


def _model_and_batches(rank, steps=5):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    g = torch.Generator().manual_seed(rank)
    return model, [torch.randn(16, 8, generator=g) for _ in range(steps)]


def _train_fn(config):
    """The plain DDP loop a Ray Train user writes; only TorchConfig(backend=...) names HARP."""
    import json
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches = _model_and_batches(rank)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for x in batches:
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        with open(config["out"], "w") as f:
            json.dump({"backend": dist.get_backend(), "world": world,
                       "params": [p.detach().double().flatten().tolist() for p in model.parameters()]}, f)


def test_ray_train_torch_config_backend_harp(ray_cluster, tmp_path):
    """TorchTrainer(torch_config=TorchConfig(backend="harp")) trains 2 workers to the parameters that
    training on the mean of both workers' gradients gives (computed here, alone)."""
    import json
    pytest.importorskip("ray.train.torch")
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    out = tmp_path / "result.json"
    trainer = TorchTrainer(_train_fn, train_loop_config={"out": str(out)}, torch_config=TorchConfig(backend="harp"),
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path="/var/tmp/harp-ray-train", name="harp"))
    res = trainer.fit()
    assert res.error is None, res.error
    got = json.loads(out.read_text())
    assert got["backend"] == "harp" and got["world"] == 2, got
    # reference: one model stepped with the average of both ranks' gradients
    model, _ = _model_and_batches(0)
    batches = [_model_and_batches(r)[1] for r in range(2)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(2):
            model.zero_grad()
            x = batches[r][step]
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            for gsum, p in zip(grads, model.parameters()):
                gsum += p.grad / 2
        for gsum, p in zip(grads, model.parameters()):
            p.grad = gsum
        opt.step()
    for a, p in zip(got["params"], model.parameters()):
        assert np.allclose(a, p.detach().double().flatten().numpy(), rtol=1e-5, atol=1e-6)
