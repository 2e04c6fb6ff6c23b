#!/usr/bin/env python3
"""Write docs/params.md from base/params.def (the parameter registry).

    python3 scripts/params_doc.py           # regenerate docs/params.md
    python3 scripts/params_doc.py --check   # exit 1 (naming the file) when it is stale

Loads python/harp/_params.py by path, so it needs neither the compiled library
nor numpy. tests/test_params.py runs --check.
"""
import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_params():
    spec = importlib.util.spec_from_file_location("harp_params", os.path.join(ROOT, "python", "harp", "_params.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when docs/params.md is not current")
    a = ap.parse_args(argv)
    path = os.path.join(ROOT, "docs", "params.md")
    text = load_params().markdown() + "\n"
    if a.check:
        cur = open(path).read() if os.path.exists(path) else ""
        if cur != text:
            print(f"{path} is stale: run python3 scripts/params_doc.py", file=sys.stderr)
            return 1
        return 0
    with open(path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
