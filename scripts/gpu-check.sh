#!/usr/bin/env bash
# scripts/gpu-check.sh — the one prepared GPU run: everything HARP can check on a CUDA
# GPU, in one command of about 5 minutes, each step under its own timeout inside a total budget.
#
# On the device machine (nvidia-h200: torch+CUDA 13, cupy, nvidia-nccl-cu13, cmake, ninja, pybind11
# are in its image; no network, so nothing is installed there), from the repository root:
#
#   run(command="bash scripts/gpu-check.sh", carry=[], timeout_s=480)
#
# then read $OUT/report.txt (files_at/report.txt): report.txt, report.json (every step's status,
# seconds, exit code, note, plus the probe, torch and bench figures), logs.txt (each step's log),
# bench.json. Exit status: 0 all passed, 1 a check failed, 2 no GPU here (nothing run).
# The budget (GPU_CHECK_BUDGET, default 420 s) ends the steps before run's timeout_s=480, so the
# report always comes back; a step that would start with under 20 s left is reported "skip".
# HARP is built there (HARP_BUILD_TESTS=OFF: no GoogleTest there, JOBS=nproc). Insurance: build
# here for the machine's Python 3.12 first (bash scripts/gpu-carry-build.sh) and carry python/harp;
# the script still builds there and falls back to the carried libraries only if that build fails:
#   run(command="bash scripts/gpu-check.sh", carry=["python/harp/libharp.so",
#       "python/harp/libharp-nccl.so", "python/harp/_harp.cpython-312-x86_64-linux-gnu.so"], timeout_s=480)
# (GPU_CHECK_USE_CARRIED=1 skips the build there and uses the carried ones directly.)
#
# Steps (in order; later ones are skipped when the budget runs out):
#   probe      GPU, Python, torch, cupy, compilers; NVIDIA's nccl.h / libnccl.so.2; libcudart
#   build      scripts/dev-build.sh into build/gpu (or the carried python/harp libraries)
#   nccl2      tests/nccl/device_check.py --ranks 2 --part core (device buffers, ctypes+cudart)
#   cupy       tests/nccl/device_check.py --ranks 2 --part cupy (cupy arrays; cupy missing = fail)
#   client     tests/nccl/client.c -DCLIENT_DEVICE built against NVIDIA's nccl.h, linked to NVIDIA's
#              libnccl.so.2, run on 2 and 3 ranks under LD_PRELOAD=libharp-nccl.so: every rank PASS,
#              HARP served every NCCL call (harpNcclCallsServed), HARP's banner printed
#   torch      tests/gpu/torch_cuda_check.py --require-cuda: init_process_group("harp"), CUDA tensors,
#              all_reduce/broadcast/all_gather/async, DDP vs gloo on CPU copies
#   nccl3      tests/nccl/device_check.py --ranks 3 --part core
#   bench      bench/gpu/allreduce_device.py: device vs host allreduce 1K..256M, cudaMemcpy bandwidth
#
# Without a GPU it stops after the probe (exit 2, report says why). GPU_CHECK_EMULATE=1 runs the
# plumbing on a CPU machine instead: tests/nccl/emu_cudart.c as the CUDA runtime, HARP's own nccl.h
# for the client, torch on CPU tensors, cupy skipped, bench to 1M (GPU_CHECK_SKIP_BUILD=1 uses the
# libraries already in python/harp). That is a test of this script, not of a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUTDIR"
BUDGET=${GPU_CHECK_BUDGET:-420}
RESERVE=10
EMULATE=${GPU_CHECK_EMULATE:-}
T0=$(date +%s)
WORK=$(mktemp -d /tmp/harp-gpu-check.XXXXXX)
STEPS=$WORK/steps.tsv
: >"$STEPS"
: >"$OUTDIR/logs.txt"
export ROOT WORK EMULATE OUTDIR
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HARP_TIMEOUT=${HARP_TIMEOUT:-60}

left() { echo $((BUDGET - ($(date +%s) - T0) - RESERVE)); }

