"""The C test suite (plain and under ASan+UBSan) and a bounded fuzzing run, from pytest."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _make(*targets, **env):
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), *targets],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, f"make {' '.join(targets)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_c_tests_plain():
    out = _make("test-c")
    assert "failures" in out and " 0 failures" in out


def test_c_tests_asan_ubsan():
    out = _make("test-asan")
    assert " 0 failures" in out


def test_c_tests_generic_kernels():
    # The baseline-ISA path the SIMD kernels are checked against must pass the same tests.
    out = _make("test-c", H3_NO_SIMD="1")
    assert "kernels: generic" in out


def test_fuzz_safetensors_bounded():
    runs = os.environ.get("H3_FUZZ_RUNS", "150000")
    out = _make("fuzz", FUZZ_RUNS=runs)
    assert f"{runs} executions" in out and "no crash" in out
