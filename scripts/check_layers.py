#!/usr/bin/env python3
"""scripts/check_layers.py — HARP's include graph, checked.

Usage:
    python3 scripts/check_layers.py [--root DIR] [--quiet]

Reads every C/C++ source under base/, bootstrap/, core/, transport/,
bindings/ and include/ of the tree at --root (default: this checkout), resolves each
#include "..." (and each #include <base/...>, <core/...>, ...) to a file of the
tree, and checks that the layers only point down. The folders are the layers
(LAYERS below, lowest first):

    base        base/**                           (types, vocab, params, env, log, reduce)
    bootstrap   bootstrap/**                      (socket, crypto, store, rendezvous, bootstrap)
    transports  transport/*.{h,cc}                (the interface and its registry)
                transport/common/**               (what several transports share: handshake)
                transport/<name>/**               (one transport each)
    algorithm   core/engine/context.h, core/algorithms/*.h   (the algorithm API)
    engine      core/*, core/algorithms/**        (communicator, context, tuning, algorithms)
    bindings    bindings/**                       (Python, NCCL C API, the C++ API's facade)
    public      include/**                        (the public C++ API: include/harp/harp.h)

Rules (the name in brackets is what a violation report says):
  [base-only]       base/** includes only base/**.
  [bootstrap-only]  bootstrap/** includes only base/** and bootstrap/**.
  [transport-only]  transport/** includes only base/**, bootstrap/** and transport/*
                    (the files directly in transport/: the interface); a file in
                    transport/<name>/ may also include its own folder and
                    transport/common/, never another transport's
                    (transport/<other>/...), and a file directly in transport/
                    never includes a transport folder.
  [transport-common] transport/common/** (what several transports share) sits
                    between the interface and the transports: it may include
                    base/**, bootstrap/**, the interface and itself, never a
                    transport folder; the interface (transport/*) never
                    includes transport/common/.
  [hosted-algorithm] A file a transport hosts as an algorithm may in addition
                    include the algorithm API headers (ALGORITHM_API below).
                    Such a file lives in transport/<name>/ (not common/) and carries the
                    marker line
                        // harp-layer: algorithm
                    (a line of its own, before the includes). The marker
                    anywhere else is itself a violation.
  [engine-interface] The engine (core/) includes from
                    transport/ only the interface, transport/transport.h —
                    never a concrete transport header (transport/<name>/...).
  [engine-no-concrete] Engine code (comments and strings aside) contains no
                    dynamic_cast to a transport class (Transport, Pair or a
                    class a transport folder defines) and names no concrete
                    transport: no class derived from Transport or Pair in
                    transport/<name>/, no <name>:: namespace qualifier.
  [core-down]       Inside core/ the folders are layers too (CORE_LAYERS,
                    lowest first: topology, ft, observe, select, compress,
                    algorithms, engine): a file in core/<folder>/ includes
                    only its own folder, folders listed before it, and the
                    algorithm API headers (ALGORITHM_API: the Context, the
                    call's arguments and resources, core/algorithms/*.h).
                    Every engine source lives in one of those folders.
  [api-closed]      An algorithm API header includes only other API headers
                    and layers below the engine (base, bootstrap, the
                    transport interface, core/topology/): an algorithm that
                    includes the API never sees the Communicator.
  [no-bindings]     Nothing outside bindings/ includes bindings/**.
  [public-closed]   include/** (the public C++ API) includes no file of the tree
                    but include/**: a program needs only include/ and libharp.
  [public-api]      Only bindings/ (the facade that implements it) includes
                    include/**; the engine never sees the public header.
  [resolves]        Every quoted include names a file of the tree (relative
                    to the including file or to the root), except the
                    generated headers listed in GENERATED.
  [acyclic]         No include cycle among the files checked.
Bindings may include anything below them.

Prints one line per violation, "file:line: <include or text>: [rule] why", and
exits 1 when there is any; prints a one-line summary and exits 0 otherwise.
tests/test_layers.py runs it on the tree and on trees with injected
violations. Needs only the Python standard library.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_py_imports import circles  # noqa: E402  (strongly connected components, shared)

SOURCE_SUFFIXES = (".h", ".hh", ".hpp", ".c", ".cc", ".cpp", ".cxx", ".inc", ".h.in", ".cc.in")
# The layers, lowest first: (name, folder). An arrow may only point to its own
# layer or one listed before it (the transport and engine rules add detail).
LAYERS = (("base", "base/"), ("bootstrap", "bootstrap/"), ("transport", "transport/"),
          ("engine", "core/"), ("bindings", "bindings/"), ("public", "include/"))
TOP_DIRS = tuple(folder.rstrip("/") for _, folder in LAYERS)
# The algorithm API: what an algorithm hosted by a transport may include
# besides base and transport headers (fnmatch patterns): the Context and the
# headers in core/algorithms/ (registry.h and the helpers algorithms share).
# A new header every algorithm needs (a cost-model type, say) goes here.
ALGORITHM_API = ("core/engine/context.h", "core/engine/call.h", "core/engine/resources.h", "core/engine/scratch.h",
                 "core/algorithms/*.h")
# The engine's own layers, lowest first (folders of core/).
CORE_LAYERS = ("core/topology/", "core/ft/", "core/observe/", "core/select/", "core/compress/",
               "core/algorithms/", "core/engine/")
# The folder of transport/ that holds what several transports share (not a transport).
TRANSPORT_COMMON = "common"
# The one header through which the engine sees transports.
TRANSPORT_API = ("transport/transport.h",)
# Headers generated into the build tree (configure_file), by include name.
GENERATED = {"build_reasons.h": "transport/build_reasons.h.in"}
MARKER_RE = re.compile(r"^\s*//\s*harp-layer:\s*algorithm\s*$")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


@dataclass
class Violation:
    file: str
    line: int
    what: str
    rule: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}: [{self.rule}] {self.why}"


@dataclass
class Source:
    rel: str                       # path relative to the root, with '/'
    text: str
    hosted: bool = False           # carries the algorithm marker
    marker_line: int = 0
    includes: list = field(default_factory=list)  # (line, written, resolved or None, quoted)


def layer_of(rel: str) -> str:
    for name, folder in LAYERS:
        if rel.startswith(folder):
            return name
    return "other"


def core_layer(rel: str) -> int:
    """Index of rel's folder in CORE_LAYERS; -1 outside core/, len(CORE_LAYERS) for a file in none."""
    if not rel.startswith("core/"):
        return -1
    for i, folder in enumerate(CORE_LAYERS):
        if rel.startswith(folder):
            return i
    return len(CORE_LAYERS)


