"""The DPDK transport's protocol state machine (transport/dpdk/protocol.cc) fed
crafted and generated frames under AddressSanitizer and UndefinedBehaviorSanitizer.

tests/cpp/fuzz_dpdk_protocol.cc is compiled here with g++ -fsanitize=address,undefined
(protocol.cc itself included, linked against the package's libharp.so for the rest)
and run case by case; DPDK is not needed: frames go straight to Protocol::onFrame,
as the transport's receive path hands them over. A receive buffer is a heap block
of exactly the posted length, so any write outside it is a sanitizer report. The
generated cases are deterministic (fixed seeds) and bounded to seconds each."""
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

import harp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "tests", "cpp", "fuzz_dpdk_protocol.cc"),
           os.path.join(ROOT, "transport", "dpdk", "protocol.cc")]
FLAGS = ["-std=c++20", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", "-Wall", "-Wextra", "-Wno-unused-parameter", "-I", ROOT]
# Leak checking is off: its stop-the-world needs ptrace, which some CI containers forbid;
# the cases bound heap growth themselves.
SAN_ENV = {"ASAN_OPTIONS": "abort_on_error=0:halt_on_error=1:detect_leaks=0:exitcode=23",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=24"}


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler (g++) is needed to build the DPDK protocol fuzzer"
    lib = os.path.dirname(os.path.abspath(harp.__file__))
    assert os.path.exists(os.path.join(lib, "libharp.so")), f"no libharp.so next to {harp.__file__}"
    out = tmp_path_factory.mktemp("fuzz_dpdk")
    objs = [str(out / (os.path.basename(s) + ".o")) for s in SOURCES]

    cache = [shutil.which("ccache")] if shutil.which("ccache") else []  # shared with scripts/dev-build.sh

    def compile_one(src, obj):
        return subprocess.run([*cache, cxx, *FLAGS, "-c", src, "-o", obj], capture_output=True, text=True,
                              env=dict(os.environ, CCACHE_BASEDIR=ROOT))

    with ThreadPoolExecutor(2) as ex:
        for r in ex.map(compile_one, SOURCES, objs):
            assert r.returncode == 0, r.stderr[-4000:]
    exe = str(out / "fuzz_dpdk_protocol")
    r = subprocess.run([cxx, *FLAGS, *objs, "-L", lib, "-lharp", f"-Wl,-rpath,{lib}", "-o", exe],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def run(exe, *args, timeout=60):
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **SAN_ENV))
    out = r.stdout + r.stderr
    print(r.stdout[-3000:], r.stderr[-1000:])
    sanitizer = "ERROR: AddressSanitizer" in out or "runtime error:" in out
    assert r.returncode == 0 and not sanitizer, f"exit status {r.returncode}\n{out[-6000:]}"
    assert "OK " + args[0] in r.stdout, out[-3000:]
    return r.stdout


def test_staged_chunk_past_its_message_is_not_copied_into_the_receive(fuzzer):
    """A chunk staged before its receive was posted, at an offset that reaches past
    the message: posting the receive must not copy it (was: heap-buffer-overflow in irecv)."""
    run(fuzzer, "staged-offset")


def test_chunk_whose_offset_wraps_is_not_placed(fuzzer):
    """offset = 2^64 - 50, 100 bytes, into a posted 100-byte receive: offset + n wraps
    to 50 <= 100 (was: a write 50 bytes before the buffer, from placeData)."""
    run(fuzzer, "posted-wrap")


def test_zero_byte_messages_cannot_grow_staging_without_bound(fuzzer):
    """200000 zero-byte messages nobody posted a receive for: the staged messages are
    capped per peer, so the heap stays within a few MiB (was: 22 MB, and on without end)."""
    out = run(fuzzer, "zero-flood", "--iters", "200000")
    assert "heap grew by" in out


def test_one_byte_chunks_cannot_grow_staging_past_its_limit(fuzzer):
    """200000 one-byte chunks of one unposted message, with a 1 MiB staging limit: each
    chunk is charged its bookkeeping, so the heap stays near the limit (was: 13 MB)."""
    run(fuzzer, "chunk-flood", "--iters", "200000")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_generated_frames_under_sanitizers(fuzzer, seed):
    """A real sender's frames, mutated (offsets near 2^64, wrong lengths, tags, flags,
    sequence numbers, truncated payloads), duplicated, and frames made up from scratch,
    into a receiver posting matching and mismatching receives: no sanitizer report,
    bounded heap. 150000 steps per seed."""
    run(fuzzer, "random", "--iters", "150000", "--seed", str(seed))


@pytest.mark.parametrize("seed", [1, 2])
def test_honest_frames_over_a_lossy_link_arrive_exact(fuzzer, seed):
    """The validation refuses no legitimate frame: two protocols over a link that drops,
    duplicates and reorders frames deliver every message byte for byte."""
    run(fuzzer, "roundtrip", "--iters", "400", "--seed", str(seed))


def test_frames_from_a_peer_without_a_verified_proof_are_dropped(fuzzer):
    """Until the transport has verified a peer's HELLO proof, its DATA, ACK, PING, BYE and
    ABORT frames are dropped and counted; only its HELLOs go up. Verified, it is heard."""
    run(fuzzer, "unproven")