report() {  # report.json + report.txt from the step table and the JSON the steps wrote
  python3 - "$STEPS" "$WORK" "$OUTDIR" "$(($(date +%s) - T0))" "${EMULATE:+emulated}" <<'EOF'
import json, os, sys
steps_f, work, outdir, elapsed, mode = sys.argv[1:6]
steps = []
for line in open(steps_f):
    name, status, secs, rc, note = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    steps.append({"step": name, "status": status, "seconds": float(secs or 0), "rc": rc, "note": note})
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
rep = {"harp_gpu_check": 1, "mode": mode or "gpu", "elapsed_s": int(elapsed),
       "result": "fail" if any(s["status"] == "fail" for s in steps) else "pass",
       "steps": steps, "probe": load(os.path.join(work, "probe.json")),
       "torch": load(os.path.join(work, "torch.json")), "bench": load(os.path.join(outdir, "bench.json"))}
json.dump(rep, open(os.path.join(outdir, "report.json"), "w"), indent=1)
L = [f"HARP GPU check ({rep['mode']}): {rep['result'].upper()} after {elapsed} s"]
p = rep["probe"] or {}
for k in ("nvidia_smi", "python", "torch", "torch_cuda", "cupy", "nccl_h", "nccl_h_version", "cudart", "nvcc", "python_h"):
    if k in p:
        L.append(f"  {k}: {p[k]}")
L.append("")
for s in steps:
    L.append(f"{s['status'].upper():5} {s['step']:8} {s['seconds']:7.1f} s  rc={s['rc']:<4} {s['note']}")
t = rep["torch"]
if t and t.get("ddp"):
    L.append(f"\ntorch: DDP {t['ddp']['steps']} steps, max param diff harp vs gloo {t['ddp']['max_param_diff']:.3e}; "
             "timings " + ", ".join(f"{k} {v}" for k, v in t.get("timings_s", {}).items()))
b = rep["bench"]
if b and b.get("allreduce"):
    L.append(f"\nallreduce float32 SUM, {b['ranks']} ranks (rank 0 medians): bytes, device us, host us, device/host, device GB/s, staging model us")
    for r in b["allreduce"]:
        if "device" in r:
            m = r.get("staging_model_us")
            L.append(f"  {r['bytes']:>10} {r['device']['median_us']:11.1f} {r['host']['median_us']:11.1f} "
                     f"{r['device']['median_us'] / r['host']['median_us']:6.2f} {r['device']['algbw_GBps']:8.2f} "
                     f"{'' if m is None else f'{m:11.1f}'}{'  ERROR ' + r['error'] if 'error' in r else ''}")
        else:
            L.append(f"  {r['bytes']:>10} skipped: {r.get('skipped')}")
if b and b.get("copy"):
    L.append("cudaMemcpy GB/s: bytes, h2d pinned, d2h pinned, h2d pageable, d2h pageable")
    for r in b["copy"]:
        L.append(f"  {r['bytes']:>10} {r['h2d_pinned_GBps']:8.2f} {r['d2h_pinned_GBps']:8.2f} "
                 f"{r['h2d_pageable_GBps']:8.2f} {r['d2h_pageable_GBps']:8.2f}")
open(os.path.join(outdir, "report.txt"), "w").write("\n".join(L) + "\n")
EOF
}

record() {  # record NAME STATUS SECONDS RC NOTE
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$STEPS"
  report || echo "(report writer failed)"
}

