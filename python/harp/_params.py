"""HARP's parameter registry, read from the same list as the C++ core.

Every HARP_* environment variable is declared once in base/params.def
(installed beside this file as params.def): name, type, default, scope and one
line of doc. This module parses that file (it imports nothing from harp, so
scripts may load it by path) and gives Python code the same rules as
base/env.h:

    from harp import _params
    bind = _params.get("HARP_LAUNCH_BIND")   # the value, or the declared default
    _params.raw("HARP_CUDART")               # the value, or None
    _params.table()                          # rows for harp-config --params
    _params.warn_unknown()                   # one warning per undeclared HARP_* variable

Reading an undeclared name raises LookupError naming it. Thread-safe after
the first call (the table is parsed once and never changed).
"""
from __future__ import annotations

import os
import re
import sys
from collections import namedtuple

TYPES = ("int", "real", "seconds", "bytes", "string", "bool", "enum")
SCOPES = ("library", "launcher", "bench", "test", "build")
_STR = r'"((?:[^"\\]|\\.)*)"'
_LINE = re.compile(r"^HARP_PARAM\(\s*(HARP_[A-Z0-9_]+)\s*,\s*(\w+)\s*,\s*" + _STR + r"\s*,\s*" + _STR +
                   r"\s*,\s*(\w+)\s*,\s*" + _STR + r"\s*\)\s*$")


# One declaration: name, type (TYPES), default (text), choices (Enum), scope (SCOPES), doc.
Param = namedtuple("Param", "name type default choices scope doc")


def def_path() -> str:
    """params.def: beside this file in an installed package, else in the source tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "params.def"),
              os.path.join(os.path.dirname(os.path.dirname(here)), "base", "params.def")):
        if os.path.exists(p):
            return p
    raise FileNotFoundError("harp: params.def not found beside harp/_params.py or in base/ of the source tree")


def parse(text: str, where: str = "params.def") -> dict:
    """{name: Param} from the text of params.def; ValueError for a line that starts like an entry but
    does not parse, a duplicate, or an unknown type or scope."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("HARP_PARAM("):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{where}:{n}: not a HARP_PARAM(NAME, Type, \"default\", \"choices\", Scope, \"doc\") line")
        name, typ, default, choices, scope, doc = m.groups()
        typ, scope = typ.lower(), scope.lower()
        if typ not in TYPES or scope not in SCOPES or name in out:
            raise ValueError(f"{where}:{n}: {name}: bad type {typ!r} or scope {scope!r}, or declared twice")
        out[name] = Param(name, typ, default, tuple(c for c in choices.split("|") if c), scope, doc)
    return out


_TABLE = None


def params() -> dict:
    """{name: Param} for every declared parameter, in declaration order."""
    global _TABLE
    if _TABLE is None:
        with open(def_path()) as f:
            _TABLE = parse(f.read())
    return _TABLE


def declared(name: str) -> Param:
    p = params().get(name)
    if p is None:
        raise LookupError(f"{name} is read but not declared in base/params.def "
                          f"(declare it there, with its type, default and doc; nearest: {nearest(name)})")
    return p


def raw(name: str, environ=None):
    """The variable's value when set and non-empty, else None (after the declaration check)."""
    declared(name)
    v = (os.environ if environ is None else environ).get(name)
    return v or None


def get(name: str, environ=None) -> str:
    """The variable's value when set and non-empty, else its declared default."""
    p = declared(name)
    v = raw(name, environ)
    return p.default if v is None else v


def env_of(environ=None):
    return os.environ if environ is None else environ


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        diag, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diag + (ca != cb))
    return row[len(b)]


def nearest(name: str) -> str:
    """The declared name closest to `name` (ties: the first declared), as base/params.cc picks it."""
    best, best_d = None, None
    for p in params():
        d = edit_distance(name, p)
        if best_d is None or d < best_d:
            best, best_d = p, d
    return best


def unknown(environ=None) -> list:
    """[(name, nearest declared name)] for each HARP_* variable of the environment that is not declared."""
    env = os.environ if environ is None else environ
    return [(k, nearest(k)) for k in env if k.startswith("HARP_") and k not in params()]


def unknown_message(name: str, near: str) -> str:
    return f"{name} is not a HARP parameter (did you mean {near}?)"