def is_api(rel: str) -> bool:
    return any(fnmatch.fnmatchcase(rel, pat) for pat in ALGORITHM_API)


def check_core_include(src: Source, target: str, bad) -> None:
    """[core-down] and [api-closed] for an include from core/ to core/."""
    mine, theirs = core_layer(src.rel), core_layer(target)
    if is_api(src.rel):
        if not (is_api(target) or target.startswith("core/topology/")):
            bad("api-closed", f"an algorithm API header includes only API headers ({', '.join(ALGORITHM_API)}) "
                f"and core/topology/, not {target}")
        return
    if theirs <= mine or is_api(target):
        return
    bad("core-down", f"{CORE_LAYERS[mine]} is below {CORE_LAYERS[theirs]} (CORE_LAYERS); "
        f"it may include the engine only through the algorithm API")


def transport_folder(rel: str) -> str | None:
    """'shm' for transport/shm/..., None for files directly in transport/."""
    parts = rel.split("/")
    return parts[1] if parts[0] == "transport" and len(parts) > 2 else None


def strip_code(text: str) -> str:
    """The text with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def collect(root: Path) -> dict[str, Source]:
    files: dict[str, Source] = {}
    for top in TOP_DIRS:
        base = root / top
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    p = Path(dirpath) / name
                    rel = p.relative_to(root).as_posix()
                    files[rel] = Source(rel, p.read_text(errors="replace"))
    return files


def resolve(src: Source, written: str, quoted: bool, known: dict[str, Source], root: Path) -> str | None:
    """The tree path an include names, or None when it is outside the tree."""
    here = Path(src.rel).parent
    candidates = []
    if quoted:
        candidates.append(os.path.normpath((here / written).as_posix()))
    candidates.append(os.path.normpath(written))
    for c in candidates:
        c = c.replace(os.sep, "/")
        if c in known or (root / c).is_file():
            return c
    return None


def parse(files: dict[str, Source], root: Path) -> None:
    for src in files.values():
        for no, line in enumerate(src.text.splitlines(), 1):
            if MARKER_RE.match(line) and not src.hosted:
                src.hosted, src.marker_line = True, no
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            quoted, written = m.group(1) == '"', m.group(2).strip()
            if not quoted and not written.startswith(tuple(d + "/" for d in TOP_DIRS)):
                continue  # a system or third-party header
            src.includes.append((no, written, resolve(src, written, quoted, files, root), quoted))


def concrete_transport_classes(files: dict[str, Source]) -> set[str]:
    """Classes in transport/<name>/ deriving (transitively) from Transport or Pair."""
    bases: dict[str, list[str]] = {}
    decl = re.compile(r"\b(?:class|struct)\s+(\w+)\s*(?:final\s*)?:\s*([^{;]+)\{")
    for rel, src in files.items():
        if transport_folder(rel) in (None, TRANSPORT_COMMON):
            continue
        for m in decl.finditer(strip_code(src.text)):
            names = re.findall(r"(\w+)\s*(?:,|$)", m.group(2).strip())
            bases[m.group(1)] = names
    found = {"Transport", "Pair"}
    changed = True
    while changed:
        changed = False
        for cls, bs in bases.items():
            if cls not in found and any(b in found for b in bs):
                found.add(cls)
                changed = True
    return found - {"Transport", "Pair"}


def check_includes(src: Source, out: list[Violation]) -> None:
    layer, own = layer_of(src.rel), transport_folder(src.rel)
    for no, written, target, quoted in src.includes:
        what = f'#include {chr(34) if quoted else "<"}{written}{chr(34) if quoted else ">"}'

        def bad(rule: str, why: str) -> None:
            out.append(Violation(src.rel, no, what, rule, why))

        if target is None:
            if quoted and written not in GENERATED:
                bad("resolves", "names no file of the tree (list generated headers in GENERATED)")
            continue
        t_layer, t_folder = layer_of(target), transport_folder(target)
        if layer == "public" and t_layer != "public":
            bad("public-closed", f"the public C++ API includes only the standard library and include/, not {target}")
        elif t_layer == "public" and layer not in ("bindings", "public"):
            bad("public-api", f"only bindings/ (the C++ API's facade) includes the public header; {layer} code uses "
                "the engine's own headers")
        elif t_layer == "bindings" and layer != "bindings":
            bad("no-bindings", f"{layer} code must not include the bindings")
        elif layer == "base" and t_layer != "base":
            bad("base-only", f"base/ includes only base/, not the {t_layer} layer ({target})")
        elif layer == "bootstrap" and t_layer not in ("base", "bootstrap"):
            bad("bootstrap-only", f"bootstrap/ includes only base/ and bootstrap/, not the {t_layer} layer ({target})")
        elif layer == "transport":
            check_transport_include(src, own, target, t_layer, t_folder, bad)
        elif layer == "engine" and t_layer == "engine":
            check_core_include(src, target, bad)
        elif layer == "engine" and t_layer == "transport" and target not in TRANSPORT_API:
            bad("engine-interface", "the engine reaches transports only through " + ", ".join(TRANSPORT_API) +
                (", never transport/common/" if t_folder == TRANSPORT_COMMON else
                 f", never a concrete transport's header (transport/{t_folder}/)" if t_folder else ""))


def check_transport_include(src: Source, own, target, t_layer, t_folder, bad) -> None:
    if t_layer in ("base", "bootstrap"):
        return
    if t_layer == "transport":
        if t_folder == TRANSPORT_COMMON:
            if own is None:
                bad("transport-common", f"transport/{os.path.basename(src.rel)} is the interface, below "
                    "transport/common/: it must not include it")
            return
        if t_folder is None or t_folder == own:
            return
        if own == TRANSPORT_COMMON:
            bad("transport-common", f"transport/common/ is shared by the transports and must not include one "
                f"(transport/{t_folder}/)")
        elif own is None:
            bad("transport-only", f"transport/{os.path.basename(src.rel)} is the interface layer and must not "
                f"include a concrete transport (transport/{t_folder}/)")
        else:
            bad("transport-only", f"transport {own} must not include another transport's header (transport/{t_folder}/)")
        return
    api = is_api(target)
    if src.hosted and api:
        return
    if api:
        bad("hosted-algorithm", f"only a file a transport hosts as an algorithm (marker line '// harp-layer: "
            f"algorithm', in transport/<name>/) may include the algorithm API ({target})")
    else:
        allowed = "base/, bootstrap/, transport/" + (" and the algorithm API " + ", ".join(ALGORITHM_API) if src.hosted else "")
        bad("transport-only", f"transport code includes only {allowed}, not {target} ({t_layer} layer)")


def check_engine_code(src: Source, concrete: set[str], folders: set[str], out: list[Violation]) -> None:
    code = strip_code(src.text)
    names = re.compile(r"\b(" + "|".join(sorted(concrete)) + r")\b") if concrete else None
    spaces = re.compile(r"\b(" + "|".join(sorted(folders)) + r")::") if folders else None
    transport_type = {"Transport", "Pair"} | concrete
    for no, line in enumerate(code.splitlines(), 1):
        for m in re.finditer(r"\bdynamic_cast\s*<([^>]*)>", line):
            words = set(re.findall(r"\w+", m.group(1)))
            if words & transport_type or "transport" in words or words & folders:
                out.append(Violation(src.rel, no, m.group(0), "engine-no-concrete",
                                     "the engine must not dynamic_cast to a transport class; ask the transport "
                                     "through Transport::capability (transport/transport.h)"))
        for rx, kind in ((names, "class"), (spaces, "namespace")):
            for m in rx.finditer(line) if rx else ():
                out.append(Violation(src.rel, no, m.group(0), "engine-no-concrete",
                                     f"the engine names a concrete transport {kind}; it may know only "
                                     "transport::Transport and transport::Pair"))


def check_markers(src: Source, out: list[Violation]) -> None:
    if src.hosted and transport_folder(src.rel) in (None, TRANSPORT_COMMON):
        out.append(Violation(src.rel, src.marker_line, "// harp-layer: algorithm", "hosted-algorithm",
                             "the algorithm marker belongs only in a transport's folder (transport/<name>/, "
                             "not transport/common/)"))


def check_cycles(files: dict[str, Source], out: list[Violation]) -> None:
    graph = {rel: [(t, no) for no, _, t, _ in s.includes if t in files] for rel, s in files.items()}
    comps = circles({v: {t for t, _ in edges} for v, edges in graph.items()})
    comps += [[v] for v in sorted(graph) if any(t == v for t, _ in graph[v])]  # a file that includes itself
    for comp in comps:
        first = comp[0]
        no = next(n for t, n in graph[first] if t in comp)
        out.append(Violation(first, no, " -> ".join(comp), "acyclic", "these files include each other"))


def check(root: Path) -> tuple[list[Violation], dict[str, Source]]:
    files = collect(root)
    parse(files, root)
    concrete = concrete_transport_classes(files)
    folders = ({p.name for p in (root / "transport").iterdir() if p.is_dir() and p.name != TRANSPORT_COMMON}
               if (root / "transport").is_dir() else set())
    out: list[Violation] = []
    for src in files.values():
        if core_layer(src.rel) == len(CORE_LAYERS):
            out.append(Violation(src.rel, 1, src.rel, "core-down",
                                 "every engine source lives in one of the folders of CORE_LAYERS"))
        check_includes(src, out)
        check_markers(src, out)
        if layer_of(src.rel) == "engine":
            check_engine_code(src, concrete, folders, out)
    check_cycles(files, out)
    return out, files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="tree to check (default: this checkout)")
    ap.add_argument("--quiet", action="store_true", help="print violations only")
    args = ap.parse_args(argv)
    if not (args.root / "core").is_dir():
        print(f"check_layers: {args.root} has no core/ folder", file=sys.stderr)
        return 2
    violations, files = check(args.root)
    for v in sorted(violations, key=lambda v: (v.file, v.line)):
        print(v)
    if violations:
        print(f"check_layers: {len(violations)} violation(s) in {len(files)} files", file=sys.stderr)
        return 1
    if not args.quiet:
        n = sum(len(s.includes) for s in files.values())
        hosted = sorted(s.rel for s in files.values() if s.hosted)
        print(f"check_layers: {len(files)} files, {n} includes, layers point down; hosted algorithms: "
              + (", ".join(hosted) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
