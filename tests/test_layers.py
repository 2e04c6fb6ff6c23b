"""The include graph (scripts/check_layers.py): layers only point down.

* The tree passes, and the algorithm the shm transport hosts is recognised.
* The checker can fail: core/, transport/ and bindings/ are copied to a
  temporary tree, one violation is injected (an upward include, a dynamic_cast
  to a concrete transport, an include cycle, a marker in the wrong place...),
  and the checker must exit 1 and report exactly the injected line(s) with the
  rule that line breaks — nothing else (but the include cycle an upward
  include may close), so a rule that fires everywhere fails as surely as one
  that never fires.
* Comments and strings that merely mention a concrete transport are not
  violations (the checker reads code, not prose).
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "check_layers.py")
REPORT = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+): .*\[(?P<rule>[a-z-]+)\]")


def run_check(root):
    p = subprocess.run([sys.executable, SCRIPT, "--root", str(root)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def reports(stdout):
    """(file, line, rule) of every violation line."""
    out = []
    for line in stdout.splitlines():
        m = REPORT.match(line)
        assert m, f"unparsable report line: {line!r}"
        out.append((m["file"], int(m["line"]), m["rule"]))
    return out


@pytest.fixture
def tree(tmp_path):
    for top in ("base", "bootstrap", "core", "transport", "bindings"):
        shutil.copytree(os.path.join(ROOT, top), tmp_path / top)
    return tmp_path


def insert_after_includes(root, rel, text):
    """Insert `text` (one line) after the file's last #include; return its line number."""
    path = root / rel
    lines = path.read_text().splitlines(keepends=True)
    last = max(i for i, l in enumerate(lines) if l.lstrip().startswith("#include"))
    lines.insert(last + 1, text + "\n")
    path.write_text("".join(lines))
    return last + 2


def append_line(root, rel, text):
    path = root / rel
    body = path.read_text()
    if not body.endswith("\n"):
        body += "\n"
    path.write_text(body + text + "\n")
    return body.count("\n") + 1


def test_tree_passes():
    rc, out, err = run_check(ROOT)
    assert rc == 0, out + err
    assert "layers point down" in out
    assert "transport/shm/allreduce_shm.cc" in out, "the shm transport's hosted algorithm was not recognised"


def test_no_engine_file_names_a_concrete_transport():
    # Independent of the checker: the moved algorithm is gone from the engine and
    # nothing in core/ includes a transport folder's header.
    assert not os.path.exists(os.path.join(ROOT, "core", "algorithms", "allreduce_shm.cc"))
    for dirpath, _, names in os.walk(os.path.join(ROOT, "core")):
        for n in names:
            text = open(os.path.join(dirpath, n), errors="replace").read()
            assert not re.search(r'#\s*include\s*"transport/\w+/', text), os.path.join(dirpath, n)
            assert "dynamic_cast<transport::shm" not in text, os.path.join(dirpath, n)


# Each case: (file to edit, line to inject, rule expected). The injected line is
# the only thing reported.
INCLUDE_CASES = [
    ("base/log.cc", '#include "core/engine/communicator.h"', "base-only"),
    ("base/env.h", '#include "core/select/tuning.h"', "base-only"),
    ("base/log.cc", '#include "bootstrap/store.h"', "base-only"),  # base is below bootstrap
    ("bootstrap/store.h", '#include "transport/transport.h"', "bootstrap-only"),
    ("bootstrap/socket.h", '#include "../core/engine/communicator.h"', "bootstrap-only"),  # relative path, resolved
    ("bootstrap/store.cc", '#include "base/log.h"', None),  # allowed: bootstrap stands on base
    ("base/types.h", "#include <core/engine/context.h>", "base-only"),  # angle brackets, in-tree
    ("transport/tcp/tcp.cc", '#include "core/engine/context.h"', "hosted-algorithm"),
    ("transport/tcp/tcp.cc", '#include "core/engine/communicator.h"', "transport-only"),
    ("transport/verbs/verbs.h", '#include "core/algorithms/fold.h"', "hosted-algorithm"),
    ("transport/shm/shm_transport.cc", '#include "core/select/tuning.h"', "transport-only"),
    ("transport/shm/shm_connect.cc", '#include "transport/dpdk/wire.h"', "transport-only"),
    ("transport/registry.cc", '#include "transport/shm/shm_transport.h"', "transport-only"),
    ("transport/shm/allreduce_shm.cc", '#include "core/engine/communicator.h"', "transport-only"),
    ("core/engine/communicator.cc", '#include "transport/shm/shm_transport.h"', "engine-interface"),
    ("core/algorithms/allreduce_ring.cc", '#include "transport/tcp/tcp.cc"', "engine-interface"),
    ("core/engine/context.cc", '#include "transport/handshake.h"', "engine-interface"),
    ("core/engine/context.cc", '#include "bindings/nccl/nccl.h"', "no-bindings"),
    ("core/select/tuning.cc", '#include "core/no_such_header.h"', "resolves"),
    # Inside core/: folders as layers (CORE_LAYERS) and the closed algorithm API.
    ("core/select/select.cc", '#include "core/engine/communicator.h"', "core-down"),
    ("core/topology/topology.cc", '#include "core/observe/recorder.h"', "core-down"),
    ("core/algorithms/allreduce_ring.cc", '#include "core/engine/communicator.h"', "core-down"),
    ("core/observe/fr_dump.cc", '#include "core/compress/compress.h"', "core-down"),
    ("core/engine/context.h", '#include "core/engine/communicator.h"', "api-closed"),
    ("core/algorithms/hier.h", '#include "core/select/cost.h"', "api-closed"),
    ("core/algorithms/allreduce_ring.cc", '#include "core/engine/context.h"', None),  # the API
    ("core/engine/communicator.cc", '#include "core/select/select.h"', None),  # the engine is on top
]


