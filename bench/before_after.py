"""Medians and spreads of bench/before_after.sh's runs: python3 bench/before_after.py OUTDIR [SIZES]

For every (ranks, transport, size, form): the median over repetitions of harp-bench's time per
call, before and after, the min-max spread, and after/before (< 1: faster after); then the
geometric mean of after/before per (ranks, transport) over all sizes and both forms.
"""
import glob
import json
import math
import os
import re
import statistics
import sys


def load(out):
    rows = {}
    for f in sorted(glob.glob(os.path.join(out, "*-np*-*-r*.json"))):
        side, np_, tp = re.match(r"(before|after)-np(\d+)-(\w+)-r\d+\.json", os.path.basename(f)).groups()
        for r in json.load(open(f))["results"]["harp"]["rows"]:
            for m in ("oop", "ip"):
                rows.setdefault((int(np_), tp, r["size"], m), {}).setdefault(side, []).append(r[f"{m}_us"])
    return rows


def main():
    out = sys.argv[1]
    show = {int(x) for x in sys.argv[2].split(",")} if len(sys.argv) > 2 else None
    rows = load(out)
    print("| ranks | transport | size (B) | form | before: median us (min-max) | after: median us (min-max) | after/before |")
    print("|---:|---|---:|---|---:|---:|---:|")
    ratios = {}
    for (np_, tp, size, m), v in sorted(rows.items()):
        if "before" not in v or "after" not in v:
            continue
        a, b = statistics.median(v["before"]), statistics.median(v["after"])
        ratios.setdefault((np_, tp), []).append(b / a)
        if show is None or size in show:
            print(f"| {np_} | {tp} | {size} | {'in-place' if m == 'ip' else 'out-of-place'} | {a:.1f} "
                  f"({min(v['before']):.1f}-{max(v['before']):.1f}) | {b:.1f} ({min(v['after']):.1f}-"
                  f"{max(v['after']):.1f}) | {b / a:.2f} |")
    print()
    for (np_, tp), rs in sorted(ratios.items()):
        g = math.exp(sum(math.log(x) for x in rs) / len(rs))
        print(f"- {np_} ranks, {tp}: geometric mean after/before {g:.2f} over {len(rs)} size x form medians "
              f"(range {min(rs):.2f}-{max(rs):.2f})")


if __name__ == "__main__":
    main()
