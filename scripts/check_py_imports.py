#!/usr/bin/env python3
"""scripts/check_py_imports.py — no import circle among the modules of python/harp and
python/harp_dev, no reach into another module's privates, and no use of the developer tools
by the runtime.

Usage:
    python3 scripts/check_py_imports.py [--root DIR]

Reads every .py under DIR/python/harp and DIR/python/harp_dev (default: this checkout), collects each
import of a harp module — at the top and inside functions alike (a lazy
import only hides a circle) — and reports every group of modules that import
each other, directly or through others (a strongly connected component of the
graph), with the edges inside it. `from . import x` counts as an import of the
module x when x is a module of the package, else of the package itself; the
compiled extension (_harp) is a leaf. Exit 0 when there is none, 1 otherwise.

A package's __init__ that gathers names from its modules is fine; a module
importing its own package's __init__ back is the circle this refuses (put what
both need in a leaf module instead, as harp._work and
harp.horovod.torch._names are).

Private reaches: an attribute `x._name` (one leading underscore) read or
written on anything but `self`/`cls`, where `_name` is a private member that
another module of the package defines (a method, a class attribute, or an
attribute it assigns on `self`) and the reading module does not define itself.
Modules cooperate through documented handles instead (e.g.
Communicator.calls, harp._work.CallLayer; ProcessGroupHarp.communicator).
Private submodules (harp._buffers) and third-party privates (torch._C) are
not members and are not reported; a third party's private that happens to
share a member's name is marked on its line with `# private-ok: <why>`.

Runtime and developer tools: the runtime wheel (python/harp, python/harp_torch_plugin)
ships without harp_dev (harp-bench, harp-cluster; the harp-dev distribution), so no
runtime module may import it: an `import harp_dev...` / `from harp_dev... import`,
importlib.import_module("harp_dev...") or __import__, at the top or inside a function, or a
string that is a harp_dev module name (what `python -m harp_dev.x` would run) is reported.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

COMPILED = {"_harp"}  # extension modules of the package: no imports of their own
PACKAGES = ("harp", "harp_dev")  # checked for circles and private reaches
RUNTIME = ("harp", "harp_torch_plugin")  # what the runtime wheel ships
DEV = "harp_dev"  # the developer tools, which the runtime never imports
DEV_NAME = re.compile(r"^harp_dev(\.\w+)*$")


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    base = root / "python"
    out = {}
    for path in sorted(p for pkg in packages for p in (base / pkg).rglob("*.py")):
        name = ".".join(path.relative_to(base).with_suffix("").parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        out[name] = path
    return out


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                while parts and ".".join(parts) not in mods:
                    parts.pop()
                if parts:
                    found.add(".".join(parts))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                if node.module:
                    base += "." + node.module
            else:
                base = node.module or ""
            if base not in mods:
                continue
            for a in node.names:
                if a.name in COMPILED:
                    continue
                sub = base + "." + a.name
                found.add(sub if sub in mods else base)
    found.discard(name)
    return found


def private_members(tree: ast.AST) -> set[str]:
    """Private names a module defines as members: methods and class attributes of its classes,
    and attributes it assigns on self/cls."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    for tg in (item.targets if isinstance(item, ast.Assign) else [item.target]):
                        if isinstance(tg, ast.Name):
                            out.add(tg.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            out.add(node.attr)
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def private_reaches(root: Path) -> list[str]:
    """'path:line: x._name' for each reach into a private member another module defines."""
    mods = modules(root)
    trees = {m: ast.parse(p.read_text(encoding="utf-8"), str(p)) for m, p in mods.items()}
    owned = {m: private_members(tr) for m, tr in trees.items()}
    submodules = {m.rsplit(".", 1)[-1] for m in mods}
    out = []
    for m, tree in trees.items():
        others = set().union(*(o for k, o in owned.items() if k != m)) - owned[m]
        lines = mods[m].read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in submodules or node.attr not in others:
                continue
            if "# private-ok:" in lines[node.lineno - 1]:  # a third party's private the name collides with
                continue
            rel = mods[m].relative_to(root).as_posix()
            out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}: reaches into a private member of another module")
    return out


def dev_uses(root: Path) -> list[str]:
    """'path:line: ...' for each use of harp_dev by a runtime module."""
    out = []
    for m, path in modules(root, RUNTIME).items():
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            named = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                named = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DEV_NAME.match(node.value):
                named = [node.value]  # importlib.import_module("harp_dev.x"), ["python", "-m", "harp_dev.x"]
            for name in named:
                if name == DEV or name.startswith(DEV + "."):
                    out.append(f"{rel}:{node.lineno}: {m} uses {name}: the runtime never needs the developer "
                               f"tools ({DEV}, the harp-dev distribution)")
    return sorted(set(out))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args(argv)
    mods = modules(args.root)
    graph = {m: imports(m, p, mods) for m, p in mods.items()}
    found = circles(graph)
    reaches = private_reaches(args.root)
    dev = dev_uses(args.root)
    for line in reaches + dev:
        print(line)
    for comp in found:
        inside = set(comp)
        print(f"import circle: {', '.join(comp)}")
        for m in comp:
            print(f"  {m} -> {', '.join(sorted(graph[m] & inside))}")
    if found or reaches or dev:
        return 1
    print(f"python/harp, python/harp_dev: {len(mods)} modules, no import circle, no private reach, "
          f"no runtime use of {DEV}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
