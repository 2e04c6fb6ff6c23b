"""Local-user attacks on the files HARP makes: flight-record dumps, the status folder, harp-status,
harp.elastic's state sync and harp-cluster's hugetlbfs mount.

The tests run as root (the CI machine) and play the other local user with a forked child that drops to
uid/gid 65534 (nobody), in a sticky world-writable folder made for the test (like /tmp); they are skipped
where the process is not root.
"""
import json
import os
import pickle
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import harp
import harp.debug
from harp import status as hstatus
from harness import run_ranks

OTHER = 65534  # nobody

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="plays a second user with setuid: needs root")


def as_other(fn, *args):
    """Run fn(*args) in a forked child as uid/gid OTHER; raises if it failed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(OTHER)
            os.setuid(OTHER)
            fn(*args)
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported by the exit code
            print(f"as_other: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            os._exit(code)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, "the other user's action failed"


@pytest.fixture
def shared():
    """A sticky folder every user may write, like /tmp."""
    d = tempfile.mkdtemp(prefix="harp-sec-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    subprocess.run(["rm", "-rf", d])


def _private_of_me(d):
    st = os.lstat(d)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077 == 0


# -- flight-record dumps -------------------------------------------------------------------------------------

@root_only
def test_dump_does_not_write_through_a_planted_symlink(shared, tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's secret")
    os.chmod(victim, 0o600)
    prefix = f"{shared}/fr_"
    monkeypatch.setenv("HARP_FR_DUMP_PREFIX", prefix)
    monkeypatch.setenv("RANK", "0")
    names = [f"{prefix}0", f"{prefix}0.tmp{os.getpid()}"]  # the dump and the old code's temporary name

    def plant():
        for n in names:
            os.symlink(str(victim), n)

    as_other(plant)
    path = harp.debug.dump("symlink test")
    assert victim.read_bytes() == b"root's secret"
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    with open(path, "rb") as f:
        assert pickle.load(f)["harp"]["reason"] == "symlink test"


@root_only
def test_dump_never_lands_in_a_file_another_user_made(shared, monkeypatch):
    prefix = f"{shared}/fr_"
    monkeypatch.setenv("HARP_FR_DUMP_PREFIX", prefix)
    monkeypatch.setenv("RANK", "3")
    names = [f"{prefix}3", f"{prefix}3.tmp{os.getpid()}"]

    def precreate():
        for n in names:
            with open(n, "wb") as f:
                f.write(b"attacker's")
            os.chmod(n, 0o666)

    as_other(precreate)
    theirs = [open(n, "rb") for n in names]  # their inodes, whatever happens to the names
    try:
        path = harp.debug.dump()
        st = os.lstat(path)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, "the dump is not the dumping user's"
        for f in theirs:
            assert os.fstat(f.fileno()).st_ino != st.st_ino
            assert f.read() == b"attacker's", "another user's file was truncated"
    finally:
        for f in theirs:
            f.close()


@root_only
def test_default_dump_goes_to_a_private_folder_of_the_user(shared, monkeypatch):
    monkeypatch.delenv("HARP_FR_DUMP_PREFIX", raising=False)
    monkeypatch.setenv("TMPDIR", shared)
    monkeypatch.setenv("RANK", "4242")
    path = harp.debug.dump()
    try:
        folder = os.path.dirname(path)
        assert os.path.dirname(folder) == shared and _private_of_me(folder), path
        assert os.path.basename(path) == "harp_trace_rank_4242"
    finally:
        os.unlink(path)


@root_only
@pytest.mark.parametrize("how", ["folder", "symlink"])
def test_default_dump_folder_made_first_by_another_user_is_not_used(shared, tmp_path, monkeypatch, how):
    monkeypatch.delenv("HARP_FR_DUMP_PREFIX", raising=False)
    monkeypatch.setenv("TMPDIR", shared)
    monkeypatch.setenv("RANK", "1")
    squat = f"{shared}/harp-trace-{os.getuid()}"
    target = tmp_path / "elsewhere"
    target.mkdir()

    def take():
        if how == "folder":
            os.mkdir(squat)
            os.chmod(squat, 0o777)
        else:
            os.symlink(str(target), squat)

    as_other(take)
    path = harp.debug.dump()
    folder = os.path.dirname(path)
    assert _private_of_me(folder) and os.path.dirname(folder) == shared, path
    assert os.path.realpath(folder) != os.path.realpath(squat)
    assert not os.listdir(target) and (how == "symlink" or not os.listdir(squat))
    again = harp.debug.dump()
    assert again == path, "each dump of a process goes to the same folder"


# -- the status folder and harp-status -----------------------------------------------------------------------

FORGED = {"pid": 1, "host": "forged\x1b[2J\x1b]0;pwned\x07", "global_rank": 0,
          "comms": [{"comm": "f0f0f0f0f0f0f0f0", "rank": 0, "size": 1, "hosts": ["h\x1b[31m"], "pids": [1],
                     "transport": "tcp\r\nrank 9 pid 9 fake line", "started": 1, "completed": 1, "ops": 1,
                     "in_flight": None, "stall_view": "\x1b[1;1H\x9b2J", "global_ranks": [0],
                     "timeout_s": 1, "metrics": []}]}


def _serve(path, answer, ready, stop):
    """A status socket that answers `answer` (bytes) to every request until stop is set."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(4)
    s.settimeout(0.2)
    ready.set()
    while not stop.is_set():
        try:
            c, _ = s.accept()
        except socket.timeout:
            continue
        with c:
            c.settimeout(1)
            try:
                c.recv(64)
                c.sendall(answer)
            except OSError:
                pass
    s.close()


