#!/usr/bin/env bash
# Install what HARP needs, in two layers, and the project's virtual environment.
#
#   bash scripts/install-deps.sh            the main job: scripts/deps/main.{apt,pip}
#   bash scripts/install-deps.sh --compare  + harp-bench --compare gloo,mpi (compare.*)
#   bash scripts/install-deps.sh --test     + every other list in scripts/deps/ (the
#                                             tests: qemu, kernel image, rdma-core, DPDK,
#                                             NCCL wheels' needs, torch, hypothesis...)
#   bash scripts/install-deps.sh --sim      + scripts/deps/sim.apt (the SimGrid projection,
#                                             bench/sim/; never part of --test)
#
# Debian packages (*.apt) go to the system with apt-get (sudo when not root; only
# the missing ones). Python packages (*.pip) go into .venv/ at the top of the
# checkout, created with $PYTHON (default python3) — so it works the same on a
# Debian box whose python3 is externally managed (PEP 668) and on a pyenv Python.
# Re-running is fast: apt is skipped when nothing is missing, pip when .venv
# already holds exactly these lists (a stamp keyed by their hash).
# Env: PYTHON (base interpreter), HARP_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${HARP_VENV:-.venv}
mode=main
sim=0
for arg in "$@"; do
  case "$arg" in
    --compare) [ "$mode" = test ] || mode=compare ;;
    --test) mode=test ;;
    --sim) sim=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (--compare, --test, --sim)" >&2; exit 2 ;;
  esac
done

lists() {  # lists EXT: the scripts/deps files of this mode
  local ext=$1
  ls scripts/deps/main."$ext" 2>/dev/null || true
  [ "$mode" = main ] || ls scripts/deps/compare."$ext" 2>/dev/null || true
  if [ "$mode" = test ]; then
    ls scripts/deps/*."$ext" 2>/dev/null | grep -v -e '/main\.' -e '/compare\.' -e '/sim\.' || true
  fi
  [ "$sim" = 0 ] || ls scripts/deps/sim."$ext" 2>/dev/null || true
}
packages() { cat $(lists "$1") /dev/null | sed 's/#.*//' | xargs; }

apt_pkgs=$(packages apt)
if [ -n "$apt_pkgs" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    missing=""
    for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    if [ -n "$missing" ]; then
      echo "install-deps: apt-get install$missing"
      SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
      $SUDO apt-get update -qq
      $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing </dev/null
    fi
  else
    echo "install-deps: no apt-get; make sure these are installed: $apt_pkgs" >&2
  fi
fi

# The virtual environment: reused when its interpreter still runs.
if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  echo "install-deps: creating $VENV with $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi

pip_pkgs=$(packages pip)
stamp="$VENV/.harp-deps-$(echo "$mode $pip_pkgs" | sha256sum | cut -c1-16)"
if [ -n "$pip_pkgs" ] && [ ! -f "$stamp" ]; then
  echo "install-deps: pip install into $VENV: $pip_pkgs"
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q $pip_pkgs </dev/null
  rm -f "$VENV"/.harp-deps-*
  touch "$stamp"
fi
echo "install-deps: $mode packages ready; Python: $VENV/bin/python"
