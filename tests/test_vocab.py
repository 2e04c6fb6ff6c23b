"""One vocabulary: base/vocab.def, and scripts/check_vocab.py, which the build
runs to hold every mirror to it (python/harp/_types.py, errors.py, nccl.py,
bindings/nccl/nccl.h, the NCCL and Python mapping switches in bindings/).

Each mutation test copies the checked files to a temporary tree, changes one
value in one mirror, runs the checker there and expects it to fail naming the
file and the entry. The C++ enums are built from vocab.def itself
(base/types.h); the last tests compare the running library with it.
"""
import os
import shutil
import subprocess
import sys

import pytest

from harp import _harp
from harp._types import ITEMSIZE, Coll, DataType, ReduceOp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKER = os.path.join(ROOT, "scripts", "check_vocab.py")
FILES = ["base/vocab.def", "python/harp/_types.py", "python/harp/errors.py", "python/harp/nccl.py",
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
    ("python/harp/_types.py", "    float32 = 8\n", "    float32 = 7\n",
     "python/harp/_types.py: DataType float32 = 7, base/vocab.def says 8"),
    ("python/harp/_types.py", "DataType.float64: 8,", "DataType.float64: 4,",
     "python/harp/_types.py: ITEMSIZE float64 = 4, base/vocab.def says 8"),
    ("python/harp/_types.py", '"mean": ReduceOp.AVG', '"mean": ReduceOp.SUM',
     "python/harp/_types.py: _OP_NAMES mean = sum, base/vocab.def says avg"),
    ("python/harp/_types.py", "    p2p_batch = 12\n", "    p2p_batch = 12\n    gossip = 13\n",
     "python/harp/_types.py: Coll gossip = 13 is not in base/vocab.def"),
    ("python/harp/_types.py", "np.dtype(np.int32): DataType.int32", "np.dtype(np.int16): DataType.int32",
     "python/harp/_types.py: _NP_TO_DT numpy dtype int32 is missing"),
    ("python/harp/_types.py", '"double": "float64"', '"double": "float32"',
     "python/harp/_types.py: parse_dtype alias double = float32, base/vocab.def says float64"),
    ("python/harp/errors.py", "class PeerError(HarpError):", "class PeerFailure(HarpError):",
     "python/harp/errors.py: no class PeerError"),
    ("bindings/python_module.cc", '"InvalidArgumentError", "MismatchError", "PeerError"',
     '"InvalidArgumentError", "PeerError", "MismatchError"',
     "bindings/python_module.cc: translate() names[] Error kind 1 = PeerError, base/vocab.def says MismatchError"),
    ("bindings/nccl/nccl.h", "  ncclFloat32 = 7,\n", "  ncclFloat32 = 8,\n",
     "bindings/nccl/nccl.h: ncclDataType_t ncclFloat32 = 8, base/vocab.def says 7"),
    ("bindings/nccl/nccl.h", "  ncclRemoteError = 6,\n", "  ncclRemoteError = 9,\n",
     "bindings/nccl/nccl.h: ncclResult_t ncclRemoteError = 9, base/vocab.def says 6"),
    ("python/harp/nccl.py", "NCCL_MAX = 2\n", "NCCL_MAX = 3\n",
     "python/harp/nccl.py: constant NCCL_MAX = 3, base/vocab.def says 2"),
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
