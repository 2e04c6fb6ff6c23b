"""The parameter registry (base/params.def): every HARP_* name declared once,
defaults taken from it, harp-config --params, unknown-variable warnings, docs/params.md.

The C++ side (readers refuse undeclared or mistyped names, defaults come from
the registry, nearest-name) is tests/cpp/test_params.cc (run by test_cpp.py).
"""
import json
import os
import re
import subprocess
import sys

import pytest

from harp import _params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
NAME = re.compile(r"HARP_[A-Z0-9_]+")

# HARP_* words in the tree that are not environment variables, and why. Everything
# else must be declared in base/params.def.
NON_PARAMETERS = {
    "HARP_PARAM": "the X-macro of base/params.def",
    "HARP_LOG": "C++ logging macro (base/log.h)",
    "HARP_WARN": "C++ logging macro",
    "HARP_INFO": "C++ logging macro",
    "HARP_TRACE": "C++ logging macro",
    "HARP_LOG_S": "C++ logging macro with a subsystem (base/log.h)",
    "HARP_INFO_S": "C++ logging macro with a subsystem (base/log.h)",
    "HARP_TRACE_S": "C++ logging macro with a subsystem (base/log.h)",
    "HARP_NCCL_H": "include marker of bindings/nccl/nccl.h",
    "HARP_NCCL_EXPORT": "C++ macro (bindings/nccl/nccl_export.h)",
    "HARP_NCCL_ENTER": "C++ macro",
    "HARP_NCCL_ALIAS": "C++ macro",
    "HARP_REGISTER_TRANSPORT": "C++ macro (transport/transport.h)",
    "HARP_REGISTER_ALGORITHM": "C++ macro (core/algorithms/algorithm.h)",
    "HARP_ALGO_CONCAT": "C++ macro",
    "HARP_ALGO_CONCAT2": "C++ macro",
    "HARP_ALGORITHM_SOURCES": "CMake variable (core/CMakeLists.txt)",
    "HARP_REGISTER_TRANSPORT_CONCAT": "C++ macro",
    "HARP_REGISTER_TRANSPORT_CONCAT2": "C++ macro",
    "HARP_TRANSPORT_ABI": "C++ constant (transport/transport.h)",
    "HARP_TRANSPORT_MODULE": "CMake variable / compile definition",
    "HARP_TRANSPORT_LINK_STATIC": "CMake variable",
    "HARP_TRANSPORT_MISSING_REASON": "CMake variable",
    "HARP_TRANSPORT_REASONS": "CMake variable",
    "HARP_VERSION": "CMake variable",
    "HARP_VERSION_LINE": "CMake variable",
    "HARP_VERSION_STRING": "compile definition",
    "HARP_HAVE_AVX2_KERNELS": "compile definition",
    "HARP_KERNEL_ISA": "compile definition",
    "HARP_TUNING_TSV": "CMake variable",
    "HARP_BUILD_PYTHON": "CMake option",
    "HARP_NO_CFFI": "CMake variable",
    "HARP_DPDK_CFFI_DIR": "CMake variable",
    "HARP_PATH": "Python constant in tests/test_shm.py",
    "HARP_MPI_PORT": "Python constant in python/harp_dev/cluster/launchers.py",
    "HARP_UNIQUE": "a prefix matched by python/harp_dev/bench/cli.py (HARP_UNIQUE_ID)",
    "HARP_VOCAB_FILES": "CMake variable (the vocabulary check)",
}
NON_PARAMETERS.update(dict.fromkeys(
    ("HARP_DTYPE", "HARP_DTYPE_ALIAS", "HARP_NCCL_DTYPE_ALIAS", "HARP_REDOP", "HARP_REDOP_ALIAS", "HARP_COLL",
     "HARP_ERROR", "HARP_NCCL_RESULT", "HARP_NCCL_COUNT"), "X-macros of base/vocab.def"))
# Deliberately misspelt or placeholder names: the examples of unknown variables in docs and tests.
NON_PARAMETERS.update(dict.fromkeys(("HARP_TRANSPRT", "HARP_TIMEUOT", "HARP_SEGMENT_BYTE", "HARP_SOCKET_IFNAM",
                                     "HARP_X"), "an example of an unknown name (docs, tests)"))
# Files where HARP_* words are history or the registry itself.
SKIP = {"CHANGELOG.md", "base/params.def", "docs/params.md"}


