#!/usr/bin/env python3
"""Check HARP's vocabulary mirrors against base/vocab.def (the one list).

    python3 scripts/check_vocab.py [--root DIR] [--stamp FILE]

C++ builds its enums and name tables from vocab.def directly; the files that
cannot include it are checked here, and the build runs this script (CMake
target harp_vocab_check), so a mismatch fails the build with a line naming
the file, the entry and both values:

  python/harp/errors.py   an exception class per error kind
  bindings/python_module.cc   error kind -> Python exception (translate's names[])
  bindings/nccl/nccl.h    ncclDataType_t, ncclRedOp_t, ncclResult_t values
  python/harp/nccl/__init__.py   NCCL_* constants
  bindings/nccl/nccl_common.cc, nccl_coll.cc  NCCL <-> HARP switches
  base/types.h            the Extent and InPlaceRule enumerators HARP_COLL's columns name
  python/harp/_types.py   buffer_blocks: a branch per byte-rule extent that holds blocks
  and vocab.def's NCCL values against NCCL's public ABI (held below), and each
  HARP_COLL line's traits against each other (a root-only buffer on a collective
  without a root, an in-place rule its byte rule cannot satisfy, ...).
python/harp/_types.py is no mirror: it builds its classes from the table the
compiled module exports (_harp.vocab(), made from vocab.def's own lines).

Exit status 0 when everything agrees, 1 otherwise (each mismatch on stderr).
Standard library only. tests/test_vocab.py changes one mirror in a copy and
expects the named mismatch.
"""
import argparse
import ast
import os
import re
import sys

# NCCL's public ABI (nccl.h 2.21): not HARP's to change.
NCCL_ABI = {
    "ncclDataType_t": {"ncclInt8": 0, "ncclChar": 0, "ncclUint8": 1, "ncclInt32": 2, "ncclInt": 2, "ncclUint32": 3,
                       "ncclInt64": 4, "ncclUint64": 5, "ncclFloat16": 6, "ncclHalf": 6, "ncclFloat32": 7,
                       "ncclFloat": 7, "ncclFloat64": 8, "ncclDouble": 8, "ncclBfloat16": 9, "ncclNumTypes": 10},
    "ncclRedOp_t": {"ncclSum": 0, "ncclProd": 1, "ncclMax": 2, "ncclMin": 3, "ncclAvg": 4, "ncclNumOps": 5},
    "ncclResult_t": {"ncclSuccess": 0, "ncclUnhandledCudaError": 1, "ncclSystemError": 2, "ncclInternalError": 3,
                     "ncclInvalidArgument": 4, "ncclInvalidUsage": 5, "ncclRemoteError": 6, "ncclInProgress": 7,
                     "ncclNumResults": 8},
}


# HARP_COLL's columns after name, Enumerator and value (vocab.def's header explains them).
COLL_COLUMNS = ("reduces", "rooted", "vcounts", "send", "recv", "inplace", "torch")


class Vocab:
    def __init__(self, text):
        self.rows = {}
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r"^(HARP_[A-Z_]+)\((.*)\)\s*$", line)
            if m:
                self.rows.setdefault(m.group(1), []).append([x.strip() for x in m.group(2).split(",")])
        d = self.rows
        self.dtypes = [(r[0], r[1], int(r[2]), int(r[3]), r[4], r[5], int(r[6])) for r in d.get("HARP_DTYPE", [])]
        self.dtype_alias = dict(d.get("HARP_DTYPE_ALIAS", []))
        self.nccl_dtype_alias = dict(d.get("HARP_NCCL_DTYPE_ALIAS", []))
        self.ops = [(r[0], r[1], int(r[2]), r[3], r[4], int(r[5])) for r in d.get("HARP_REDOP", [])]
        self.op_alias = dict(d.get("HARP_REDOP_ALIAS", []))
        self.colls = [(r[0], r[1], int(r[2])) for r in d.get("HARP_COLL", [])]
        # name -> {reduces, rooted, vcounts (bool), send, recv, inplace, torch (str)}
        self.coll_traits = {r[0]: dict(zip(COLL_COLUMNS, [x == "1" for x in r[3:6]] + r[6:10]))
                            for r in d.get("HARP_COLL", []) if len(r) == 10}
        self.coll_widths = {r[0]: len(r) for r in d.get("HARP_COLL", [])}
        self.errors = [(r[0], int(r[1]), r[2], r[3]) for r in d.get("HARP_ERROR", [])]
        self.results = {r[0]: int(r[1]) for r in d.get("HARP_NCCL_RESULT", [])}
        self.counts = {r[0]: int(r[1]) for r in d.get("HARP_NCCL_COUNT", [])}

    def nccl_dtypes(self):
        """{NCCL enumerator: value}, aliases and the count included."""
        out = {nc: v for (_, _, _, _, _, nc, v) in self.dtypes if nc != "none"}
        out.update({a: out.get(t, -1) for a, t in self.nccl_dtype_alias.items()})
        out["ncclNumTypes"] = self.counts.get("ncclNumTypes", -1)
        return out

    def nccl_ops(self):
        out = {nc: v for (_, _, _, _, nc, v) in self.ops if nc != "none"}
        out["ncclNumOps"] = self.counts.get("ncclNumOps", -1)
        return out

    def nccl_results(self):
        return dict(self.results, ncclNumResults=self.counts.get("ncclNumResults", -1))


