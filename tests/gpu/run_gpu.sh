#!/usr/bin/env bash
# Every GPU check of h3ctl, on a machine with an NVIDIA GPU (compute capability 8.0+), from the repository root:
#
#   tests/gpu/run_gpu.sh [build] [ctest] [pytest] [bench]     (no argument: all four, in that order)
#
#   build   make lib cuda (the CUDA backend: python/h3ctl/libh3_cuda.so)
#   ctest   the C op conformance test of the backends (build/tests/test_backend_ops)
#   pytest  python3 -m pytest -q -s tests/gpu (GPU_TESTS=paths: only those) (CUDA vs diffusers bf16 and vs the
#           CPU path, h3-tiny's semantic
#           suite on CUDA, faults)
#   bench   tests/bench_cuda_dit.py at the released widths (table + bench.json), then tests/bench_cuda_stages.py (the
#           text encoder and both decoders next to transformers / diffusers; bench-stages.json; alone: bench-stages),
#           then tests/bench_stream.py (weight streaming under a 4 GiB budget, bf16 and fp8, next to diffusers' group
#           offloading; bench-stream.json; alone, with budgets 4 and 8 GiB: bench-stream, whose arguments
#           BENCH_STREAM_ARGS replaces)
#   bench-fp8  (optional) attention alone at 1,874 / 7,135 / 37,838 tokens, bf16 and fp8 (H3_BENCH=1
#           test_backend_ops), then tests/bench_cuda_dit.py --fp8 --fp8-attention at 7,135 and 37,838 tokens without
#           torch.compile: bf16, fp8 weights, fp8 attention and both, ms per block and rel-L2 (bench-fp8.json)
#   hashes  (optional) tests/gpu/render_hashes.py: h3-tiny render hashes per configuration (hashes.txt), to compare
#           two builds bit for bit
#   facts   (optional) the driver and the NVIDIA wheels' libraries and headers the machine has
#   bench-render  (optional, not in the default list: ~4 min) tests/bench_render_released.py: whole renders at the
#           released widths (4 blocks, 4 text layers, full decoders) at 864x480x56 and 1344x768x124, per phase next
#           to diffusers, extrapolated to 50 blocks / 20 steps, bf16 and (--fp8) fp8 weights + fp8 attention (table +
#           bench-render.json; BENCH_RENDER_ARGS replaces the default "--no-compile --repeats 1 --fp8")
#   bench-memory  (optional, not in the default list) tests/bench_memory_single_file.py: the single-file variants
#           (bf16, fp8_scaled, int8_convrot) at the released widths with 4 blocks, libh3's memory estimate next to the
#           measured device peak of a 2-step denoise at 864x480x56 and 1344x768x124, with and without a --vram budget,
#           extrapolated to 50 blocks (bench-memory.json; BENCH_MEMORY_ARGS replaces "--blocks 4"), then the docs'
#           estimate table from a CUDA context (bench-memory-table.log: the fp8_scaled rows from its codes)
#
# Logs go to $OUT when it is set, else ./gpu-out. Python packages the machine lacks (diffusers) are installed from
# wheels in ./.whl when that folder exists (tests/gpu/make_carry.sh packs diffusers and hatchling for
# a machine without network, and says how to unpack them). A failing stage does not stop the later ones (except the build, which
# they all need); the exit status is non-zero when any stage failed, and summary.txt lists them.
set -o pipefail
export PYTHONUNBUFFERED=1

cd "$(dirname "$0")/../.." || exit 2
LOG="${OUT:-./gpu-out}"
mkdir -p "$LOG" || exit 2
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(build ctest pytest bench)
PY="${PYTHON:-python3}"
JOBS="$(nproc 2>/dev/null || echo 4)"

# The CUDA backend needs nothing from NVIDIA at build time (g++ over our own declarations); at run time it opens
# libcuda.so.1 (the driver), NVRTC, cuBLASLt and cuDNN.
MAKE_CUBLAS=()
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels in .whl failed"; exit 2; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# shellcheck source=tests/gpu/gpu_env.sh
. tests/gpu/gpu_env.sh

