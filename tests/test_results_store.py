"""The results store (results/, scripts/results_manifest.py): raw results live there, not beside the code.

* No tracked file outside results/ is benchmark output (a .json, .log, .csv or .txt record), and the
  check fails when one is put in bench/.
* results/MANIFEST.json is current, and goes stale when a run set is added.
* Every link from bench/RESULTS*.md into the store names a file or folder that exists.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "results_manifest.py")
RESULT_SUFFIXES = (".json", ".log", ".csv", ".txt")
NOT_RESULTS = {"CMakeLists.txt"}


def tracked(root):
    p = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def strays(files):
    """Result-like files outside results/."""
    return [f for f in files if f.endswith(RESULT_SUFFIXES) and os.path.basename(f) not in NOT_RESULTS
            and not f.startswith("results/")]


def test_no_result_file_outside_the_store():
    files = tracked(ROOT)
    if not files:
        import pytest
        pytest.skip("not a git checkout")
    assert not strays(files), "benchmark output belongs in results/<concept>/: " + ", ".join(strays(files)[:20])


def test_the_stray_check_can_fail():
    assert strays(["bench/out-ab/before-np2-tcp-r1.json", "bench/vpc/x.log", "results/arena/a.json",
                   "tests/cpp/CMakeLists.txt"]) == ["bench/out-ab/before-np2-tcp-r1.json", "bench/vpc/x.log"]


def _manifest(root, *args):
    return subprocess.run([sys.executable, SCRIPT, "--root", str(root), *args], capture_output=True, text=True,
                          timeout=300)


def test_the_manifest_is_current():
    r = _manifest(ROOT, "--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_manifest_goes_stale_when_a_run_set_is_added(tmp_path):
    shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
    shutil.copytree(os.path.join(ROOT, "bench"), tmp_path / "bench",
                    ignore=shutil.ignore_patterns("*.py", "*.sh", "*.cc", "__pycache__"))
    assert _manifest(tmp_path, "--check").returncode == 0
    new = tmp_path / "results" / "arena" / "new-set"
    new.mkdir()
    (new / "run.json").write_text('{"stamp": {"commit": "abc", "cpu": "x", "cores": 2, "time": "t",'
                                  ' "command": "harp-bench allreduce --json ' + str(new / "run.json") + '"}}')
    r = _manifest(tmp_path, "--check")
    assert r.returncode == 1 and "stale" in r.stderr
    assert _manifest(tmp_path).returncode == 0
    import json
    entry = json.loads((tmp_path / "results" / "MANIFEST.json").read_text())["arena/new-set"]
    assert entry["commits"] == ["abc"] and entry["commands"] == ["harp-bench allreduce --json <out>"]


LINK = re.compile(r"\]\((\.\./results/[^)#\s]+)\)")


def test_links_into_the_store_resolve():
    missing = []
    bench = os.path.join(ROOT, "bench")
    for name in sorted(os.listdir(bench)):
        if name.startswith("RESULTS") and name.endswith(".md"):
            for m in LINK.finditer(open(os.path.join(bench, name)).read()):
                if not os.path.exists(os.path.normpath(os.path.join(bench, m[1]))):
                    missing.append(f"{name}: {m[1]}")
    assert not missing, missing
