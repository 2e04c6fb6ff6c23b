#!/bin/bash
# tests/dpdk_netem_vm.sh — run the DPDK transport's `tc netem` tests inside a
# qemu guest whose (Debian) kernel has the netem qdisc, for hosts whose own
# kernel lacks it (CONFIG_NET_SCH_NETEM unset, no modules).
#
#   tests/dpdk_netem_vm.sh [pytest -k expression]     (default: netem)
#
# The guest is scripts/rxe-vm/rxevm.py's (the tree's one qemu harness): the
# host's /boot/vmlinuz-<kver> under TCG with a busybox initramfs that loads
# sch_netem, veth, bridge and 9p (and mounts bpffs for af_xdp), the host's root
# read-only over 9p, and this checkout's tests/test_dpdk.py run with the Python
# on PATH (the same harp install the host tests use); `--no-rdma` skips the
# Soft-RoCE setup. Network traffic stays inside namespaces in the guest. Needs
# qemu-system-x86, busybox-static, kmod and linux-image-amd64
# (scripts/deps/dpdk.apt). The caller's environment goes into the guest (PYTHONPATH=$PWD/python
# for a source-tree build). Exit status: pytest's (rxevm.py's own: 2 when the
# guest cannot start here, 3 when it did not finish).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
KEXPR=${1:-netem}
cd "$HERE"
echo "booting the rxevm guest (TCG) to run: pytest test_dpdk.py -k '$KEXPR'"
HARP_TEST_NETEM_RANKS=2 exec python3 "$REPO/scripts/rxe-vm/rxevm.py" run --no-rdma --timeout 3000 --memory 4096 \
  -- python3 -m pytest -p no:cacheprovider -q -rs test_dpdk.py -k "$KEXPR" --basetemp=/tmp/pt