class Checker:
    def __init__(self, root):
        self.root = root
        self.errors = []

    def read(self, rel):
        with open(os.path.join(self.root, rel)) as f:
            return f.read()

    def fail(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def same(self, where, what, got, want):
        """Compare {name: value} maps; one message per missing, extra or different entry."""
        for k in sorted(set(got) | set(want), key=str):
            if k not in got:
                self.fail(where, f"{what} {k} is missing (vocab.def: {want[k]})")
            elif k not in want:
                self.fail(where, f"{what} {k} = {got[k]} is not in base/vocab.def")
            elif got[k] != want[k]:
                self.fail(where, f"{what} {k} = {got[k]}, base/vocab.def says {want[k]}")


def check_def(c, v):
    where = "base/vocab.def"
    for kind, rows, idx in (("HARP_DTYPE", v.dtypes, 2), ("HARP_REDOP", v.ops, 2), ("HARP_COLL", v.colls, 2),
                            ("HARP_ERROR", v.errors, 1)):
        if not rows:
            c.fail(where, f"no {kind} lines")
        for i, r in enumerate(rows):
            if r[idx] != i:
                c.fail(where, f"{kind}({r[0]}) has value {r[idx]}; values must be 0, 1, 2, ... in order")
    for r in v.rows.get("HARP_DTYPE", []):
        if len(r) != 9:
            c.fail(where, f"HARP_DTYPE({r[0]}) has {len(r)} columns, needs 9 (name, Enumerator, value, itemsize, "
                          "numpy name, NCCL enumerator, NCCL value, integer, torch)")
        elif r[7] not in ("0", "1") or not re.fullmatch(r"[A-Z]\w*", r[8]):
            c.fail(where, f"HARP_DTYPE({r[0]}): integer must be 0 or 1 and torch a c10 ScalarType name, "
                          f"not {r[7]}, {r[8]}")
    names = {r[0] for r in v.dtypes}
    for a, t in v.dtype_alias.items():
        if t not in names:
            c.fail(where, f"HARP_DTYPE_ALIAS({a}, {t}): no datatype {t}")
    for a, t in v.op_alias.items():
        if t not in {r[0] for r in v.ops}:
            c.fail(where, f"HARP_REDOP_ALIAS({a}, {t}): no op {t}")
    c.same(where + " (against NCCL's ABI)", "ncclDataType_t", v.nccl_dtypes(), NCCL_ABI["ncclDataType_t"])
    c.same(where + " (against NCCL's ABI)", "ncclRedOp_t", v.nccl_ops(), NCCL_ABI["ncclRedOp_t"])
    c.same(where + " (against NCCL's ABI)", "ncclResult_t", v.nccl_results(), NCCL_ABI["ncclResult_t"])


def _blocks(extent, root):
    """buffer_blocks at p = 2 (0, 1 or 2 blocks on a rank; None for listed)."""
    return {"none": 0, "count": 1, "count_p": 2, "root_count": int(root), "root_count_p": 2 * root}.get(extent)


def check_colls(c, v):
    """Each HARP_COLL line's traits agree with each other: the byte rule, the in-place rule and the
    flags describe one collective."""
    where = "base/vocab.def"
    for name, width in v.coll_widths.items():
        if width != 3 + len(COLL_COLUMNS):
            c.fail(where, f"HARP_COLL({name}) has {width} columns, needs {3 + len(COLL_COLUMNS)} "
                          f"(name, Enumerator, value, {', '.join(COLL_COLUMNS)})")
    for name, t in v.coll_traits.items():
        line = f"HARP_COLL({name})"
        sides = (t["send"], t["recv"])
        if not re.fullmatch(r"[a-z][a-z0-9_]*", t["torch"]):
            c.fail(where, f"{line}: torch name '{t['torch']}' is not a lower-case identifier")
        if any(x.startswith("root_") for x in sides) and not t["rooted"]:
            c.fail(where, f"{line}: a root-only buffer ({'/'.join(sides)}) on a collective without a root")
        if t["vcounts"] and sides != ("listed", "listed"):
            c.fail(where, f"{line}: per-rank counts need send and recv 'listed', not {'/'.join(sides)}")
        if t["reduces"] and t["send"] == "none":
            c.fail(where, f"{line}: a reduction without a send buffer")
        if "listed" in sides:
            continue
        at_root = [(_blocks(t["send"], r), _blocks(t["recv"], r)) for r in (True, False)]
        if None in sum(at_root, ()):
            continue  # an unknown extent: check_enums names it
        rule = t["inplace"]
        if rule == "same" and any(s and r and s != r for s, r in at_root):
            c.fail(where, f"{line}: in-place rule 'same' with buffers of different sizes ({'/'.join(sides)})")
        if rule == "block" and any(s and r and s != 2 * r for s, r in at_root):
            c.fail(where, f"{line}: in-place rule 'block' needs a send buffer of p blocks of the receive buffer "
                          f"({'/'.join(sides)})")
        if rule == "none" and any(s and r for s, r in at_root):
            c.fail(where, f"{line}: in-place rule 'none' on a collective with two buffers ({'/'.join(sides)})")
        if rule == "alone" and not all(r for _, r in at_root):
            c.fail(where, f"{line}: in-place rule 'alone' needs a receive buffer on every rank")


def _enum_class(text, name):
    m = re.search(r"enum class " + name + r"\s*:\s*\w+\s*\{([^}]*)\}", text)
    return None if m is None else [x.strip() for x in m.group(1).split(",") if x.strip()]


def check_enums(c, v):
    """The tokens vocab.def's send/recv/inplace columns use are base/types.h's enumerators (spelt
    alike, so the X-macros compile), and harp._types.buffer_blocks knows each extent holding blocks."""
    rel = "base/types.h"
    text = c.read(rel)
    for enum, cols in (("Extent", ("send", "recv")), ("InPlaceRule", ("inplace",))):
        have = _enum_class(text, enum)
        if have is None:
            c.fail(rel, f"no enum class {enum}")
            continue
        for name, t in v.coll_traits.items():
            for col in cols:
                if t[col] not in have:
                    c.fail(rel, f"enum class {enum} has no {t[col]} (vocab.def: HARP_COLL({name}) {col})")
    extents = _enum_class(text, "Extent") or []
    rel = "python/harp/_types.py"
    tree = ast.parse(c.read(rel))
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "buffer_blocks"), None)
    if fn is None:
        c.fail(rel, "no buffer_blocks()")
        return
    known = {n.comparators[0].value for n in ast.walk(fn) if isinstance(n, ast.Compare)
             and len(n.comparators) == 1 and isinstance(n.comparators[0], ast.Constant)}
    for x in extents:
        if x not in ("none", "listed") and x not in known:
            c.fail(rel, f"buffer_blocks has no branch for extent {x} (base/types.h Extent)")