step() {  # step NAME CAP_S FUNCTION: run FUNCTION (exported) under min(CAP_S, budget left)
  local name=$1 cap=$2 fn=$3 l lim t0 rc dt note status
  l=$(left)
  if [ "$l" -lt 20 ]; then
    echo "== [$name] SKIP: budget spent"
    record "$name" skip 0 - "budget spent (GPU_CHECK_BUDGET=$BUDGET s)"
    return
  fi
  lim=$((cap < l ? cap : l))
  echo "== [$name] $(date -u +%H:%M:%S), timeout ${lim} s"
  t0=$(date +%s.%N)
  timeout -k 10 "$lim" bash -c "$fn" >"$WORK/$name.log" 2>&1
  rc=$?
  dt=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0")
  note=$(grep -a '^NOTE: ' "$WORK/$name.log" | tail -1 | cut -c7- | tr '\t' ' ')
  case $rc in
    0) status=pass ;;
    77) status=skip ;;
    124 | 137) status=fail; note="timed out after ${lim} s${note:+; $note}" ;;
    *) status=fail; [ -n "$note" ] || note=$(grep -a -E 'FAIL|Error|error' "$WORK/$name.log" | tail -1 | cut -c1-200 | tr '\t' ' ') ;;
  esac
  tail -n 25 "$WORK/$name.log" | sed "s/^/   [$name] /"
  echo "== [$name] ${status^^} in ${dt} s (rc $rc)"
  { echo "===== $name: $status, ${dt} s, rc $rc"; tail -n 400 "$WORK/$name.log"; echo; } >>"$OUTDIR/logs.txt"
  record "$name" "$status" "$dt" "$rc" "$note"
}

# ---- the steps (each runs in its own bash under timeout; NOTE: lines become the report's note) ----
s_probe() {
  nvidia-smi -L 2>&1 || echo "(nvidia-smi: none)"
  python3 tests/gpu/probe_env.py "$WORK/probe.json" "$WORK/paths.sh"
}

