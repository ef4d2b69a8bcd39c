#!/usr/bin/env bash
# Packs what a GPU machine without network needs into ./.carry (git-ignored through .git/info/exclude): diffusers
# 0.42.1 (the oracle of tests/gpu/run_gpu.sh; pure Python) and hatchling with its dependencies as wheels (the build
# backend that tests/gpu/fresh_install.sh's offline `pip install --no-build-isolation` needs). Nothing else: the
# CUDA backend needs no NVIDIA header or library at build time. Run here, where pip reaches an index:
#
#   tests/gpu/make_carry.sh            # writes .carry/diffusers.tar.xz and .carry/hatch/*.whl (about 2.3 MB)
#
# and there, from the repository root, before run_gpu.sh:
#
#   mkdir -p /tmp/site && tar -xJf .carry/diffusers.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/../.."
DIFFUSERS="${DIFFUSERS:-diffusers==0.42.1}"
GPU_PYTHON="${GPU_PYTHON:-3.12}"   # the GPU machine's python, for hatchling's wheels
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp/whl" "$DIFFUSERS"
mkdir -p "$tmp/site"
unzip -q "$tmp"/whl/diffusers-*.whl -d "$tmp/site"
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >>.git/info/exclude
mkdir -p .carry
rm -rf .carry/hatch
python3 -m pip download -q --only-binary=:all: --python-version "$GPU_PYTHON" -d .carry/hatch hatchling editables
tar -cJf .carry/diffusers.tar.xz -C "$tmp/site" .
ls -l .carry .carry/hatch
