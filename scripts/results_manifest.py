#!/usr/bin/env python3
"""scripts/results_manifest.py — the manifest of HARP's results store (results/).

Usage:
    python3 scripts/results_manifest.py            # rewrite results/MANIFEST.json
    python3 scripts/results_manifest.py --check    # exit 1 if it is stale (tests/test_layers.py)

Raw benchmark output (JSON records, logs, per-run tables) lives in results/, one
folder per thing measured (results/<concept>/[<run set>/]...), never beside the
code in bench/, core/, python/ or tests/: the source tree holds programs, the
store holds what they printed. Curated tables with their exact commands stay in
bench/RESULTS*.md, which link into the store.

The manifest has one entry per run set (a folder that holds files, or a file
directly in a concept folder) with what the records say about themselves:
the commits they were measured on (and whether a tree was dirty), the CPU and
core count, the UTC time range, the commands (the output path replaced by
<out>), how many files carried no stamp, and which RESULTS*.md files cite the
set. A record's stamp is its "stamp", "stamp_before" or "stamp_after" object
(harp.bench's and bench/vpc/stamp.py's); its command is the stamp's "command"
or the record's "command"/"argv". Needs only the Python standard library.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = "results"
MANIFEST = "MANIFEST.json"
# Files in the store that are not results themselves.
OWN = {MANIFEST, "README.md"}


def _stamps(rec: dict) -> list[dict]:
    return [rec[k] for k in ("stamp", "stamp_before", "stamp_after") if isinstance(rec.get(k), dict)]


def _command(rec: dict, stamps: list[dict]) -> str | None:
    for s in stamps:
        if isinstance(s.get("command"), str):
            return s["command"]
    c = rec.get("command", rec.get("argv"))
    if isinstance(c, list):
        c = " ".join(map(str, c))
    return c if isinstance(c, str) else None


def _normalise(cmd: str, path: str) -> str:
    """The command with this file's own path (wherever the run's checkout was) as <out>."""
    name = re.escape(os.path.basename(path))
    return re.sub(r"\S*" + name, "<out>", cmd)


def run_sets(root: Path) -> dict[str, list[Path]]:
    """Run set -> its files: the folder a file sits in, or the file itself at concept level."""
    sets: dict[str, list[Path]] = {}
    store = root / STORE
    for p in sorted(store.rglob("*")):
        if not p.is_file() or (p.parent == store and p.name in OWN):
            continue
        rel = p.relative_to(store)
        key = str(rel) if len(rel.parts) == 2 else str(rel.parent)
        sets.setdefault(key, []).append(p)
    return sets


def citations(root: Path) -> dict[str, list[str]]:
    """Text of every bench/RESULTS*.md, for the cited-by lists."""
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in sorted((root / "bench").glob("RESULTS*.md"))}


def entry(root: Path, key: str, files: list[Path], texts: dict[str, str]) -> dict:
    commits: set[str] = set()
    dirty = False
    cpus: set[str] = set()
    cores: set[int] = set()
    times: list[str] = []
    commands: set[str] = set()
    unstamped = 0
    for f in files:
        if f.suffix != ".json":
            continue
        try:
            rec = json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError):
            unstamped += 1
            continue
        st = _stamps(rec) if isinstance(rec, dict) else []
        if not st:
            unstamped += 1
            continue
        for s in st:
            if s.get("commit"):
                commits.add(str(s["commit"])[:12])
            dirty |= bool(s.get("dirty"))
            if s.get("cpu"):
                cpus.add(str(s["cpu"]))
            if isinstance(s.get("cores"), int):
                cores.add(s["cores"])
            if isinstance(s.get("time"), str):
                times.append(s["time"])
        cmd = _command(rec, st)
        if cmd:
            commands.add(_normalise(cmd, str(f)))
    path = f"{STORE}/{key}"
    cited = sorted(name for name, text in texts.items() if path in text or f"../{path}" in text)
    return {
        "files": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        "commits": sorted(commits),
        "dirty": dirty,
        "cpu": sorted(cpus),
        "cores": sorted(cores),
        "time": [min(times), max(times)] if times else [],
        "commands": sorted(commands)[:20],
        "commands_total": len(commands),
        "unstamped_json": unstamped,
        "cited_by": cited,
    }


def manifest(root: Path) -> dict:
    texts = citations(root)
    return {key: entry(root, key, files, texts) for key, files in run_sets(root).items()}


def render(m: dict) -> str:
    return json.dumps(m, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--check", action="store_true", help="exit 1 when results/MANIFEST.json is stale")
    args = ap.parse_args(argv)
    text = render(manifest(args.root))
    target = args.root / STORE / MANIFEST
    if args.check:
        old = target.read_text() if target.exists() else ""
        if old != text:
            print(f"{target} is stale: run python3 scripts/results_manifest.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    print(f"{target}: {len(json.loads(text))} run sets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
