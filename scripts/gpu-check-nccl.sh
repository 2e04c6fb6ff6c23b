#!/usr/bin/env bash
# GPU check of the NCCL-compatible layer's device-pointer path (bindings/nccl) alone.
# The full prepared GPU run (this, the real-NCCL client on device buffers, torch with CUDA
# tensors, cupy, and the device-vs-host allreduce bench, with a report in $OUT) is
# scripts/gpu-check.sh; this narrower script stays for quick reruns of device_check.py.
#
# runs tests/nccl/device_check.py (2 ranks on the GPU: every collective on
# cudaMalloc'ed buffers, stream order with a non-blocking caller, grouped
# send/recv, PreMulSum with a device scalar, ncclMemAlloc, ncclCommInitAll
# threads, and cupy arrays when cupy is installed).
#
# For the device machine (no network there): carry the built libraries, e.g.
#   run(command="bash scripts/gpu-check-nccl.sh", carry=["python/harp/libharp.so",
#       "python/harp/libharp-nccl.so"], timeout_s=300)
# (the pybind module is optional: the check loads harp/nccl/__init__.py directly if needed)
# (build them first here with ./scripts/dev-build.sh). Without them the script
# tries ./scripts/dev-build.sh on the device machine.
# Needs: python3 with numpy, a libcudart (system, HARP_CUDART, or a pip
# nvidia-cuda-runtime/torch install). Exit status 0 = every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
echo "== gpu-check-nccl: $(date -u +%H:%M:%S) on $(hostname)"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not available)"
if ! ls python/harp/libharp-nccl.so python/harp/libharp.so >/dev/null 2>&1; then
  echo "== libraries not carried: building (./scripts/dev-build.sh)"
  # no GoogleTest on the GPU machine: build without the C++ unit tests
  HARP_BUILD_TESTS=OFF BUILD_DIR=build/gpu JOBS="$(nproc)" ./scripts/dev-build.sh >/tmp/gpu-check-build.log 2>&1 ||
    { tail -30 /tmp/gpu-check-build.log; exit 2; }
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" HARP_TIMEOUT=60
HARP_DEBUG=INFO python3 -c '
import sys; sys.path.insert(0, "tests/nccl"); import device_check
nccl = device_check.load_nccl()
c = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
print("single-rank communicator on device", c.device_id(), "library", nccl.library_path()); c.destroy()' 2>&1 | grep -E "HARP .*serving|CUDA runtime|single-rank|Error" || true
rc=0
timeout 240 python3 tests/nccl/device_check.py --ranks 2 || rc=$?
if [ $rc -eq 0 ]; then
  echo "== 3 ranks on one GPU"
  timeout 120 python3 tests/nccl/device_check.py --ranks 3 || rc=$?
fi
echo "== gpu-check-nccl: exit $rc at $(date -u +%H:%M:%S)"
exit $rc