def _forger(folder, answer, seconds):
    """As the other user: squat the folder (0777) and serve a forged answer there."""
    os.mkdir(folder)
    os.chmod(folder, 0o777)
    ready, stop = threading.Event(), threading.Event()
    threading.Timer(seconds, stop.set).start()
    _serve(f"{folder}/{os.getpid()}.sock", answer, ready, stop)


def _wait_rank(rank, size, flag):
    comm = harp.init()
    comm.allreduce(np.ones(2, np.float32))
    for _ in range(400):
        if os.path.exists(flag):
            break
        time.sleep(0.05)
    return os.getpid()


ONE_RANK = """
import glob, os, sys
import numpy as np
import harp
uid = harp.get_unique_id("127.0.0.1:0")  # owns the store: kept until the rank joined
os.environ.update(HARP_UNIQUE_ID=uid.hex(), HARP_RANK="0", HARP_WORLD_SIZE="1")
harp.init().allreduce(np.ones(2))
print(len(glob.glob(os.environ["XDG_RUNTIME_DIR"] + f"/harp-status-{os.getuid()}.*/*.sock")))
"""


def _control_chars(text):
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) < 0xa0]


@root_only
def test_squatted_status_folder_the_rank_falls_back_and_harp_status_ignores_the_squatter(shared, tmp_path):
    folder = f"{shared}/harp-status-{os.getuid()}"
    pid = os.fork()
    if pid == 0:  # the squatter, in the background while the rank runs
        try:
            os.setgroups([])
            os.setgid(OTHER)
            os.setuid(OTHER)
            _forger(folder, json.dumps(FORGED).encode() + b"\n", 60)
        finally:
            os._exit(0)
    try:
        for _ in range(100):
            if os.path.isdir(folder) and os.listdir(folder):
                break
            time.sleep(0.05)
        flag = str(tmp_path / "done")
        env = {"XDG_RUNTIME_DIR": shared, "HARP_STATUS_DIR": "", "HARP_TRANSPORT": "tcp"}
        out = {}

        def ask():
            time.sleep(2)  # the rank is up and waiting
            envp = dict(os.environ, XDG_RUNTIME_DIR=shared, PYTHONPATH=os.pathsep.join(sys.path))
            envp.pop("HARP_STATUS_DIR", None)
            p = subprocess.run([sys.executable, "-m", "harp.status"], env=envp, capture_output=True,
                               text=True, timeout=30)
            out["text"] = p.stdout + p.stderr
            envp2 = dict(envp)
            p = subprocess.run([sys.executable, "-m", "harp.status", "--json"], env=envp2, capture_output=True,
                               text=True, timeout=30)
            out["json"] = p.stdout
            open(flag, "w").close()

        t = threading.Thread(target=ask)
        t.start()
        (rank_pid,) = run_ranks(1, _wait_rank, flag, env=env, timeout=60)
        t.join(40)
        text = out["text"]
        assert f"pid {rank_pid} " in text, text
        assert "f0f0f0f0f0f0f0f0" not in text and "forged" not in text, text
        assert not _control_chars(text), repr(text)
        comms = json.loads(out["json"])["comms"]
        assert [c["ranks"]["0"]["pid"] for c in comms] == [rank_pid]
        assert os.listdir(folder), "harp-status removed files in another user's folder"
        # A process that exits (atexit runs; the harness's ranks leave by os._exit) removes its fallback.
        for d in os.listdir(shared):
            if d.startswith(f"harp-status-{os.getuid()}."):
                subprocess.run(["rm", "-rf", os.path.join(shared, d)])
        p = subprocess.run([sys.executable, "-c", ONE_RANK], env=dict(os.environ, XDG_RUNTIME_DIR=shared,
                           PYTHONPATH=os.pathsep.join(sys.path)), capture_output=True, text=True, timeout=60)
        assert "using " + shared in p.stderr and p.stdout.strip() == "1", p.stdout + p.stderr
        assert not [d for d in os.listdir(shared) if d.startswith(f"harp-status-{os.getuid()}.")], \
            "the process left its fallback folder behind"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_harp_status_escapes_control_characters_from_a_socket(tmp_path, capsys):
    path = str(tmp_path / "1.sock")
    ready, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=_serve, args=(path, json.dumps(FORGED).encode() + b"\n", ready, stop))
    t.start()
    ready.wait(5)
    try:
        for argv in ([], ["--json"], ["--json", "--raw"]):
            hstatus.main(["--socket", path] + argv)
            text = capsys.readouterr().out
            assert "f0f0f0f0f0f0f0f0" in text
            assert not _control_chars(text), (argv, repr(text))
        err = tmp_path / "2.sock"
        stop.set()
        t.join()
        ready.clear()
        stop.clear()
        t = threading.Thread(target=_serve, args=(str(err), b'{"error": "\\u001b[2Jbad\\u0007"}\n', ready, stop))
        t.start()
        ready.wait(5)
        hstatus.main(["--socket", str(err), "--dump"])
        text = capsys.readouterr().out
        assert "bad" in text and not _control_chars(text), repr(text)
    finally:
        stop.set()
        t.join()


