"""Build libh3 with make before the wheel (or the editable install) is assembled.

The CUDA backend (python/h3ctl/libh3_cuda.so, which libh3 loads at run time when it is present) is built too on Linux
whenever a C++ compiler is found ($CUDA_CXX, else $CXX, else g++, clang++ or c++ on PATH). It needs nothing from
NVIDIA at build time: no nvcc, no CUDA header, no CUDA library. Its host code talks to the GPU through the driver API
(libcuda.so.1, opened at run time), its kernels are compiled at run time by NVRTC, and cuBLASLt / cuDNN are opened at
run time too (the `cuda` extra's wheels, or the system's). So the same build serves machines with and without a GPU,
and the plain install fetches nothing.

H3_CUDA=1 requires the backend (no compiler, or a failing build, fails the install); H3_CUDA=0 leaves it out. When
the optional build fails, the install is the plain CPU one with a warning (a machine without a working C++ toolchain
must still get a working h3ctl). macOS and Windows: not built (no NVIDIA driver there); H3_CUDA=1 is an error.

The Metal backend (python/h3ctl/libh3_metal.dylib) is built on a Mac (`make metal`: clang, Metal.framework and
Foundation, from the Xcode command-line tools); a failure there is a warning and the install is the CPU one.
H3_METAL=0 leaves it out. On Linux the only Metal library is the test build against the Metal test double
(`make metal-double`): a wheel never carries it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # the decision logic below is importable (and tested) without hatchling installed
    BuildHookInterface = object

CUDA_LIB = "python/h3ctl/libh3_cuda.dylib" if sys.platform == "darwin" else "python/h3ctl/libh3_cuda.so"
# The compilers tried, in order, when neither CUDA_CXX nor CXX names one.
CXX_NAMES = ("g++", "clang++", "c++")
# Signs of an NVIDIA driver: its kernel module's folder, or its user-space library in the usual places.
DRIVER_SIGNS = ("/proc/driver/nvidia/version", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
                "/usr/lib/aarch64-linux-gnu/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1")


def nvidia_driver_present(signs=DRIVER_SIGNS) -> bool:
    """Whether this machine looks like it has an NVIDIA driver (so a CPU-only build deserves a warning)."""
    return any(os.path.exists(p) for p in signs)


def _compiler(env, which) -> tuple[str | None, str]:
    """The C++ compiler make should use, and where it came from."""
    for var in ("CUDA_CXX", "CXX"):
        val = (env.get(var) or "").strip()
        if val:
            # A bare name goes through PATH; a path must be an executable file.
            found = which(val, path=env.get("PATH")) if os.sep not in val else (
                val if os.path.isfile(val) and os.access(val, os.X_OK) else None)
            return found, f"${var}={val}" + ("" if found else " is not an executable")
    for name in CXX_NAMES:
        found = which(name, path=env.get("PATH"))
        if found:
            return found, f"{name} on PATH"
    return None, "no C++ compiler found (" + ", ".join(CXX_NAMES) + " on PATH, $CXX, $CUDA_CXX)"


def cuda_plan(env=None, which=shutil.which, platform=None) -> tuple[str, str | None, str]:
    """Whether to build the CUDA backend: (mode, c++ compiler, why), mode "off", "optional" or "required"."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    flag = env.get("H3_CUDA", "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"H3_CUDA must be 0 (no CUDA backend) or 1 (require it), got {flag!r}")
    if flag == "0":
        return "off", None, "H3_CUDA=0"
    if not platform.startswith("linux"):
        why = f"the CUDA backend is built on Linux only (this is {platform})"
        return ("required", None, "H3_CUDA=1 but " + why) if flag == "1" else ("off", None, why)
    cxx, where = _compiler(env, which)
    if flag == "1":
        return "required", cxx, "H3_CUDA=1" if cxx else f"H3_CUDA=1 but {where}"
    if cxx:
        return "optional", cxx, f"C++ compiler: {where}"
    return "off", None, where


