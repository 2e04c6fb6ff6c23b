#!/usr/bin/env bash
# Before/after: harp-bench allreduce (COLL=broadcast etc. for another) on two checkouts (each built with scripts/dev-build.sh),
# alternating run by run in the same session so both see the same machine load; which side
# goes first alternates by repetition (use an even REPS).
#   bench/before_after.sh BEFORE_ROOT AFTER_ROOT [outdir]     (default outdir results/before-after)
# REPS (default 3), NPS (default "2 4"), TRANSPORTS (default "tcp shm"), SWEEP (harp-bench
# size flags, default "-b 8 -e 16M -f 4 -n 20 -w 5"). Every run's JSON is stamped (commit,
# load, time); bench/before_after.py OUTDIR prints medians and spreads. A failed or wrong
# run stops the script (harp-bench exits 1 on any wrong value).
set -euo pipefail
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); out=${3:-results/before-after}
mkdir -p "$out"; out=$(cd "$out" && pwd)  # the runs cd into each checkout
for rep in $(seq 1 "${REPS:-3}"); do
  for np_ in ${NPS:-2 4}; do
    for tp in ${TRANSPORTS:-tcp shm}; do
      # ABBA: the side that runs first alternates by repetition (the second run of a pair
      # measured 1.15-1.25x slower at 2-rank tcp small sizes, whichever tree it was; session 7).
      sides="before after"; [ $((rep % 2)) = 0 ] && sides="after before"
      for side in $sides; do
        root=$before; [ "$side" = after ] && root=$after
        f="$out/$side-np$np_-$tp-r$rep.json"
        # shellcheck disable=SC2086
        cli=harp_dev.bench.cli; [ -d "$root/python/harp_dev" ] || cli=harp.bench.cli  # trees before harp-dev
        (cd "$root" && PYTHONPATH="$root/python" python3 -m "$cli" "${COLL:-allreduce}" -np "$np_" ${SWEEP:--b 8 -e 16M -f 4 -n 20 -w 5} \
          --transport "$tp" --no-progress --json "$f" > "$f.txt" 2>&1)
        echo "$side np$np_ $tp rep $rep: load $(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%T)" | tee -a "$out/log"
      done
    done
  done
done
