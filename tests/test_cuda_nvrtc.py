"""The CUDA backend builds with the ordinary C++ compiler (no CUDA header, -Werror) and every kernel module compiles
to a cubin for sm_80, sm_89 and sm_90 through the backend's own NVRTC path (h3_cuda_compile_check in libh3_cuda:
the same sources, options and launcher-signature checks a GPU run compiles). NVRTC comes from the nvidia-cuda-nvrtc
wheel (the `test` extra) or H3_NVRTC_LIB; no GPU is needed."""
import ctypes
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "python" / "h3ctl" / "libh3_cuda.so"


def _nvrtc() -> str | None:
    env = os.environ.get("H3_NVRTC_LIB")
    if env and os.path.isfile(env):
        return env
    from h3ctl import _lib

    return _lib._nvidia_wheel_file("cu13", "lib", "libnvrtc.so.13")


def _cxx() -> str | None:
    return shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(not _cxx(), reason="no C++ compiler")
def test_host_code_builds_warning_free_without_cuda_headers():
    srcs = sorted(glob.glob(str(ROOT / "libh3/backend/cuda/*.cpp")))
    if not (ROOT / "libh3/backend/cuda/cuda_sdpa_cudnn.cpp").exists():
        srcs.append(str(ROOT / "libh3/backend/cuda/cudnn_absent/cudnn_absent.cpp"))
    assert len(srcs) >= 14
    for src in srcs:
        # No CUDA include folder on the command line: a CUDA header would not be found.
        r = subprocess.run([_cxx(), "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-I" + str(ROOT / "libh3"),
                            src], capture_output=True, text=True)
        assert r.returncode == 0, f"{src}:\n{r.stderr[-4000:]}"


@pytest.fixture(scope="module")
def cuda_lib():
    nvrtc = _nvrtc()
    if not nvrtc:
        msg = "the nvidia-cuda-nvrtc wheel is not installed (pip install -e '.[test]') and H3_NVRTC_LIB is unset"
        if os.environ.get("H3_TEST_REQUIRE_NVRTC") == "1":  # CI (.ci/run): the test extra must have brought it
            pytest.fail(msg)
        print("skipping: " + msg)
        pytest.skip("nvidia-cuda-nvrtc wheel absent")
    r = subprocess.run(["make", "-C", str(ROOT), "cuda"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lib = ctypes.CDLL(str(LIB))
    lib.h3_cuda_compile_check.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.h3_cuda_compile_check.restype = ctypes.c_int
    return lib, nvrtc


@pytest.mark.parametrize("arch", [80, 89, 90])
def test_every_kernel_module_compiles(cuda_lib, arch):
    lib, nvrtc = cuda_lib
    err = ctypes.create_string_buffer(1 << 16)
    rc = lib.h3_cuda_compile_check(nvrtc.encode(), arch, err, len(err))
    assert rc == 0, err.value.decode(errors="replace")
    assert err.value.decode() == f"9 modules compiled for sm_{arch}"


def test_compile_check_names_a_missing_nvrtc(tmp_path):
    if not LIB.exists():
        pytest.skip("libh3_cuda not built")
    # A fresh process: NVRTC is loaded once per process.
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); e = ctypes.create_string_buffer(4096); "
            "rc = lib.h3_cuda_compile_check(sys.argv[2].encode(), 90, e, 4096); print(rc, e.value.decode())")
    r = subprocess.run(["python3", "-c", code, str(LIB), str(tmp_path / "libnvrtc.so.13")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("-1 NVRTC missing (libnvrtc.so.13: "), r.stdout
    assert 'pip install "h3ctl[cuda]"' in r.stdout
