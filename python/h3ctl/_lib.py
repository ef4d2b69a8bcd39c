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
# The CUDA backend: its own library next to libh3 (`make cuda`), which libh3 loads at run time when present.
_CUDA_LIBNAME = "libh3_cuda.dylib" if sys.platform == "darwin" else "libh3_cuda.so"

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
    _fields_ = [("struct_size", c_uint32), ("threads", c_int32), ("flags", c_uint32), ("device", c_int32),
                ("device_index", c_int32), ("precision", c_int32), ("vram_bytes", c_int64),
                # pre-quantised fp8 weights (`h3ctl quantize`), read instead of quantising at load
                ("quantized_path", c_char_p),
                # single files replacing a component's weights (h3ctl.components), and a tokenizer folder
                ("transformer_path", c_char_p), ("text_encoder_path", c_char_p), ("video_vae_path", c_char_p),
                ("audio_vae_path", c_char_p), ("tokenizer_dir", c_char_p)]


# int (*)(void *user, const char *phase, int done, int total): non-zero cancels.
H3ProgressFn = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_int, c_int)


class H3VideoDecodeOpts(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("tile_px", c_int32), ("overlap_px", c_int32), ("flags", c_uint32),
                ("progress", H3ProgressFn), ("user", c_void_p)]


H3_VIDEO_RAW = 1
H3_VIDEO_UNTILED = 2
c_uint8_p = ctypes.POINTER(ctypes.c_uint8)

H3_OPT_REF2VA = 1
# Exact slow paths (h3.h); each also has an environment override that h3_init reads.
H3_OPT_DIT_PER_STEP = 2
H3_OPT_KEEP_ADALN = 4
H3_OPT_NO_TEXT_PREFETCH = 8
H3_OPT_DROP_PAGE_CACHE = 16
# On a GPU device, the text encoder and the decoders on the CPU (their exact f32 path; H3_STAGES_CPU=1).
H3_OPT_STAGES_CPU = 32
# The main blocks' self-attention as cuDNN's fp8 SDPA (Hopper+; a speed switch, not exact; H3_FP8_ATTENTION=1).
H3_OPT_FP8_ATTENTION = 64
# The video decoder's layer GEMMs with fp8 weights (CUDA sm_89+; not exact, measured slower; H3_FP8_DECODER=1).
H3_OPT_FP8_DECODER = 128

# Where the transformer and the sampler run (h3_options.device).
H3_DEVICE_AUTO = 0
H3_DEVICE_CPU = 1
H3_DEVICE_CUDA = 2
H3_DEVICE_METAL = 3  # an Apple GPU (libh3_metal; on Linux only the Metal test double's build has one)
DEVICES = {"auto": H3_DEVICE_AUTO, "cpu": H3_DEVICE_CPU, "cuda": H3_DEVICE_CUDA, "metal": H3_DEVICE_METAL}


class H3Parity(ctypes.Structure):
    """h3_parity (h3_stages.h): the tensors a parity check injects into a render."""
    _fields_ = [("struct_size", c_uint32), ("video_noise", c_float_p), ("audio_noise", c_float_p),
                ("first_noise", c_float_p), ("last_noise", c_float_p),
                ("first_posterior_noise", c_float_p), ("last_posterior_noise", c_float_p),
                ("first_latent", c_float_p), ("last_latent", c_float_p),
                ("text_states", c_float_p), ("text_tags", c_uint8_p), ("text_rows", c_int32),
                # per reference (n_references pointers, NULL entries allowed), or NULL
                ("reference_noise", ctypes.POINTER(c_float_p)), ("reference_posterior_noise", ctypes.POINTER(c_float_p))]


