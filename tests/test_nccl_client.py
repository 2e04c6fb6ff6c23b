"""Proof of the drop-in: a real NCCL client, built against NVIDIA's own nccl.h
and linked to NVIDIA's libnccl.so.2, runs on HARP under LD_PRELOAD.

The NVIDIA files come from their PyPI wheels (nvidia-nccl-cu12 and CUDA's
runtime/nvcc/cccl header wheels), downloaded with pip at test time into a
cache (HARP_NCCL_WHEEL_CACHE, default build/nccl-wheels) — never committed.
If pip cannot fetch them the test FAILS, naming the command and its output
(set HARP_NCCL_WHEEL_CACHE to a directory already holding the wheels to run
offline).

What is checked, with several ranks on host buffers:
  - without the preload the binary cannot even create a communicator on a
    machine without a GPU (it really is NVIDIA's library underneath);
  - with LD_PRELOAD=libharp-nccl.so every rank PASSes its result checks, and
    harpNcclCallsServed (found by dlsym) equals the number of NCCL calls the
    program made: HARP served every call;
  - HARP_DEBUG=INFO prints HARP's banner (version, transport);
  - the same binary also runs with HARP installed as libnccl.so.2 on
    LD_LIBRARY_PATH (no preload), and the client source builds against HARP's
    own nccl.h too.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from harp import nccl

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLIENT_SRC = os.path.join(HERE, "nccl", "client.c")
# Pinned: NCCL 2.21.5 is the API level HARP implements; CUDA 12.9 headers.
WHEELS = {
    "nvidia-nccl-cu12==2.21.5": "nvidia_nccl_cu12-2.21.5-*.whl",
    "nvidia-cuda-runtime-cu12==12.9.79": "nvidia_cuda_runtime_cu12-12.9.79-*.whl",
    "nvidia-cuda-nvcc-cu12==12.9.86": "nvidia_cuda_nvcc_cu12-12.9.86-*.whl",
    "nvidia-cuda-cccl-cu12==12.9.27": "nvidia_cuda_cccl_cu12-12.9.27-*.whl",
}


def _cc():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc/gcc) on PATH: the client test needs one")
    return cc


@pytest.fixture(scope="session")
def nvidia_tree():
    """Directory with nvidia/{nccl,cuda_runtime,cuda_nvcc,cuda_cccl} extracted from the wheels."""
    cache = os.environ.get("HARP_NCCL_WHEEL_CACHE") or os.path.join(REPO, "build", "nccl-wheels")
    os.makedirs(cache, exist_ok=True)
    missing = [spec for spec, pat in WHEELS.items() if not glob.glob(os.path.join(cache, pat))]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", cache, *missing]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            pytest.fail("cannot download NVIDIA's NCCL/CUDA wheels for the real-client test:\n  " + " ".join(cmd) +
                        "\n" + out.stdout[-2000:] + out.stderr[-3000:])
    tree = os.path.join(cache, "tree")
    stamp = os.path.join(tree, ".complete")
    if not os.path.exists(stamp):
        shutil.rmtree(tree, ignore_errors=True)
        for pat in WHEELS.values():
            whl = sorted(glob.glob(os.path.join(cache, pat)))[-1]
            with zipfile.ZipFile(whl) as z:
                for name in z.namelist():
                    # headers and the NCCL library only
                    if "/include/" in name or name.endswith("libnccl.so.2"):
                        z.extract(name, tree)
        open(stamp, "w").close()
    for sub in ("nccl/include/nccl.h", "nccl/lib/libnccl.so.2", "cuda_runtime/include/cuda_runtime.h"):
        assert os.path.exists(os.path.join(tree, "nvidia", sub)), f"{sub} missing from the NVIDIA wheels"
    return os.path.join(tree, "nvidia")


@pytest.fixture(scope="session")
def client(nvidia_tree, tmp_path_factory):
    """The client compiled against NVIDIA's nccl.h, linked to NVIDIA's libnccl.so.2."""
    exe = str(tmp_path_factory.mktemp("nccl-client") / "client")
    lib = os.path.join(nvidia_tree, "nccl", "lib")
    cmd = [_cc(), "-O1", "-Wall", "-o", exe, CLIENT_SRC,
           "-I", os.path.join(nvidia_tree, "nccl", "include"),
           "-I", os.path.join(nvidia_tree, "cuda_runtime", "include"),
           "-I", os.path.join(nvidia_tree, "cuda_nvcc", "include"),
           "-I", os.path.join(nvidia_tree, "cuda_cccl", "include"),
           "-L", lib, "-l:libnccl.so.2", f"-Wl,-rpath,{lib}", "-ldl"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, "compiling the client against NVIDIA's nccl.h failed:\n" + out.stderr
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    assert re.search(r"libnccl\.so\.2 => .*nvidia/nccl/lib/libnccl\.so\.2", ldd), ldd
    return exe


def _run(exe, n, tmp_path, env_extra, timeout=120):
    idfile = str(tmp_path / f"id-{n}-{len(os.listdir(tmp_path))}")
    env = dict(os.environ, HARP_TIMEOUT="60", **env_extra)
    procs = [subprocess.Popen([exe, str(r), str(n), idfile], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for r in range(n)]
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"client ranks hung for {timeout} s")
        outs.append((p.returncode, o, e))
    return outs


def _nvidia_gpu_present():
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def test_without_preload_nvidia_library_needs_a_gpu(client, tmp_path):
    if _nvidia_gpu_present():
        pytest.skip("an NVIDIA GPU is present: NVIDIA's own library would work here")
    (rc, out, err), = _run(client, 1, tmp_path, {})
    assert rc != 0 and "FAIL rank 0" in out and "ncclCommInitRank" in out, out + err
    assert "served=" not in out


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_preload_serves_every_call(client, tmp_path, nranks):
    lib = nccl.library_path()
    outs = _run(client, nranks, tmp_path, {"LD_PRELOAD": lib, "HARP_DEBUG": "INFO"})
    for rank, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {rank} rc={rc}\n{out}\n{err[-3000:]}"
        m = re.search(r"PASS rank (\d+) calls=(\d+) served=(-?\d+) version=(\d+)", out)
        assert m, out
        assert int(m.group(1)) == rank
        calls, served = int(m.group(2)), int(m.group(3))
        assert calls > 25 and served == calls, f"rank {rank}: made {calls} NCCL calls, HARP served {served}"
        assert int(m.group(4)) == 22105
        assert re.search(r"HARP \S+ serving the NCCL 2\.21\.5 API from \S*libharp-nccl\.so", err), err[:2000]
        assert re.search(r"communicator rank %d of %d ready on HARP \S+, transport \w+" % (rank, nranks), err), err


def test_libnccl_so_2_on_library_path(client, tmp_path):
    d = tmp_path / "lib"
    out = subprocess.run([sys.executable, "-m", "harp.tools.config", "--install-libnccl", str(d)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert os.path.realpath(out.stdout.strip()) == os.path.realpath(nccl.library_path())
    outs = _run(client, 2, tmp_path, {"LD_LIBRARY_PATH": str(d)})
    for rc, o, e in outs:
        assert rc == 0 and "PASS" in o, o + e
        calls, served = map(int, re.search(r"calls=(\d+) served=(\d+)", o).groups())
        assert served == calls


def test_client_builds_against_harps_own_header(tmp_path):
    """HARP's nccl.h is source-compatible with NVIDIA's: the same client builds
    with it (no CUDA headers at all) and links to libharp-nccl.so directly."""
    exe = str(tmp_path / "client-harp")
    inc = os.path.join(REPO, "bindings", "nccl")
    libdir = os.path.dirname(nccl.library_path())
    cmd = [_cc(), "-O1", "-Wall", "-Werror", "-std=c11", "-o", exe, CLIENT_SRC, "-I", inc, "-L", libdir,
           "-l:libharp-nccl.so", f"-Wl,-rpath,{libdir}", "-ldl"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for rc, o, e in _run(exe, 3, tmp_path, {}):
        assert rc == 0 and "PASS" in o, o + e


def test_header_facts_match_nvidia(nvidia_tree):
    """Enum values, NCCL_VERSION and ncclConfig_t layout agree with NVIDIA's header,
    checked by the C compiler (a program that includes both and static-asserts)."""
    src = r"""
    #include <stddef.h>
    #include <nccl.h>
    #define ASSERT(c) _Static_assert(c, #c)
    ASSERT(NCCL_VERSION_CODE == 22105);
    ASSERT(NCCL_UNIQUE_ID_BYTES == 128);
    ASSERT(sizeof(ncclUniqueId) == 128);
    ASSERT(ncclSuccess == %(ncclSuccess)s && ncclUnhandledCudaError == %(ncclUnhandledCudaError)s);
    ASSERT(ncclSystemError == %(ncclSystemError)s && ncclInternalError == %(ncclInternalError)s);
    ASSERT(ncclInvalidArgument == %(ncclInvalidArgument)s && ncclInvalidUsage == %(ncclInvalidUsage)s);
    ASSERT(ncclRemoteError == %(ncclRemoteError)s && ncclInProgress == %(ncclInProgress)s);
    ASSERT(ncclSum == %(ncclSum)s && ncclProd == %(ncclProd)s && ncclMax == %(ncclMax)s);
    ASSERT(ncclMin == %(ncclMin)s && ncclAvg == %(ncclAvg)s && ncclNumOps == %(ncclNumOps)s);
    ASSERT(ncclInt8 == %(ncclInt8)s && ncclUint8 == %(ncclUint8)s && ncclInt32 == %(ncclInt32)s);
    ASSERT(ncclUint32 == %(ncclUint32)s && ncclInt64 == %(ncclInt64)s && ncclUint64 == %(ncclUint64)s);
    ASSERT(ncclFloat16 == %(ncclFloat16)s && ncclFloat32 == %(ncclFloat32)s && ncclFloat64 == %(ncclFloat64)s);
    ASSERT(ncclBfloat16 == %(ncclBfloat16)s);
    ASSERT(sizeof(ncclConfig_t) == %(cfg_size)s);
    ASSERT(offsetof(ncclConfig_t, blocking) == %(off_blocking)s);
    ASSERT(offsetof(ncclConfig_t, netName) == %(off_netName)s);
    ASSERT(offsetof(ncclConfig_t, splitShare) == %(off_splitShare)s);
    ASSERT(sizeof(ncclRedOp_t) == %(redop_size)s);
    int main(void) { return 0; }
    """
    # The values as NVIDIA's header states them, read by compiling a probe against it.
    names = ["ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError", "ncclInvalidArgument",
             "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclSum", "ncclProd", "ncclMax", "ncclMin",
             "ncclAvg", "ncclNumOps", "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
             "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"]
    probe = "#include <stdio.h>\n#include <stddef.h>\n#include <nccl.h>\nint main(void){\n"
    for n in names:
        probe += f'printf("{n}=%d\\n", (int){n});\n'
    probe += 'printf("cfg_size=%zu\\n", sizeof(ncclConfig_t));\n'
    for f in ("blocking", "netName", "splitShare"):
        probe += f'printf("off_{f}=%zu\\n", offsetof(ncclConfig_t, {f}));\n'
    probe += 'printf("redop_size=%zu\\n", sizeof(ncclRedOp_t));\nreturn 0;}\n'
    work = os.path.join(REPO, "build", "nccl-header-check")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "probe.c"), "w") as f:
        f.write(probe)
    inc = ["-I", os.path.join(nvidia_tree, "nccl", "include"), "-I", os.path.join(nvidia_tree, "cuda_runtime", "include"),
           "-I", os.path.join(nvidia_tree, "cuda_nvcc", "include"), "-I", os.path.join(nvidia_tree, "cuda_cccl", "include")]
    # As C++: NVIDIA's header defines ncclBfloat16 only when CUDA's bf16 type exists, which cuda_bf16.h
    # provides to C++ translation units.
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    out = subprocess.run([cxx, "-x", "c++", "-o", os.path.join(work, "probe"), os.path.join(work, "probe.c"), *inc],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    facts = dict(line.split("=") for line in subprocess.run([os.path.join(work, "probe")], capture_output=True,
                                                            text=True).stdout.split())
    assert len(facts) == len(names) + 5
    with open(os.path.join(work, "ours.c"), "w") as f:
        f.write(src % facts)
    out = subprocess.run([_cc(), "-std=c11", "-fsyntax-only", "-I", os.path.join(REPO, "bindings", "nccl"),
                          os.path.join(work, "ours.c")], capture_output=True, text=True)
    assert out.returncode == 0, "HARP's nccl.h disagrees with NVIDIA's:\n" + out.stderr


def test_device_client_on_emulated_cuda(tmp_path):
    """The client's device build (-DCLIENT_DEVICE, what scripts/gpu-check.sh runs on a GPU against
    NVIDIA's nccl.h): every buffer is "device memory" of tests/nccl/emu_cudart.c, which host code
    cannot read, so every rank passing means HARP staged every buffer through the runtime."""
    emu = str(tmp_path / "libemucudart.so")
    out = subprocess.run([_cc(), "-shared", "-fPIC", "-O1", "-o", emu, os.path.join(HERE, "nccl", "emu_cudart.c"),
                          "-lpthread"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    exe = str(tmp_path / "client-device")
    libdir = os.path.dirname(nccl.library_path())
    cmd = [_cc(), "-O1", "-Wall", "-Werror", "-std=c11", "-DCLIENT_DEVICE", "-o", exe, CLIENT_SRC,
           "-I", os.path.join(REPO, "bindings", "nccl"), "-L", libdir, "-l:libharp-nccl.so", "-L", str(tmp_path),
           "-l:libemucudart.so", f"-Wl,-rpath,{libdir}:{tmp_path}", "-ldl"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for n in (2, 3):
        for rank, (rc, o, e) in enumerate(_run(exe, n, tmp_path, {"HARP_CUDART": emu})):
            m = re.search(r"PASS rank (\d+) calls=(\d+) served=(\d+) version=\d+ device=1", o)
            assert rc == 0 and m, f"rank {rank} rc={rc}\n{o}\n{e[-3000:]}"
            assert int(m.group(1)) == rank and m.group(2) == m.group(3)
