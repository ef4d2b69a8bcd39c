"""Audio VAE encoding through libh3, and the `audio_encode` parity stage.

`encode` computes `AutoencoderKLMiniMaxH3Audio.encode(pcm[:, None]).latent_dist.mode()`: each channel of the
waveform is a batch item of the mono VAE (right-padded with zeros to a multiple of the hop inside libh3), and the
result is the posterior mean [channels, C, frames]. `latent_rows` is the Ref2VA layout of that mean
(`MiniMaxH3Ref2VAEncodeStep`): (mean - latents_mean) / latents_std, channel-major rows [channels * frames, C].
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _lib
from .._lib import H3Error
from . import Stage, open_context, register


def encode_shape(ctx, samples: int) -> tuple[int, int]:
    """(C, frames) of the encode of `samples` samples per channel."""
    c, t = ctypes.c_int(), ctypes.c_int64()
    _lib.check(_lib.lib().h3_audio_encode_shape(ctx.ptr, int(samples), ctypes.byref(c), ctypes.byref(t)))
    return c.value, t.value


def _pcm(pcm) -> np.ndarray:
    x = np.asarray(pcm)
    if not np.issubdtype(x.dtype, np.floating):
        raise H3Error(f"audio encode: the waveform must be floating point, got {x.dtype}")
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise H3Error(f"audio encode: expected [channels, samples] or [samples], got shape {list(x.shape)}")
    return np.ascontiguousarray(x, dtype=np.float32)


def encode(ctx, pcm) -> np.ndarray:
    """Posterior mean of pcm [channels, samples] (or [samples]) -> float32 [channels, C, frames]."""
    x = _pcm(pcm)
    ch, n = x.shape
    C, T = encode_shape(ctx, n)
    mean = np.empty((ch, C, T), np.float32)
    _lib.check(_lib.lib().h3_audio_encode(ctx.ptr, x.ctypes.data_as(_lib.c_float_p), int(ch), int(n),
                                          mean.ctypes.data_as(_lib.c_float_p), mean.size))
    return mean


def latent_rows(ctx, mean: np.ndarray) -> np.ndarray:
    """Ref2VA rows of a posterior mean [channels, C, frames] -> float32 [channels * frames, C]."""
    m = np.ascontiguousarray(mean, dtype=np.float32)
    if m.ndim != 3:
        raise H3Error(f"audio latent rows: expected [channels, C, frames], got shape {list(m.shape)}")
    ch, C, T = m.shape
    rows = np.empty((ch * T, C), np.float32)
    _lib.check(_lib.lib().h3_audio_latent_rows(ctx.ptr, m.ctypes.data_as(_lib.c_float_p), int(ch), int(T),
                                               rows.ctypes.data_as(_lib.c_float_p), rows.size))
    return rows


def _run(model_dir: str, inputs: dict[str, np.ndarray], options: dict) -> dict[str, np.ndarray]:
    pcm = np.asarray(inputs["audio"])
    if pcm.ndim == 3 and pcm.shape[1] == 1:
        pcm = pcm[:, 0]  # diffusers' [batch, 1, samples]
    with open_context(model_dir, options) as ctx:
        mean = encode(ctx, pcm)
        rows = latent_rows(ctx, mean)
    return {"mean": mean, "rows": rows}


register(Stage(
    name="audio_encode",
    doc="AutoencoderKLMiniMaxH3Audio.encode(audio).latent_dist.mode() per channel, and its Ref2VA rows",
    inputs={"audio": "float32 [channels, 1, samples] (diffusers' batch of mono items) or [channels, samples]"},
    outputs={"mean": "float32 [channels, C, frames]",
             "rows": "float32 [channels * frames, C]: (mean - latents_mean) / latents_std, channel-major"},
    run=_run,
))