@root_only
def test_harp_status_refuses_a_folder_another_user_owns(shared, monkeypatch, capsys):
    folder = f"{shared}/theirs"
    dead = f"{folder}/999999999.sock"

    def make():
        os.mkdir(folder)
        os.chmod(folder, 0o777)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(dead)
        s.close()  # a socket nobody listens on, named for a process that does not exist

    as_other(make)
    monkeypatch.setenv("HARP_STATUS_DIR", folder)
    hstatus.main([])
    text = capsys.readouterr().out
    assert os.path.exists(dead), "harp-status unlinked a file in another user's folder"
    assert "not a private folder" in text, text


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
                     max_leaves=12)
_comm = st.fixed_dictionaries({"comm": st.text(), "rank": st.integers(0, 9) | st.integers(),
                               "size": st.integers(1, 9) | st.integers(),
                               "hosts": st.lists(st.text() | _json, max_size=3), "transport": st.text(),
                               "started": st.integers(0, 99), "completed": st.integers(0, 99),
                               "stall_view": st.text(), "in_flight": st.none() | _json})


@settings(max_examples=300, deadline=None)
@given(comms=st.lists(st.one_of(_comm, _json), max_size=3), extra=st.dictionaries(st.text(), _json, max_size=3),
       pid=_json, host=_json)
