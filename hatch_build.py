"""Build libh3 with make before the wheel (or the editable install) is assembled.

The CUDA backend (python/h3ctl/libh3_cuda.so, which libh3 loads at run time when it is present) is built too when a
CUDA compiler is found: `nvcc` on PATH or under $CUDA_HOME/bin. H3_CUDA=1 requires it (a failure fails the install);
H3_CUDA=0 leaves it out. Without nvcc, or when that optional build fails, the install is the plain CPU one, with a
warning in the second case: a machine without a working CUDA toolchain must still get a working h3ctl.
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


def cuda_plan(env=None, which=shutil.which) -> tuple[str, str | None, str]:
    """Whether to build the CUDA backend: (mode, nvcc, why), mode "off", "optional" or "required"."""
    env = os.environ if env is None else env
    flag = env.get("H3_CUDA", "").strip()
    if flag not in ("", "0", "1"):
        raise ValueError(f"H3_CUDA must be 0 (no CUDA backend) or 1 (require it), got {flag!r}")
    if flag == "0":
        return "off", None, "H3_CUDA=0"
    nvcc = which("nvcc", path=env.get("PATH"))
    if not nvcc:
        home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
        cand = os.path.join(home, "bin", "nvcc") if home else None
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            nvcc = cand
    if flag == "1":
        return "required", nvcc, "H3_CUDA=1"
    if nvcc:
        return "optional", nvcc, f"nvcc found at {nvcc}"
    return "off", None, "no nvcc on PATH or under $CUDA_HOME/bin"


def build_cuda(root: str, env=None, run=subprocess.run, warn=None, remove_stale: bool = True) -> bool:
    """Run `make cuda` as cuda_plan decides. True when the backend was built. Raises (failing the install) only
    when H3_CUDA=1; an optional build that fails is a warning. With `remove_stale` (a wheel, which copies the
    file), a backend left by an earlier build is removed when this build did not make it, so a wheel never
    carries one that does not match this libh3; an editable install uses the tree in place and keeps it."""
    env = dict(os.environ if env is None else env)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    mode, nvcc, why = cuda_plan(env)
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
        return False
    if mode == "required" and not nvcc:
        raise RuntimeError("H3_CUDA=1 but no nvcc was found on PATH or under $CUDA_HOME/bin")
    # make finds nvcc through PATH and NVCC, also when it was only found under $CUDA_HOME/bin
    env["PATH"] = os.path.dirname(nvcc) + os.pathsep + env.get("PATH", "")
    proc = run(["make", "-C", str(root), "cuda", f"NVCC={nvcc}"], env=env, capture_output=True, text=True)
    if proc.returncode == 0 and out.exists():
        return True
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
    if mode == "required":
        raise RuntimeError(f"building the CUDA backend failed (H3_CUDA=1):\n{tail}")
    drop_stale("this build of it failed")
    warn(f"the optional CUDA backend was not built ({why}, but `make cuda` failed). Set H3_CUDA=0 to skip it or "
         f"H3_CUDA=1 to make this an error. Last lines:\n{tail}")
    return False


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        subprocess.check_call(["make", "-C", self.root, "lib"])
        build_cuda(self.root, warn=getattr(getattr(self, "app", None), "display_warning", None),
                   remove_stale=version != "editable")
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
