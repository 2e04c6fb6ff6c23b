"""Build and run the C++ unit tests (GoogleTest) as part of pytest.

One build (build/cpp-tests, Release, no Python module) serves every test here;
it is made once per session by the `gtest_binary` fixture, so CI (which runs
`pytest tests/`) always has it: nothing here is skipped for want of a build.

* test_cpp_unit_tests            every suite except ShmTransport
* test_cpp_shm_transport_gtest   the shared-memory transport suite
  (tests/cpp/test_shm_transport.cc: forked ranks over real segments), run on its
  own and checked to have run as many tests as the file declares, so a filter
  or a build that drops them fails instead of passing with zero tests.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "cpp-tests")
SHM_SOURCE = os.path.join(ROOT, "tests", "cpp", "test_shm_transport.cc")


def build_gtest(target="harp_cpp_tests"):
    """Configure build/cpp-tests and build `target`; returns the build folder (asserts on failure)."""
    if not shutil.which("cmake"):
        pytest.fail("cmake is required to build the C++ tests (pip install cmake)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    c = subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DHARP_BUILD_TESTS=ON", "-DHARP_BUILD_PYTHON=OFF",
                        "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True)
    assert c.returncode == 0, c.stdout[-4000:] + c.stderr[-4000:]
    b = subprocess.run(["cmake", "--build", BUILD, "-j", "2", "--target", target], capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-4000:] + b.stderr[-4000:]
    return BUILD


@pytest.fixture(scope="module")
def gtest_binary():
    build_gtest()
    exe = os.path.join(BUILD, "tests", "cpp", "harp_cpp_tests")
    assert os.access(exe, os.X_OK), f"{exe} was not built"
    return exe


def _run(exe, gtest_filter):
    r = subprocess.run([exe, "--gtest_brief=1", f"--gtest_filter={gtest_filter}"], capture_output=True, text=True,
                       timeout=600)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    m = re.search(r"\[  PASSED  \] (\d+) tests?", r.stdout)
    assert m, r.stdout[-3000:]
    return int(m.group(1))


def declared_tests(source, suite):
    """The TEST(suite, name) cases a source file declares."""
    with open(source) as f:
        return re.findall(r"^TEST\(\s*" + suite + r"\s*,\s*(\w+)\s*\)", f.read(), re.M)


def test_cpp_unit_tests(gtest_binary):
    assert _run(gtest_binary, "-ShmTransport.*") > 20


def test_cpp_shm_transport_gtest(gtest_binary):
    want = declared_tests(SHM_SOURCE, "ShmTransport")
    assert len(want) >= 5, want  # the parser found the suite
    assert _run(gtest_binary, "ShmTransport.*") == len(want), want


def test_declared_tests_counts_what_the_file_declares(tmp_path):
    """The count the shm test compares against comes from the source: a file with
    two ShmTransport cases (one indented, one of another suite) yields those two."""
    src = tmp_path / "t.cc"
    src.write_text("TEST(ShmTransport, A) {}\n  TEST(ShmTransport, Indented) {}\nTEST(ShmTransport,B) {}\n"
                   "TEST(Other, C) {}\n// TEST(ShmTransport, Commented)\n")
    assert declared_tests(str(src), "ShmTransport") == ["A", "B"]