def test_any_answer_is_refused_by_name_or_printed_without_control_characters(comms, extra, pid, host):
    raw = json.dumps({**extra, "pid": pid, "host": host, "comms": comms}).encode()
    try:
        a = hstatus.parse_answer(raw)
    except ValueError as e:
        assert "malformed answer" in str(e)
        return
    answers = [("/x/1.sock", a), ("/x/2.sock", {"error": "\x1b[2J" + str(host)})]
    text = hstatus._text(hstatus.summarize(answers), answers)
    assert not _control_chars(text), repr(text)


@given(st.binary(max_size=200))
def test_garbage_answers_are_value_errors(raw):
    try:
        hstatus.parse_answer(raw)
    except ValueError:
        pass


# -- harp.elastic.State.sync ---------------------------------------------------------------------------------

class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling creates the marker file


def _send_pickle(comm, obj):
    """An on-path injector's frames: a length, then a pickle, as broadcast_object sends them."""
    blob = pickle.dumps(obj)
    comm.broadcast(np.array([len(blob)], np.int64), root=0)
    comm.broadcast(np.frombuffer(blob, np.uint8).copy(), root=0)
    return "sent"


def _inject(rank, size, marker):
    """Rank 0 plays an on-path injector: it sends a crafted pickle in sync's frames."""
    from harp import elastic

    comm = harp.init()
    if rank == 0:
        return _send_pickle(comm, {"w": _Boom(marker)})
    state = elastic.State(w=np.zeros(3))
    try:
        state.sync(comm)
    except Exception as e:  # noqa: BLE001 - the test reads what the rank saw
        return f"{type(e).__name__}: {e}"
    return "accepted"


def test_state_sync_does_not_unpickle_what_it_receives(tmp_path):
    marker = str(tmp_path / "ran")
    sent, got = run_ranks(2, _inject, marker, env={"HARP_TRANSPORT": "tcp"}, timeout=60)
    assert not os.path.exists(marker), "a crafted payload ran code on the receiving rank"
    assert got.startswith("InvalidArgumentError") and "not a HARP state payload" in got, got


def _hvd_inject(rank, size, marker):
    """The same injection against hvd.elastic.ObjectState.sync (it used hvd.broadcast_object's frames)."""
    import harp.horovod.torch as hvd

    hvd.init()
    comm = hvd._comm()
    if rank == 0:
        return _send_pickle(comm, {"epoch": _Boom(marker)})
    state = hvd.elastic.ObjectState(epoch=0)
    try:
        state.sync()
    except Exception as e:  # noqa: BLE001 - the test reads what the rank saw
        return f"{type(e).__name__}: {e}"
    return f"accepted {state.epoch!r}"


def test_hvd_object_state_sync_does_not_unpickle_what_it_receives(tmp_path):
    pytest.importorskip("torch")
    marker = str(tmp_path / "ran")
    sent, got = run_ranks(2, _hvd_inject, marker, env={"HARP_TRANSPORT": "tcp"}, timeout=60)
    assert not os.path.exists(marker), "a crafted payload ran code on the receiving rank"
    assert got.startswith("InvalidArgumentError") and "not a HARP state payload" in got, got


# -- harp-cluster's hugetlbfs mount --------------------------------------------------------------------------

