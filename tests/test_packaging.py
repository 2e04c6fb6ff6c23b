"""The wheel as a user gets it: built with `pip wheel .`, installed into a fresh
virtual environment, run from there (never from this checkout).

* The runtime wheel carries no developer tools (harp_dev: harp-bench, harp-cluster,
  the arena's delay line) and runs without them: in a fresh venv holding only the
  wheel (and numpy), `import harp`, a 2-rank allreduce under harp-run, `harp-run
  --help` and `harp-config` work, and neither harp-bench nor harp_dev is there. The
  developer distribution (harp-dev, `pip wheel ./python`, pure Python) then adds
  harp-bench, which runs against that runtime.
* Built with pkg-config unable to find libibverbs and libdpdk (PKG_CONFIG_LIBDIR
  pointing at an empty folder), the build succeeds, the wheel carries no verbs/dpdk
  module, harp-config says why, and `harp-bench allreduce -np 2` finds 0 wrong values.
* Built with every library present (or the wheel CI installed, when HARP_TEST_WHEEL
  names it), the same installed wheel lists 4 transports whose modules loaded; run
  again in a private mount namespace where empty files are bind-mounted over the
  modules' system libraries (libibverbs.so.1, librte_eal.so.23: the real paths come
  from ldd), it lists 2 usable transports and the dlerror reason for each of the
  other two, and still imports and runs a 2-rank allreduce.

Each venv gets numpy from the interpreter running the tests through a .pth file naming a
folder that holds only numpy (no network, and nothing else of the outer site-packages, which
may hold harp and harp_dev of their own); HARP itself comes only from the wheels. Build folders live under
build/test-packaging/ so a second local run is incremental (ccache is used when
installed).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "test-packaging")
OPTIONAL = {"verbs": "libibverbs.so", "dpdk": "librte_eal.so"}  # module -> system library to hide


def clean_env(**extra):
    """The environment of a user's shell: no PYTHONPATH into this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore", HARP_TIMEOUT="120")
    env.update(extra)
    return env


