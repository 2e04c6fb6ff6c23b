#!/usr/bin/env bash
# Install every system and Python package HARP's build, tests and benchmarks need:
# the Debian packages listed in scripts/deps/*.apt and the pip packages in
# scripts/deps/*.pip (each transport adds its own list). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

apt_pkgs=$(cat scripts/deps/*.apt 2>/dev/null | sed 's/#.*//' | xargs || true)
if [ -n "$apt_pkgs" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    missing=""
    for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    if [ -n "$missing" ]; then
      echo "install-deps: apt-get install$missing"
      SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
    fi
  else
    echo "install-deps: no apt-get; make sure these are installed: $apt_pkgs" >&2
  fi
fi

pip_pkgs=$(cat scripts/deps/*.pip 2>/dev/null | sed 's/#.*//' | xargs || true)
if [ -n "$pip_pkgs" ]; then
  echo "install-deps: pip install $pip_pkgs"
  # shellcheck disable=SC2086
  $PY -m pip install -q $pip_pkgs
fi
