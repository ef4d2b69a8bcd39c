#!/usr/bin/env bash
# Packs what a GPU machine without network needs for tests/gpu/run_gpu.sh into ./.carry (git-ignored through
# .git/info/exclude): diffusers 0.42.1 (the oracle; pure Python) and the header-only cudnn-frontend (the GPU image
# has cuDNN's libraries in torch's wheel but not the frontend's headers). Run here, where pip reaches an index:
#
#   tests/gpu/make_carry.sh            # writes .carry/diffusers.tar.xz and .carry/fe.tar.xz (about 2.3 MB)
#
# and there, from the repository root, before run_gpu.sh:
#
#   mkdir -p /tmp/site build && tar -xJf .carry/diffusers.tar.xz -C /tmp/site && \
#     tar -xJf .carry/fe.tar.xz -C build && export PYTHONPATH=/tmp/site
#
# (run_gpu.sh looks for the frontend in build/cudnn-fe/include.)
set -euo pipefail
cd "$(dirname "$0")/../.."
DIFFUSERS="${DIFFUSERS:-diffusers==0.42.1}"
FRONTEND="${FRONTEND:-nvidia-cudnn-frontend==1.32.0}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp/whl" "$DIFFUSERS" "$FRONTEND"
mkdir -p "$tmp/site" "$tmp/fe/cudnn-fe"
unzip -q "$tmp"/whl/diffusers-*.whl -d "$tmp/site"
unzip -q "$tmp"/whl/nvidia_cudnn_frontend-*.whl 'include/*' -d "$tmp/fe/cudnn-fe"
[ -f "$tmp/fe/cudnn-fe/include/cudnn_frontend.h" ] || { echo "make_carry: the frontend wheel has no include/cudnn_frontend.h" >&2; exit 1; }
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >>.git/info/exclude
mkdir -p .carry
tar -cJf .carry/diffusers.tar.xz -C "$tmp/site" .
tar -cJf .carry/fe.tar.xz -C "$tmp/fe" cudnn-fe
ls -l .carry
