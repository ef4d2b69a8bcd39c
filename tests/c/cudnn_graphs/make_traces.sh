#!/usr/bin/env bash
# Regenerates the frontend traces of this folder (see README.md). Needs, on any machine (no GPU):
#   FE_INC     the include/ folder of the nvidia-cudnn-frontend 1.32.0 wheel (pip download --no-deps
#              nvidia-cudnn-frontend==1.32.0, unzip it)
#   CUDNN_INC  cuDNN 9 headers whose version says 9.19.0 (cudnn_version.h and the sub-headers' MAJOR/MINOR/
#              PATCH defines), the version libh3's GPU builds compiled the frontend against
#   CUDA_INC   a folder with cuda_runtime.h, and NVRTC_INC one with nvrtc.h (both included by the frontend)
# and the test double built by `make build/tests/test_cudnn_sdpa` (build/tests/fake_cudnn/libcudnn.so.9).
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${FE_INC:?}" "${CUDNN_INC:?}" "${CUDA_INC:?}" "${NVRTC_INC:?}"
out=tests/c/cudnn_graphs
bin=build/tests/cudnn_fe_oracle
g++ -std=c++17 -O0 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -I"$FE_INC" -I"$CUDNN_INC" -I"$CUDA_INC" -I"$NVRTC_INC" \
    -o "$bin" "$out/cudnn_fe_oracle.cpp" -ldl
fake="$PWD/build/tests/fake_cudnn/libcudnn.so.9"
gen() {
    local name=$1 version=$2
    shift 2
    local trace
    trace="$(mktemp)"
    FAKE_CUDNN_VERSION=$version FAKE_CUDNN_TRACE="$trace" H3_CUDNN_LIB="$fake" "$bin" "$@" >/dev/null
    { echo "# $name: cuDNN $version, args $*"; sed -E 's/0x[0-9a-f]+/PTR/g' "$trace"; } >"$out/$name.txt"
    rm -f "$trace"
    if grep -q ERROR "$out/$name.txt"; then echo "$name: the double refused a call" >&2; exit 1; fi
}
# name cuDNN-version Lq Lk heads kv_heads D ldq ldk ldv ldo scale causal fp8 sm (the cases of test_cudnn_sdpa.c)
gen fused          91900 1024 1024 8 8 128 1024 1024 1024 1024 0.088388 0 0 90
gen fused_gqa      91900 300 700 8 2 128 1024 256 512 1024 0.088388 0 0 80
gen causal         91900 512 512 4 4 64 256 256 256 256 0.125 1 0 90
gen causal_br      91900 256 512 4 4 64 256 256 256 256 0.125 1 0 90
gen causal_br_gqa  91900 300 700 8 2 128 1024 256 512 1024 0.088388 1 0 80
gen fp8            91900 1024 1024 8 8 128 1024 1024 1024 1024 0.088388 0 1 90
gen fp8_gqa        91900 256 512 8 2 128 1024 256 512 1024 0.088388 0 1 90
gen composite_v9_5 90500 1024 1024 8 8 128 1024 1024 1024 1024 0.088388 0 0 90
gen causal_v9_5    90500 512 512 4 4 64 256 256 256 256 0.125 1 0 90
gen fused_v9_28    92800 1024 1024 8 8 128 1024 1024 1024 1024 0.088388 0 0 90
echo "traces written to $out"
