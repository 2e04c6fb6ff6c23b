#!/bin/bash
# view.sh HOLDER_PID HOSTNAME ARGS...: harp-status (this tree's, with the python on PATH) inside that
# emulated host's network, UTS and mount namespaces, with that host's status folder, timed.
h=$1; name=$2; shift 2
py=$(cd "$(dirname "$0")/../python" && pwd)
s=$(date +%s.%N)
HARP_STATUS_DIR=${JV_DIR:-/tmp/jv/arena}/status-$name PYTHONPATH=$py nsenter -t $h -n -u -m -- "$(command -v python3)" -m harp.status "$@"
e=$(date +%s.%N)
echo "# from $name: $(echo "$e - $s" | bc) s" >&2
