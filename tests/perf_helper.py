"""tests/test_perf.py's two-rank helper: the buffers, calls and result checks both
ranks share, and rank 1's loop (python tests/perf_helper.py, with PERF_UID and
PERF_TRANSPORT set): wait for rank 0's broadcast command (collective index, count,
calls), make exactly `calls` matching calls, check the result with numpy, write
this rank's wrong-value count to PERF_DIR/wrong<k> (k: the command's number, from
0) and enter a barrier, after which rank 0 reads the file and asserts on it; a
negative index stops. The count never travels through the library measured.
"""
import os

import numpy as np

COLLS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "barrier"]


def buffers(coll, n, rank, size):
    send = (np.arange(n, dtype=np.float32) % 7 + 1 + rank * 10).astype(np.float32)
    out_n = {"allgather": n * size, "reduce_scatter": n // size}.get(coll, n)
    return send, np.zeros(out_n, np.float32)


def call(comm, coll, send, out):
    if coll == "allreduce":
        comm.allreduce(send, out)
    elif coll == "broadcast":
        comm.broadcast(send if comm.rank == 0 else out, root=0)
    elif coll == "reduce":
        comm.reduce(send, out, root=0)
    elif coll == "allgather":
        comm.allgather(send, out)
    elif coll == "reduce_scatter":
        comm.reduce_scatter(send, out)
    elif coll == "alltoall":
        comm.alltoall(send, out)
    else:
        comm.barrier()


def wrong(comm, coll, send, out):
    """How many output values differ from what the collective must produce."""
    r, size, n = comm.rank, comm.size, send.size
    ins = [(np.arange(n, dtype=np.float32) % 7 + 1 + q * 10).astype(np.float32) for q in range(size)]
    if coll == "allreduce" or (coll == "reduce" and r == 0):
        exp = sum(ins)
    elif coll == "broadcast":
        exp, out = ins[0], (send if r == 0 else out)
    elif coll == "allgather":
        exp = np.concatenate(ins)
    elif coll == "reduce_scatter":
        per = n // size
        exp = sum(ins)[r * per:(r + 1) * per]
    elif coll == "alltoall":
        per = n // size
        exp = np.concatenate([ins[q][r * per:(r + 1) * per] for q in range(size)])
    else:
        return 0
    return int(np.count_nonzero(out != exp))


def report_path(k):
    return os.path.join(os.environ["PERF_DIR"], f"wrong{k}")


def rank1():
    import harp

    comm = harp.Communicator(1, 2, harp.UniqueId.from_hex(os.environ["PERF_UID"]),
                             transport=os.environ["PERF_TRANSPORT"])
    k = 0
    while True:
        cmd = np.zeros(3, np.int64)
        comm.broadcast(cmd, root=0)
        if cmd[0] < 0:
            break
        coll, n, calls = COLLS[int(cmd[0])], int(cmd[1]), int(cmd[2])
        send, out = buffers(coll, n, 1, 2)
        for _ in range(calls):
            call(comm, coll, send, out)
        with open(report_path(k) + ".tmp", "w") as f:
            f.write(str(wrong(comm, coll, send, out)))
        os.replace(report_path(k) + ".tmp", report_path(k))
        k += 1
        comm.barrier()
    comm.destroy()


if __name__ == "__main__":
    rank1()