def check_errors(c, v):
    rel = "python/harp/errors.py"
    classes = {n.name for n in ast.parse(c.read(rel)).body if isinstance(n, ast.ClassDef)}
    for kind, _, py, _ in v.errors:
        if py not in classes:
            c.fail(rel, f"no class {py} (vocab.def: HARP_ERROR({kind}, ...))")
    rel = "bindings/python_module.cc"
    m = re.search(r"void translate\(const Error& e\)\s*\{\s*static const char\* names\[\]\s*=\s*\{([^}]*)\}", c.read(rel))
    if not m:
        c.fail(rel, "translate(): no names[] table of Python exception classes")
        return
    got = re.findall(r'"(\w+)"', m.group(1))
    c.same(rel, "translate() names[] Error kind", dict(enumerate(got)), {r[1]: r[2] for r in v.errors})


def _enum_body(text, name):
    m = re.search(r"typedef enum\s*\{([^}]*)\}\s*" + name + r"\s*;", text)
    return m.group(1) if m else None


def check_nccl_h(c, v):
    rel = "bindings/nccl/nccl.h"
    text = c.read(rel)
    for name, want in (("ncclDataType_t", v.nccl_dtypes()), ("ncclRedOp_t", v.nccl_ops()),
                       ("ncclResult_t", v.nccl_results())):
        body = _enum_body(text, name)
        if body is None:
            c.fail(rel, f"no typedef enum {{...}} {name}")
            continue
        got = {k: int(val) for k, val in re.findall(r"\b(nccl\w+)\s*=\s*(-?\d+)\s*(?:,|$)", body)}
        c.same(rel, name, got, want)


