#!/usr/bin/env bash
# The Metal backend on a real Mac (Apple silicon, macOS 14 or later, the Xcode command-line tools), in one go:
#   1. builds libh3.dylib and the Metal backend (libh3_metal.dylib: clang, Metal.framework, Foundation);
#   2. op conformance on the GPU: tests/c/test_backend_ops's metal part, every op against its double-precision
#      reference at the CPU's tolerances (the same cases the emulator runs on Linux);
#   3. renders h3-tiny on the CPU and through --device metal and compares them (frames PSNR >= 55 dB, audio
#      rel-L2 <= 1e-2), and times a default-size h3-tiny render on both;
#   4. times one released-width block (56 heads x 128, hidden 5376, SwiGLU 14336: attention and the four
#      GEMMs at 1,874 / 7,135 / 37,838 tokens, bf16), with H3_BENCH=1.
# Run from the repository root:  bash tests/metal/run_mac.sh 2>&1 | tee metal-mac.log
# Paste the log into docs/metal.md ("Runs on Apple hardware"); until one is recorded there, `h3ctl info` says
# the backend has not been verified on hardware. Nothing here has run yet: no Mac was available to write it.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(uname -s)" = Darwin ] || { echo "run_mac.sh: this is for macOS on Apple silicon"; exit 2; }
echo "== machine"
sw_vers || true
sysctl -n machdep.cpu.brand_string || true
system_profiler SPDisplaysDataType 2>/dev/null | grep -E "Chipset Model|Total Number of Cores|Metal" || true
echo "== build"
make -j"$(sysctl -n hw.ncpu)" lib metal build/tests/test_backend_ops
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv && .venv/bin/pip install -q -e '.[test]'; fi
PY=.venv/bin/python
export H3_METAL_LIB="$PWD/python/h3ctl/libh3_metal.dylib"
echo "== backends"
"$PY" -m h3ctl info | sed -n '/Backends of this libh3/,/Tuning/p'
echo "== op conformance on the GPU"
build/tests/test_backend_ops | grep -E "^metal|checks,|skipped" | tee /tmp/h3-metal-ops.log
grep -q "^metal: skipped" /tmp/h3-metal-ops.log && { echo "run_mac.sh: the Metal backend did not open"; exit 1; }
echo "== h3-tiny: CPU against Metal"
"$PY" - <<'PYEOF'
import time
import numpy as np
from h3ctl.engine import Engine

P = "a red circle moves right on a black background, a high beep"
out = {}
for dev in ("cpu", "metal"):
    with Engine(device=dev) as eng:
        print(dev, eng.device_description)
        eng.render(P, 64, 64, 22, steps=2, seed=1)  # warm: pipelines, page cache
        t = time.perf_counter()
        out[dev] = eng.render(P, 64, 64, 22, steps=2, seed=1)
        small = time.perf_counter() - t
        t = time.perf_counter()
        eng.render(P, seed=42)  # the model's default size and steps
        full = time.perf_counter() - t
        print(f"{dev}: 64x64x22 2 steps {small:.2f} s; default render {full:.2f} s")
a, b = out["cpu"], out["metal"]
mse = np.mean((a.frames.astype(np.float64) - b.frames) ** 2)
psnr = float("inf") if mse == 0 else 10 * np.log10(255 ** 2 / mse)
rel = np.linalg.norm(a.audio.astype(np.float64) - b.audio) / np.linalg.norm(a.audio.astype(np.float64))
print(f"metal vs cpu: frames PSNR {psnr:.2f} dB, audio rel-L2 {rel:.3e}")
assert psnr >= 55 and rel <= 1e-2, "Metal does not match the CPU"
PYEOF
echo "== one released-width block (bf16), timed on the GPU"
H3_BENCH=1 build/tests/test_backend_ops | grep -E "^metal +(attention|linear) +L " || true
echo "== done: paste this log into docs/metal.md"