@pytest.fixture
def fake_sys(tmp_path, monkeypatch):
    """veth_hosts.hugepages against files in tmp_path instead of /proc and /sys; mount/umount recorded."""
    from harp_dev.cluster import veth_hosts

    files = {"/proc/sys/vm/nr_hugepages": tmp_path / "nr", "/proc/mounts": tmp_path / "mounts",
             "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": tmp_path / "free"}
    files["/proc/sys/vm/nr_hugepages"].write_text("0\n")
    files["/proc/mounts"].write_text("proc /proc proc rw 0 0\n")
    files["/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"].write_text("0\n")
    real_open = open
    free = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"

    def fake_open(path, *a, **k):
        if str(path) == free:  # the kernel: all nr_hugepages pages are free
            files[free].write_text(files["/proc/sys/vm/nr_hugepages"].read_text())
        return real_open(files.get(str(path), path), *a, **k)

    calls = []

    def fake_run(cmd, check=True):
        calls.append((list(cmd), [(os.path.islink(c), os.path.realpath(c), c) for c in cmd if c.startswith("/")]))
        if cmd[0] == "mount":
            st = os.lstat(cmd[-1])
            calls[-1] = calls[-1] + (st,)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(veth_hosts, "open", fake_open, raising=False)
    monkeypatch.setattr(veth_hosts, "_run", fake_run)
    return veth_hosts, files, calls


def test_hugepages_mounts_on_a_fresh_private_folder_not_a_planted_symlink(fake_sys, tmp_path, monkeypatch):
    veth_hosts, files, calls = fake_sys
    target = tmp_path / "target"
    target.mkdir()
    planted = f"/tmp/harp-hugetlbfs-{os.getpid()}"
    os.symlink(str(target), planted)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, 0, "", ""))
    try:
        with veth_hosts.hugepages(0):
            mounts = [c for c in calls if c[0][0] == "mount"]
            assert mounts, calls
            cmd, paths, st = mounts[0]
            where = cmd[-1]
            assert not os.path.islink(where) and os.path.realpath(where) == os.path.abspath(where), where
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077 == 0
            assert os.path.realpath(where) != str(target)
        assert os.path.islink(planted) and not os.listdir(target)
    finally:
        os.unlink(planted)


def test_hugepages_restores_nr_hugepages_when_cleanup_fails(fake_sys, monkeypatch):
    veth_hosts, files, calls = fake_sys
    nr = files["/proc/sys/vm/nr_hugepages"]
    made = []

    def failing_run(cmd, **k):  # umount fails: the folder stays mounted (here: not empty)
        return subprocess.CompletedProcess(cmd, 32, "", "umount: target is busy")

    monkeypatch.setattr(subprocess, "run", failing_run)
    with pytest.raises(Exception) as e:
        with veth_hosts.hugepages(4):
            assert nr.read_text().strip() == "4"
            where = [c for c in calls if c[0][0] == "mount"][0][0][-1]
            made.append(where)
            open(os.path.join(where, "busy"), "w").close()
    assert nr.read_text().strip() == "0", "nr_hugepages was not restored"
    assert made[0] in str(e.value), e.value
    os.unlink(os.path.join(made[0], "busy"))
    os.rmdir(made[0])


# -- harp._statewire: the data-only format State.sync sends --------------------------------------------------

from harp import _statewire  # noqa: E402

_np_dtypes = st.sampled_from(["<f4", "<f8", "<f2", "<i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8",
                              "|b1", "<c8", "<c16", ">i4", ">f8"])
_arrays = st.builds(lambda dt, shape, seed: np.random.default_rng(seed).integers(0, 2, size=shape).astype(dt),
                    _np_dtypes, st.lists(st.integers(0, 4), max_size=3), st.integers(0, 99))