def run(cmd, timeout=1800, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def build_wheel(name, **env):
    out = os.path.join(BUILD, name, "dist")
    shutil.rmtree(out, ignore_errors=True)
    cmake_args = os.environ.get("CMAKE_ARGS", "")
    if shutil.which("ccache"):
        cmake_args += " -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-q", "-w", out,
         "--config-settings", f"build-dir={os.path.join(BUILD, name, 'build')}"],
        cwd=ROOT, env=clean_env(CMAKE_ARGS=cmake_args, CCACHE_BASEDIR=ROOT, **env))
    wheels = glob.glob(os.path.join(out, "harp-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def numpy_only(path):
    """A folder holding only the outer numpy (links to it and its vendored libraries)."""
    os.makedirs(path, exist_ok=True)
    outer = os.path.dirname(os.path.dirname(numpy.__file__))
    for name in os.listdir(outer):
        if (name == "numpy" or name.startswith(("numpy.", "numpy-"))) and not os.path.exists(os.path.join(path, name)):
            os.symlink(os.path.join(outer, name), os.path.join(path, name))
    return path


def install(bindir, wheel):
    run([os.path.join(bindir, "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
         wheel], timeout=600, env=clean_env())


def make_venv(path, wheel):
    """A fresh venv with `wheel` installed; returns its bin directory."""
    run([sys.executable, "-m", "venv", "--clear", str(path)], timeout=300)
    bindir = os.path.join(path, "bin")
    install(bindir, wheel)
    py = os.path.join(bindir, "python")
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    with open(os.path.join(site, "outer_numpy.pth"), "w") as f:
        f.write(numpy_only(os.path.join(str(path), "numpy-only")) + "\n")
    return bindir


def build_dev_wheel():
    """harp-dev (python/pyproject.toml): pure Python, built with this interpreter's setuptools."""
    out = os.path.join(BUILD, "dev", "dist")
    shutil.rmtree(out, ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", os.path.join(ROOT, "python"), "--no-build-isolation", "--no-deps",
         "-q", "-w", out], cwd=ROOT, env=clean_env(), timeout=600)
    wheels = glob.glob(os.path.join(out, "harp_dev-*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "harp_dev/bench/cli.py" in names and "harp_dev/cluster/delayline.c" in names, names
    assert not [n for n in names if n.startswith("harp/") or n.endswith((".so", ".pyd"))], names
    return wheels[0]


@pytest.fixture(scope="module")
def dev_wheel():
    return build_dev_wheel()


DEV_FILES = ("harp_dev/", "harp/bench/", "harp/cluster/", "harp/harp-delayline")


def assert_runtime_only(wheel):
    """The runtime wheel: no developer tools, no harp-bench / harp-cluster console scripts."""
    z = zipfile.ZipFile(wheel)
    assert not [n for n in z.namelist() if n.startswith(DEV_FILES)], z.namelist()
    entry = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    scripts = z.read(entry).decode()
    assert "harp-run" in scripts and "harp-config" in scripts, scripts
    assert "harp-bench" not in scripts and "harp-cluster" not in scripts, scripts


ALLREDUCE = """import sys
import numpy as np, harp
comm = harp.init()
x = np.full(1000, comm.rank + 1, dtype=np.float32)
comm.allreduce(x)
assert (x == 3).all(), x[:4]
sys.stdout.write(f"allreduce ok on rank {comm.rank} of {comm.size}\\n")  # one write with its newline: the ranks share the pipe
sys.stdout.flush()
"""


def runs_without_dev(bindir, tmp):
    """The runtime alone: harp imports, 2 ranks allreduce under harp-run, harp-run --help and
    harp-config work; harp-bench, harp-cluster and harp_dev are not installed."""
    for tool in ("harp-bench", "harp-cluster"):
        assert not os.path.exists(os.path.join(bindir, tool)), tool
    py = os.path.join(bindir, "python")
    r = run([py, "-c", "import importlib.util, harp; print(harp.__version__, importlib.util.find_spec('harp_dev'))"],
            env=clean_env(), timeout=120)
    assert r.stdout.split()[1:] == ["None"], r.stdout
    prog = os.path.join(tmp, "allreduce2.py")
    with open(prog, "w") as f:
        f.write(ALLREDUCE)
    r = run([os.path.join(bindir, "harp-run"), "-n", "2", prog], env=clean_env(), timeout=300)
    assert sorted(l for l in r.stdout.splitlines() if l.startswith("allreduce ok")) == [
        "allreduce ok on rank 0 of 2", "allreduce ok on rank 1 of 2"], r.stdout + r.stderr
    assert "-n" in run([os.path.join(bindir, "harp-run"), "--help"], env=clean_env(), timeout=120).stdout
    r = run([os.path.join(bindir, "harp-config")], env=clean_env(), timeout=120)
    assert r.stdout.startswith("harp ") and "transport tcp" in r.stdout, r.stdout


def installed_libdir(bindir):
    r = run([os.path.join(bindir, "harp-config"), "--libdir"], env=clean_env(), timeout=120)
    libdir = r.stdout.strip()
    assert libdir.startswith(os.path.dirname(bindir)), f"harp came from {libdir}, not from the venv"
    return libdir


def transports(bindir, prefix=()):
    r = run([*prefix, os.path.join(bindir, "harp-config"), "--json"], env=clean_env(), timeout=120)
    return {t["name"]: t for t in json.loads(r.stdout)["transports"]}


def allreduce_2_ranks(bindir, prefix=(), maxbytes="1M", tmp=None):
    """harp-bench allreduce over 2 local ranks; returns the JSON record (0 wrong values checked)."""
    js = os.path.join(tmp, "bench.json")
    run([*prefix, os.path.join(bindir, "harp-bench"), "allreduce", "-np", "2", "-b", "8", "-e", maxbytes, "-f", "4",
         "-n", "3", "-w", "1", "--json", js], env=clean_env(), timeout=600)
    res = json.load(open(js))["results"]["harp"]
    assert res["nranks"] == 2 and len(res["rows"]) >= 5
    for row in res["rows"]:
        assert row["oop_wrong"] == 0 and row["ip_wrong"] == 0, row
    return res


def test_wheel_without_optional_libraries_builds_installs_and_runs(tmp_path, dev_wheel):
    empty = tmp_path / "no-pkgconfig"
    empty.mkdir()
    wheel = build_wheel("minimal", PKG_CONFIG_LIBDIR=str(empty), PKG_CONFIG_PATH="")
    assert_runtime_only(wheel)
    names = zipfile.ZipFile(wheel).namelist()
    assert "harp/libharp.so" in names and any(n.startswith("harp/_harp") for n in names)
    assert not [n for n in names if "libharp-verbs" in n or "libharp-dpdk" in n], names
    bindir = make_venv(tmp_path / "venv", wheel)
    libdir = installed_libdir(bindir)
    ldd = run(["ldd", os.path.join(libdir, "libharp.so")]).stdout
    assert "libibverbs" not in ldd and "librte_" not in ldd, ldd
    ts = transports(bindir)
    assert ts["tcp"]["available"] and ts["shm"]["available"]
    for name in OPTIONAL:
        assert not ts[name]["loaded"] and not ts[name]["available"]
        assert "was not built" in ts[name]["why"] and "not found by pkg-config" in ts[name]["why"], ts[name]
    runs_without_dev(bindir, str(tmp_path))
    install(bindir, dev_wheel)
    allreduce_2_ranks(bindir, tmp=str(tmp_path))


@pytest.fixture(scope="module")
def full_venv(tmp_path_factory, dev_wheel):
    """The full runtime wheel in a fresh venv, checked to run without harp-dev; then harp-dev added."""
    wheel = os.environ.get("HARP_TEST_WHEEL") or build_wheel("full")
    assert_runtime_only(wheel)
    names = zipfile.ZipFile(wheel).namelist()
    for name in OPTIONAL:
        if f"harp/libharp-{name}.so" not in names:
            pytest.fail(f"{wheel} has no {name} module: build it where lib{name} development files are installed "
                        "(bash scripts/install-deps.sh --test)")
    tmp = tmp_path_factory.mktemp("full")
    bindir = make_venv(tmp / "venv", wheel)
    runs_without_dev(bindir, str(tmp))
    install(bindir, dev_wheel)
    return bindir, installed_libdir(bindir)


def test_runtime_runs_without_the_dev_package_which_adds_harp_bench(full_venv, tmp_path):
    bindir, _ = full_venv  # the fixture ran the runtime alone (runs_without_dev) before adding harp-dev
    for tool in ("harp-bench", "harp-cluster"):
        assert os.access(os.path.join(bindir, tool), os.X_OK), tool
    bench = run([os.path.join(bindir, "harp-bench"), "--version"], env=clean_env(), timeout=120).stdout
    config = run([os.path.join(bindir, "harp-config"), "--version"], env=clean_env(), timeout=120).stdout
    assert bench.startswith("harp-bench (harp ") and bench.split("(harp ")[1] == config.split("(harp ")[1], bench
    allreduce_2_ranks(bindir, tmp=str(tmp_path))


def test_one_wheel_loads_every_transport_module_where_libraries_exist(full_venv):
    bindir, libdir = full_venv
    ts = transports(bindir)
    assert sorted(ts) == ["dpdk", "shm", "tcp", "verbs"]
    for name, t in ts.items():
        assert t["loaded"], t  # module loaded (verbs may still report no RDMA device: t["available"])
        assert t["provided"] == ("module" if name in OPTIONAL else "built in")
        assert t["available"] or name == "verbs", t
    if not ts["verbs"]["available"]:
        assert "RDMA device" in ts["verbs"]["why"] or "ibv_" in ts["verbs"]["why"], ts["verbs"]
    text = run([os.path.join(bindir, "harp-config"), "--transports"], env=clean_env()).stdout
    how = [" ".join(line.split()[2:4]) for line in text.splitlines()]
    assert sorted(how) == ["built in", "built in", "module loaded", "module loaded"], text


def hidden_libraries(libdir):
    """{module: real path of the system library it needs} from ldd of each module."""
    found = {}
    for name, lib in OPTIONAL.items():
        for line in run(["ldd", os.path.join(libdir, f"libharp-{name}.so")]).stdout.splitlines():
            parts = line.split()
            if parts and parts[0].startswith(lib) and "=>" in parts and "not" not in parts:
                found[name] = (parts[0], os.path.realpath(parts[2]))
    assert sorted(found) == sorted(OPTIONAL), found
    return found


def test_same_wheel_with_system_libraries_hidden_lists_two_and_still_runs(full_venv, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    bindir, libdir = full_venv
    hide = hidden_libraries(libdir)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    mounts = " && ".join(f"mount --bind {empty} {path}" for _, path in hide.values())
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", mounts + ' && exec "$@"', "hide"]
    ts = transports(bindir, prefix)
    usable = sorted(n for n, t in ts.items() if t["available"])
    assert usable == ["shm", "tcp"], ts
    for name, (soname, _) in hide.items():
        t = ts[name]
        assert not t["loaded"] and f"libharp-{name}.so" in t["why"] and soname in t["why"], t
    run([*prefix, os.path.join(bindir, "python"), "-c", "import harp; print(harp.__version__)"], env=clean_env())
    allreduce_2_ranks(bindir, prefix, maxbytes="256K", tmp=str(tmp_path))
    # Outside the namespace nothing changed.
    assert transports(bindir)["dpdk"]["loaded"]
