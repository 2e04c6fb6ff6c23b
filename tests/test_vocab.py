"""One vocabulary: base/vocab.def, and scripts/check_vocab.py, which the build
runs to hold every mirror to it (python/harp/errors.py, nccl/__init__.py,
bindings/nccl/nccl.h, the NCCL and Python mapping switches in bindings/).

Each mutation test copies the checked files to a temporary tree, changes one
value in one mirror, runs the checker there and expects it to fail naming the
file and the entry. The C++ enums are built from vocab.def itself
(base/types.h), and so are harp._types' classes (from _harp.vocab(), the
table the compiled module makes from vocab.def's lines): the last tests
compare the running library and the Python classes with vocab.def, and show
that the classes follow the table (a new entry needs no Python edit).
"""
import os
import shutil
import subprocess
import sys

import pytest

from harp import _harp
from harp import _types
from harp._types import ITEMSIZE, Coll, DataType, ReduceOp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKER = os.path.join(ROOT, "scripts", "check_vocab.py")
FILES = ["base/vocab.def", "python/harp/errors.py", "python/harp/nccl/__init__.py",
         "bindings/nccl/nccl.h", "bindings/nccl/nccl_common.cc", "bindings/nccl/nccl_coll.cc",
         "bindings/python_module.cc"]


def run_checker(root):
    return subprocess.run([sys.executable, CHECKER, "--root", str(root)], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def tree(tmp_path):
    for rel in FILES:
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), tmp_path / rel)
    return tmp_path


def test_the_tree_agrees_with_vocab_def(tree):
    r = run_checker(ROOT)
    assert r.returncode == 0, r.stderr
    r = run_checker(tree)  # the copy the mutation tests start from
    assert r.returncode == 0, r.stderr


MUTATIONS = [
    ("python/harp/errors.py", "class PeerError(HarpError):", "class PeerFailure(HarpError):",
     "python/harp/errors.py: no class PeerError"),
    ("bindings/python_module.cc", '"InvalidArgumentError", "MismatchError", "PeerError"',
     '"InvalidArgumentError", "PeerError", "MismatchError"',
     "bindings/python_module.cc: translate() names[] Error kind 1 = PeerError, base/vocab.def says MismatchError"),
    ("bindings/nccl/nccl.h", "  ncclFloat32 = 7,\n", "  ncclFloat32 = 8,\n",
     "bindings/nccl/nccl.h: ncclDataType_t ncclFloat32 = 8, base/vocab.def says 7"),
    ("bindings/nccl/nccl.h", "  ncclRemoteError = 6,\n", "  ncclRemoteError = 9,\n",
     "bindings/nccl/nccl.h: ncclResult_t ncclRemoteError = 9, base/vocab.def says 6"),
    ("python/harp/nccl/__init__.py", "NCCL_MAX = 2\n", "NCCL_MAX = 3\n",
     "python/harp/nccl/__init__.py: constant NCCL_MAX = 3, base/vocab.def says 2"),
    ("bindings/nccl/nccl_common.cc", "case ncclFloat32: return DataType::kFloat32;",
     "case ncclFloat32: return DataType::kFloat64;",
     "bindings/nccl/nccl_common.cc: toDtype case ncclFloat32 = kFloat64, base/vocab.def says kFloat32"),
    ("bindings/nccl/nccl_coll.cc", "case ncclMax: return ReduceOp::kMax;", "case ncclMax: return ReduceOp::kMin;",
     "bindings/nccl/nccl_coll.cc: toOp case ncclMax = kMin, base/vocab.def says kMax"),
    ("bindings/nccl/nccl_common.cc", "case Error::kMismatch: return ncclInvalidUsage;",
     "case Error::kMismatch: return ncclInternalError;",
     "bindings/nccl/nccl_common.cc: resultOf: Error::kMismatch does not return ncclInvalidUsage"),
    # The one list itself: NCCL's ABI is pinned, and values must stay dense.
    ("base/vocab.def", "HARP_DTYPE(bfloat16, kBfloat16, 7, 2, bfloat16, ncclBfloat16, 9)",
     "HARP_DTYPE(bfloat16, kBfloat16, 7, 2, bfloat16, ncclBfloat16, 8)",
     "base/vocab.def (against NCCL's ABI): ncclDataType_t ncclBfloat16 = 8, base/vocab.def says 9"),
    ("base/vocab.def", "HARP_REDOP(bxor, kBxor, 7,", "HARP_REDOP(bxor, kBxor, 9,",
     "base/vocab.def: HARP_REDOP(bxor) has value 9; values must be 0, 1, 2, ... in order"),
]


@pytest.mark.parametrize("rel,old,new,message", MUTATIONS, ids=[m[3].split(":")[0] + ":" + m[2].strip()[:30]
                                                                 for m in MUTATIONS])
def test_checker_names_a_changed_mirror(tree, rel, old, new, message):
    path = tree / rel
    text = path.read_text()
    assert text.count(old) == 1, f"the mutation no longer applies to {rel}: {old!r}"
    path.write_text(text.replace(old, new))
    r = run_checker(tree)
    assert r.returncode == 1
    assert f"check_vocab: {message}" in r.stderr, r.stderr