_keys = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8)
_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(max_size=32) | _arrays
    | st.builds(np.float32, st.floats(width=32)) | st.builds(np.int64, st.integers(-2**63, 2**63 - 1)),
    lambda kids: st.lists(kids, max_size=4) | st.lists(kids, max_size=4).map(tuple)
    | st.dictionaries(_keys, kids, max_size=4), max_leaves=20)


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b) and \
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, float):
        return type(b) is float and (a == b or (a != a and b != b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(_data)
def test_statewire_round_trips_data(x):
    assert _same(x, _statewire.decode(_statewire.encode(x)))


@settings(max_examples=500, deadline=None)
@given(_data, st.data())
def test_statewire_refuses_damaged_payloads_by_name(x, d):
    blob = bytearray(_statewire.encode(x))
    how = d.draw(st.sampled_from(["flip", "cut", "grow"]))
    if how == "flip":
        i = d.draw(st.integers(0, len(blob) - 1))
        blob[i] ^= d.draw(st.integers(1, 255))
    elif how == "cut":
        blob = blob[:d.draw(st.integers(0, len(blob) - 1))]
    else:
        blob += d.draw(st.binary(min_size=1, max_size=8))
    try:
        _statewire.decode(bytes(blob))
    except harp.InvalidArgumentError as e:
        assert "HARP state payload" in str(e)


@given(st.binary(max_size=300))
def test_statewire_refuses_garbage(raw):
    if not raw.startswith(_statewire.MAGIC):
        with pytest.raises(harp.InvalidArgumentError, match="not a HARP state payload"):
            _statewire.decode(raw)
    try:  # with the right start, the rest is checked
        _statewire.decode(b"HARPST1\n" + raw)
    except harp.InvalidArgumentError as e:
        assert "malformed HARP state payload" in str(e)


@pytest.mark.parametrize("header", [b'["a","|O8",[1],false]', b'["T","object",[1],false,false,"cpu"]',
                                    b'["a","<f8",[99999999999],false]', b'["d",[[["l",[]],["n"]]]]',
                                    b"[" * 100000, b'["x"]', b'["i",1.5]', b'["b",1]'])
def test_statewire_refuses_crafted_headers(header):
    blob = b"HARPST1\n" + len(header).to_bytes(8, "little") + header
    with pytest.raises(harp.InvalidArgumentError, match="malformed HARP state payload"):
        _statewire.decode(blob)


def test_statewire_refuses_objects_by_path():
    with pytest.raises(harp.InvalidArgumentError, match=r"state\['opt'\]\[1\] is a .*_Boom"):
        _statewire.encode({"opt": [1, _Boom("x")]})
    with pytest.raises(harp.InvalidArgumentError, match="numpy object array"):
        _statewire.encode(np.array([object()]))
    with pytest.raises(harp.InvalidArgumentError, match="key is a frozenset"):
        _statewire.encode({frozenset(): 1})


def test_statewire_torch_state_dicts_round_trip():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    for sd in (model.state_dict(), opt.state_dict()):
        back = _statewire.decode(_statewire.encode(sd))
        assert type(back) is type(sd) and list(back) == list(sd)
        flat = lambda o: o if not isinstance(o, dict) else {k: flat(v) for k, v in o.items()}  # noqa: E731
        assert str(flat(back)) == str(flat(sd))
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))
    q = _statewire.decode(_statewire.encode(p))
    assert isinstance(q, torch.nn.Parameter) and q.dtype == torch.bfloat16 and torch.equal(p, q)
    opt2 = torch.optim.Adam(model.parameters(), lr=0.5)
    opt2.load_state_dict(_statewire.decode(_statewire.encode(opt.state_dict())))
    assert opt2.param_groups[0]["lr"] == 0.01


def _unsendable(rank, size):
    from harp import elastic

    comm = harp.init()
    state = elastic.State(w=np.zeros(3), f=(lambda: 0) if rank == 0 else None)
    try:
        state.sync(comm)
    except harp.InvalidArgumentError as e:
        return str(e)
    return "synced"


def test_state_sync_of_a_value_that_is_not_data_raises_on_every_rank():
    msgs = run_ranks(3, _unsendable, env={"HARP_TRANSPORT": "tcp"}, timeout=60)
    assert "State['f'] is a builtins.function" in msgs[0], msgs[0]
    assert all("rank 0 could not send its state" in m for m in msgs[1:]), msgs
