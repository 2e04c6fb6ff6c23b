#!/bin/bash
# view.sh HOLDER_PID HOSTNAME ARGS...: harp-status inside that emulated host, timed
h=$1; name=$2; shift 2
s=$(date +%s.%N)
HARP_STATUS_DIR=${JV_DIR:-/tmp/jv/arena}/status-$name nsenter -t $h -n -u -m -- /work/ci/.venv/bin/python -m harp.status "$@"
e=$(date +%s.%N)
echo "# from $name: $(echo "$e - $s" | bc) s" >&2