def test_the_build_runs_the_checker():
    cm = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    assert "scripts/check_vocab.py" in cm and "add_dependencies(harp harp_vocab_check)" in cm


def test_library_matches_vocab_def():
    """The compiled library (built from vocab.def) and the Python mirror agree entry by entry:
    sizes per datatype code, the operation behind each op code, and every collective name."""
    import numpy as np

    for dt in DataType:
        assert _harp.dtype_size(int(dt)) == ITEMSIZE[dt], dt
    a, b = np.array([1, 5, 6], dtype=np.int32), np.array([3, 2, 6], dtype=np.int32)
    want = {ReduceOp.SUM: a + b, ReduceOp.PROD: a * b, ReduceOp.MIN: np.minimum(a, b),
            ReduceOp.MAX: np.maximum(a, b), ReduceOp.BAND: a & b, ReduceOp.BOR: a | b, ReduceOp.BXOR: a ^ b}
    for op, expected in want.items():
        out = np.zeros_like(a)
        _harp.reduce_local(out.ctypes.data, a.ctypes.data, b.ctypes.data, a.size, int(DataType.int32), int(op))
        assert out.tolist() == expected.tolist(), op
    for c in Coll:
        _harp.algorithms(c.name)  # parseColl knows every Python name (raises otherwise)
    with pytest.raises(Exception, match="unknown collective"):
        _harp.algorithms("allreduc")


def _vocab_def():
    """base/vocab.def as scripts/check_vocab.py parses it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_vocab", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(os.path.join(ROOT, "base", "vocab.def")) as f:
        return mod.Vocab(f.read())


def test_compiled_table_is_vocab_def():
    """_harp.vocab() (bindings/python_module.cc, X-macros over vocab.def) holds every line, in order."""
    v, t = _vocab_def(), _harp.vocab()
    assert t["dtypes"] == [(r[0], r[2], r[3], r[4]) for r in v.dtypes]
    assert t["ops"] == [(r[0], r[2], r[3]) for r in v.ops]
    assert t["dtype_aliases"] == list(v.dtype_alias.items())
    assert t["op_aliases"] == list(v.op_alias.items())
    colls = [r for r in v.rows["HARP_COLL"]]
    assert t["colls"] == [(r[0], int(r[2]), r[3] == "1", r[4] == "1", r[5] == "1") for r in colls]


def test_python_classes_follow_vocab_def():
    """Every public name and value of harp._types, entry by entry against vocab.def."""
    import numpy as np

    v = _vocab_def()
    assert {d.name: int(d) for d in DataType} == {r[0]: r[2] for r in v.dtypes}
    assert {o.name: int(o) for o in ReduceOp} == {r[3]: r[2] for r in v.ops}
    assert {c.name: int(c) for c in Coll} == {r[0]: r[2] for r in v.colls}
    assert {d.name: n for d, n in ITEMSIZE.items()} == {r[0]: r[3] for r in v.dtypes}
    assert {k.name: d.name for k, d in _types._NP_TO_DT.items()} == {
        np.dtype(getattr(np, r[4])).name: r[0] for r in v.dtypes if hasattr(np, r[4])}
    assert {k: o.name for k, o in _types._OP_NAMES.items()} == dict(
        {r[0]: r[3] for r in v.ops}, **{a: dict((r[0], r[3]) for r in v.ops)[t] for a, t in v.op_alias.items()})
    for alias, name in v.dtype_alias.items():
        assert _types.parse_dtype(alias) is DataType[name]
    assert all(isinstance(c, type) and issubclass(c, int) for c in (DataType, ReduceOp, Coll))


def test_a_new_vocabulary_entry_needs_no_python_edit():
    """The classes are made from the table: a datatype, an op alias and a collective appended to it
    (as a line appended to vocab.def would append them to _harp.vocab()) appear with their values,
    item size and numpy dtype, and nothing in _types.py names an entry itself."""
    import ast

    import numpy as np

    t = _harp.vocab()
    n_dt, n_coll = len(t["dtypes"]), len(t["colls"])
    grown = dict(t, dtypes=t["dtypes"] + [("int16", n_dt, 2, "int16")], op_aliases=t["op_aliases"] + [("add", "sum")],
                 colls=t["colls"] + [("gossip", n_coll, False, False, False)])
    dt, op, coll, itemsize, np_to_dt, op_names, _ = _types._classes(grown)
    assert int(dt.int16) == n_dt and itemsize[dt.int16] == 2 and np_to_dt[np.dtype(np.int16)] is dt.int16
    assert op_names["add"] is op.SUM and int(coll.gossip) == n_coll
    assert [d.name for d in dt][:n_dt] == [d.name for d in DataType]
    src = ast.parse(open(_types.__file__).read())
    declared = {n.name for n in ast.walk(src) if isinstance(n, ast.ClassDef)}
    assert not declared & {"DataType", "ReduceOp", "Coll"}, "harp._types declares the vocabulary again"
    names = {d.name for d in DataType} | {o.name for o in ReduceOp} | {c.name for c in Coll}
    literal = {n.value for n in ast.walk(src) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not (names - {"bool", "bfloat16"}) & literal, "harp._types names vocabulary entries itself"
