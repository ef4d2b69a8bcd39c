"""The Metal kernels (shaders/metal/*.metal) run in the MSL emulator (tests/metal_emu): the emulator's own checks
(barriers, SIMD-group functions, simdgroup matrices, deadlocks reported) and every kernel against its op's
double-precision reference at the CUDA tolerances. Needs only a C++17 compiler (g++); no Apple hardware."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CXX = os.environ.get("METAL_CXX", "g++")
pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")

LINE = re.compile(r"^metal (\S+)\s+(.*?)\s+rel-L2 (\S+) \(tol (\S+)\)(.*)$")


def _run_make():
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "test-metal-emu"], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def test_metal_kernels_in_emulation():
    rc, out = _run_make()
    assert rc == 0, out[-6000:]
    # the emulator's checks, then the kernels', then (where GNU Objective-C is) the host against the Metal test
    # double (tests/test_metal_double.py checks that one in detail)
    sums = re.findall(r"^(\d+) checks, (\d+) failures$", out, re.M)
    assert len(sums) in (2, 3) and all(f == "0" for _, f in sums), out[-3000:]
    assert int(sums[0][0]) >= 30 and int(sums[1][0]) >= 280, sums
    for fault in ("barrier under if (tid < 16)", "a thread returns before a barrier",
                  "simd_sum / simd_max in divergent branches", "simdgroup_load with half the lanes"):
        assert re.search(rf"^reported: {re.escape(fault)}\s+-> (deadlock|lanes|a simdgroup)", out, re.M), fault
    # every op the kernels implement was measured, each within its tolerance
    seen = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            op, what, err, tol = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
            assert err <= tol and "FAIL" not in m.group(5), line
            seen[op] = seen.get(op, 0) + 1
    for op in ("linear", "linear_q8", "attention", "norm_mod", "gated_add", "gated_add_norm", "qk_norm_rope", "rope", "swiglu",
               "gelu", "mul", "conv_gemm", "conv3d", "snake", "snake_aa", "conv1_clamp", "layernorm", "group_norm", "head_pool",
               "abs_diff_sum"):
        assert seen.get(op, 0) >= 2, f"{op}: {seen.get(op, 0)} cases"
    # the ops that must give the CPU's bits
    assert "BITS DIFFER" not in out
    for op in ("euler", "extrapolate", "sub", "pool_pairs", "unpool_pairs", "scatter_rows", "copy", "add_div", "channels_last",
               "unpatchify", "vae_stitch"):
        assert len(re.findall(rf"^metal {op}\s+.*bit-identical$", out, re.M)) >= 2, op
    assert re.search(r"^metal attention\s+Lq 20000 ", out, re.M), "the long-sequence attention case did not run"


@pytest.mark.skipif(shutil.which(os.environ.get("METAL_CLANG", "clang++")) is None, reason="no clang++")
def test_metal_kernels_strict_address_spaces():
    # clang with distinct address spaces: every kernel compiles, and the three mixed-address-space kernels do not.
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "test-metal-strict"], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert len(re.findall(r"^strict: h3_\w+\.metal compiles$", out, re.M)) >= 6, out
    assert len(re.findall(r"^strict: H3_BAD_\w+ refused: ", out, re.M)) == 3, out
