"""The public C++ API (include/harp/harp.h) from outside the tree.

* harp.h includes only standard headers, so a program needs nothing of the
  source tree but include/.
* tests/cpp/test_public_api.cc, built with only include/ on the include path
  and linked against the libharp.so the Python package loads, forks 3 ranks
  and checks the collectives' results and the error paths (it exits 1 on any
  wrong value, naming it).
* examples/allreduce.cc, built the same way, runs under harp-run on 3 ranks.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

import harp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "include")
LIBDIR = os.path.dirname(harp.__file__)
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def build(tmp_path, source, name):
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.fail("a C++ compiler is needed to build the public API test")
    exe = str(tmp_path / name)
    r = subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{INCLUDE}", source, "-o", exe,
                        f"-L{LIBDIR}", "-lharp", f"-Wl,-rpath,{LIBDIR}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return exe


def test_the_header_includes_only_the_standard_library():
    text = open(os.path.join(INCLUDE, "harp", "harp.h")).read()
    includes = re.findall(r'^\s*#\s*include\s*([<"][^>"]+[>"])', text, re.M)
    assert includes, "no include found: the pattern is wrong"
    for inc in includes:
        assert inc.startswith("<") and "/" not in inc and "." not in inc, f"harp.h includes {inc}"


def test_three_ranks_through_the_public_api(tmp_path):
    exe = build(tmp_path, os.path.join(ROOT, "tests", "cpp", "test_public_api.cc"), "public_api")
    r = subprocess.run([exe], capture_output=True, text=True, env=ENV, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(re.findall(r"^rank (\d) ok$", r.stdout, re.M)) == ["0", "1", "2"], r.stdout + r.stderr
    assert "public API: all ranks ok" in r.stdout


def test_the_cpp_example_runs_under_harp_run(tmp_path):
    exe = build(tmp_path, os.path.join(ROOT, "examples", "allreduce.cc"), "allreduce")
    r = subprocess.run([sys.executable, "-m", "harp.launch", "-n", "3", exe], capture_output=True, text=True,
                       env=ENV, timeout=180)
    assert r.returncode == 0 and "3 ranks, sum = 6 everywhere" in r.stdout, r.stdout + r.stderr
