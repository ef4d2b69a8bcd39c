#!/usr/bin/env bash
# The fresh-machine test of the GPU install (issue #24), on a machine with an NVIDIA driver, from the repository root:
#
#   tests/gpu/fresh_install.sh            (logs in $OUT/fresh, else ./gpu-out/fresh)
#
# A new virtual environment from the machine's python3 that sees the machine's site-packages (where the NVIDIA
# wheels are: nvidia-cuda-nvrtc, nvidia-cublas, nvidia-cudnn-cu13, as torch or `pip install "h3ctl[cuda]"` installs
# them), PATH without any folder holding nvcc, CUDA_HOME / CUDA_PATH unset; then the README's GPU install, `h3ctl
# info`, and an h3-tiny render on the GPU with --profile twice: with an empty kernel cache (NVRTC compiles every
# module the render uses: the first-run cost) and again (the cached start).
#
# The install is the README's `pip install -e ".[cuda]"` where an index is reachable. A GPU machine without network
# (the lent one) installs the same way offline: `--no-build-isolation --no-deps` over the NVIDIA wheels already in
# site-packages, with hatchling (the build backend) and editables (its editable installs) from ./.carry/hatch/*.whl when
# python3 lacks them (tests/gpu/make_carry.sh downloads them where an index is reachable).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
LOG="${OUT:-./gpu-out}/fresh"
mkdir -p "$LOG" || exit 2
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
say() { echo "== $*"; }

# PATH without nvcc anywhere, no toolkit variables
NEWPATH=""
IFS=: read -r -a DIRS <<<"$PATH"
for d in "${DIRS[@]}"; do
    [ -n "$d" ] && [ ! -x "$d/nvcc" ] && NEWPATH="${NEWPATH:+$NEWPATH:}$d"
done
export PATH="$NEWPATH"
unset CUDA_HOME CUDA_PATH
say "nvcc on PATH: $(command -v nvcc || echo none); CUDA_HOME: ${CUDA_HOME:-unset}"

say "venv (--system-site-packages) from $("$PY" --version 2>&1)"
"$PY" -m venv --system-site-packages "$WORK/venv" || exit 1
V="$WORK/venv/bin"
# A venv made from another venv's python sees only the base interpreter's site-packages: point it at the invoking
# python's too, where the machine's NVIDIA wheels (and numpy) are.
"$PY" -c 'import site; print("\n".join(site.getsitepackages()))' >"$("$V/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine-site.pth"
rm -rf build/cuda python/h3ctl/libh3.so python/h3ctl/libh3_cuda.so   # nothing left from an earlier build
if "$V/python" -m pip download -q --retries 0 --timeout 5 --no-deps -d "$WORK/probe" hatchling >/dev/null 2>&1; then
    say 'install (online): pip install -e ".[cuda]"'
    t0=$SECONDS; "$V/pip" install -q -e ".[cuda]" >"$LOG/install.log" 2>&1; rc=$?
else
    if ! "$V/python" -c 'import hatchling, editables' 2>/dev/null; then
        ls .carry/hatch/*.whl >/dev/null 2>&1 || { echo "no network and no hatchling: carry .carry/hatch/*.whl"; exit 2; }
        "$V/pip" install -q --no-index --no-deps .carry/hatch/*.whl || exit 1
    fi
    say "install (offline): pip install --no-build-isolation --no-deps -e ."
    t0=$SECONDS; "$V/pip" install -q --no-build-isolation --no-deps -e . >"$LOG/install.log" 2>&1; rc=$?
fi
say "install: exit $rc in $((SECONDS - t0)) s; built: $(ls python/h3ctl/libh3*.so 2>/dev/null | tr '\n' ' ')"
[ "$rc" -eq 0 ] || { tail -30 "$LOG/install.log"; exit 1; }
[ -f python/h3ctl/libh3_cuda.so ] || { echo "FAILED: the install built no CUDA backend"; exit 1; }

cd "$WORK" || exit 2   # away from the checkout, so the installed h3ctl is the one that runs
say "h3ctl info"
"$V/h3ctl" info 2>&1 | tee "$LOG/info.txt"
export H3_KERNEL_CACHE="$WORK/kernels"
# The MP4 needs imageio-ffmpeg, a dependency an offline --no-deps install does not bring: without it the renders
# write the WAV and the PNG frames instead (the same render; only the container differs).
if "$V/python" -c 'import imageio_ffmpeg' 2>/dev/null; then MP4=1; else MP4=0; say "no imageio-ffmpeg: WAV + PNG frames"; fi
FAILED=0
for run in first cached; do
    say "render ($run kernel cache: $(ls "$H3_KERNEL_CACHE" 2>/dev/null | wc -l) entries)"
    if [ "$MP4" = 1 ]; then OUTS=(-o "$WORK/$run.mp4"); else OUTS=(-o "" --wav "$WORK/$run.wav" --frames-dir "$WORK/$run"); fi
    t0=$(date +%s%N)
    "$V/h3ctl" render -p "a red circle moves right on a black background, a high beep" --device cuda --profile \
        "${OUTS[@]}" 2>&1 | tee "$LOG/render-$run.txt"
    rc=$?
    t1=$(date +%s%N)
    printf '== render %s: exit %d, %s s wall, output %s bytes\n' "$run" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" \
        "$(du -cb "$WORK/$run"* 2>/dev/null | tail -1 | cut -f1)" | tee -a "$LOG/summary.txt"
    [ "$rc" -eq 0 ] || FAILED=1
done
if [ "$MP4" = 1 ]; then same() { cmp -s "$WORK/first.mp4" "$WORK/cached.mp4"; }
else same() { cmp -s "$WORK/first.wav" "$WORK/cached.wav" && diff -rq "$WORK/first" "$WORK/cached" >/dev/null; }; fi
same && echo "== the two renders are byte-identical" || { echo "== FAILED: the renders differ"; FAILED=1; }
exit $FAILED