def source_files():
    """Tracked and new (not ignored) files of the checkout."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in out:
        path = os.path.join(ROOT, rel)
        if rel and rel not in SKIP and os.path.isfile(path) and not rel.endswith((".so", ".png", ".whl")):
            try:
                with open(path, encoding="utf-8") as f:
                    yield rel, f.read()
            except UnicodeDecodeError:
                continue


def test_registry_parses_every_line_once():
    path = _params.def_path()
    text = open(path).read()
    lines = [ln for ln in text.splitlines() if ln.startswith("HARP_PARAM(")]
    table = _params.params()
    assert len(table) == len(lines) > 50
    for p in table.values():
        assert p.doc and p.type in _params.TYPES and p.scope in _params.SCOPES
        assert (p.type == "enum") == bool(p.choices), p.name
        if p.default not in ("", "auto"):
            assert _params.check_value(p, p.default) == "", (p.name, p.default)
    with pytest.raises(ValueError, match="params.def:2"):
        _params.parse('// x\nHARP_PARAM(HARP_X, Int, "1", "", Library)\n')
    with pytest.raises(ValueError, match="declared twice"):
        _params.parse('HARP_PARAM(HARP_X, Int, "1", "", Library, "d")\nHARP_PARAM(HARP_X, Int, "1", "", Library, "d")\n')


def test_every_harp_name_in_the_tree_is_declared():
    declared = _params.params()
    bad = {}
    for rel, text in source_files():
        for m in NAME.finditer(text):
            name = m.group(0)
            if name in declared or name in NON_PARAMETERS:
                continue
            if name.endswith("_") and any(d.startswith(name) for d in declared):
                continue  # a prefix: HARP_SHM_*, HARP_LOCAL_*
            bad.setdefault(name, set()).add(rel)
    assert not bad, "HARP_* names neither declared in base/params.def nor listed in NON_PARAMETERS: " + \
        "; ".join(f"{k} ({', '.join(sorted(v))})" for k, v in sorted(bad.items()))


def test_the_scan_catches_an_undeclared_name():
    """The scan above can fail: a new file naming a misspelt variable is reported."""
    probe = os.path.join(ROOT, "python", "harp", "_params_probe_tmp.py")
    name = "HARP_" + "TRANSPROT"  # split, so this file does not trip the scan itself
    with open(probe, "w") as f:
        f.write(f'import os\nx = os.environ.get("{name}")\n')
    try:
        with pytest.raises(AssertionError, match=name + r" \(python/harp/_params_probe_tmp.py\)"):
            test_every_harp_name_in_the_tree_is_declared()
    finally:
        os.remove(probe)


# Literal "defaults" that are not defaults of a read: a script that sets its own value, a label.
NOT_READ_DEFAULTS = {
    ("scripts/gpu-check.sh", "HARP_TIMEOUT"): "exports a shorter timeout for its own runs",
    ("bench/gpu/allreduce_device.py", "HARP_TRANSPORT"): "'(default)' is a label in its report",
}


def test_literal_defaults_in_python_and_shell_match_the_registry():
    """Reads that still spell a default (os.environ.get("HARP_X", "d"), ${HARP_X:-d}) agree with it."""
    py = re.compile(r"""environ\.get\(\s*["'](HARP_[A-Z0-9_]+)["']\s*,\s*["']([^"']*)["']""")
    sh = re.compile(r"\$\{(HARP_[A-Z0-9_]+):-([^}]*)\}")
    wrong, seen = [], 0
    for rel, text in source_files():
        pat = py if rel.endswith(".py") else sh if rel.endswith(".sh") or rel == ".ci/run" else None
        for m in pat.finditer(text) if pat else ():
            seen += 1
            name, lit = m.groups()
            p = _params.params().get(name)
            if p is not None and p.default != "auto" and lit != p.default and (rel, name) not in NOT_READ_DEFAULTS:
                wrong.append(f"{rel}: {name} defaults to {lit!r} there, {p.default!r} in params.def")
    assert seen >= 3 and not wrong, wrong


def test_python_reads():
    env = {"HARP_SPIN": "7", "HARP_TIMEOUT": ""}
    assert _params.get("HARP_SPIN", env) == "7"
    assert _params.get("HARP_TIMEOUT", env) == "300"  # empty counts as unset
    assert _params.get("HARP_LAUNCH_BIND", {}) == "127.0.0.1:0"
    assert _params.raw("HARP_CUDART", {}) is None
    with pytest.raises(LookupError, match="HARP_TRANSPRT is read but not declared.*nearest: HARP_TRANSPORT"):
        _params.get("HARP_TRANSPRT", {})
    assert _params.nearest("HARP_TIMEUOT") == "HARP_TIMEOUT"
    assert _params.edit_distance("kitten", "sitting") == 3
    assert _params.unknown({"HARP_TRANSPRT": "tcp", "HARP_SPIN": "1", "PATH": "/"}) == [
        ("HARP_TRANSPRT", "HARP_TRANSPORT")]


def _config(*args, **env):
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", *args], capture_output=True, text=True,
                       env=dict(ENV, **env), timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_harp_config_params_lists_value_and_source():
    out = _config("--params", HARP_SEGMENT_BYTES="64K", HARP_SPIN="abc", HARP_SEGMENT_BYTE="1M")
    lines = {ln.split()[0]: ln for ln in out.splitlines()}
    for name in _params.params():
        assert name in lines, name
    assert re.match(r"HARP_SEGMENT_BYTES\s+bytes\s+64K\s+environment\s+library\s+pipelining", lines["HARP_SEGMENT_BYTES"])
    assert re.match(r"HARP_SHM_CMA_PIECE\s+bytes\s+4M\s+default\s+library", lines["HARP_SHM_CMA_PIECE"])
    assert "[invalid: not an int]" in lines["HARP_SPIN"]
    assert "did you mean HARP_SEGMENT_BYTES?" in lines["HARP_SEGMENT_BYTE"]


def test_harp_config_params_json():
    rows = json.loads(_config("--params", "--json", HARP_TIMEOUT="7", HARP_TRANSPRT="tcp"))
    by = {r["name"]: r for r in rows}
    assert set(_params.params()) <= set(by)
    assert by["HARP_TIMEOUT"]["value"] == "7" and by["HARP_TIMEOUT"]["source"] == "environment"
    assert by["HARP_TIMEOUT"]["default"] == "300" and by["HARP_TIMEOUT"]["type"] == "seconds"
    assert by["HARP_DPDK_MEMIF_DIR"] == {"name": "HARP_DPDK_MEMIF_DIR", "type": "string", "value": "/tmp",
                                         "source": "default", "default": "/tmp", "choices": [], "scope": "library",
                                         "doc": "where memif sockets live", "invalid": ""}
    assert by["HARP_TRANSPRT"]["scope"] == "unknown"




def _run(cmd, **env):
    base = {k: v for k, v in ENV.items() if not k.startswith("HARP_")}
    base.update(HARP_TIMEOUT="60", **env)
    return subprocess.run(cmd, capture_output=True, text=True, env=base, timeout=300)


WARN_T = "HARP_TRANSPRT is not a HARP parameter (did you mean HARP_TRANSPORT?)"
WARN_S = "HARP_SEGMENT_BYTE is not a HARP parameter (did you mean HARP_SEGMENT_BYTES?)"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_unknown_variable_warned_once_per_process(tmp_path, transport):
    """A rank started without harp-run (address launch, as under mpirun) warns once from C++ at
    communicator creation, even when it creates two communicators; declared variables never warn."""
    prog = tmp_path / "p.py"
    prog.write_text("import os, harp\n"
                    "a = harp.init()\n"
                    "b = harp.Communicator(0, 1, harp.get_unique_id('127.0.0.1:0'))\n"
                    "a.barrier()\nprint('ok')\n")
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    secret = os.urandom(16).hex()
    procs = [subprocess.Popen([sys.executable, str(prog)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict({k: v for k, v in ENV.items() if not k.startswith("HARP_")},
                                       HARP_ADDR=f"127.0.0.1:{port}", HARP_SECRET=secret, HARP_RANK=str(r),
                                       HARP_WORLD_SIZE="3", HARP_TIMEOUT="60", HARP_TRANSPORT=transport,
                                       HARP_TRANSPRT="tcp", HARP_SEGMENT_BYTE="1M"))
             for r in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "ok" in out, err
        assert err.count(WARN_T) == 1 and err.count(WARN_S) == 1, err
        assert "HARP_TRANSPORT is not" not in err and "HARP_SECRET is not" not in err


def test_harp_run_warns_once_for_all_ranks(tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("import harp\nc = harp.init()\nc.barrier()\nprint('ok', c.rank)\n")
    r = _run([sys.executable, "-m", "harp.launch", "-n", "3", str(prog)], HARP_TRANSPRT="tcp")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok") == 3
    assert r.stderr.count(WARN_T) == 1, r.stderr
    assert f"harp: warning: {WARN_T}" in r.stderr


def test_docs_params_md_is_current():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "params_doc.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "docs/params.md" in readme and "harp-config --params" in readme


# -- C++ reads are checked when they compile (base/env.h Name, params::decl from params.def) ----------
CXX = os.environ.get("CXX") or "c++"
COMPILE_CASES = [
    ('env::str("HARP_TRANSPRT")', "HARP_name_is_not_declared_in_base_params_def"),
    ('env::integer("HARP_SEGMENT_BYTES")', "HARP_parameter_is_read_as_another_type_than_params_def_declares"),
    ('env::integer("HARP_SHM_SLOTS")', "HARP_auto_parameter_needs_the_computed_default_read_it_with_an_Or_function"),
    ('env::integerOr("HARP_SPIN", 3)', "HARP_parameter_with_a_fixed_default_takes_no_computed_default"),
    ('env::bytes("HARP_SEGMENT_BYTES"), env::integerOr("HARP_SHM_SLOTS", 2), env::str("HARP_SPIN")', None),
]


@pytest.mark.parametrize("read, rule", COMPILE_CASES, ids=[c[1] or "declared" for c in COMPILE_CASES])
def test_a_misspelt_or_mistyped_read_does_not_compile(tmp_path, read, rule):
    src = tmp_path / "read.cc"
    src.write_text(f'#include "base/env.h"\nusing namespace harp;\nvoid f() {{ (void)({read}); }}\n')
    try:
        p = subprocess.run([CXX, "-std=c++20", "-fsyntax-only", "-I", ROOT, str(src)], capture_output=True,
                           text=True, timeout=120)
    except FileNotFoundError:
        pytest.skip(f"no C++ compiler ({CXX})")
    if rule is None:
        assert p.returncode == 0, p.stderr
    else:
        assert p.returncode != 0, f"{read} compiled"
        assert rule in p.stderr, p.stderr[-2000:]
