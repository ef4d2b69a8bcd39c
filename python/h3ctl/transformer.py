"""numpy-level wrappers of libh3's transformer and sampler entry points (h3.h "Transformer")."""

from __future__ import annotations

import ctypes
import json

import numpy as np

from . import _lib
from ._lib import H3Error


def _ptr(a: np.ndarray | None, ctype):
    if a is None:
        return None
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _f32(a, name: str, ndim: int) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    if a.ndim != ndim:
        raise H3Error(f"{name} must have {ndim} dimensions, got shape {list(a.shape)}")
    return a


def _config(ctx) -> dict:
    comp = ctx.info()["components"]["transformer"]
    if not comp.get("present"):
        raise H3Error(f"{ctx.model_dir}: component 'transformer' is missing")
    return comp["config"]


def sigma_schedule(steps: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """(sigmas, timesteps) of MiniMaxH3Scheduler.set_timesteps(steps) with `shift` (steps = sigma grid points)."""
    steps = int(steps)
    sig = np.zeros(max(steps, 2), np.float32)
    ts = np.zeros(max(steps, 2), np.float32)
    n = _lib.check(_lib.lib().h3_sigma_schedule(steps, float(shift), _ptr(sig, ctypes.c_float), _ptr(ts, ctypes.c_float)))
    return sig[:n].copy(), ts[: n - 1].copy()


def noise(seed: int, stream: int, shape, offset: int = 0) -> np.ndarray:
    """libh3's counter-based standard-normal noise (stream 0 video, 1 audio) in C order of `shape`."""
    out = np.empty(tuple(int(s) for s in shape), np.float32)
    _lib.check(_lib.lib().h3_noise_fill(int(seed) & (2**64 - 1), int(stream), int(offset), _ptr(out, ctypes.c_float),
                                        out.size))
    return out


def packed_layout(ctx, n_text: int, latent_frames: int, latent_height: int, latent_width: int, audio_latents: int,
                  text_tags=None, anchors=()) -> dict[str, np.ndarray]:
    """The t2va/fl2va packed layout: position_ids, token_tags, text/video/audio_indices (diffusers names)."""
    lib = _lib.lib()
    tags = None if text_tags is None else np.ascontiguousarray(np.asarray(text_tags, np.uint8))
    an = np.ascontiguousarray(np.asarray([{"first": 0, "last": 1}.get(a, a) for a in anchors], np.int32))
    args = (ctx.ptr, int(n_text), _ptr(tags, ctypes.c_uint8), int(latent_frames), int(latent_height),
            int(latent_width), int(audio_latents), _ptr(an, ctypes.c_int32) if an.size else None, int(an.size))
    seq = _lib.check(lib.h3_dit_packed_layout(*args, None, None, None, None, None))
    pos = np.zeros((seq, 3), np.float64)
    tok = np.zeros(seq, np.int64)
    tix = np.zeros(int(n_text), np.int64)
    n_audio = 2 * int(audio_latents)
    vix = np.zeros(seq - int(n_text) - n_audio, np.int64)
    aix = np.zeros(n_audio, np.int64)
    _lib.check(lib.h3_dit_packed_layout(*args, _ptr(pos, ctypes.c_double), _ptr(tok, ctypes.c_int64),
                                        _ptr(tix, ctypes.c_int64), _ptr(vix, ctypes.c_int64), _ptr(aix, ctypes.c_int64)))
    return {"position_ids": pos, "token_tags": tok, "text_indices": tix, "video_indices": vix, "audio_indices": aix}


def forward(ctx, hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices, token_tags,
            position_ids, video_indices, audio_indices, text_indices) -> tuple[np.ndarray, np.ndarray]:
    """One transformer forward with diffusers' arguments (no batch axis). Returns (sample, audio_sample)."""
    hs = _f32(hidden_states, "hidden_states", 2)
    ahs = _f32(audio_hidden_states, "audio_hidden_states", 2)
    ehs = _f32(encoder_hidden_states, "encoder_hidden_states", 2)
    ts = np.ascontiguousarray(np.asarray(timestep, np.float32).reshape(-1))
    i64 = lambda a: np.ascontiguousarray(np.asarray(a, np.int64).reshape(-1))  # noqa: E731
    tsi, tags, vix, aix, tix = (i64(a) for a in (timestep_indices, token_tags, video_indices, audio_indices, text_indices))
    pos = np.ascontiguousarray(np.asarray(position_ids, np.float64))
    seq = pos.shape[0]
    if pos.ndim != 2 or pos.shape[1] != 3:
        raise H3Error(f"position_ids must be [seq_len, 3], got {list(pos.shape)}")
    for name, a in (("timestep_indices", tsi), ("token_tags", tags)):
        if a.shape[0] != seq:
            raise H3Error(f"{name} has {a.shape[0]} entries but position_ids has {seq} rows")
    for name, a, rows in (("video_indices", vix, hs), ("audio_indices", aix, ahs), ("text_indices", tix, ehs)):
        if a.shape[0] != rows.shape[0]:
            raise H3Error(f"{name} has {a.shape[0]} entries for {rows.shape[0]} input rows")
    cfg = _config(ctx)
    patch = cfg["latents_dim"] * cfg["patch_size"][1] * cfg["patch_size"][2]
    for name, a, width in (("hidden_states", hs, patch), ("audio_hidden_states", ahs, cfg["audio_latents_dim"]),
                           ("encoder_hidden_states", ehs, cfg["text_dim"])):
        if a.shape[1] != width:
            raise H3Error(f"{name} rows have {a.shape[1]} features, the transformer takes {width}")
    sample = np.zeros(hs.shape, np.float32)
    audio_sample = np.zeros(ahs.shape, np.float32)
    f, l = ctypes.c_float, ctypes.c_int64
    _lib.check(_lib.lib().h3_dit_forward(
        ctx.ptr, _ptr(hs, f), hs.shape[0], _ptr(ahs, f), ahs.shape[0], _ptr(ehs, f), ehs.shape[0], _ptr(ts, f),
        ts.shape[0], _ptr(tsi, l), _ptr(tags, l), _ptr(pos, ctypes.c_double), seq, _ptr(vix, l), _ptr(aix, l),
        _ptr(tix, l), _ptr(sample, f), _ptr(audio_sample, f)))
    return sample, audio_sample


def denoise(ctx, prompt_embeds, latents, audio_latents, steps: int, text_tags=None) -> tuple[np.ndarray, np.ndarray, int]:
    """The engine's t2va loop. latents [C, T, H, W] and audio_latents [2, C_a, T_a] are the initial noise.

    Returns (latents, audio_latents, model evaluations).
    """
    pe = _f32(prompt_embeds, "prompt_embeds", 2)
    lat = np.array(latents, np.float32, copy=True, order="C")
    aud = np.array(audio_latents, np.float32, copy=True, order="C")
    if lat.ndim != 4 or aud.ndim != 3 or aud.shape[0] != 2:
        raise H3Error(f"latents must be [C, T, H, W] and audio_latents [2, C, T_a], got {list(lat.shape)} and "
                      f"{list(aud.shape)}")
    cfg = _config(ctx)
    if lat.shape[0] != cfg["latents_dim"] or aud.shape[1] != cfg["audio_latents_dim"]:
        raise H3Error(f"latents have {lat.shape[0]} channels and audio latents {aud.shape[1]}, but the transformer "
                      f"takes {cfg['latents_dim']} and {cfg['audio_latents_dim']}")
    if pe.shape[1] != cfg["text_dim"]:
        raise H3Error(f"prompt_embeds rows have {pe.shape[1]} features, the transformer takes {cfg['text_dim']}")
    tags = None if text_tags is None else np.ascontiguousarray(np.asarray(text_tags, np.uint8))
    f = ctypes.c_float
    n = _lib.check(_lib.lib().h3_dit_denoise(ctx.ptr, _ptr(pe, f), pe.shape[0], _ptr(tags, ctypes.c_uint8),
                                             lat.shape[1], lat.shape[2], lat.shape[3], aud.shape[2], int(steps),
                                             _ptr(lat, f), _ptr(aud, f)))
    return lat, aud, n


def profile(ctx) -> dict:
    raw = _lib.lib().h3_dit_profile_json(ctx.ptr)
    if raw is None:
        raise H3Error(_lib.last_error())
    return json.loads(raw.decode("utf-8"))