@pytest.mark.parametrize("rel,line,rule", INCLUDE_CASES, ids=[f"{c[0]}:{c[2]}" for c in INCLUDE_CASES])
def test_injected_include_is_reported(tree, rel, line, rule):
    no = insert_after_includes(tree, rel, line)
    rc, out, err = run_check(tree)
    if rule is None:  # a downward include: nothing to report
        assert rc == 0, out + err
        return
    assert rc == 1, f"{line} in {rel} went unnoticed:\n{out}{err}"
    got = reports(out)
    # An upward include usually closes a cycle too (the engine includes the
    # base): that is reported as well, and nothing else.
    assert [g for g in got if g[2] != "acyclic"] == [(rel, no, rule)], out


CODE_CASES = [
    ("core/engine/context.cc", "static void* f(transport::Transport* t) { return dynamic_cast<transport::shm::ShmTransport*>(t); }"),
    ("core/algorithms/allreduce_ring.cc", "static void* g(harp::transport::Pair* p) { return dynamic_cast<TcpPair*>(p); }"),
    ("core/engine/communicator.cc", "static bool h(void* t) { return static_cast<dpdk::DpdkTransport*>(t) != nullptr; }"),
    ("core/algorithms/registry.cc", "using V = harp::transport::verbs::VerbsTransport;"),
]


@pytest.mark.parametrize("rel,line", CODE_CASES, ids=[c[0] for c in CODE_CASES])
def test_engine_naming_a_concrete_transport_is_reported(tree, rel, line):
    no = append_line(tree, rel, line)
    rc, out, err = run_check(tree)
    assert rc == 1, f"{line!r} in {rel} went unnoticed:\n{out}{err}"
    got = reports(out)
    assert got and all(g == (rel, no, "engine-no-concrete") for g in got), out


def test_dynamic_cast_to_the_interface_is_reported(tree):
    no = append_line(tree, "core/engine/context.cc", "static bool k(void* p) { return dynamic_cast<transport::Transport*>((transport::Transport*)p); }")
    rc, out, _ = run_check(tree)
    assert rc == 1 and reports(out) == [("core/engine/context.cc", no, "engine-no-concrete")], out


def test_hosted_algorithm_needs_its_marker(tree):
    path = tree / "transport/shm/allreduce_shm.cc"
    lines = path.read_text().splitlines(keepends=True)
    marker = [i for i, l in enumerate(lines) if l.strip() == "// harp-layer: algorithm"]
    assert len(marker) == 1, "allreduce_shm.cc must carry the marker line exactly once"
    del lines[marker[0]]
    path.write_text("".join(lines))
    rc, out, _ = run_check(tree)
    assert rc == 1, out
    api = [i + 1 for i, l in enumerate(lines) if re.match(r'#include "core/(context\.h|algorithms/[^"]+\.h)"', l)]
    assert api and reports(out) == [("transport/shm/allreduce_shm.cc", n, "hosted-algorithm") for n in api], out


def test_marker_outside_a_transport_folder_is_reported(tree):
    for rel in ("core/algorithms/allreduce_ring.cc", "transport/registry.cc"):
        path = tree / rel
        path.write_text("// harp-layer: algorithm\n" + path.read_text())
    rc, out, _ = run_check(tree)
    assert rc == 1, out
    assert sorted(reports(out)) == [("core/algorithms/allreduce_ring.cc", 1, "hosted-algorithm"),
                                    ("transport/registry.cc", 1, "hosted-algorithm")], out