def _py_name(nccl):
    return "NCCL_" + re.sub(r"(?<!^)(?=[A-Z])", "_", nccl[len("nccl"):]).upper()


def check_nccl_py(c, v):
    rel = "python/harp/nccl/__init__.py"
    tree = ast.parse(c.read(rel))
    got = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id.startswith("NCCL_"):
                    got[t.id] = node.value.value
    want = {}
    for table in (v.nccl_dtypes(), v.nccl_ops(), v.nccl_results()):
        want.update({_py_name(k): val for k, val in table.items() if not k.startswith("ncclNum")})
    c.same(rel, "constant", {k: val for k, val in got.items() if k in want or k.startswith(
        ("NCCL_INT", "NCCL_UINT", "NCCL_FLOAT", "NCCL_BFLOAT", "NCCL_HALF", "NCCL_DOUBLE", "NCCL_CHAR"))}, want)


def _switch(text, func):
    m = re.search(func + r"\([^)]*\)\s*\{(.*?)\n\}", text, re.S)
    return m.group(1) if m else None


def check_nccl_switches(c, v):
    rel = "bindings/nccl/nccl_common.cc"
    text = c.read(rel)
    body = _switch(text, r"DataType toDtype")
    if body is None:
        c.fail(rel, "no toDtype()")
    else:
        got = dict(re.findall(r"case (nccl\w+): return DataType::(k\w+);", body))
        c.same(rel, "toDtype case", got, {r[5]: r[1] for r in v.dtypes if r[5] != "none"})
    body = _switch(text, r"ncclResult_t resultOf")
    if body is None:
        c.fail(rel, "no resultOf()")
    else:
        for kind, _, _, nccl in v.errors:
            m = re.search(r"case Error::" + kind + r":(.*?)(?=case |default:|$)", body, re.S)
            if kind != "kInternal" and not m:
                c.fail(rel, f"resultOf: no case Error::{kind}")
            elif m and nccl not in m.group(1):
                c.fail(rel, f"resultOf: Error::{kind} does not return {nccl} (vocab.def)")
            elif not m and "default: return " + nccl not in body:
                c.fail(rel, f"resultOf: Error::{kind} does not return {nccl} (vocab.def)")
    rel = "bindings/nccl/nccl_coll.cc"
    body = _switch(c.read(rel), r"ReduceOp toOp")
    if body is None:
        c.fail(rel, "no toOp()")
    else:
        got = dict(re.findall(r"case (nccl\w+): return ReduceOp::(k\w+);", body))
        c.same(rel, "toOp case", got, {r[4]: r[1] for r in v.ops if r[4] != "none"})


def check(root):
    c = Checker(root)
    v = Vocab(c.read("base/vocab.def"))
    for step in (check_def, check_colls, check_enums, check_errors, check_nccl_h, check_nccl_py,
                 check_nccl_switches):
        try:
            step(c, v)
        except (OSError, SyntaxError, ValueError) as e:
            c.fail(step.__name__, f"cannot check: {e}")
    return c.errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--stamp", help="touch this file when everything agrees (for the build)")
    a = ap.parse_args(argv)
    errors = check(a.root)
    for e in errors:
        print(f"check_vocab: {e}", file=sys.stderr)
    if errors:
        print(f"check_vocab: {len(errors)} mismatch(es) with base/vocab.def", file=sys.stderr)
        return 1
    if a.stamp:
        with open(a.stamp, "w") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