class H3Request(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("prompt", c_char_p), ("width", c_int32), ("height", c_int32),
                ("frames", c_int32), ("steps", c_int32), ("seed", c_uint64), ("vae_tile_px", c_int32),
                # speed knobs (h3.h; 0 = off) and LoRA files merged at load
                ("reuse", c_int32), ("core_reuse", c_int32), ("layers", c_int32), ("layer_policy", c_int32),
                ("token_reduction", c_int32), ("render_width", c_int32), ("render_height", c_int32),
                ("cache_threshold", ctypes.c_float), ("lora_paths", ctypes.POINTER(c_char_p)),
                ("lora_scales", c_float_p), ("n_lora", c_int32),
                # FL2VA keyframes (uint8 RGB)
                ("first_frame", c_uint8_p), ("first_width", c_int32), ("first_height", c_int32),
                ("last_frame", c_uint8_p), ("last_width", c_int32), ("last_height", c_int32),
                # Ref2VA references (H3Reference entries, request order)
                ("references", ctypes.c_void_p), ("n_references", c_int32),
                # sigma schedule: a name (docs/few-step.md) or explicit grids (video then audio)
                ("schedule", c_char_p), ("sigmas", c_float_p), ("n_sigmas", c_int32),
                # parity injections (H3Parity), NULL for every other render
                ("parity", ctypes.POINTER(H3Parity))]


# h3_reference.kind
H3_REFERENCE_IMAGE = 0
H3_REFERENCE_VIDEO = 1
H3_REFERENCE_AUDIO = 2


class H3Reference(ctypes.Structure):
    _fields_ = [("kind", c_int32), ("rgb", c_uint8_p), ("width", c_int32), ("height", c_int32), ("frames", c_int32),
                ("fps", ctypes.c_double), ("pcm", c_float_p), ("samples", c_int64), ("channels", c_int32),
                ("sample_rate", c_int32)]


# h3_request.layer_policy
H3_LAYERS_GATE = 0
H3_LAYERS_UNIFORM = 1


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

