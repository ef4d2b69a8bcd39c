"""libh3 builds for other platforms: every source compiles warning-free and links into a shared library for
aarch64 Linux and for macOS (arm64 and x86-64), cross-compiled with zig's clang (PyPI `ziglang`)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every C source of libh3 except the CUDA backend (a separate library built by nvcc).
SOURCES = sorted(str(p) for p in (ROOT / "libh3").rglob("*.c") if "cuda" not in p.parts)
COMMON = ["-std=c11", f"-I{ROOT / 'libh3'}", "-O1", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
          "-D_POSIX_C_SOURCE=200809L", "-D_DEFAULT_SOURCE"]
TARGETS = {
    "aarch64-linux-gnu": (["-shared"], ["-lm", "-lpthread"], b"ARM aarch64", "libh3.so"),
    "aarch64-macos": (["-D_DARWIN_C_SOURCE", "-dynamiclib"], ["-lm"], b"\xcf\xfa\xed\xfe", "libh3.dylib"),
    "x86_64-macos": (["-D_DARWIN_C_SOURCE", "-dynamiclib"], ["-lm"], b"\xcf\xfa\xed\xfe", "libh3.dylib"),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_cross_build(target, tmp_path):
    extra, libs, magic, name = TARGETS[target]
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", target, *COMMON, *extra, "-o", str(out),
                           *SOURCES, *libs], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = out.read_bytes()
    if target.endswith("macos"):
        assert data[:4] == magic
        cpu = int.from_bytes(data[4:8], "little")
        assert cpu == (0x0100000C if target.startswith("aarch64") else 0x01000007)  # CPU_TYPE_ARM64 / X86_64
    else:
        assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 183  # EM_AARCH64
