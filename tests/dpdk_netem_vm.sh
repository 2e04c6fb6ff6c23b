#!/bin/bash
# tests/dpdk_netem_vm.sh — run the DPDK transport's `tc netem` tests inside a
# qemu guest whose (Debian) kernel has the netem qdisc, for hosts whose own
# kernel lacks it (CONFIG_NET_SCH_NETEM unset, no modules).
#
#   tests/dpdk_netem_vm.sh [pytest -k expression]     (default: netem)
#
# The guest boots the host's /boot/vmlinuz-<kver> under TCG with a busybox
# initramfs that loads sch_netem, veth, bridge and 9p, mounts the host's root
# read-only over 9p, and runs this checkout's tests/test_dpdk.py with the
# Python on PATH (the same harp install the host tests use). Network traffic
# stays inside namespaces in the guest. Needs qemu-system-x86, busybox-static
# and linux-image-amd64 (scripts/deps/dpdk.apt). Exit status: pytest's.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
KEXPR=${1:-netem}
KVER=$(ls /lib/modules | sort -V | tail -1)
KERNEL=/boot/vmlinuz-$KVER
PY=$(command -v python3)
[ -e "$KERNEL" ] || { echo "no kernel image $KERNEL (apt-get install linux-image-amd64)"; exit 2; }
command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 missing (apt-get install qemu-system-x86)"; exit 2; }
W=$(mktemp -d /tmp/harp-netem-vm.XXXX)
trap 'rm -rf "$W"' EXIT
R=$W/rootfs
mkdir -p $R/bin $R/mnt/root $R/proc $R/sys $R/dev $R/lib/modules/$KVER $W/work
cp /bin/busybox $R/bin/busybox
for a in $($R/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox $R/bin/$a; done
MODS="virtio_pci virtio_net 9pnet_virtio 9p sch_netem veth bridge"
for m in $MODS; do modprobe -S $KVER --show-depends $m; done | awk '$1=="insmod"{print $2}' | sort -u | while read -r f; do
  mkdir -p "$R$(dirname "$f")"; cp "$f" "$R$f"
done
cp /lib/modules/$KVER/modules.order /lib/modules/$KVER/modules.builtin* $R/lib/modules/$KVER/ 2>/dev/null || true
depmod -b $R $KVER
cat > $R/init <<EOF
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $MODS; do modprobe \$m || echo "GUEST: modprobe \$m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /mnt/root || { echo "GUEST: 9p failed"; poweroff -f; }
for d in proc sys dev; do mount --bind /\$d /mnt/root/\$d; done
mount -t tmpfs tmp /mnt/root/tmp; mount -t tmpfs run /mnt/root/run
mkdir -p /mnt/root/tmp/harp-work /mnt/root/run/netns
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 work /mnt/root/tmp/harp-work
mount -t bpf bpf /mnt/root/sys/fs/bpf 2>/dev/null
chroot /mnt/root /bin/sh /tmp/harp-work/guest.sh
poweroff -f
EOF
chmod +x $R/init
cat > $W/work/guest.sh <<EOF
export PATH=$(dirname "$PY"):/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
ip link set lo up
cd $REPO/tests
echo "GUEST: kernel \$(uname -r), netem: \$(ls /sys/module | grep -c sch_netem)"
export HARP_TEST_NETEM_RANKS=2
($PY -m pytest -p no:cacheprovider -q -rs test_dpdk.py -k "$KEXPR" --basetemp=/tmp/pt; echo \$? > /tmp/harp-work/rc) 2>&1 | grep -v '^[0-9]*: /'
dmesg | grep -iE "oom|killed process" | tail -5
EOF
(cd $R && find . | cpio -o -H newc 2>/dev/null | gzip -1) > $W/initrd.gz
echo "booting $KERNEL (TCG) to run: pytest test_dpdk.py -k '$KEXPR'"
timeout 3000 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 4096 -smp 2 -nographic -no-reboot \
  -kernel $KERNEL -initrd $W/initrd.gz -append "console=ttyS0 quiet panic=-1" -nic none \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path=$W/work,mount_tag=work,security_model=none | grep --line-buffered -v "^\s*$" || true
RC=$(cat $W/work/rc 2>/dev/null || echo 3)
echo "guest pytest exit status: $RC"
exit $RC