def warn_unknown(environ=None, file=None) -> list:
    """Print 'harp: warning: ...' once per undeclared HARP_* variable; returns the messages."""
    msgs = [unknown_message(k, n) for k, n in unknown(environ)]
    for m in msgs:
        print(f"harp: warning: {m}", file=file or sys.stderr)
    return msgs


def check_value(p: Param, v: str) -> str:
    """'' when v is a valid value of p, else why not (as harp-config --params reports it)."""
    try:
        if p.type == "int":
            int(v, 10)
        elif p.type == "real":
            float(v)
        elif p.type == "seconds":
            if not float(v) > 0:
                return "not a positive number of seconds"
        elif p.type == "bytes":
            if not re.fullmatch(r"[0-9.]+(|B|K|k|KB|M|MB|G|GB)", v):
                return "not a size (512K, 4M)"
        elif p.type == "bool":
            if v.lower() not in ("0", "1", "true", "false", "yes", "no", "on", "off") and not re.fullmatch(r"-?\d+", v):
                return "not a boolean (1/0, true/false, yes/no, on/off)"
        elif p.type == "enum":
            if v.upper() not in (c.upper() for c in p.choices):
                return "not one of " + "|".join(p.choices)
    except ValueError:
        return f"not a{'n' if p.type == 'int' else ''} {p.type}"
    return ""


def table(environ=None) -> list:
    """One dict per parameter: name, type, value, source (environment/default), default, choices,
    scope, doc, and invalid (why the set value would be refused, or '')."""
    env = os.environ if environ is None else environ
    rows = []
    for p in params().values():
        v = env.get(p.name) or None
        rows.append({"name": p.name, "type": p.type, "value": p.default if v is None else v,
                     "source": "default" if v is None else "environment", "default": p.default,
                     "choices": list(p.choices), "scope": p.scope, "doc": p.doc,
                     "invalid": "" if v is None or (p.default == "auto" and v == "auto") else check_value(p, v)})
    return rows


def markdown() -> str:
    """docs/params.md: the table of every parameter, generated from params.def."""
    out = ["# HARP parameters", "",
           "<!-- Generated from base/params.def by scripts/params_doc.py; do not edit. -->", "",
           "Every `HARP_*` environment variable HARP reads, declared once in "
           "[base/params.def](../base/params.def). `harp-config --params` lists them with their "
           "current values and where each came from; an unknown `HARP_*` variable gets a warning naming the "
           "nearest known one.", ""]
    for scope in SCOPES:
        rows = [p for p in params().values() if p.scope == scope]
        if not rows:
            continue
        out += [f"## {scope}", "", "| name | type | default | description |", "|---|---|---|---|"]
        for p in rows:
            typ = p.type + (f" ({'/'.join(p.choices)})" if p.choices else "")
            default = f"`{p.default}`" if p.default else ""
            out.append(f"| `{p.name}` | {typ} | {default} | {p.doc.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


def print_params(as_json: bool = False, environ=None, file=None) -> None:
    """harp-config --params [--json]: every parameter with its current value and where it came from."""
    import json

    rows = table(environ)
    out = file or sys.stdout
    if as_json:
        rows += [{"name": k, "type": "", "value": env_of(environ)[k], "source": "environment", "default": "",
                  "choices": [], "scope": "unknown", "doc": unknown_message(k, n), "invalid": ""}
                 for k, n in unknown(environ)]
        print(json.dumps(rows, indent=1), file=out)
        return
    w = max(len(r["name"]) for r in rows)
    vw = min(24, max(len(r["value"]) for r in rows))
    for r in rows:
        value = r["value"] if r["value"] else "(unset)"
        bad = f"  [invalid: {r['invalid']}]" if r["invalid"] else ""
        print(f"{r['name']:{w}s}  {r['type']:7s}  {value:{vw}s}  {r['source']:11s}  {r['scope']:8s}  "
              f"{r['doc']}{bad}", file=out)
    for name, near in unknown(environ):  # also in --json, as scope 'unknown'
        print(f"{name:{w}s}  {'?':7s}  {'':{vw}s}  {'environment':11s}  {'unknown':8s}  "
              f"{unknown_message(name, near)}", file=out)
