#!/usr/bin/env bash
# Runs build/sdpa_check (tests/cuda/sdpa_check.cpp) on a GPU machine, from the repository root:
#
#   make lib cuda build/sdpa_check && tests/cuda/run_sdpa_check.sh [--runs N] [--quick]
#
# The NVIDIA libraries come from python3's nvidia wheels (as torch or `pip install "h3ctl[cuda]"` installs
# them) where H3_CUDNN_LIB / H3_NVRTC_LIB / H3_CUBLASLT_LIB are unset: cuDNN for the cuDNN path, NVRTC and
# cuBLASLt for the backend that runs the own kernel. libcuda.so.1 comes from the driver.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
wheel_file() {
    "$PY" - "$1" <<'PYEOF' 2>/dev/null || true
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
hits = sorted(p for r in roots for p in glob.glob(os.path.join(r, "nvidia", sys.argv[1])))
print(hits[0] if hits else "")
PYEOF
}
[ -n "${H3_CUDNN_LIB:-}" ] || H3_CUDNN_LIB="$(wheel_file cudnn/lib/libcudnn.so.9)"
[ -n "${H3_NVRTC_LIB:-}" ] || H3_NVRTC_LIB="$(wheel_file cu13/lib/libnvrtc.so.13)"
[ -n "${H3_CUBLASLT_LIB:-}" ] || H3_CUBLASLT_LIB="$(wheel_file cu13/lib/libcublasLt.so.13)"
export H3_CUDNN_LIB H3_NVRTC_LIB H3_CUBLASLT_LIB
echo "H3_CUDNN_LIB=${H3_CUDNN_LIB:-<loader search>}"
echo "H3_NVRTC_LIB=${H3_NVRTC_LIB:-<loader search>}"
echo "H3_CUBLASLT_LIB=${H3_CUBLASLT_LIB:-<loader search>}"
[ -x build/sdpa_check ] || { echo "run_sdpa_check: build/sdpa_check is missing (make lib cuda build/sdpa_check)" >&2; exit 2; }
exec build/sdpa_check "$@"