note "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1); $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)"
for stage in "${STAGES[@]}"; do
    case "$stage" in
    build)
        run build make -j"$JOBS" lib cuda "${MAKE_CUBLAS[@]}" || { note "stopping: nothing runs without the build"; exit 1; }
        run backends "$PY" -c 'import json; from h3ctl import _lib; print(json.dumps(_lib.backends(), indent=1))'
        ;;
    ctest)
        run ctest bash -c "make -j$JOBS build/tests/test_backend_ops ${MAKE_CUBLAS[*]} && build/tests/test_backend_ops"
        ;;
    pytest)
        # shellcheck disable=SC2086  # GPU_TESTS may name several files
        run pytest "$PY" -m pytest -q -s -rs -p no:cacheprovider ${GPU_TESTS:-tests/gpu}
        [ $? -eq 5 ] && note "pytest: every GPU test was skipped (exit 5): libh3 found no usable GPU, see below"
        # the measured numbers, where a reader of the summary looks first
        grep -oE '(parity|semantic|fault|stream|skip): .*' "$LOG/pytest.log" >>"$LOG/summary.txt"
        ;;
    bench)
        run bench "$PY" tests/bench_cuda_dit.py --fp8 --fp8-attention --out "$LOG/bench.json"
        run bench-stages "$PY" tests/bench_cuda_stages.py --out "$LOG/bench-stages.json"
        run bench-stream "$PY" tests/bench_stream.py --blocks 4 --fp8 --budgets 4 --out "$LOG/bench-stream.json"
        ;;
    bench-fp8)
        # attention alone at the released shape, bf16 and fp8 (H3_BENCH: the conformance test's timings, with sampled
        # rows checked against a double reference), then whole blocks
        run bench-attention bash -c "set -o pipefail; make -j$JOBS build/tests/test_backend_ops ${MAKE_CUBLAS[*]} && \
            H3_BENCH=1 build/tests/test_backend_ops | grep -E '^== |attention|checks,'"
        run bench-fp8 "$PY" tests/bench_cuda_dit.py --fp8 --fp8-attention --no-compile --repeats 3 \
            --shapes 864x480x56:64,1344x768x124:128 --out "$LOG/bench-fp8.json"
        ;;
    bench-stream)
        run bench-stream "$PY" tests/bench_stream.py ${BENCH_STREAM_ARGS:---fp8 --budgets 4,8} --out "$LOG/bench-stream.json"
        ;;
    bench-stages)
        run bench-stages "$PY" tests/bench_cuda_stages.py --out "$LOG/bench-stages.json"
        ;;
    hashes)
        # h3-tiny renders' hashes per configuration: diff two builds' hashes.txt to check they give the same bytes
        run hashes "$PY" tests/gpu/render_hashes.py
        cp "$LOG/hashes.log" "$LOG/hashes.txt"
        ;;
    facts)
        # what the machine offers a driver-only install: the driver, and the NVIDIA wheels' libraries and headers
        run facts bash -c "nvidia-smi; \"$PY\" -c 'import nvidia, os; [print(r, sorted(os.listdir(r))) for r in nvidia.__path__]'; \
            \"$PY\" -c 'import glob, nvidia; [print(p) for r in nvidia.__path__ for p in sorted(glob.glob(r + \"/**/*.so*\", recursive=True) + glob.glob(r + \"/**/include/*.h\", recursive=True))]' | grep -E 'nvrtc|cublasLt|cudnn.so|cudnn_graph|cuda_bf16|cuda_fp8|cuda.h|libcuda|runtime'; \
            ls -l /usr/lib/x86_64-linux-gnu/libcuda.so* 2>&1 | head -3; \"$PY\" -m pip list 2>/dev/null | grep -i -E 'nvidia|torch'"
        ;;
    bench-render)
        run bench-render "$PY" tests/bench_render_released.py ${BENCH_RENDER_ARGS:---no-compile --repeats 1 --fp8} \
            --out "$LOG/bench-render.json"
        # the extrapolated totals, where a reader of the summary looks first
        grep -E '^\| \*\*total|extrapolated to' "$LOG/bench-render.log" >>"$LOG/summary.txt"
        ;;
    bench-memory)
        run bench-memory "$PY" tests/bench_memory_single_file.py ${BENCH_MEMORY_ARGS:---blocks 4} \
            --out "$LOG/bench-memory.json"
        grep -E '^(bf16|fp8_scaled|int8_convrot) ' "$LOG/bench-memory.log" >>"$LOG/summary.txt"
        # the docs' estimate table as a CUDA context gives it (fp8_scaled from its codes on compute capability 8.9+)
        run bench-memory-table "$PY" tests/bench_memory_single_file.py --estimate-table --device cuda \
            --variants bf16,fp8_scaled,int8_convrot,pruned_int8_convrot
        ;;
    *)
        note "unknown stage '$stage' (build, ctest, pytest, bench, bench-fp8, bench-stages, bench-stream, bench-render, bench-memory, hashes, facts)"
        FAILED=1
        ;;
    esac
done
echo "==== summary"
cat "$LOG/summary.txt"
exit $FAILED