# name -> (restype, argtypes): every export of libh3/h3.h and libh3/h3_stages.h.
BINDINGS: dict[str, tuple[object, list[object]]] = {
    "h3_version": (c_char_p, []),
    "h3_last_error": (c_char_p, []),
    "h3_cpu_features": (c_char_p, []),
    "h3_options_default": (None, [ctypes.POINTER(H3Options)]),
    "h3_backends_json": (c_char_p, []),
    "h3_set_note": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "h3_cuda_warmup": (c_int, [c_int]),
    "h3_device_name": (c_char_p, [c_void_p]),
    "h3_device_description": (c_char_p, [c_void_p]),
    "h3_stages_device": (c_char_p, [c_void_p]),
    "h3_device_memory_peak": (c_int, [c_void_p, c_int, ctypes.POINTER(c_uint64)]),
    "h3_init": (c_void_p, [c_char_p, ctypes.POINTER(H3Options)]),
    "h3_free": (None, [c_void_p]),
    "h3_threads": (c_int, [c_void_p]),
    "h3_set_progress": (None, [c_void_p, H3ProgressFn, c_void_p]),
    # model_dir, flags, precision, threads, out_path, overwrite, progress, user
    "h3_quantize": (c_int, [c_char_p, c_uint32, c_int, c_int, c_char_p, c_int, H3ProgressFn, c_void_p]),
    "h3_fp8_e4m3_from_f32": (c_int, [c_float_p, c_int64, c_uint8_p]),
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
    "h3_text_image_rows": (c_int, [c_void_p, c_char_p, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
    "h3_text_encode_images": (c_int, [c_void_p, c_char_p, c_int, ctypes.POINTER(c_uint8_p), ctypes.POINTER(c_int),
                                      ctypes.POINTER(c_int), c_float_p, c_int, c_int32_p, c_uint8_p]),
    "h3_image_preprocess": (c_int64, [c_void_p, c_uint8_p, c_int, c_int, c_float_p, c_int64, c_int32_p,
                                      c_int32_p]),
    # Transformer
    "h3_sigma_schedule": (c_int, [c_int, c_double, c_float_p, c_float_p]),
    "h3_schedule_sigmas": (c_int, [c_char_p, c_int, c_double, c_double, c_float_p, c_float_p]),
    "h3_schedule_name": (c_char_p, [c_int]),
    "h3_schedule_declared": (c_int, [c_void_p, ctypes.POINTER(H3Request), c_char_p, c_int]),
    "h3_noise_fill": (c_int, [c_uint64, c_uint32, c_uint64, c_float_p, c_int64]),
    "h3_dit_packed_layout": (c_int64, [c_void_p, c_int64, c_uint8_p, c_int, c_int, c_int, c_int, c_int32_p, c_int,
                                       c_double_p, c_int64_p, c_int64_p, c_int64_p, c_int64_p]),
    "h3_dit_ref2va_layout": (c_int64, [c_void_p, c_int64, c_uint8_p, c_int32_p, c_int, c_int, c_int, c_int, c_int,
                                       c_double_p, c_int64_p, c_int64_p, c_int64_p, c_int64_p, c_uint8_p,
                                       c_int64_p]),
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
    "h3_video_encode_shape": (c_int, [c_void_p, c_int, c_int, c_int, c_int, c_int, c_uint32, c_int_p, c_int_p,
                                      c_int_p, c_int_p]),
    "h3_video_encode": (c_int, [c_void_p, c_float_p, c_int, c_int, c_int, c_int, c_int, c_uint32, c_float_p,
                                c_float_p]),
    "h3_video_encode_condition": (c_int, [c_void_p, c_uint8_p, c_int, c_int, c_int, c_float_p, c_uint64,
                                          c_float_p]),
    "h3_audio_info": (c_int, [c_void_p, c_int_p, c_int_p, c_int_p]),
    "h3_audio_samples": (c_int64, [c_void_p, c_int]),
    "h3_audio_decode": (c_int, [c_void_p, c_float_p, c_int, c_int, c_float_p, c_int64, H3ProgressFn, c_void_p]),
    "h3_audio_encode_shape": (c_int, [c_void_p, c_int64, c_int_p, c_int64_p]),
    "h3_audio_encode": (c_int, [c_void_p, c_float_p, c_int, c_int64, c_float_p, c_int64]),
    "h3_audio_latent_rows": (c_int, [c_void_p, c_float_p, c_int, c_int64, c_float_p, c_int64]),
    # context-free: pcm, channels, samples, in_rate, out_rate, out, out_capacity, out_samples
    "h3_audio_resample": (c_int, [c_float_p, c_int, c_int64, c_int, c_int, c_float_p, c_int64, c_int64_p]),
    # text to video + audio
    "h3_request_default": (c_int, [c_void_p, ctypes.POINTER(H3Request)]),
    "h3_prepare": (c_int, [c_void_p, ctypes.POINTER(H3Request)]),
    "h3_step": (c_int, [c_void_p]),
    "h3_render_info_get": (c_int, [c_void_p, ctypes.POINTER(H3RenderInfo)]),
    "h3_plan": (c_int, [c_void_p, ctypes.POINTER(H3Request), ctypes.POINTER(H3RenderInfo)]),
    "h3_get_latents": (c_int, [c_void_p, c_float_p, c_float_p]),
    "h3_prompt_tokens": (c_int, [c_void_p, c_int32_p, c_int]),
    "h3_decode": (c_int, [c_void_p, c_uint8_p, c_float_p]),
    "h3_decode_video_f32": (c_int, [c_void_p, c_float_p]),
    "h3_keyframe_canvas": (c_int, [c_void_p, c_int, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
    "h3_reference_size": (c_int, [c_void_p, c_int, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
    "h3_reference_video_size": (c_int, [c_void_p, c_int, c_int, c_int, ctypes.c_double, c_int,
                                        ctypes.POINTER(c_int), ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                        ctypes.POINTER(c_int)]),
    "h3_keyframe_resize": (c_int, [c_uint8_p, c_int, c_int, c_int, c_int, c_int, c_uint8_p]),
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


@ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
def _NOTE(_user, line):
    """The CUDA backend's one-line progress and warnings (the first kernel compile for a GPU, an unwritable cache)."""
    try:
        print(f"h3ctl: {line.decode(errors='replace')}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001  (never raise into C)
        pass


def _nvidia_wheel_file(*parts: str) -> str | None:
    """A file of NVIDIA's pip wheels (nvidia-cublas, nvidia-cudnn-cu13, as torch installs them), found without
    importing anything heavy: the `nvidia` namespace package's folders on sys.path."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        cand = Path(folder, *parts)
        if cand.is_file():
            return str(cand)
    return None


def _prepare_cuda_backend() -> None:
    """Point the CUDA backend at its vendor libraries when they come from pip wheels rather than a system CUDA.

    libh3_cuda opens libnvrtc.so.13, libcublasLt.so.13 and libcudnn.so.9 itself at run time (H3_NVRTC_LIB,
    H3_CUBLASLT_LIB, H3_CUDNN_LIB, else the loader's search): where a variable is unset and the nvidia-cuda-nvrtc /
    nvidia-cublas / nvidia-cudnn-cu13 wheel (`pip install "h3ctl[cuda]"`) has the file, name the wheel's copy.
    Nothing here runs without a built CUDA backend, and nothing is imported or loaded."""
    if sys.platform == "darwin" or not (_HERE / _CUDA_LIBNAME).exists():
        return
    for var, parts in (("H3_NVRTC_LIB", ("cu13", "lib", "libnvrtc.so.13")),
                       ("H3_CUBLASLT_LIB", ("cu13", "lib", "libcublasLt.so.13")),
                       ("H3_CUDNN_LIB", ("cudnn", "lib", "libcudnn.so.9"))):
        if not os.environ.get(var):
            found = _nvidia_wheel_file(*parts)
            if found:
                os.environ[var] = found


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
            _prepare_cuda_backend()
            handle = ctypes.CDLL(str(path))
            for name, (restype, argtypes) in BINDINGS.items():
                try:
                    fn = getattr(handle, name)
                except AttributeError:
                    # A library from another build than these bindings (H3CTL_LIB, a stale install): say
                    # so instead of failing later inside a call.
                    raise H3Error(f"{path}: libh3 lacks {name}; it does not match this h3ctl "
                                  "(rebuild with `make lib` or reinstall h3ctl)") from None
                fn.restype = restype
                fn.argtypes = argtypes
            handle.h3_set_note(_NOTE, None)
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


# h3_options.precision (H3_PRECISION_*): "bf16" names the default exact path on a GPU (bf16 weights), as on the CLI.
PRECISIONS = {"default": 0, "bf16": 0, "fp8": 1, "int8": 2}


VRAM_MAX_GIB = 1 << 20  # 1 PiB, libh3's limit: larger is a unit mistake, not a card


def vram_bytes(vram) -> int:
    """h3_options.vram_bytes from a budget in GiB (None or 0: auto). H3Error on anything else than a number in
    [0, 1 PiB]."""
    if vram is None:
        return 0
    try:
        gib = float(vram) if not isinstance(vram, bool) else float("nan")
    except (TypeError, ValueError):
        gib = float("nan")
    if not 0 <= gib <= VRAM_MAX_GIB:  # also refuses NaN
        raise H3Error(f"vram must be a number of GiB between 0 (auto) and {VRAM_MAX_GIB}, got {vram!r}")
    return int(round(gib * (1 << 30)))


def precision_code(precision: str) -> int:
    """H3_PRECISION_* for "default"/"bf16", "fp8" or "int8" (H3Error naming the choices otherwise)."""
    code = PRECISIONS.get(precision) if isinstance(precision, str) else None
    if code is None:
        raise H3Error(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return code


def device_code(device: str) -> int:
    """H3_DEVICE_* for "auto", "cpu", "cuda" or "metal" (H3Error naming the choices otherwise)."""
    code = DEVICES.get(device) if isinstance(device, str) else None
    if code is None:
        raise H3Error(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    return code


def backends() -> dict:
    """What this build of libh3 can compute on (h3_backends_json): {"cpu": {...}, "cuda": {"built", "available",
    "device", "compute_capability", "memory_bytes", "reason"}}. Initialises the CUDA driver when the backend is
    built, so call it when the answer is wanted, not at import."""
    import json

    raw = lib().h3_backends_json()
    if raw is None:
        raise H3Error(last_error() or "libh3 could not describe its backends")
    return json.loads(raw.decode("utf-8"))


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
