"""The C test suite (plain and under ASan+UBSan, the stateful API sequences included) and bounded fuzzing runs, from
pytest."""

import os
import re
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


# tests/c/test_api_seq.c prints this after its random call sequences (10,000 by default, fixed seed).
API_SEQ = re.compile(r"api_seq: seed \d+, (\d+) sequences")


def test_c_tests_plain():
    out = _make("test-c")
    assert "failures" in out and " 0 failures" in out
    m = API_SEQ.search(out)
    assert m and int(m.group(1)) >= 10000, "the stateful API test did not run its sequences"


def test_c_tests_asan_ubsan():
    # Every tests/c/test_*.c under ASan+UBSan, the stateful API sequences included.
    out = _make("test-asan")
    assert " 0 failures" in out
    m = API_SEQ.search(out)
    assert m and int(m.group(1)) >= 10000, "the stateful API test did not run its sequences under ASan"


def test_c_tests_generic_kernels():
    # The baseline-ISA path the SIMD kernels are checked against must pass the same tests.
    out = _make("test-c", H3_NO_SIMD="1")
    assert "kernels: generic" in out


def _fuzz(target: str, name: str, runs: str, min_edges: int) -> None:
    out = _make(target, FUZZ_RUNS=runs)
    m = re.search(rf"{name}: {runs} executions in [\d.]+ s, (\d+) coverage edges, corpus \d+, no crash", out)
    assert m, out[-2000:]
    # A target that refuses every input at its first check would still "not crash": demand real coverage.
    assert int(m.group(1)) >= min_edges, f"{name} reached only {m.group(1)} edges"


def test_fuzz_safetensors_bounded():
    _fuzz("fuzz", "fuzz_safetensors", os.environ.get("H3_FUZZ_RUNS", "150000"), 400)


def test_fuzz_json_bounded():
    # The JSON reader on arbitrary bytes: a consistent DOM, lookups that agree with it, write-back round trips.
    _fuzz("fuzz-json", "fuzz_json", os.environ.get("H3_FUZZ_JSON_RUNS", "150000"), 500)


def test_fuzz_tokenizer_bounded():
    # tokenizer.json loading and the encoder/decoder it builds.
    _fuzz("fuzz-tokenizer", "fuzz_tokenizer", os.environ.get("H3_FUZZ_TOKENIZER_RUNS", "100000"), 1200)
