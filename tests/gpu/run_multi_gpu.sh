#!/usr/bin/env bash
# Sequence parallelism on GPUs (docs/multi-gpu.md), from the repository root, on an nvidia-h200-x{2,4,8} machine
# (stage ws1 needs one GPU only):
#
#   tests/gpu/run_multi_gpu.sh [build] [nccl] [ws1] [tiny] [release]     (no argument: all, in that order)
#
#   build    make lib cuda, and the NCCL communicator's loader test against fake libraries (build/tests/test_nccl)
#   nccl     the real libnccl.so.2 (the nvidia-nccl-cu13 wheel's): found, version, NVLS off
#   ws1      world size 1 through the NCCL path on one GPU: byte-identical to the plain single-GPU render
#   tiny     h3-tiny split over 2, 3, 6 GPUs (the degrees its 6 heads allow, up to the GPUs present) vs one GPU,
#            within the GPU suite's bf16 tolerance (rel-L2 2e-2)
#   release  released widths (RELEASE_BLOCKS blocks, default 8) at 1344x768x124: speed-up of the block stack over
#            one GPU on 2, 4, 8 GPUs (targets >= 1.9x / 3.6x / 6.8x), peak memory per GPU, output vs one GPU, and
#            the 50-step denoise extrapolated next to SGLang's 39.7 s on 8xH200 (release.json)
#
# Logs go to $OUT when set, else ./gpu-out-multi; summary.txt lists each stage's result. A failing stage does not
# stop the later ones (except the build). Exit status non-zero when any stage failed.
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.." || exit 2
LOG="${OUT:-./gpu-out-multi}"
mkdir -p "$LOG" || exit 2
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(build nccl ws1 tiny release)
PY="${PYTHON:-python3}"
JOBS="$(nproc 2>/dev/null || echo 4)"

MAKE_ARGS=()
# shellcheck source=tests/gpu/gpu_env.sh
. tests/gpu/gpu_env.sh

note "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sort | uniq -c | tr -s ' ')"
note "nccl: ${H3_NCCL_LIB:-libnccl.so.2 by the loader search}"
for stage in "${STAGES[@]}"; do
    case "$stage" in
    build)
        run build make -j"$JOBS" lib cuda "${MAKE_ARGS[@]}" || { note "stopping: nothing runs without the build"; exit 1; }
        run test-nccl bash -c "make -j$JOBS build/tests/test_nccl && build/tests/test_nccl"
        ;;
    nccl)
        run nccl "$PY" - <<'PYEOF'
import ctypes, os, sys
path = os.environ.get("H3_NCCL_LIB") or "libnccl.so.2"
lib = ctypes.CDLL(path)
v = ctypes.c_int(0)
assert lib.ncclGetVersion(ctypes.byref(v)) == 0
print(f"{path}: NCCL version code {v.value}")
sys.exit(0 if v.value >= 2700 else 1)
PYEOF
        ;;
    ws1)
        run ws1 "$PY" tests/gpu/multi_gpu_bench.py ws1
        grep -E '^ws1:' "$LOG/ws1.log" >>"$LOG/summary.txt"
        ;;
    tiny)
        run tiny "$PY" tests/gpu/multi_gpu_bench.py tiny
        grep -E '^tiny:' "$LOG/tiny.log" >>"$LOG/summary.txt"
        ;;
    release)
        run release "$PY" tests/gpu/multi_gpu_bench.py release --blocks "${RELEASE_BLOCKS:-8}" --out "$LOG/release.json"
        grep -E '^\|' "$LOG/release.log" >>"$LOG/summary.txt"
        ;;
    *)
        note "unknown stage '$stage' (build, nccl, ws1, tiny, release)"
        FAILED=1
        ;;
    esac
done
echo "==== summary"
cat "$LOG/summary.txt"
exit $FAILED
