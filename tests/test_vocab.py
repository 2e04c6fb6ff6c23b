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
         "bindings/python_module.cc", "base/types.h", "python/harp/_types.py"]


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
    ("base/vocab.def", "HARP_DTYPE(bfloat16, kBfloat16, 7, 2, bfloat16, ncclBfloat16, 9,",
     "HARP_DTYPE(bfloat16, kBfloat16, 7, 2, bfloat16, ncclBfloat16, 8,",
     "base/vocab.def (against NCCL's ABI): ncclDataType_t ncclBfloat16 = 8, base/vocab.def says 9"),
    ("base/vocab.def", "HARP_REDOP(bxor, kBxor, 7,", "HARP_REDOP(bxor, kBxor, 9,",
     "base/vocab.def: HARP_REDOP(bxor) has value 9; values must be 0, 1, 2, ... in order"),
    ("base/vocab.def", "ncclFloat16, 6, 0, Half)", "ncclFloat16, 6, 0, half)",
     "base/vocab.def: HARP_DTYPE(float16): integer must be 0 or 1 and torch a c10 ScalarType name, not 0, half"),
    # HARP_COLL's traits: the byte rule, the in-place rule and the flags must describe one collective.
    ("base/vocab.def", "HARP_COLL(scatter, kScatter, 8, 0, 1, 0,", "HARP_COLL(scatter, kScatter, 8, 0, 0, 0,",
     "base/vocab.def: HARP_COLL(scatter): a root-only buffer (root_count_p/count) on a collective without a root"),
    ("base/vocab.def", "count_p, count, block, reduce_scatter)", "count, count, block, reduce_scatter)",
     "base/vocab.def: HARP_COLL(reduce_scatter): in-place rule 'block' needs a send buffer of p blocks"),
    ("base/vocab.def", "count_p, count_p, same, all_to_all)", "count_p, count, same, all_to_all)",
     "base/vocab.def: HARP_COLL(alltoall): in-place rule 'same' with buffers of different sizes (count_p/count)"),
    ("base/vocab.def", "count, none, none, send)", "count, count, none, send)",
     "base/vocab.def: HARP_COLL(send): in-place rule 'none' on a collective with two buffers (count/count)"),
    ("base/vocab.def", "root_count, count, alone, broadcast)", "root_count, root_count, alone, broadcast)",
     "base/vocab.def: HARP_COLL(broadcast): in-place rule 'alone' needs a receive buffer on every rank"),
    ("base/vocab.def", "listed, listed, unchecked, all_to_all)", "count, listed, unchecked, all_to_all)",
     "base/vocab.def: HARP_COLL(alltoallv): per-rank counts need send and recv 'listed', not count/listed"),
    ("base/vocab.def", "none, count, none, recv)", "none, count, none, Recv)",
     "base/vocab.def: HARP_COLL(recv): torch name 'Recv' is not a lower-case identifier"),
    ("base/vocab.def", "count, count_p, any, all_gather)", "count, count_p, any)",
     "base/vocab.def: HARP_COLL(allgather) has 9 columns, needs 10"),
    ("base/vocab.def", "count, root_count_p, any, gather)", "count, root_count_x, any, gather)",
     "base/types.h: enum class Extent has no root_count_x (vocab.def: HARP_COLL(gather) recv)"),
    ("base/vocab.def", "count_p, count, block, reduce_scatter)", "count_p, count, blocked, reduce_scatter)",
     "base/types.h: enum class InPlaceRule has no blocked (vocab.def: HARP_COLL(reduce_scatter) inplace)"),
    ("python/harp/_types.py", 'if extent == "root_count_p":', 'if extent == "root_count_q":',
     "python/harp/_types.py: buffer_blocks has no branch for extent root_count_p"),
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
    assert t["dtypes"] == [(r[0], r[2], r[3], r[4], r[6]) for r in v.dtypes]
    assert t["ops"] == [(r[0], r[2], r[3]) for r in v.ops]
    assert t["dtype_aliases"] == list(v.dtype_alias.items())
    assert t["op_aliases"] == list(v.op_alias.items())
    colls = [r for r in v.rows["HARP_COLL"]]
    assert t["colls"] == [(r[0], int(r[2]), r[3] == "1", r[4] == "1", r[5] == "1", *r[6:]) for r in colls]
    assert {c.name: tuple(tr) for c, tr in _types.COLL_TRAITS.items()} == {
        r[0]: tuple(v.coll_traits[r[0]].values()) for r in colls}


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
    grown = dict(t, dtypes=t["dtypes"] + [("int16", n_dt, 2, "int16", -1)], op_aliases=t["op_aliases"] + [("add", "sum")],
                 colls=t["colls"] + [("gossip", n_coll, False, False, False, "count", "count_p", "any", "gossip")])
    dt, op, coll, itemsize, np_to_dt, op_names, _, traits = _types._classes(grown)
    assert int(dt.int16) == n_dt and itemsize[dt.int16] == 2 and np_to_dt[np.dtype(np.int16)] is dt.int16
    assert op_names["add"] is op.SUM and int(coll.gossip) == n_coll
    assert traits[coll.gossip].recv == "count_p" and traits[coll.gossip].torch == "gossip"
    assert [d.name for d in dt][:n_dt] == [d.name for d in DataType]
    src = ast.parse(open(_types.__file__).read())
    declared = {n.name for n in ast.walk(src) if isinstance(n, ast.ClassDef)}
    assert not declared & {"DataType", "ReduceOp", "Coll"}, "harp._types declares the vocabulary again"
    names = {d.name for d in DataType} | {o.name for o in ReduceOp} | {c.name for c in Coll}
    literal = {n.value for n in ast.walk(src) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not (names - {"bool", "bfloat16"}) & literal, "harp._types names vocabulary entries itself"


# The byte rule, written out apart from vocab.def: (send, receive) elements on the root and on
# another rank for count c at p ranks; None: the call lists its own buffers.
def _byte_rule(c, p):
    return {
        "allreduce": ((c, c), (c, c)), "broadcast": ((c, c), (0, c)), "reduce": ((c, c), (c, 0)),
        "allgather": ((c, c * p), (c, c * p)), "reduce_scatter": ((c * p, c), (c * p, c)),
        "alltoall": ((c * p, c * p), (c * p, c * p)), "gather": ((c, c * p), (c, 0)),
        "scatter": ((c * p, c), (0, c)), "barrier": ((0, 0), (0, 0)), "send": ((c, 0), (c, 0)),
        "recv": ((0, c), (0, c)), "alltoallv": None, "p2p_batch": None, "allreduce_coalesced": None}


def test_byte_rule():
    """harp._types.buffer_elems (vocab.def's send and recv columns) gives every collective's buffer
    sizes as NCCL and MPI define them, on the root and elsewhere, at odd p and c."""
    for p, c in ((1, 5), (3, 7), (4, 1)):
        want = _byte_rule(c, p)
        assert set(want) == {x.name for x in Coll}, "a collective without a byte rule here"
        for coll in Coll:
            w = want[coll.name]
            if w is None:
                assert _types.COLL_TRAITS[coll][3:5] == ("listed", "listed"), coll
                continue
            assert (_types.buffer_elems(coll, c, p, True), _types.buffer_elems(coll, c, p, False)) == w, coll


def test_torch_names():
    """The names torch's ProcessGroupNCCL records ("nccl:<name>"), as vocab.def's torch column gives them."""
    assert _types.TORCH_NAMES == {
        "allreduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce", "allgather": "all_gather",
        "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all", "alltoallv": "all_to_all", "gather": "gather",
        "scatter": "scatter", "barrier": "barrier", "send": "send", "recv": "recv", "p2p_batch": "coalesced",
        "allreduce_coalesced": "allreduce_coalesced"}
    assert all(_types.NCCL_ITEMSIZE[int(v)] == ITEMSIZE[DataType[n]] for n, v in (
        ("int8", 0), ("uint8", 1), ("int32", 2), ("uint32", 3), ("int64", 4), ("uint64", 5), ("float16", 6),
        ("float32", 7), ("float64", 8), ("bfloat16", 9)))
