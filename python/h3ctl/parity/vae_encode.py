"""Video VAE encoding through libh3: Python wrappers and the `video_encode` / `vae_condition` parity stages.

`video_encode` computes what diffusers' `AutoencoderKLMiniMaxH3.encode(pixels).latent_dist` holds (tiling on,
the config's 256 px tiles with at least 64 px overlap): its `mean` and its `logvar` (clamped to [-30, 20]).

`vae_condition` computes `encode_vae_condition(vae, pixels, pixel_mean, pixel_std)` of
`modular_pipelines/minimax_h3/encoders.py` (ImageNet normalisation, encode, posterior sample, float16 rounding,
latents_mean / latents_std), with the posterior noise injected as `eps` (diffusers draws it from
`torch.Generator().manual_seed(42)`; libh3 does not port torch's generator).
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _lib
from .._lib import H3Error
from . import Stage, open_context, register

PHASE = "video_encode"


def encode_shape(ctx, T: int, H: int, W: int, *, tile_px: int = 0, overlap_px: int = 0,
                 untiled: bool = False) -> tuple[int, int, int, int]:
    """(C, latent_frames, h, w) of the encode of T frames of H x W pixels."""
    out = [ctypes.c_int() for _ in range(4)]
    flags = _lib.H3_VIDEO_UNTILED if untiled else 0
    _lib.check(_lib.lib().h3_video_encode_shape(ctx.ptr, int(T), int(H), int(W), int(tile_px), int(overlap_px),
                                                flags, *(ctypes.byref(o) for o in out)))
    return tuple(o.value for o in out)


def _video(pixels, what: str, dtype) -> np.ndarray:
    x = np.asarray(pixels)
    if x.ndim == 5:
        if x.shape[0] != 1:
            raise H3Error(f"{what}: batch of {x.shape[0]} videos; encode one at a time")
        x = x[0]
    if x.ndim != 4:
        raise H3Error(f"{what}: expected [3, T, H, W] or [1, 3, T, H, W], got shape {list(x.shape)}")
    if x.shape[0] != 3:
        raise H3Error(f"{what}: expected 3 channels first, got shape {list(x.shape)}")
    return np.ascontiguousarray(x, dtype=dtype)


def encode(ctx, pixels: np.ndarray, *, tile_px: int = 0, overlap_px: int = 0,
           untiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """vae.encode(pixels).latent_dist -> (mean, logvar), each float32 [C, latent_frames, h, w].

    `pixels`: float [3, T, H, W] (or [1, 3, T, H, W]), ImageNet-normalised as diffusers feeds the VAE."""
    x = np.asarray(pixels)
    if x.ndim in (4, 5) and not np.issubdtype(x.dtype, np.floating):
        raise H3Error(f"video encode: pixels must be floating point, got {x.dtype}")
    x = _video(x, "video encode", np.float32)
    _, T, H, W = x.shape
    C, Tl, h, w = encode_shape(ctx, T, H, W, tile_px=tile_px, overlap_px=overlap_px, untiled=untiled)
    mean = np.empty((C, Tl, h, w), np.float32)
    logvar = np.empty((C, Tl, h, w), np.float32)
    flags = _lib.H3_VIDEO_UNTILED if untiled else 0
    _lib.check(_lib.lib().h3_video_encode(ctx.ptr, x.ctypes.data_as(_lib.c_float_p), T, H, W, int(tile_px),
                                          int(overlap_px), flags, mean.ctypes.data_as(_lib.c_float_p),
                                          logvar.ctypes.data_as(_lib.c_float_p)))
    return mean, logvar


def encode_condition(ctx, rgb: np.ndarray, eps: np.ndarray | None = None, seed: int = 42) -> np.ndarray:
    """encode_vae_condition of uint8 frames [T, H, W, 3] (or one frame [H, W, 3]) -> float32 [C, Tl, h, w].

    `eps` [C, Tl, h, w] is the posterior noise; None draws libh3's noise under `seed`."""
    f = np.asarray(rgb)
    if f.dtype != np.uint8:
        raise H3Error(f"video encode condition: frames must be uint8, got {f.dtype}")
    if f.ndim == 3:
        f = f[None]
    if f.ndim != 4 or f.shape[-1] != 3:
        raise H3Error(f"video encode condition: frames must be [T, H, W, 3] or [H, W, 3], got shape {list(f.shape)}")
    f = np.ascontiguousarray(f)
    T, H, W, _ = f.shape
    C, Tl, h, w = encode_shape(ctx, T, H, W)
    e = None
    if eps is not None:
        e = np.ascontiguousarray(eps, dtype=np.float32)
        if e.size != C * Tl * h * w:
            raise H3Error(f"video encode condition: eps has shape {list(np.shape(eps))}, expected {[C, Tl, h, w]}")
    out = np.empty((C, Tl, h, w), np.float32)
    _lib.check(_lib.lib().h3_video_encode_condition(
        ctx.ptr, f.ctypes.data_as(_lib.c_uint8_p), T, H, W,
        e.ctypes.data_as(_lib.c_float_p) if e is not None else None, int(seed), out.ctypes.data_as(_lib.c_float_p)))
    return out


def _run_encode(model_dir: str, inputs: dict[str, np.ndarray], options: dict) -> dict[str, np.ndarray]:
    with open_context(model_dir, options) as ctx:
        mean, logvar = encode(ctx, inputs["pixels"])
    return {"mean": mean[None], "logvar": logvar[None]}


def _run_condition(model_dir: str, inputs: dict[str, np.ndarray], options: dict) -> dict[str, np.ndarray]:
    px = np.asarray(inputs["pixels"])
    if px.ndim != 5 or px.shape[0] != 1 or px.shape[1] != 3 or px.dtype != np.uint8:
        raise H3Error(f"parity vae_condition: 'pixels' must be uint8 [1, 3, T, H, W], got {px.dtype} "
                      f"{list(px.shape)}")
    eps = inputs["eps"]
    with open_context(model_dir, options) as ctx:
        lat = encode_condition(ctx, px[0].transpose(1, 2, 3, 0), eps=eps[0] if eps.ndim == 5 else eps)
    return {"latents": lat[None]}


register(Stage(
    name="video_encode",
    doc="AutoencoderKLMiniMaxH3.encode(pixels).latent_dist: tiled causal 3-D encoder; mean and clamped logvar",
    inputs={"pixels": "float32 [1, 3, T, H, W], ImageNet-normalised"},
    outputs={"mean": "float32 [1, C, Tl, h, w]", "logvar": "float32 [1, C, Tl, h, w], clamped to [-30, 20]"},
    run=_run_encode,
))

register(Stage(
    name="vae_condition",
    doc="encode_vae_condition: /255, ImageNet, encode, posterior sample with eps, float16, latents_mean/std",
    inputs={"pixels": "uint8 [1, 3, T, H, W]", "eps": "float32 [1, C, Tl, h, w], the posterior noise"},
    outputs={"latents": "float32 [1, C, Tl, h, w]"},
    run=_run_condition,
))