def test_include_cycle_is_reported(tree):
    # core/engine/resources.h includes core/engine/scratch.h (one folder, both the
    # algorithm API: no other rule applies); make scratch.h include it back.
    no = insert_after_includes(tree, "core/engine/scratch.h", '#include "core/engine/resources.h"')
    rc, out, _ = run_check(tree)
    assert rc == 1, out
    got = reports(out)
    assert len(got) == 1 and got[0][2] == "acyclic", out
    assert "core/engine/resources.h" in out and "core/engine/scratch.h" in out
    assert got[0] in {("core/engine/scratch.h", no, "acyclic"), ("core/engine/resources.h", got[0][1], "acyclic")}


def test_prose_and_strings_are_not_code(tree):
    append_line(tree, "core/engine/context.cc", "// a dynamic_cast<transport::shm::ShmTransport*> here would be wrong")
    append_line(tree, "core/engine/communicator.cc", 'static const char* kNote = "dynamic_cast<TcpTransport*> and shm::";')
    append_line(tree, "core/select/tuning.cc", "/* #include \"transport/shm/shm_transport.h\" is not an include */")
    append_line(tree, "core/algorithms/registry.cc", 'static const char* kRaw = R"x(VerbsTransport dpdk::)x";')
    rc, out, err = run_check(tree)
    assert rc == 0, out + err


def test_hosted_algorithm_may_use_the_algorithm_api(tree):
    # What the marker grants: every algorithm API header, and its own transport.
    insert_after_includes(tree, "transport/shm/allreduce_shm.cc", '#include "core/algorithms/fold.h"')
    insert_after_includes(tree, "transport/shm/allreduce_shm.cc", '#include "transport/shm/shm_segment.h"')
    rc, out, err = run_check(tree)
    assert rc == 0, out + err


def test_generated_header_is_allowed_but_only_by_name(tree):
    # transport/registry.cc includes the generated "build_reasons.h"; another
    # unknown bare name is not excused.
    no = insert_after_includes(tree, "transport/registry.cc", '#include "made_up_reasons.h"')
    rc, out, _ = run_check(tree)
    assert rc == 1 and reports(out) == [("transport/registry.cc", no, "resolves")], out


# -- python/harp: no import circle (scripts/check_py_imports.py) ------------------------------------
PY_SCRIPT = os.path.join(ROOT, "scripts", "check_py_imports.py")


