"""What the machine has, for scripts/gpu-check.sh: GPU, Python, torch, cupy, compilers, and the
paths the NCCL client build needs (NVIDIA's nccl.h and libnccl.so.2, CUDA's headers, libcudart).

    python tests/gpu/probe_env.py JSON_OUT SH_OUT

Prints one line per fact; writes them as JSON to JSON_OUT and the paths as shell assignments
(NCCL_INC NCCL_LIB CUDA_INC CCCL_INC CUDART NVCC GPU) to SH_OUT. Never fails on a missing item:
an empty value means "not found". Exit 0 always (gpu-check.sh decides what is fatal).
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "nccl"))


def sh(cmd):
    try:
        out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
        return (out.stdout + out.stderr).strip() if out.returncode == 0 else ""
    except Exception:  # noqa: BLE001
        return ""


def first(paths):
    for p in paths:
        if p and os.path.exists(p):
            return p
    return ""


def main():
    jout, shout = sys.argv[1], sys.argv[2]
    f = {}
    f["hostname"] = os.uname().nodename
    f["nvidia_smi"] = sh("nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader")
    f["dev_nvidia0"] = os.path.exists("/dev/nvidia0")
    f["nproc"] = os.cpu_count()
    f["python"] = f"{sys.executable} {sys.version.split()[0]}"
    inc = sysconfig.get_paths().get("include", "")
    f["python_h"] = os.path.join(inc, "Python.h") if os.path.exists(os.path.join(inc, "Python.h")) else ""
    try:
        import torch

        f["torch"] = torch.__version__
        f["torch_cuda"] = torch.version.cuda
        f["torch_cuda_available"] = torch.cuda.is_available()
        f["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""
    except Exception as e:  # noqa: BLE001
        f["torch"] = f"not importable: {e}"
        f["torch_cuda_available"] = False
    try:
        import cupy

        f["cupy"] = cupy.__version__
    except Exception as e:  # noqa: BLE001
        f["cupy"] = f"not importable: {type(e).__name__}: {e}"
    try:
        import numpy

        f["numpy"] = numpy.__version__
    except Exception as e:  # noqa: BLE001
        f["numpy"] = f"not importable: {e}"
    for tool, cmd in (("cc", "cc --version | head -1"), ("cxx", "c++ --version | head -1"),
                      ("cmake", "cmake --version | head -1"), ("ninja", "ninja --version"),
                      ("nvcc", "nvcc --version | tail -2 | head -1")):
        f[tool] = sh(cmd)
    try:
        import pybind11

        f["pybind11"] = pybind11.__version__
    except Exception:  # noqa: BLE001
        f["pybind11"] = ""
    try:
        import device_check

        f["cudart"] = device_check.find_cudart()
    except BaseException as e:  # noqa: BLE001  (SystemExit when none)
        f["cudart"] = ""
        f["cudart_error"] = str(e)
    if f["cudart"] and "/" not in f["cudart"]:  # a name on the library path: where is it
        for line in sh("ldconfig -p").splitlines():
            if line.strip().startswith(f["cudart"] + " ") and "=>" in line:
                f["cudart"] = line.split("=>")[1].strip()
                break
        else:
            for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") + ["/usr/local/cuda/lib64"]:
                if d and os.path.exists(os.path.join(d, f["cudart"])):
                    f["cudart"] = os.path.join(d, f["cudart"])
                    break
    # NVIDIA's nccl.h and libnccl.so.2: the nvidia-nccl-cu1x wheel, else the system / toolkit
    roots = [d for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path if d and os.path.isdir(d)]
    cands = []
    for d in roots:
        cands += glob.glob(os.path.join(d, "nvidia", "nccl", "include", "nccl.h"))
        cands += glob.glob(os.path.join(d, "nvidia", "*", "include", "nccl.h"))
    cands += ["/usr/include/nccl.h", "/usr/local/cuda/include/nccl.h", "/usr/local/include/nccl.h"]
    nccl_h = first(cands)
    f["nccl_h"] = nccl_h
    nccl_lib = ""
    if nccl_h:
        base = os.path.dirname(os.path.dirname(nccl_h))
        nccl_lib = first([os.path.join(base, "lib", "libnccl.so.2"), os.path.join(base, "lib64", "libnccl.so.2"),
                          "/usr/lib/x86_64-linux-gnu/libnccl.so.2"])
        ver = sh(f"grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' {shlex.quote(nccl_h)} | awk '{{print $3}}' | paste -sd.")
        f["nccl_h_version"] = ver
    f["libnccl"] = nccl_lib
    # CUDA's headers (nvcc's toolkit, else the CUDA 13 / 12 wheels)
    nvcc = shutil.which("nvcc") or first(["/usr/local/cuda/bin/nvcc"])
    f["nvcc_path"] = nvcc or ""
    cuda_cands = []
    if nvcc:
        cuda_cands.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    cuda_cands += ["/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include"]
    for d in roots:
        cuda_cands += [os.path.join(d, "nvidia", "cu13", "include"), os.path.join(d, "nvidia", "cuda_runtime", "include")]
    cuda_inc = first([c for c in cuda_cands if os.path.exists(os.path.join(c, "cuda_runtime.h"))])
    f["cuda_inc"] = cuda_inc
    cccl = first([os.path.join(cuda_inc, "cccl")] if cuda_inc else [])
    f["cccl_inc"] = cccl
    with open(jout, "w") as fh:
        json.dump(f, fh, indent=1)
    gpu = bool(f["nvidia_smi"]) or f["dev_nvidia0"] or bool(f.get("torch_cuda_available"))
    with open(shout, "w") as fh:
        for k, v in (("NCCL_INC", os.path.dirname(nccl_h) if nccl_h else ""),
                     ("NCCL_LIB", os.path.dirname(nccl_lib) if nccl_lib else ""), ("CUDA_INC", cuda_inc),
                     ("CCCL_INC", cccl), ("CUDART", f["cudart"]), ("NVCC", f["nvcc_path"]), ("GPU", "1" if gpu else "")):
            fh.write(f"{k}={shlex.quote(str(v))}\n")
    for k, v in f.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
