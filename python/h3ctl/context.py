"""A thin owner of an `h3_ctx`: opens a model directory and frees it deterministically."""

from __future__ import annotations

import ctypes
import json
import operator
import os

from . import _lib
from ._lib import H3Error


class Context:
    """`device` picks where the transformer and the sampler run: "auto" (CUDA when the backend is built and a
    GPU answers, on a Mac Metal, else the CPU), "cpu", "cuda" or "metal" (H3Error with the reason when that GPU
    cannot be used);
    `device_index` is the GPU ordinal. `flags` adds H3_OPT_* bits (the exact slow paths). `precision` is how the
    transformer's block weights are held: "default" (= "bf16": the exact path), "fp8" (CUDA, compute capability
    8.9+) or "int8" (the CPU); H3Error when the device cannot run it. `vram`: GiB the transformer's GEMM weights may
    hold (h3_options.vram_bytes; None or 0: auto); blocks beyond it stream, with byte-identical results.
    `quantized`: a file `h3ctl quantize` wrote from this model (h3_options.quantized_path; needs precision "fp8"),
    read instead of quantising at load; checked against the model here, H3Error with the reason otherwise."""

    def __init__(self, model_dir: str | os.PathLike, threads: int = 0, ref2va: bool = False, device: str = "auto",
                 device_index: int = 0, flags: int = 0, precision: str = "default", vram=None, quantized=None,
                 files: dict | None = None):
        self._ptr = None
        code = _lib.device_code(device)
        prec = _lib.precision_code(precision)
        vram_bytes = _lib.vram_bytes(vram)
        try:
            index = -1 if isinstance(device_index, bool) else operator.index(device_index)
        except TypeError:
            index = -1
        if not 0 <= index < 2**31:
            raise H3Error(f"device_index must be a GPU number >= 0, got {device_index!r}")
        lib = _lib.lib()
        opts = _lib.H3Options()
        lib.h3_options_default(ctypes.byref(opts))
        from . import limits

        opts.threads = limits.threads(threads or 0)
        opts.flags = int(flags) | (_lib.H3_OPT_REF2VA if ref2va else 0)
        opts.device = code
        opts.device_index = index
        opts.precision = prec
        opts.vram_bytes = vram_bytes
        opts.quantized_path = os.fsencode(os.fspath(quantized)) if quantized is not None else None
        for key, value in (files or {}).items():  # h3ctl.components: single files and a tokenizer folder
            setattr(opts, {"tokenizer": "tokenizer_dir"}.get(key, key + "_path"),
                    os.fsencode(os.fspath(value)) if value is not None else None)
        self._ptr = lib.h3_init(os.fsencode(os.fspath(model_dir)), ctypes.byref(opts))
        if not self._ptr:
            raise H3Error(_lib.last_error() or f"{model_dir}: cannot open")
        self.model_dir = os.fspath(model_dir)

    @property
    def ptr(self) -> int:
        if not self._ptr:
            raise H3Error("the model context is closed")
        return self._ptr

    @property
    def threads(self) -> int:
        return _lib.lib().h3_threads(self.ptr)

    @property
    def device(self) -> str:
        """The backend the transformer runs on: "cpu", "cuda" or "metal"."""
        raw = _lib.lib().h3_device_name(self.ptr)
        return raw.decode("utf-8", "replace") if raw else ""

    @property
    def device_description(self) -> str:
        """One line: the device, its memory and the kernels in use."""
        raw = _lib.lib().h3_device_description(self.ptr)
        return raw.decode("utf-8", "replace") if raw else ""

    @property
    def stages_device(self) -> str:
        """Where the text encoder and the decoders run: "cuda" or "cpu" (H3_OPT_STAGES_CPU keeps them there)."""
        raw = _lib.lib().h3_stages_device(self.ptr)
        return raw.decode("ascii") if raw else "cpu"

    def info(self) -> dict:
        raw = _lib.lib().h3_model_info_json(self.ptr)
        if raw is None:
            raise H3Error(_lib.last_error())
        return json.loads(raw.decode("utf-8"))

    def memory_estimate(self, width: int, height: int, frames: int, prompt_tokens: int) -> dict:
        raw = _lib.lib().h3_memory_estimate_json(self.ptr, width, height, frames, prompt_tokens)
        if raw is None:
            raise H3Error(_lib.last_error())
        return json.loads(raw.decode("utf-8"))

    def close(self) -> None:
        if self._ptr:
            _lib.lib().h3_free(self._ptr)
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# Signs of an NVIDIA driver on this machine (its kernel module's version file, its user-space library).
NVIDIA_DRIVER_SIGNS = ("/proc/driver/nvidia/version", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
                       "/usr/lib/aarch64-linux-gnu/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1")


def cpu_fallback_note(requested: str, running: str, signs=NVIDIA_DRIVER_SIGNS, backends=None) -> str | None:
    """The one line a render owes when `--device auto` lands on the CPU of a machine that has an NVIDIA driver
    (a CPU-only build, a missing library, an old driver: the CUDA backend's own reason), else None."""
    # H3_LIBCUDA names the driver library by hand (an unusual install; the fault tests' stand-in driver): a sign too
    named = os.environ.get("H3_LIBCUDA")
    if requested != "auto" or running != "cpu" or not (named and os.path.isfile(named)
                                                       or any(os.path.exists(p) for p in signs)):
        return None
    if backends is None:
        backends = _lib.backends()
    cuda = backends.get("cuda", {})
    if cuda.get("available"):
        return None
    reason = cuda.get("reason") or "the CUDA backend is not usable"
    return f"note: this machine has an NVIDIA driver but the render runs on the CPU: {reason} (`h3ctl info` lists the backends)"
