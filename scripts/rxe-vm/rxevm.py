#!/usr/bin/env python3
"""scripts/rxe-vm/rxevm.py — run a command inside a qemu guest that has a Soft-RoCE device.

HARP's verbs transport must be tested against a real verbs stack. The build
machines' kernels cannot load modules and /dev/kvm cannot boot a stock kernel,
but qemu's software emulation (TCG) can boot Debian's `linux-image-amd64`,
which ships `rdma_rxe.ko`. This module:

  1. builds (once per kernel version, cached under build/rxe-vm/) a busybox
     initramfs holding the rxe, uverbs, virtio and 9p modules and our `init`,
     from Debian packages only (busybox-static, linux-image-amd64, kmod);
  2. boots it with the host's root file system exported read-only over 9p,
     plus a fresh writable work directory (results, logs);
  3. inside the guest (chrooted into the host root, so the same Python, the
     same build tree and the same libibverbs) creates a veth pair, brings up
     `rdma link add rxe0 type rxe netdev veth0`, waits for the port to be
     ACTIVE with an IPv4 RoCE v2 GID, and runs the caller's command with the
     caller's environment and working directory;
  4. returns the command's exit status and output (stdout+stderr, merged).

Paths under /tmp, /run and /dev/shm are guest-private tmpfs (the host's are
not visible); everything else is the host's tree, read-only.

The one qemu harness of the tree: tests/test_verbs.py imports this file, and
tests/dpdk_netem_vm.sh runs the DPDK netem tests through `run --no-rdma`
(the guest kernel has sch_netem and bridge; bpffs is mounted for af_xdp).
From the shell:

    scripts/rxe-vm/rxevm.py run [--timeout S] [--no-rdma] [-v] -- CMD ARGS...
    scripts/rxe-vm/rxevm.py check      # ibv_devices + ibv_rc_pingpong in the guest
    scripts/rxe-vm/rxevm.py build      # only build the initramfs; print its path
    scripts/rxe-vm/rxevm.py why-not    # why the guest cannot run here ("" = it can)

Environment: HARP_RXE_VM_KERNEL (kernel version to boot), HARP_RXE_VM_CACHE
(initramfs cache directory), HARP_RXE_VM_QEMU (qemu binary).

Threading: none; each run() is one blocking qemu process. Several runs may
proceed in parallel (each has its own work directory).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import hashlib
import io
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Modules init loads (their dependencies come from modprobe --show-depends).
# sch_netem and bridge: the DPDK transport's `tc netem` tests (tests/dpdk_netem_vm.sh), for hosts
# whose own kernel lacks netem. Keep in step with the modprobe loop in `init`.
MODULES = ["virtio_pci", "virtio_net", "9pnet_virtio", "9p", "crc32_generic", "crc32_pclmul",
           "rdma_rxe", "rdma_ucm", "ib_uverbs", "veth", "dummy", "sch_netem", "bridge"]
# Packed when the kernel has them, skipped otherwise (the verbs guest does not need them).
OPTIONAL_MODULES = {"sch_netem", "bridge"}
# Debian packages that provide what this harness needs (also in scripts/deps/verbs.apt).
PACKAGES = "qemu-system-x86 linux-image-amd64 busybox-static kmod iproute2 rdma-core ibverbs-providers"

# Environment variables not carried into the guest.
_ENV_SKIP = {"PWD", "OLDPWD", "SHLVL", "_", "TERM", "TERMCAP", "COLUMNS", "LINES", "DISPLAY",
             "SSH_AUTH_SOCK", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "TMPDIR",
             "PYTEST_CURRENT_TEST"}


class VmUnavailable(RuntimeError):
    """The guest cannot be started on this machine (missing package, no kernel)."""


class GuestError(RuntimeError):
    """The guest started but did not run the command to completion (crash, timeout)."""

    def __init__(self, msg: str, console: str = "", output: str = ""):
        super().__init__(msg)
        self.console = console
        self.output = output


@dataclasses.dataclass
class GuestResult:
    rc: int          # exit status of the command in the guest (124: it hit the timeout)
    output: str      # its stdout and stderr, interleaved
    setup: str       # the rxe setup log (ip, rdma, ibv_devinfo)
    console: str     # the guest's serial console (kernel and init messages)
    seconds: float   # wall time from qemu start to exit


# ---------------------------------------------------------------------------
# Kernel and prerequisites

def _qemu() -> str | None:
    q = os.environ.get("HARP_RXE_VM_QEMU") or shutil.which("qemu-system-x86_64")
    return q if q and os.access(q, os.X_OK) else None


def _rxe_module(kver: str) -> str | None:
    hits = glob.glob(f"/lib/modules/{kver}/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*")
    return hits[0] if hits else None


def find_kernel() -> tuple[str, str]:
    """(version, vmlinuz path) of a kernel with rdma_rxe.ko, newest first."""
    want = os.environ.get("HARP_RXE_VM_KERNEL")
    cands = [want] if want else sorted(os.listdir("/lib/modules") if os.path.isdir("/lib/modules") else [],
                                       reverse=True)
    for kver in cands:
        vmlinuz = f"/boot/vmlinuz-{kver}"
        if _rxe_module(kver) and os.access(vmlinuz, os.R_OK):
            return kver, vmlinuz
    if want:
        raise VmUnavailable(f"HARP_RXE_VM_KERNEL={want}: no readable /boot/vmlinuz-{want} with "
                            f"/lib/modules/{want}/.../rdma_rxe.ko")
    raise VmUnavailable("no kernel with rdma_rxe.ko under /lib/modules and /boot "
                        f"(apt-get install {PACKAGES})")


def why_not() -> str:
    """Why the guest cannot run here; "" when it can."""
    missing = []
    if not _qemu():
        missing.append("qemu-system-x86_64")
    if not os.path.exists("/bin/busybox") or not _is_static("/bin/busybox"):
        missing.append("a static /bin/busybox (busybox-static)")
    for tool in ("modprobe", "depmod"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}") and not os.path.exists(f"/sbin/{tool}"):
            missing.append(tool)
    if not shutil.which("rdma") and not os.path.exists("/usr/sbin/rdma") and not os.path.exists("/sbin/rdma"):
        missing.append("rdma (iproute2)")
    try:
        find_kernel()
    except VmUnavailable as e:
        missing.append(str(e))
    if missing:
        return "Soft-RoCE guest unavailable, missing: " + "; ".join(missing) + f" (apt-get install {PACKAGES})"
    return ""


def _is_static(path: str) -> bool:
    try:
        out = subprocess.run(["file", "-L", path], capture_output=True, text=True).stdout
        if out:
            return "statically linked" in out or "static-pie" in out
    except OSError:
        pass
    # No `file`: a static binary has no PT_INTERP; look for the loader path.
    with open(path, "rb") as f:
        return b"/lib64/ld-linux" not in f.read(4096)


def _tool(name: str) -> str:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), name)


# ---------------------------------------------------------------------------
# Initramfs (cpio "newc", written here so no cpio binary or root is needed)

class _Cpio:
    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        name_b = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08x}" for v in (
            self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0))
        self.ino += 1
        self.buf.write(hdr.encode() + name_b)
        self.buf.write(b"\0" * ((4 - (110 + len(name_b)) % 4) % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * ((4 - len(data) % 4) % 4))

    def dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def _module_files(kver: str) -> list[str]:
    files: list[str] = []
    for m in MODULES:
        r = subprocess.run([_tool("modprobe"), "-S", kver, "--show-depends", m], capture_output=True, text=True)
        if r.returncode != 0:
            if m in OPTIONAL_MODULES:
                continue
            raise VmUnavailable(f"modprobe -S {kver} --show-depends {m} failed: {r.stderr.strip()}")
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "insmod" and parts[1] not in files:
                files.append(parts[1])
    return files


def initramfs(kver: str | None = None, cache_dir: str | None = None) -> str:
    """Path of the cached initramfs for `kver`, building it if needed."""
    if kver is None:
        kver = find_kernel()[0]
    cache_dir = cache_dir or os.environ.get("HARP_RXE_VM_CACHE") or os.path.join(REPO, "build", "rxe-vm")
    with open(os.path.join(HERE, "init"), "rb") as f:
        init = f.read()
    mods = _module_files(kver)
    key = hashlib.sha256(init + "\n".join(mods).encode() + str(os.stat("/bin/busybox").st_mtime_ns).encode())
    out = os.path.join(cache_dir, f"initrd-{kver}-{key.hexdigest()[:12]}.cpio.gz")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harp-rxe-initrd-") as tmp:
        moddir = os.path.join(tmp, "lib", "modules", kver)
        for m in mods:
            rel = os.path.relpath(m, f"/lib/modules/{kver}")
            os.makedirs(os.path.dirname(os.path.join(moddir, rel)), exist_ok=True)
            shutil.copy2(m, os.path.join(moddir, rel))
        for extra in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
            src = f"/lib/modules/{kver}/{extra}"
            if os.path.exists(src):
                shutil.copy2(src, os.path.join(moddir, extra))
        r = subprocess.run([_tool("depmod"), "-b", tmp, kver], capture_output=True, text=True)
        if r.returncode != 0:
            raise VmUnavailable(f"depmod -b {tmp} {kver} failed: {r.stderr.strip()}")
        c = _Cpio()
        for d in ("bin", "dev", "proc", "sys", "mnt", "mnt/root", "tmp", "etc", "lib"):
            c.dir(d)
        c.symlink("sbin", "bin")
        c.chardev("dev/console", 5, 1)
        c.chardev("dev/null", 1, 3)
        with open("/bin/busybox", "rb") as f:
            c.file("bin/busybox", f.read(), 0o755)
        applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
        for a in applets:
            if a != "busybox" and "/" not in a:
                c.symlink(f"bin/{a}", "busybox")
        c.file("init", init, 0o755)
        for root, dirs, files in os.walk(os.path.join(tmp, "lib")):
            dirs.sort()
            rel_root = os.path.relpath(root, tmp)
            if rel_root != "lib":
                c.dir(rel_root)
            for fn in sorted(files):
                with open(os.path.join(root, fn), "rb") as f:
                    c.file(os.path.join(rel_root, fn), f.read())
        data = gzip.compress(c.finish(), compresslevel=6)
    part = out + f".{os.getpid()}.part"
    with open(part, "wb") as f:
        f.write(data)
    os.replace(part, out)
    return out


# ---------------------------------------------------------------------------
# Running a command in the guest

_GUEST_SH = r"""#!/bin/sh
# Generated by scripts/rxe-vm/rxevm.py; runs chrooted in the host root inside the guest.
W=/run/harp-vm
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec 3>&1 >$W/setup.log 2>&1
up() { cut -d' ' -f1 /proc/uptime; }
echo "setup begins at $(up)s"
ip link set lo up
fail() { echo "RXE SETUP FAILED: $*"; echo "HARP-VM: rxe setup failed: $*" >&3; echo 253 > $W/rc; exit 0; }
if [ "@RDMA@" = 1 ]; then
  ip link add veth0 type veth peer name veth1 || fail "ip link add veth"
  # Jumbo frames: rxe then runs with a 4096-byte path MTU (fewer, larger packets).
  ip link set veth0 mtu @MTU@ && ip link set veth1 mtu @MTU@ || fail "ip link set mtu @MTU@"
  ip addr add 10.99.0.1/24 dev veth0 && ip addr add 10.99.0.2/24 dev veth1 || fail "ip addr add"
  ip link set veth0 up && ip link set veth1 up || fail "ip link set up"
  rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0 type rxe netdev veth0"
  i=0
  while [ $i -lt 100 ]; do
    st=$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)
    gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null)
    case "$st" in *ACTIVE*) case "$gid" in 0000:0000:0000:0000:0000:ffff:*) break;; esac;; esac
    sleep 0.1; i=$((i+1))
  done
  echo "rxe0 port state: $st, gid[1]: $gid"
  case "$st" in *ACTIVE*) ;; *) fail "rxe0 port 1 not ACTIVE after 10 s ($st)";; esac
  rdma link show
  ibv_devices
