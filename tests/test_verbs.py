"""The RDMA verbs transport, over a real verbs stack: Soft-RoCE (rdma_rxe) in a qemu guest.

The build machines cannot load kernel modules, so every scenario runs inside the
guest that scripts/rxe-vm/rxevm.py boots (software emulation, Debian's kernel and
rdma_rxe, the host root read-only over 9p). One guest boot runs all scenarios of
tests/verbs_guest.py in one Python process (imports are slow under emulation);
each scenario is reported back as its own test below:

  devices      harp.verbs.devices() (pyverbs) lists rxe0, port ACTIVE, RoCE v2 GID
  selection    HARP_TRANSPORT=verbs uses verbs for every peer; automatic choice
               between ranks on different hosts (own IPC namespaces) is verbs,
               never tcp; with verbs disabled the same check sees tcp
  collectives  every collective, algorithm, op and root (3 dtypes), 4 and 3 ranks
  large        8 MB allreduce / broadcast split into many RDMA writes
  mr_cache     lazy mode reuses one registration per buffer across 30 calls;
               safe mode (default) re-registers, correct with re-allocated arrays
  killed_peer  a rank SIGKILLed mid-allreduce: the others raise PeerError quickly
  mismatch     ranks disagreeing on a count: MismatchError on every rank
  abort        comm.abort() reaches ranks waiting in a collective
  selftest     transport-level multi-process test (C++): data, mismatch (eager and
               rendezvous), kill, abort, cache

Marked `verbs`; skipped, with the reason, only when the guest cannot be set up
here (qemu, the kernel image or busybox missing: scripts/deps/verbs.apt).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "cpp-tests")

pytestmark = pytest.mark.verbs

_spec = importlib.util.spec_from_file_location("rxevm", os.path.join(ROOT, "scripts", "rxe-vm", "rxevm.py"))
rxevm = importlib.util.module_from_spec(_spec)
sys.modules["rxevm"] = rxevm  # dataclasses look the module up while it loads
_spec.loader.exec_module(rxevm)

SCENARIOS = ["devices", "selection", "collectives", "large", "mr_cache", "killed_peer", "mismatch", "abort",
             "selftest"]


def _build_selftest():
    """Build the C++ transport self-test next to test_cpp.py's build; None if that cannot be done."""
    if not shutil.which("cmake"):
        return None, "cmake not found"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    c = subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DHARP_BUILD_TESTS=ON", "-DHARP_BUILD_PYTHON=OFF",
                        "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True)
    if c.returncode != 0:
        return None, c.stderr[-2000:]
    b = subprocess.run(["cmake", "--build", BUILD, "-j", "2", "--target", "harp_verbs_selftest"], capture_output=True,
                       text=True)
    exe = os.path.join(BUILD, "transport", "verbs", "harp_verbs_selftest")
    if b.returncode != 0 or not os.path.exists(exe):
        return None, (b.stdout + b.stderr)[-3000:]
    return exe, ""


@pytest.fixture(scope="module")
def guest():
    reason = rxevm.why_not()
    if reason:
        pytest.skip(reason)
    exe, why = _build_selftest()
    env = dict(os.environ)
    if exe:
        env["HARP_VERBS_SELFTEST"] = exe
    # The guest sees the host's files, so the same interpreter and the same
    # installed (or PYTHONPATH) harp run there.
    res = rxevm.run([sys.executable, os.path.join(ROOT, "tests", "verbs_guest.py"), *SCENARIOS], cwd=ROOT, env=env,
                    timeout=540, stream=sys.stdout)
    results = {}
    for line in res.output.splitlines():
        if line.startswith("VERBS-RESULT "):
            rec = json.loads(line[len("VERBS-RESULT "):])
            results[rec["name"]] = rec
    return {"results": results, "rc": res.rc, "output": res.output, "seconds": res.seconds,
            "selftest_build": why}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verbs_in_soft_roce_guest(guest, scenario):
    rec = guest["results"].get(scenario)
    if rec is None:
        pytest.fail(f"scenario {scenario} did not report (guest exit {guest['rc']} after {guest['seconds']:.0f} s); "
                    f"guest output tail:\n{guest['output'][-4000:]}")
    if scenario == "selftest" and rec["ok"] and rec["detail"].startswith("SKIP"):
        pytest.fail(f"the C++ selftest could not be built: {guest['selftest_build']}")
    assert rec["ok"], rec["detail"]
    print(f"{scenario} ({rec['seconds']} s): {rec['detail']}")


def test_harp_verbs_devices_without_a_device_is_a_clear_error():
    """On a host without RDMA devices (this build machine), devices() names the problem."""
    import harp
    import harp.verbs

    try:
        devs = harp.verbs.devices()
    except harp.UnavailableError as e:
        msg = str(e)
        assert "RDMA" in msg or "pyverbs" in msg, msg
        return
    assert isinstance(devs, list) and devs and all("ports" in d for d in devs)


def test_forcing_verbs_without_a_device_names_the_reason():
    import harp
    import harp.verbs

    try:
        harp.verbs.devices()
        pytest.skip("this machine has an RDMA device")
    except harp.UnavailableError:
        pass
    code = ("import harp\n"
            "try:\n"
            "    harp.Communicator(0, 1, harp.get_unique_id('127.0.0.1:0'), transport='verbs', timeout=20)\n"
            "except harp.HarpError as e:\n"
            "    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert "verbs" in out and ("RDMA" in out or "not built" in out), out
