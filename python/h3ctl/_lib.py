"""ctypes bindings of libh3.

Every function exported by the shared library is declared here with its argtypes and restype;
tests check that this table and the library's exported symbols are the same set.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_LIBNAME = "libh3.dylib" if sys.platform == "darwin" else "libh3.so"

c_int, c_int32, c_int64, c_uint32 = ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_size_t, c_char_p, c_void_p = ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p
c_uint8_p = ctypes.POINTER(ctypes.c_uint8)
c_uint64, c_double = ctypes.c_uint64, ctypes.c_double
c_float_p = ctypes.POINTER(ctypes.c_float)
c_double_p = ctypes.POINTER(ctypes.c_double)
c_int32_p = ctypes.POINTER(ctypes.c_int32)
c_int_p = ctypes.POINTER(ctypes.c_int)
c_int64_p = ctypes.POINTER(ctypes.c_int64)


class H3Options(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("threads", c_int32), ("flags", c_uint32)]


# int (*)(void *user, const char *phase, int done, int total): non-zero cancels.
H3ProgressFn = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_int, c_int)


class H3VideoDecodeOpts(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("tile_px", c_int32), ("overlap_px", c_int32), ("flags", c_uint32),
                ("progress", H3ProgressFn), ("user", c_void_p)]


H3_VIDEO_RAW = 1
H3_VIDEO_UNTILED = 2
c_uint8_p = ctypes.POINTER(ctypes.c_uint8)

H3_OPT_REF2VA = 1


class H3Request(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("prompt", c_char_p), ("width", c_int32), ("height", c_int32),
                ("frames", c_int32), ("steps", c_int32), ("seed", c_uint64), ("video_noise", c_float_p),
                ("audio_noise", c_float_p), ("vae_tile_px", c_int32)]


class H3RenderInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("width", c_int32), ("height", c_int32), ("frames", c_int32),
                ("fps", c_int32), ("audio_samples", c_int64), ("sample_rate", c_int32),
                ("latent_frames", c_int32), ("latent_height", c_int32), ("latent_width", c_int32),
                ("latent_channels", c_int32), ("audio_latents", c_int32), ("audio_latent_channels", c_int32),
                ("prompt_tokens", c_int32), ("steps", c_int32), ("steps_done", c_int32), ("sequence", c_int64)]


class H3TextCacheStats(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("reserved", c_uint32), ("hits", c_uint64), ("misses", c_uint64),
                ("entries", c_uint64), ("bytes", c_uint64), ("budget", c_uint64), ("evictions", c_uint64),
                ("last_bytes_read", c_uint64)]

# name -> (restype, argtypes). Keep in the order of libh3/h3.h.
BINDINGS: dict[str, tuple[object, list[object]]] = {
    "h3_version": (c_char_p, []),
    "h3_last_error": (c_char_p, []),
    "h3_cpu_features": (c_char_p, []),
    "h3_options_default": (None, [ctypes.POINTER(H3Options)]),
    "h3_init": (c_void_p, [c_char_p, ctypes.POINTER(H3Options)]),
    "h3_free": (None, [c_void_p]),
    "h3_threads": (c_int, [c_void_p]),
    "h3_set_progress": (None, [c_void_p, H3ProgressFn, c_void_p]),
    "h3_model_info_json": (c_char_p, [c_void_p]),
    "h3_memory_estimate_json": (c_char_p, [c_void_p, c_int, c_int, c_int, c_int]),
    "h3_model_check": (c_int, [c_void_p, c_int]),
    "h3_safetensors_check": (c_int, [c_char_p]),
    "h3_safetensors_check_buffer": (c_int, [c_void_p, c_size_t]),
    # tokenizer
    "h3_tokenizer_load": (c_void_p, [c_char_p]),
    "h3_tokenizer_free": (None, [c_void_p]),
    "h3_tokenize": (c_int64, [c_void_p, c_char_p, c_size_t, c_int32_p, c_int64]),
    "h3_token_id": (c_int32, [c_void_p, c_char_p]),
    "h3_tokenizer_vocab_size": (c_int32, [c_void_p]),
    "h3_detokenize": (c_int64, [c_void_p, c_int32_p, c_int64, c_char_p, c_int64]),
    "h3_text_hidden_size": (c_int, [c_void_p]),
    "h3_text_encode": (c_int, [c_void_p, c_int32_p, c_int, c_float_p]),
    "h3_text_cache_stats_get": (c_int, [c_void_p, ctypes.POINTER(H3TextCacheStats)]),
    "h3_text_cache_set_budget": (c_int, [c_void_p, c_uint64]),
    "h3_text_cache_clear": (None, [c_void_p]),
    # Transformer
    "h3_sigma_schedule": (c_int, [c_int, c_double, c_float_p, c_float_p]),
    "h3_noise_fill": (c_int, [c_uint64, c_uint32, c_uint64, c_float_p, c_int64]),
    "h3_dit_packed_layout": (c_int64, [c_void_p, c_int64, c_uint8_p, c_int, c_int, c_int, c_int, c_int32_p, c_int,
                                       c_double_p, c_int64_p, c_int64_p, c_int64_p, c_int64_p]),
    "h3_dit_forward": (c_int, [c_void_p, c_float_p, c_int64, c_float_p, c_int64, c_float_p, c_int64, c_float_p,
                               c_int32, c_int64_p, c_int64_p, c_double_p, c_int64, c_int64_p, c_int64_p,
                               c_int64_p, c_float_p, c_float_p]),
    "h3_dit_denoise": (c_int, [c_void_p, c_float_p, c_int64, c_uint8_p, c_int, c_int, c_int, c_int, c_int,
                               c_float_p, c_float_p]),
    "h3_dit_profile_json": (c_char_p, [c_void_p]),
    "h3_bench_gemm": (c_double, [c_void_p, c_int64, c_int64, c_int64, c_int]),
    "h3_bench_fma_peak": (c_double, [c_void_p, c_int]),
    "h3_video_decode_opts_default": (None, [ctypes.POINTER(H3VideoDecodeOpts)]),
    "h3_video_decode_shape": (c_int, [c_void_p, c_int, c_int, c_int, c_int_p, c_int_p, c_int_p]),
    "h3_video_decode_workspace": (c_int64, [c_void_p, c_int, c_int, c_int, ctypes.POINTER(H3VideoDecodeOpts)]),
    "h3_video_decode": (c_int, [c_void_p, c_float_p, c_int, c_int, c_int, c_int, ctypes.POINTER(H3VideoDecodeOpts),
                                c_uint8_p, c_float_p]),
    "h3_audio_info": (c_int, [c_void_p, c_int_p, c_int_p, c_int_p]),
    "h3_audio_samples": (c_int64, [c_void_p, c_int]),
    "h3_audio_decode": (c_int, [c_void_p, c_float_p, c_int, c_int, c_float_p, c_int64, H3ProgressFn, c_void_p]),
    # text to video + audio
    "h3_request_default": (None, [ctypes.POINTER(H3Request)]),
    "h3_prepare": (c_int, [c_void_p, ctypes.POINTER(H3Request)]),
    "h3_step": (c_int, [c_void_p]),
    "h3_render_info_get": (c_int, [c_void_p, ctypes.POINTER(H3RenderInfo)]),
    "h3_plan": (c_int, [c_void_p, ctypes.POINTER(H3Request), ctypes.POINTER(H3RenderInfo)]),
    "h3_get_latents": (c_int, [c_void_p, c_float_p, c_float_p]),
    "h3_prompt_tokens": (c_int, [c_void_p, c_int32_p, c_int]),
    "h3_decode": (c_int, [c_void_p, c_uint8_p, c_float_p]),
    "h3_decode_video_f32": (c_int, [c_void_p, c_float_p]),
}


class H3Error(Exception):
    """A libh3 failure: `str(err)` is the one-line message naming the file and the problem."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _source_root() -> Path | None:
    root = _HERE.parent.parent
    if (root / "Makefile").is_file() and (root / "libh3").is_dir():
        return root
    return None