fi
echo "setup done at $(up)s"
echo "HARP-VM: command starts at $(up)s" >&3
. $W/env.sh
cd @CWD@ 2>/dev/null || cd /
timeout -k 10 @TIMEOUT@ /bin/sh $W/cmd.sh > $W/out.log 2>&1 < /dev/null
echo $? > $W/rc
echo "HARP-VM: command exited at $(up)s" >&3
"""


def _env_script(env: dict[str, str]) -> str:
    lines = []
    for k, v in sorted(env.items()):
        if k in _ENV_SKIP or not k.replace("_", "a").isalnum() or k[0].isdigit():
            continue
        lines.append(f"export {k}={shlex.quote(v)}")
    return "\n".join(lines) + "\n"


def run(cmd: list[str] | str, *, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 300, cpus: int = 2, memory_mb: int = 2048, rdma: bool = True,
        stream=None, keep_workdir: bool = False, mtu: int = 9000) -> GuestResult:
    """Run `cmd` (argv list, or a shell string) in a fresh guest; return its status and output.

    `env`: the command's environment (default: this process's). `cwd`: its
    working directory (default: this process's; must not be under /tmp).
    `stream`: a file object that receives the command's output as it is
    produced. `mtu`: of the veth pair under rxe0 (9000: RDMA path MTU 4096;
    1500: 1024). Raises VmUnavailable when the guest cannot start here, GuestError
    when it started but did not finish the command (boot failure, guest hang
    past timeout + 60 s).
    """
    reason = why_not()
    if reason:
        raise VmUnavailable(reason)
    kver, vmlinuz = find_kernel()
    initrd = initramfs(kver)
    cwd = os.path.abspath(cwd or os.getcwd())
    # A working directory under /tmp is shared into the guest on its own (the
    # guest's /tmp is a private tmpfs); /run, /dev/shm and the Python cannot be.
    share_cwd = cwd.startswith("/tmp/") and " " not in cwd
    for what, path in (("working directory", cwd), ("Python", sys.executable)):
        if what == "working directory" and share_cwd:
            continue
        if any(path == d or path.startswith(d + "/") for d in ("/tmp", "/run", "/dev/shm")):
            raise VmUnavailable(f"the {what} {path} is under /tmp, /run or /dev/shm, which the guest replaces "
                                "with its own tmpfs; use a checkout / virtualenv elsewhere")
    env = dict(os.environ if env is None else env)
    script = cmd if isinstance(cmd, str) else shlex.join(cmd)
    work = tempfile.mkdtemp(prefix="harp-rxe-vm-")
    try:
        guest = (_GUEST_SH.replace("@RDMA@", "1" if rdma else "0").replace("@MTU@", str(int(mtu)))
                 .replace("@CWD@", shlex.quote(cwd)).replace("@TIMEOUT@", str(int(max(1, timeout)))))
        for name, text in (("guest.sh", guest), ("env.sh", _env_script(env)), ("cmd.sh", script + "\n")):
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        open(os.path.join(work, "out.log"), "w").close()
        console = os.path.join(work, "console.log")
        argv = [_qemu(), "-accel", "tcg,thread=multi", "-cpu", "max", "-m", str(memory_mb),
                "-smp", str(cpus), "-display", "none", "-monitor", "none", "-serial", f"file:{console}",
                "-no-reboot", "-kernel", vmlinuz, "-initrd", initrd,
                "-append", "console=ttyS0 quiet loglevel=3 panic=-1" + (f" harpcwd={cwd}" if share_cwd else ""),
                "-nic", "none",
                "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
                "-virtfs", f"local,path={work},mount_tag=work,security_model=none"]
        if share_cwd:
            argv += ["-virtfs", f"local,path={cwd},mount_tag=cwd,security_model=none"]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        deadline = t0 + timeout + 60  # boot + setup + the command's own timeout
        pos = 0
        killed = False
        while proc.poll() is None:
            if stream is not None:
                pos = _pump(os.path.join(work, "out.log"), pos, stream)
            if time.monotonic() > deadline:
                proc.kill()
                killed = True
                break
            time.sleep(0.2)
        qemu_out = proc.communicate()[0].decode(errors="replace")
        if stream is not None:
            _pump(os.path.join(work, "out.log"), pos, stream)
        secs = time.monotonic() - t0
        read = lambda n: open(os.path.join(work, n), errors="replace").read() if os.path.exists(os.path.join(work, n)) else ""
        cons, out, setup, rc_text = read("console.log"), read("out.log"), read("setup.log"), read("rc").strip()
        if killed:
            raise GuestError(f"guest still running {timeout + 60:.0f} s after start; killed. console tail:\n"
                             + cons[-3000:], cons, out)
        if not rc_text:
            raise GuestError(f"guest exited (qemu status {proc.returncode}) without running the command. "
                             f"qemu said: {qemu_out.strip()[-1000:]}\nsetup log:\n{setup[-2000:]}\n"
                             f"console tail:\n{cons[-3000:]}", cons, out)
        rc = int(rc_text)
        if rc == 253:
            raise GuestError("Soft-RoCE setup failed in the guest:\n" + setup[-3000:], cons, out)
        return GuestResult(rc=rc, output=out, setup=setup, console=cons, seconds=secs)
    finally:
        if keep_workdir:
            print(f"rxevm: work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _pump(path: str, pos: int, stream) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except OSError:
        return pos
    if data:
        stream.write(data.decode(errors="replace"))
        stream.flush()
    return pos + len(data)


# ---------------------------------------------------------------------------
# Command line

CHECK = r"""
set -e
ibv_devices
ibv_devinfo -d rxe0 | grep -E "hca_id|transport|state|link_layer|active_mtu"
echo "=== ibv_rc_pingpong over rxe0 (loopback QPs on one device)"
ibv_rc_pingpong -d rxe0 -g 1 -n 500 > /tmp/srv.log 2>&1 &
sleep 1
timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 500 127.0.0.1
wait $!
cat /tmp/srv.log
echo "=== pyverbs"
/usr/bin/python3 -c "import pyverbs.device as d; print('pyverbs sees', [x.name.decode() for x in d.get_device_list()])"
echo CHECK-OK
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="run a command in the guest")
    r.add_argument("--timeout", type=float, default=300)
    r.add_argument("--cpus", type=int, default=2)
    r.add_argument("--memory", type=int, default=2048, help="MiB")
    r.add_argument("--no-rdma", action="store_true", help="skip the rxe0 setup")
    r.add_argument("--mtu", type=int, default=9000, help="veth MTU under rxe0 (default 9000)")
    r.add_argument("-v", "--verbose", action="store_true", help="print the setup log and console")
    r.add_argument("--keep", action="store_true", help="keep the work directory")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    sub.add_parser("check", help="ibv_devices + ibv_rc_pingpong + pyverbs in the guest")
    sub.add_parser("build", help="build the initramfs and print its path")
    sub.add_parser("why-not", help="print why the guest cannot run here (nothing if it can)")
    a = p.parse_args(argv)
    try:
        if a.what == "why-not":
            reason = why_not()
            if reason:
                print(reason)
            return 1 if reason else 0
        if a.what == "build":
            print(initramfs())
            return 0
        if a.what == "check":
            res = run(CHECK, timeout=120, stream=sys.stdout)
            print(f"rxevm: guest exit status {res.rc} after {res.seconds:.1f} s", file=sys.stderr)
            return res.rc
        cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
        if not cmd:
            p.error("run: no command given")
        res = run(cmd, timeout=a.timeout, cpus=a.cpus, memory_mb=a.memory, rdma=not a.no_rdma,
                  stream=sys.stdout, keep_workdir=a.keep, mtu=a.mtu)
        if a.verbose:
            print("---- setup log\n" + res.setup + "---- console\n" + res.console, file=sys.stderr)
        print(f"rxevm: guest exit status {res.rc} after {res.seconds:.1f} s", file=sys.stderr)
        return res.rc
    except VmUnavailable as e:
        print(f"rxevm: {e}", file=sys.stderr)
        return 2
    except GuestError as e:
        print(f"rxevm: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