def build_cuda(root: str, env=None, run=subprocess.run, warn=None, remove_stale: bool = True,
               driver_present=nvidia_driver_present, platform=None) -> bool:
    """Run `make cuda` as cuda_plan decides. True when the backend was built. Raises (failing the install) only
    when H3_CUDA=1; an optional build that fails is a warning. With `remove_stale` (a wheel, which copies the
    file), a backend left by an earlier build is removed when this build did not make it, so a wheel never
    carries one that does not match this libh3; an editable install uses the tree in place and keeps it."""
    env = dict(os.environ if env is None else env)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    mode, cxx, why = cuda_plan(env, platform=platform)
    out = Path(root) / CUDA_LIB

    def drop_stale(reason: str) -> None:
        if not out.exists():
            return
        if remove_stale:
            out.unlink()
        else:
            warn(f"{out} is left from an earlier build and {reason}; libh3 will still load it (delete it to run "
                 "on the CPU only)")

    if mode == "off":
        if why == "H3_CUDA=0":
            drop_stale("H3_CUDA=0 asks for no CUDA backend")
        elif driver_present():
            warn(f"this machine has an NVIDIA driver, but h3ctl is being installed without its CUDA backend ({why}): "
                 "it will run on the CPU only. Install a C++ compiler (g++ or clang++) and reinstall (see "
                 "docs/gpu.md); H3_CUDA=0 silences this warning")
        return False
    if mode == "required" and not cxx:
        raise RuntimeError(why)
    proc = run(["make", "-C", str(root), "cuda", f"CUDA_CXX={cxx}"], env=env, capture_output=True, text=True)
    if proc.returncode == 0 and out.exists():
        return True
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
    if mode == "required":
        raise RuntimeError(f"building the CUDA backend failed (H3_CUDA=1):\n{tail}")
    drop_stale("this build of it failed")
    warn(f"the optional CUDA backend was not built ({why}, but `make cuda` failed); h3ctl runs on the CPU only. "
         f"Set H3_CUDA=0 to skip it or H3_CUDA=1 to make this an error. Last lines:\n{tail}")
    return False


METAL_LIB = "python/h3ctl/libh3_metal.dylib" if sys.platform == "darwin" else "python/h3ctl/libh3_metal.so"


def build_metal(root: str, env=None, run=subprocess.run, warn=None, remove_stale: bool = True,
                platform: str = sys.platform) -> bool:
    """On a Mac, `make metal` (True when built; a failure is a warning). Elsewhere nothing is built, and a wheel
    drops the test double's library if one is in the tree (an editable install keeps it for the tests)."""
    env = dict(os.environ if env is None else env)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    out = Path(root) / METAL_LIB
    flag = env.get("H3_METAL", "").strip()
    if flag not in ("", "0"):
        raise ValueError(f"H3_METAL must be 0 (no Metal backend) or unset, got {flag!r}")
    if platform != "darwin" or flag == "0":
        if out.exists() and remove_stale:
            out.unlink()  # the Linux one runs against the test double only; the Darwin one was not asked for
        return False
    proc = run(["make", "-C", str(root), "metal"], env=env, capture_output=True, text=True)
    if proc.returncode == 0 and out.exists():
        return True
    if out.exists() and remove_stale:
        out.unlink()
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
    warn(f"the Metal backend was not built (`make metal` failed; the Xcode command-line tools provide clang and "
         f"Metal.framework): h3ctl will run on the CPU. H3_METAL=0 silences this. Last lines:\n{tail}")
    return False


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        subprocess.check_call(["make", "-C", self.root, "lib"])
        build_cuda(self.root, warn=getattr(getattr(self, "app", None), "display_warning", None),
                   remove_stale=version != "editable")
        build_metal(self.root, warn=getattr(getattr(self, "app", None), "display_warning", None),
                    remove_stale=version != "editable")
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