def _lib_path() -> Path:
    env = os.environ.get("H3CTL_LIB")
    if env:
        return Path(env)
    so = _HERE / _LIBNAME
    root = _source_root()
    if root is not None:
        # Editable/source checkout: rebuild when a C file is newer than the library, so a stale
        # library never answers for edited sources.
        srcs = [p for p in (root / "libh3").rglob("*") if p.suffix in (".c", ".h", ".inc")] + [root / "Makefile"]
        if not so.exists() or so.stat().st_mtime < max(p.stat().st_mtime for p in srcs):
            proc = subprocess.run(["make", "-s", "-C", str(root), "lib"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise H3Error("building libh3 failed:\n" + proc.stdout + proc.stderr)
    return so


_lock = threading.Lock()
_lib = None


def lib():
    """The loaded library with every binding declared."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = _lib_path()
            if not path.exists():
                raise H3Error(f"{path}: libh3 is not built (run `make lib` or reinstall h3ctl)")
            handle = ctypes.CDLL(str(path))
            for name, (restype, argtypes) in BINDINGS.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = handle
    return _lib


def last_error() -> str:
    msg = lib().h3_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(rc: int) -> int:
    """Raise H3Error for a negative return code."""
    if rc < 0:
        raise H3Error(last_error() or f"libh3 error {rc}", -rc)
    return rc


def exported_symbols() -> set[str]:
    """Names the shared library exports (for the bindings test)."""
    path = _lib_path()
    tool = ["nm", "-gU", str(path)] if sys.platform == "darwin" else ["nm", "-D", "--defined-only", str(path)]
    out = subprocess.run(tool, capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("T", "t"):
            names.add(parts[2].lstrip("_") if sys.platform == "darwin" else parts[2])
    return {n for n in names if n.startswith("h3_")}
