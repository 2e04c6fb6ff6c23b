"""A rank for the job view on the arena (bench/RESULTS-observe.md, "Job view on the arena"): allreduces
forever, stays alive after a peer's failure, status sockets in a folder per emulated host
(/tmp/jv/arena/status-<hostname>), its rank, pid and host in /tmp/jv/arena/rank.<rank>."""
import json
import os
import socket
import time

import numpy as np

host = socket.gethostname()
d = f"/tmp/jv/arena/status-{host}"
os.makedirs(d, mode=0o700, exist_ok=True)
os.environ["HARP_STATUS_DIR"] = d
os.environ["HARP_KEEPALIVE_TIMEOUT"] = "300"
os.environ["HARP_STALL_WARNING_S"] = "600"
import harp  # noqa: E402 - after HARP_STATUS_DIR is set
comm = harp.init(timeout=600)
with open(f"/tmp/jv/arena/rank.{comm.rank}", "w") as f:
    json.dump({"rank": comm.rank, "pid": os.getpid(), "host": host}, f)
x = np.ones(1024, np.float32)
try:
    while True:
        comm.allreduce(x)
        time.sleep(0.005)
except harp.HarpError:
    pass
while True:
    time.sleep(1)