def _py_check(root):
    p = subprocess.run([sys.executable, PY_SCRIPT, "--root", str(root)], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def _py_check_with(tmp_path, rel, text):
    """check_py_imports.py on a copy of python/ (harp, harp_dev, harp_torch_plugin) with `text`
    appended to `rel`."""
    for pkg in ("harp", "harp_dev", "harp_torch_plugin"):
        shutil.copytree(os.path.join(ROOT, "python", pkg), tmp_path / "python" / pkg,
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    path = tmp_path / rel
    path.write_text(path.read_text() + "\n\n" + text)
    return _py_check(tmp_path)


def test_python_package_has_no_import_circle():
    rc, out = _py_check(ROOT)
    assert rc == 0, out
    assert "no import circle" in out


@pytest.mark.parametrize("rel, line, circle", [
    # a lazy import inside a function is still a circle
    ("python/harp/_work.py", "def _late():\n    from .comm import Communicator\n", {"harp._work", "harp.comm"}),
    ("python/harp/horovod/torch/_names.py", "from . import allreduce\n",
     {"harp.horovod.torch", "harp.horovod.torch._names"}),
])
def test_an_injected_import_circle_is_reported(tmp_path, rel, line, circle):
    rc, out = _py_check_with(tmp_path, rel, line)
    assert rc == 1, out
    first = [l for l in out.splitlines() if l.startswith("import circle: ")]
    assert len(first) == 1 and circle <= set(first[0].split(": ", 1)[1].split(", ")), out


@pytest.mark.parametrize("rel, line, reach", [
    # the fronts reached into Communicator privates before the CallLayer handle
    ("python/harp/compress.py", "def _late(comm):\n    return comm._pending\n", "comm._pending"),
    ("python/harp/torch/hooks.py", "def _late(pg):\n    return pg._coll\n", "pg._coll"),
    ("python/harp/elastic.py", "def _late(w):\n    w._finish(None)\n", "w._finish"),
])
def test_an_injected_private_reach_is_reported(tmp_path, rel, line, reach):
    rc, out = _py_check_with(tmp_path, rel, line)
    assert rc == 1, out
    got = [l for l in out.splitlines() if "reaches into a private member" in l]
    assert len(got) == 1 and got[0].startswith(rel + ":") and f": {reach}: " in got[0], out


@pytest.mark.parametrize("rel, line, name", [
    # the developer tools (harp_dev: harp-bench, harp-cluster) are not in the runtime wheel
    ("python/harp/comm.py", "def _late():\n    import harp_dev.bench.cli\n", "harp_dev.bench.cli"),
    ("python/harp/tools/config.py", "from harp_dev.cluster import topology\n", "harp_dev.cluster"),
    ("python/harp/launch.py", "def _late(importlib):\n    return importlib.import_module('harp_dev.bench')\n",
     "harp_dev.bench"),
    ("python/harp_torch_plugin/__init__.py", "ARGV = ['python', '-m', 'harp_dev.bench.workers']\n",
     "harp_dev.bench.workers"),
])
def test_a_runtime_use_of_the_dev_package_is_reported(tmp_path, rel, line, name):
    rc, out = _py_check_with(tmp_path, rel, line)
    assert rc == 1, out
    # an import of harp_dev by the runtime usually closes a circle too (harp_dev stands on harp):
    # that is reported as well; the rule's own line is there exactly once
    got = [l for l in out.splitlines() if " uses harp_dev" in l]
    assert len(got) == 1 and got[0].startswith(rel + ":") and f" uses {name}: " in got[0], out
    assert not [l for l in out.splitlines() if "reaches into" in l], out
    no = int(got[0].split(":")[1])
    assert "harp_dev" in (tmp_path / rel).read_text().splitlines()[no - 1], out


def test_the_dev_package_may_use_the_runtime(tmp_path):
    # the other direction is the point of harp_dev: it stands on harp
    rc, out = _py_check_with(tmp_path, "python/harp_dev/bench/check.py", "def _late():\n    import harp.tools.config\n")
    assert rc == 0, out


def test_a_private_of_the_same_module_or_a_third_party_is_not_a_reach(tmp_path):
    rc, out = _py_check_with(tmp_path, "python/harp/comm.py", "def _late(other, sys):\n    return other._c, sys._getframe\n")
    assert rc == 0, out


def test_engine_source_outside_a_core_folder_is_reported(tree):
    (tree / "core" / "stray.cc").write_text('#include "core/engine/context.h"\n')
    rc, out, err = run_check(tree)
    assert rc == 1, out + err
    assert ("core/stray.cc", 1, "core-down") in reports(out), out


# -- names say the concept: no tracker issue numbers in source files --------------------------------
HISTORY_RE = re.compile(r"\bissues? ?#?[0-9]+|\bissue[-_][0-9]+", re.IGNORECASE)
SOURCE_ROOTS = ("base", "bootstrap", "core", "transport", "bindings", "python", "scripts", "tests", "examples",
                "docs", "bench")
SOURCE_NAMES = (".h", ".cc", ".c", ".in", ".def", ".py", ".sh", ".txt", ".toml", ".cmake", ".md")


def _source_files():
    for top in SOURCE_ROOTS:
        for dirpath, dirnames, names in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__pycache__", "results"))]
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), ROOT)
                # bench/ keeps its records (RESULTS*.md, result folders): history belongs there and in git
                if rel.startswith("bench" + os.sep) and not n.endswith((".py", ".sh", ".cc", ".c", ".h")):
                    continue
                if n.endswith(SOURCE_NAMES) or n == "CMakeLists.txt":
                    yield rel
    for n in ("CMakeLists.txt", "pyproject.toml", "README.md", "SECURITY.md"):
        yield n


def test_no_source_file_names_a_tracker_issue():
    hits = []
    for rel in _source_files():
        with open(os.path.join(ROOT, rel), errors="replace") as f:
            for no, line in enumerate(f, 1):
                if HISTORY_RE.search(line):
                    hits.append(f"{rel}:{no}: {line.strip()[:100]}")
    assert not hits, "say the concept, not the tracker issue (history is git's and CHANGELOG's):\n" + "\n".join(hits)


def test_the_history_check_can_fail():
    word = "iss" + "ue"  # spelled apart so that this file passes the check above
    assert HISTORY_RE.search(f"// Topology ({word} 16): host map")
    assert HISTORY_RE.search(f"see {word.title()}-19")
    assert not HISTORY_RE.search("an issue of the transport; 16 ranks")


# -- Python lint: pyflakes' rules through ruff ([tool.ruff] in pyproject.toml) ------------------------------
def _ruff():
    import shutil as _sh
    exe = _sh.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    if not os.path.exists(exe):
        pytest.skip("ruff is not installed (scripts/deps/test.pip installs it)")
    return exe


def test_python_sources_pass_the_lint():
    r = subprocess.run([_ruff(), "check", "--output-format", "concise", "python", "scripts", "tests", "bench"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_lint_can_fail(tmp_path):
    (tmp_path / "pyproject.toml").write_text(open(os.path.join(ROOT, "pyproject.toml")).read())
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    r = subprocess.run([_ruff(), "check", "--output-format", "concise", "."], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "F401" in r.stdout and "F821" in r.stdout, r.stdout + r.stderr
