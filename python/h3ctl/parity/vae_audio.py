"""Audio VAE decoding through libh3, and the `audio_decode` parity stage.

The stage mirrors diffusers' `MiniMaxH3AudioDecodeStep`: it takes `audio_latents` [2, C, Ta] exactly as that
step receives them (normalised, one batch item per stereo side) and returns `audio` [1, 2, samples] f32.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _lib
from .._lib import H3Error
from ..context import Context
from . import Stage, open_context, register


def audio_info(ctx: Context) -> dict:
    """{"latent_channels", "sample_rate", "hop"} of the model's audio VAE."""
    ch, sr, hop = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _lib.check(_lib.lib().h3_audio_info(ctx.ptr, ctypes.byref(ch), ctypes.byref(sr), ctypes.byref(hop)))
    return {"latent_channels": ch.value, "sample_rate": sr.value, "hop": hop.value}


def audio_samples(ctx: Context, latent_frames: int) -> int:
    """PCM samples per stereo side that `latent_frames` latent frames decode to."""
    return _lib.check(_lib.lib().h3_audio_samples(ctx.ptr, int(latent_frames)))


def audio_decode(ctx: Context, latents: np.ndarray, progress=None) -> np.ndarray:
    """Decode normalised latents [2, C, Ta] (f32) into PCM [2, samples] in [-1, 1].

    `progress(done, total)` is called between convolutions (permille of the work, total 1000); returning True cancels (H3Error, code
    H3_E_CANCELLED). An exception raised by `progress` cancels the decode and is re-raised here.
    """
    if not isinstance(latents, np.ndarray) or latents.dtype != np.float32:
        raise H3Error(f"audio latents must be a float32 array, got {getattr(latents, 'dtype', type(latents))}")
    if latents.ndim != 3 or latents.shape[0] != 2:
        raise H3Error(f"audio latents must have shape [2, channels, frames], got {list(latents.shape)}")
    lat = np.ascontiguousarray(latents)
    _, channels, frames = lat.shape
    if frames < 1:
        raise H3Error("audio latents have no frames")
    samples = audio_samples(ctx, frames)
    pcm = np.empty((2, samples), np.float32)
    raised: list[BaseException] = []

    def hook(_user, _phase, done, total):
        try:
            return 1 if progress(int(done), int(total)) else 0
        except BaseException as e:  # noqa: BLE001 - re-raised after the C call returns
            raised.append(e)
            return 1

    cb = _lib.H3ProgressFn(hook) if progress is not None else _lib.H3ProgressFn()
    f32p = ctypes.POINTER(ctypes.c_float)
    rc = _lib.lib().h3_audio_decode(ctx.ptr, lat.ctypes.data_as(f32p), int(channels), int(frames),
                                    pcm.ctypes.data_as(f32p), pcm.size, cb, None)
    if raised:
        raise raised[0]
    _lib.check(rc)
    return pcm


def _run(model_dir, inputs, options):
    lat = inputs["audio_latents"]
    if lat.dtype != np.float32:
        raise H3Error(f"parity audio_decode: audio_latents must be F32, got {lat.dtype}")
    with open_context(model_dir, options) as ctx:
        pcm = audio_decode(ctx, lat)
    return {"audio": pcm[None]}


register(Stage(
    name="audio_decode",
    doc="audio VAE decode (MiniMaxH3AudioDecodeStep: de-normalise, decode both stereo sides, clamp)",
    inputs={"audio_latents": "f32 [2, C, Ta], normalised, left side first"},
    outputs={"audio": "f32 [1, 2, samples] in [-1, 1] at the VAE sample rate"},
    run=_run,
))
