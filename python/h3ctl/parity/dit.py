"""Parity stages of the transformer and the sampler: `dit`, `schedule`, `denoise`.

Tensor names are diffusers' own: the arguments and outputs of `MiniMaxH3Transformer3DModel.forward`, the attributes
`MiniMaxH3Scheduler.set_timesteps` fills, and the pipeline-state names of the t2va denoise loop.
"""

from __future__ import annotations

import numpy as np

from .. import transformer as tr
from .._lib import H3Error
from . import Stage, open_context, register


def _scalar(inputs: dict, name: str, kind):
    a = np.asarray(inputs[name])
    if a.size != 1:
        raise H3Error(f"{name} must hold one value, got shape {list(a.shape)}")
    v = a.reshape(-1)[0]
    if kind is int:
        if not np.issubdtype(a.dtype, np.integer):
            raise H3Error(f"{name} must be an integer tensor, got {a.dtype}")
        return int(v)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise H3Error(f"{name} must be a number, got {a.dtype}")
    return float(v)


def _rows(inputs: dict, name: str, batched: list) -> np.ndarray:
    """A [rows, features] tensor, also accepted with diffusers' batch axis of 1."""
    a = np.asarray(inputs[name])
    if not np.issubdtype(a.dtype, np.floating):
        raise H3Error(f"{name} must be a float tensor, got {a.dtype}")
    if a.ndim == 3:
        if a.shape[0] != 1:
            raise H3Error(f"{name} has batch size {a.shape[0]}; the parity stage runs batch 1")
        batched.append(True)
        a = a[0]
    elif a.ndim != 2:
        raise H3Error(f"{name} must be [rows, features] or [1, rows, features], got shape {list(a.shape)}")
    return a


def _ints(inputs: dict, name: str) -> np.ndarray:
    a = np.asarray(inputs[name])
    if not np.issubdtype(a.dtype, np.integer):
        raise H3Error(f"{name} must be an integer tensor, got {a.dtype}")
    if a.ndim != 1:
        raise H3Error(f"{name} must be 1-D, got shape {list(a.shape)}")
    return a.astype(np.int64)


def _run_dit(model_dir, inputs, options):
    batched: list = []
    hs = _rows(inputs, "hidden_states", batched)
    ahs = _rows(inputs, "audio_hidden_states", batched)
    ehs = _rows(inputs, "encoder_hidden_states", batched)
    ts = np.asarray(inputs["timestep"])
    if ts.ndim != 1 or not np.issubdtype(ts.dtype, np.floating):
        raise H3Error(f"timestep must be a 1-D float tensor, got {ts.dtype} {list(ts.shape)}")
    pos = np.asarray(inputs["position_ids"])
    if pos.ndim != 2 or pos.shape[1] != 3 or not np.issubdtype(pos.dtype, np.floating):
        raise H3Error(f"position_ids must be a float [seq_len, 3] tensor, got {pos.dtype} {list(pos.shape)}")
    with open_context(model_dir, options) as ctx:
        sample, audio_sample = tr.forward(
            ctx, hs, ahs, ehs, ts, _ints(inputs, "timestep_indices"), _ints(inputs, "token_tags"), pos,
            _ints(inputs, "video_indices"), _ints(inputs, "audio_indices"), _ints(inputs, "text_indices"))
    if batched:
        sample, audio_sample = sample[None], audio_sample[None]
    return {"sample": sample, "audio_sample": audio_sample}


def _run_schedule(model_dir, inputs, options):
    sigmas, timesteps = tr.sigma_schedule(_scalar(inputs, "num_inference_steps", int), _scalar(inputs, "shift", float))
    return {"sigmas": sigmas, "timesteps": timesteps}


def _run_denoise(model_dir, inputs, options):
    batched: list = []
    pe = _rows(inputs, "prompt_embeds", batched)
    lat = np.asarray(inputs["latents"], np.float32)
    if lat.ndim == 5:
        if lat.shape[0] != 1:
            raise H3Error(f"latents has batch size {lat.shape[0]}; the parity stage runs batch 1")
        lat = lat[0]
    if lat.ndim != 4:
        raise H3Error(f"latents must be [1, C, T, H, W], got shape {list(np.shape(inputs['latents']))}")
    aud = np.asarray(inputs["audio_latents"], np.float32)
    steps = _scalar(inputs, "num_inference_steps", int)
    tags = inputs.get("text_token_tags")
    with open_context(model_dir, options) as ctx:
        out, aout, _ = tr.denoise(ctx, pe, lat, aud, steps, text_tags=None if tags is None else _ints(inputs, "text_token_tags"))
    return {"latents": out[None], "audio_latents": aout}


register(Stage(
    name="dit",
    doc="one MiniMaxH3Transformer3DModel forward (batch 1) on the packed sequence",
    inputs={
        "hidden_states": "f32 [1, Nv, latents_dim*patch_h*patch_w] video rows, conditioning rows first ([Nv, ...] too)",
        "audio_hidden_states": "f32 [1, Na, audio_latents_dim] audio rows, side-major",
        "encoder_hidden_states": "f32 [1, Nt, text_dim] prompt embeddings",
        "timestep": "f32 [T] distinct timesteps in [0, 1] (t = 1 - sigma)",
        "timestep_indices": "i64 [L] index into timestep per packed row",
        "token_tags": "i64 [L] modality per packed row: 0 video, 1 text, 2 audio",
        "position_ids": "f64 [L, 3] (t, h, w) RoPE coordinates",
        "video_indices": "i64 [Nv] packed positions of the video rows",
        "audio_indices": "i64 [Na] packed positions of the audio rows",
        "text_indices": "i64 [Nt] packed positions of the text rows",
    },
    outputs={
        "sample": "f32 [1, Nv, latents_dim*patch_h*patch_w] video velocity (batch axis as given)",
        "audio_sample": "f32 [1, Na, audio_latents_dim] audio velocity",
    },
    run=_run_dit,
))

register(Stage(
    name="schedule",
    doc="MiniMaxH3Scheduler.set_timesteps(num_inference_steps) with `shift` (grid points include the terminal 0)",
    inputs={
        "num_inference_steps": "i64 [] or [1] sigma grid points (model evaluations = len(sigmas) - 1)",
        "shift": "f32/f64 [] or [1] exponential shift (12 video, 3 audio in the release)",
    },
    outputs={
        "sigmas": "f32 [n] shifted sigmas, terminal 0 included",
        "timesteps": "f32 [n-1] t = 1 - sigma of each model evaluation",
    },
    run=_run_schedule,
    needs_model=False,
))

register(Stage(
    name="denoise",
    doc="the t2va denoising loop (both schedulers, one forward per step) from injected noise",
    inputs={
        "prompt_embeds": "f32 [1, Nt, text_dim]",
        "latents": "f32 [1, latents_dim, T, H, W] initial video noise",
        "audio_latents": "f32 [2, audio_latents_dim, T_a] initial audio noise",
        "num_inference_steps": "i64 [] sigma grid points",
        "text_token_tags": "i64 [Nt] optional: 1 text, 0 vision span (default all 1)",
    },
    outputs={
        "latents": "f32 [1, latents_dim, T, H, W] denoised video latents",
        "audio_latents": "f32 [2, audio_latents_dim, T_a] denoised audio latents",
    },
    run=_run_denoise,
))
