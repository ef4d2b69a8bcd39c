"""Video VAE decoding through libh3: Python wrappers and the `video_decode` parity stage.

The stage computes what diffusers' `MiniMaxH3VideoDecodeStep` computes with `output_type="np"`:

    latents * latents_std + latents_mean  ->  AutoencoderKLMiniMaxH3.decode (tiling on, 256 px tiles,
    64 px minimum overlap: the config's vae_tile_size / vae_tile_overlap_min)  ->  * ImageNet std
    + ImageNet mean  ->  clamp(0, 1)  ->  VideoProcessor.postprocess_video(..., "np")

Input  `latents`: float32 [1, C, T, h, w], normalised (what the decode step receives).
Output `videos`:  float32 [1, F, H, W, 3] in [0, 1] (the step's `videos`).
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _lib
from .._lib import H3Error
from . import Stage, open_context, register

PHASE = "video_decode"


def _opts(tile_px: int = 0, overlap_px: int = 0, raw: bool = False, untiled: bool = False, progress=None):
    lib = _lib.lib()
    o = _lib.H3VideoDecodeOpts()
    lib.h3_video_decode_opts_default(ctypes.byref(o))
    o.tile_px = int(tile_px)
    o.overlap_px = int(overlap_px)
    o.flags = (_lib.H3_VIDEO_RAW if raw else 0) | (_lib.H3_VIDEO_UNTILED if untiled else 0)
    if progress is not None:
        o.progress = progress
    return o


def decode_shape(ctx, T: int, h: int, w: int) -> tuple[int, int, int]:
    """(frames, height, width) of the decoded video for latents [C, T, h, w]."""
    f, hh, ww = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _lib.check(_lib.lib().h3_video_decode_shape(ctx.ptr, T, h, w, ctypes.byref(f), ctypes.byref(hh),
                                                ctypes.byref(ww)))
    return f.value, hh.value, ww.value


def decode_workspace(ctx, T: int, h: int, w: int, *, tile_px: int = 0, overlap_px: int = 0,
                     untiled: bool = False) -> int:
    """Bytes of working memory libh3 allocates for this decode (weights and outputs excluded)."""
    o = _opts(tile_px, overlap_px, untiled=untiled)
    return _lib.check(_lib.lib().h3_video_decode_workspace(ctx.ptr, T, h, w, ctypes.byref(o)))


def decode(ctx, latents: np.ndarray, *, tile_px: int = 0, overlap_px: int = 0, raw: bool = False,
           untiled: bool = False, want_rgb: bool = True, want_pixels: bool = True, progress=None):
    """Decode normalised latents [C, T, h, w] (or [1, C, T, h, w]).

    Returns (rgb, pixels): rgb uint8 [F, H, W, 3] (None unless want_rgb); pixels float32 [F, H, W, 3]
    in [0, 1], or with raw=True vae.decode()'s sample [3, F, H, W] (None unless want_pixels).
    `progress(phase, done, total)` may return True to cancel (raises H3Error with code 6).
    """
    lat = np.asarray(latents)
    if lat.ndim == 5:
        if lat.shape[0] != 1:
            raise H3Error(f"video decode: batch of {lat.shape[0]} latents; decode one video at a time")
        lat = lat[0]
    if lat.ndim != 4:
        raise H3Error(f"video decode: latents must be [C, T, h, w] or [1, C, T, h, w], got shape {list(lat.shape)}")
    if not np.issubdtype(lat.dtype, np.floating):
        raise H3Error(f"video decode: latents must be floating point, got {lat.dtype}")
    lat = np.ascontiguousarray(lat, dtype=np.float32)
    C, T, h, w = (int(x) for x in lat.shape)
    F, H, W = decode_shape(ctx, T, h, w)
    rgb = np.empty((F, H, W, 3), np.uint8) if want_rgb else None
    pixels = None
    if want_pixels:
        pixels = np.empty((3, F, H, W) if raw else (F, H, W, 3), np.float32)

    failure: list[BaseException] = []
    cb = None
    if progress is not None:
        def _cb(user, phase, done, total):
            try:
                return 1 if progress(phase.decode(), done, total) else 0
            except BaseException as e:  # noqa: BLE001 (re-raised after the C call returns)
                failure.append(e)
                return 1
        cb = _lib.H3ProgressFn(_cb)
    o = _opts(tile_px, overlap_px, raw=raw, untiled=untiled, progress=cb)
    rc = _lib.lib().h3_video_decode(
        ctx.ptr, lat.ctypes.data_as(_lib.c_float_p), C, T, h, w, ctypes.byref(o),
        rgb.ctypes.data_as(_lib.c_uint8_p) if rgb is not None else None,
        pixels.ctypes.data_as(_lib.c_float_p) if pixels is not None else None)
    if failure:
        raise failure[0]
    _lib.check(rc)
    return rgb, pixels


def _run(model_dir: str, inputs: dict[str, np.ndarray], options: dict) -> dict[str, np.ndarray]:
    lat = inputs["latents"]
    if lat.ndim != 5 or lat.shape[0] != 1:
        raise H3Error(f"parity video_decode: 'latents' must be [1, C, T, h, w], got shape {list(lat.shape)}")
    with open_context(model_dir, options) as ctx:
        _, pixels = decode(ctx, lat, want_rgb=False)
    return {"videos": pixels[None]}


register(Stage(
    name="video_decode",
    doc="MiniMaxH3VideoDecodeStep (output_type='np'): de-normalise, tiled VAE decode, ImageNet, clamp",
    inputs={"latents": "float32 [1, C, T, h, w], normalised as the denoiser produces them"},
    outputs={"videos": "float32 [1, F, H, W, 3] in [0, 1]"},
    run=_run,
))
