"""Per-call cost of one allreduce on ONE rank (no communication): harp Python API, the raw
pybind submit, and mpi4py. Run: PYTHONPATH=python chrt -f 5 python3 bench/shm_tools/python_call_overhead.py"""
import os, time, numpy as np
os.environ.update(HARP_RANK='0', HARP_WORLD_SIZE='1', HARP_ADDR='127.0.0.1:29433', HARP_SECRET=os.urandom(16).hex())
import harp
from mpi4py import MPI
c = harp.init(); x = np.zeros(2, np.float32)
m = MPI.COMM_WORLD
for k in range(2):
    t = time.perf_counter()
    for i in range(20000): c.allreduce(x)
    h = (time.perf_counter() - t) / 20000 * 1e6
    t = time.perf_counter()
    for i in range(20000): m.Allreduce(MPI.IN_PLACE, x)
    mm = (time.perf_counter() - t) / 20000 * 1e6
    t = time.perf_counter()
    for i in range(20000): c._c.submit(0, x.ctypes.data, x.ctypes.data, 2, 8, 0, 0, -1, 0, "", -1.0, False, [], [], [], [])
    raw = (time.perf_counter() - t) / 20000 * 1e6
    print(f"1 rank: harp.allreduce {h:.2f} us, raw submit {raw:.2f} us, mpi4py Allreduce {mm:.2f} us")
