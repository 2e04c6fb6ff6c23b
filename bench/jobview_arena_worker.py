"""A rank for the job view on the arena (bench/RESULTS-observe.md, "Job view on the arena"): allreduces
forever, stays alive after a peer's failure, status sockets in a folder per emulated host
($JV_DIR/status-<hostname>, JV_DIR default /tmp/jv/arena), its rank, pid and host in $JV_DIR/rank.<rank>.

JV_MODE=mismatch: the ranks loop allreduces until $JV_DIR/go exists (agreed every 50 calls by a max-allreduce),
then rank JV_BAD (default 5) calls broadcast where every other rank calls allreduce (the same sequence
number), and every rank waits there (or, once the mismatch is found, stays) for the view."""
import json
import os
import socket
import time

import numpy as np

host = socket.gethostname()
top = os.environ.get("JV_DIR", "/tmp/jv/arena")
d = f"{top}/status-{host}"
os.makedirs(d, mode=0o700, exist_ok=True)
os.environ["HARP_STATUS_DIR"] = d
os.environ["HARP_KEEPALIVE_TIMEOUT"] = "300"
os.environ["HARP_STALL_WARNING_S"] = "600"
import harp  # noqa: E402 - after HARP_STATUS_DIR is set
comm = harp.init(timeout=600)
with open(f"{top}/rank.{comm.rank}", "w") as f:
    json.dump({"rank": comm.rank, "pid": os.getpid(), "host": host}, f)
x = np.ones(1024, np.float32)
mismatch = os.environ.get("JV_MODE") == "mismatch"
bad = int(os.environ.get("JV_BAD", "5"))
i = 0
try:
    while True:
        comm.allreduce(x)
        i += 1
        if mismatch and i % 50 == 0:
            go = np.array([1.0 if os.path.exists(f"{top}/go") else 0.0], np.float32)
            comm.allreduce(go, op="max")
            if go[0]:
                break
        time.sleep(0.005)
    if comm.rank == bad:
        comm.broadcast(x, root=0)
    else:
        comm.allreduce(x)
except harp.HarpError:
    pass
while True:
    time.sleep(1)