s_build() {
  if [ -n "${GPU_CHECK_USE_CARRIED:-}${GPU_CHECK_SKIP_BUILD:-}" ]; then
    ls -la python/harp/*.so || { echo "NOTE: no libraries in python/harp to use"; exit 1; }
    echo "NOTE: used the carried/present libraries in python/harp (no build)"
  else
    export HARP_BUILD_TESTS=OFF BUILD_DIR=build/gpu JOBS=$(nproc)
    if ! bash scripts/dev-build.sh; then
      if python3 -c 'import harp, harp.nccl as n; n.get_version()' 2>/dev/null; then
        ls -la python/harp/*.so
        echo "NOTE: build here failed (see logs.txt); using the libraries carried in python/harp"
        exit 0
      fi
      echo "== full build failed; retrying without the pybind11 module (torch step will fail)"
      rm -rf build/gpu-nopy
      BUILD_DIR=build/gpu-nopy HARP_CMAKE_ARGS=-DHARP_BUILD_PYTHON=OFF bash scripts/dev-build.sh || {
        echo "NOTE: build failed (see logs.txt)"; exit 1; }
      echo "NOTE: built without the Python module (no Python.h/pybind11?): harp.torch cannot load"
      exit 1
    fi
  fi
  ls -la python/harp/*.so
  python3 -c 'import harp, harp.nccl as n; print("harp", harp.__version__, "from", harp.__file__); print("libharp-nccl", n.library_path(), "NCCL API", n.get_version())' ||
    { echo "NOTE: libraries present but harp does not import"; exit 1; }
  [ -n "${GPU_CHECK_USE_CARRIED:-}${GPU_CHECK_SKIP_BUILD:-}" ] || echo "NOTE: built in build/gpu with $(nproc) jobs"
}

s_nccl2() {
  local out rc
  out=$(python3 tests/nccl/device_check.py --ranks 2 --part core 2>&1)
  rc=$?
  echo "$out"
  [ $rc -eq 0 ] || exit 1
  echo "NOTE: $(grep -c ': ok' <<<"$out") device-buffer checks ok on 2 ranks"
}

s_cupy() {
  if [ -n "$EMULATE" ]; then echo "NOTE: emulated CUDA: cupy needs a real GPU"; exit 77; fi
  python3 tests/nccl/device_check.py --ranks 2 --part cupy
  rc=$?
  [ $rc -eq 3 ] && echo "NOTE: cupy not importable on this machine"
  exit $rc
}

s_client() {
  # shellcheck disable=SC1091
  . "$WORK/paths.sh"
  local exe=$WORK/client inc lib
  if [ -n "$EMULATE" ]; then
    cc -O1 -Wall -Werror -std=c11 -DCLIENT_DEVICE -o "$exe" tests/nccl/client.c -I bindings/nccl \
      -L python/harp -l:libharp-nccl.so -L "$(dirname "$HARP_CUDART")" -l:"$(basename "$HARP_CUDART")" \
      -Wl,-rpath,"$ROOT/python/harp:$(dirname "$HARP_CUDART")" -ldl || { echo "NOTE: client build failed"; exit 1; }
    echo "NOTE-build: emulated: built against HARP's own nccl.h and the emulated runtime"
    lib=""
  else
    [ -n "$NCCL_INC" ] && [ -n "$NCCL_LIB" ] || { echo "NOTE: NVIDIA's nccl.h/libnccl.so.2 not found (nvidia-nccl wheel?)"; exit 1; }
    [ -n "$CUDART" ] || { echo "NOTE: no libcudart found"; exit 1; }
    echo "NVIDIA nccl.h: $NCCL_INC/nccl.h ($(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$NCCL_INC/nccl.h" | awk '{print $3}' | paste -sd.))"
    echo "libnccl.so.2: $NCCL_LIB; CUDA headers: $CUDA_INC; libcudart: $CUDART"
    inc=(-I "$NCCL_INC")
    [ -n "$CUDA_INC" ] && inc+=(-I "$CUDA_INC")
    [ -n "$CCCL_INC" ] && inc+=(-I "$CCCL_INC")
    local cdir
    cdir=$(dirname "$CUDART")
    local link=(-L "$NCCL_LIB" -l:libnccl.so.2 -L "$cdir" -l:"$(basename "$CUDART")" -Wl,-rpath,"$NCCL_LIB:$cdir" -ldl)
    # as C (how test_nccl_client.py builds it); else as C++ (-fpermissive: malloc's void*), in case
    # this CUDA's headers want C++; else nvcc
    if cc -O1 -Wall -DCLIENT_DEVICE -o "$exe" tests/nccl/client.c "${inc[@]}" "${link[@]}"; then
      echo "NOTE-build: cc (C)"
    elif echo "== cc failed; trying c++ -x c++ -fpermissive" &&
      c++ -x c++ -fpermissive -w -O1 -DCLIENT_DEVICE -o "$exe" tests/nccl/client.c "${inc[@]}" "${link[@]}"; then
      echo "NOTE-build: c++ -fpermissive (C failed)"
    else
      [ -n "$NVCC" ] || { echo "NOTE: client build with cc and c++ failed, no nvcc"; exit 1; }
      echo "== c++ failed; building with nvcc"
      "$NVCC" -O1 -DCLIENT_DEVICE --cudart shared -o "$exe" tests/nccl/client.c -I "$NCCL_INC" -L "$NCCL_LIB" \
        -l:libnccl.so.2 -Xlinker -rpath,"$NCCL_LIB" -ldl || { echo "NOTE: client build failed (cc, c++, nvcc)"; exit 1; }
    fi
    ldd "$exe" | grep -E 'nccl|cudart'
    ldd "$exe" | grep -q "libnccl.so.2 => $NCCL_LIB" || { echo "NOTE: client is not linked to NVIDIA's libnccl.so.2"; exit 1; }
  fi
  local n r ok=1 calls=""
  for n in 2 3; do
    rm -f "$WORK/id-$n"*
    local pids=()
    for ((r = 0; r < n; r++)); do
      LD_PRELOAD="$ROOT/python/harp/libharp-nccl.so" HARP_DEBUG=INFO timeout 90 "$exe" "$r" "$n" "$WORK/id-$n" \
        >"$WORK/client-$n-$r.out" 2>"$WORK/client-$n-$r.err" &
      pids+=($!)
    done
    for ((r = 0; r < n; r++)); do
      wait "${pids[$r]}"
      local rc=$? out
      out=$(cat "$WORK/client-$n-$r.out")
      echo "ranks=$n rank=$r rc=$rc: $out"
      if [ $rc -ne 0 ] || ! [[ $out =~ PASS\ rank\ $r\ calls=([0-9]+)\ served=([0-9]+)\ version=[0-9]+\ device=1 ]] ||
        [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ]; then
        ok=0
        tail -20 "$WORK/client-$n-$r.err"
      else
        calls="$calls ${BASH_REMATCH[1]}"
      fi
      grep -q "serving the NCCL" "$WORK/client-$n-$r.err" || { ok=0; echo "rank $r: no HARP banner on stderr"; }
    done
    grep -h -E "serving the NCCL|ready on HARP|CUDA runtime" "$WORK/client-$n-"*.err | sort | uniq -c | head -5
  done
  [ $ok -eq 1 ] || { echo "NOTE: a client rank failed (see logs.txt)"; exit 1; }
  echo "NOTE: device buffers, 2+3 ranks, every rank PASS, HARP served every call (calls per rank:$calls)"
}

s_torch() {
  if [ -n "$EMULATE" ]; then
    python3 tests/gpu/torch_cuda_check.py --device cpu --ranks 2 --json "$WORK/torch.json" --timeout 150 || exit 1
    echo "NOTE: emulated: CPU tensors (--device cpu)"
    exit 77
  fi
  python3 tests/gpu/torch_cuda_check.py --require-cuda --ranks 2 --steps 5 --json "$WORK/torch.json" --timeout 170 || exit 1
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("NOTE: %d checks ok on CUDA tensors; DDP max param diff vs gloo %.2e" % (len(d["checks"]), d["ddp"]["max_param_diff"]))' "$WORK/torch.json"
}

s_nccl3() {
  python3 tests/nccl/device_check.py --ranks 3 --part core || exit 1
  echo "NOTE: 3 ranks on one GPU"
}

s_bench() {
  local l=$1 max=256M target=0.2
  [ -n "$EMULATE" ] && max=1M target=0.02
  python3 bench/gpu/allreduce_device.py --ranks 2 --max "$max" --target-s "$target" --budget-s $((l * 2 / 3)) \
    --timeout $((l - 15)) --json "$OUTDIR/bench.json" || exit 1
  echo "NOTE: figures in report.txt / bench.json"
}
export -f s_probe s_build s_nccl2 s_cupy s_client s_torch s_nccl3 s_bench

echo "== HARP gpu-check $(date -u +%FT%TZ) on $(hostname), budget ${BUDGET} s, out $OUTDIR${EMULATE:+ (EMULATED CUDA)}"
step probe 60 s_probe
# shellcheck disable=SC1091
. "$WORK/paths.sh" 2>/dev/null || true
if [ -n "$EMULATE" ]; then
  cc -shared -fPIC -O1 -o "$WORK/libemucudart.so" tests/nccl/emu_cudart.c -lpthread || exit 1
  export HARP_CUDART=$WORK/libemucudart.so
elif [ -z "${GPU:-}" ]; then
  echo "== no GPU here (no nvidia-smi, no /dev/nvidia0, torch sees no CUDA): nothing to check"
  record gpu fail 0 2 "no GPU on this machine: run this on the device machine (GPU_CHECK_EMULATE=1 tests the script on a CPU)"
  cat "$OUTDIR/report.txt"
  rm -rf "$WORK"
  exit 2
elif [ -z "${HARP_CUDART:-}" ] && [ -n "${CUDART:-}" ]; then
  export HARP_CUDART=$CUDART  # the ctypes-only steps (device_check, client, bench) need one
fi
step build 240 s_build
if grep -q "^build	fail" "$STEPS"; then
  echo "== build failed: the other steps need HARP's libraries"
  for s in nccl2 cupy client torch nccl3 bench; do record $s skip 0 - "build failed"; done
else
  step nccl2 150 s_nccl2
  step cupy 100 s_cupy
  step client 150 s_client
  step torch 200 s_torch
  step nccl3 120 s_nccl3
  l=$(left)
  step bench 200 "s_bench $((l < 200 ? l : 200))"
fi
report
echo
cat "$OUTDIR/report.txt"
rc=0
grep -q "	fail	" "$STEPS" && rc=1
rm -rf "$WORK"
exit $rc
