"""Build and run the C++ unit tests (GoogleTest) as part of pytest."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "cpp-tests")


def test_cpp_unit_tests():
    if not shutil.which("cmake"):
        pytest.fail("cmake is required to build the C++ tests (pip install cmake)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", ROOT, "-B", BUILD, *gen, "-DHARP_BUILD_TESTS=ON", "-DHARP_BUILD_PYTHON=OFF",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True, text=True)
    b = subprocess.run(["cmake", "--build", BUILD, "-j", "2", "--target", "harp_cpp_tests"], capture_output=True,
                       text=True)
    assert b.returncode == 0, b.stdout[-4000:] + b.stderr[-4000:]
    r = subprocess.run([os.path.join(BUILD, "tests", "cpp", "harp_cpp_tests"), "--gtest_brief=1"],
                       capture_output=True, text=True, timeout=600)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "PASSED" in r.stdout
