"""Parity stages of first/last-frame conditioning (FL2VA): `keyframes` (the resize step) and `fl2va` (the whole
workflow up to the final latents, every random draw injectable)."""

from __future__ import annotations

import ctypes

import numpy as np

from .. import _lib
from .._lib import H3Error
from . import Stage, open_engine, register

# Injected tensors of `fl2va`, by condition in packed order (0 = the first keyframe given, 1 = the second).
_PER_CONDITION = {"condition_noise": "noise", "posterior_noise": "posterior_noise", "condition_latents": "latent"}


def _int(inputs, name):
    v = np.asarray(inputs[name])
    if v.size != 1 or v.dtype.kind not in "iu":
        raise H3Error(f"parity: '{name}' must be one integer, got {v.dtype} {list(v.shape)}")
    return int(v.reshape(-1)[0])


def _image(inputs, name):
    if name not in inputs:
        return None
    img = np.asarray(inputs[name])
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise H3Error(f"parity: '{name}' must be uint8 [H, W, 3], got {img.dtype} {list(img.shape)}")
    return np.ascontiguousarray(img)


def _canvas(inputs):
    if ("height" in inputs) != ("width" in inputs):
        raise H3Error("parity: give height and width together, or neither")
    return (_int(inputs, "width"), _int(inputs, "height")) if "width" in inputs else (None, None)


def _keyframes(model_dir, inputs, options):
    first, last = _image(inputs, "image"), _image(inputs, "last_image")
    frames = [f for f in (first, last) if f is not None]
    if not frames:
        raise H3Error("parity keyframes: give 'image', 'last_image' or both")
    width, height = _canvas(inputs)
    lib = _lib.lib()
    if width is None:
        from . import open_context

        w, h = ctypes.c_int(), ctypes.c_int()
        with open_context(model_dir, options) as ctx:
            _lib.check(lib.h3_keyframe_canvas(ctx.ptr, frames[0].shape[1], frames[0].shape[0], ctypes.byref(w),
                                              ctypes.byref(h)))
        width, height = w.value, h.value
    out = {"height": np.array([height], np.int64), "width": np.array([width], np.int64)}
    for i, img in enumerate(frames):
        placed = np.empty((height, width, 3), np.uint8)
        _lib.check(lib.h3_keyframe_resize(img.ctypes.data_as(_lib.c_uint8_p), img.shape[1], img.shape[0], width,
                                          height, int(i == 1), placed.ctypes.data_as(_lib.c_uint8_p)))
        out[f"keyframe_{i}"] = placed
    return out


register(Stage(
    name="keyframes",
    doc="FL2VA keyframes on the canvas, as diffusers' MiniMaxH3ResizeStep: the canvas from the first keyframe's "
        "aspect (resolve_canvas_size with the model's canvas rule) unless height/width are given, the first "
        "keyframe stretched, the last one cover-cropped after a first one (PIL's Lanczos, bit for bit)",
    inputs={"image": "uint8 [H, W, 3] first keyframe (optional)", "last_image": "uint8 [H, W, 3] (optional)",
            "height": "int [1] (optional)", "width": "int [1] (optional)"},
    outputs={"keyframe_0": "uint8 [height, width, 3]", "keyframe_1": "uint8 [height, width, 3] (with two)",
             "height": "int64 [1]", "width": "int64 [1]"},
    run=_keyframes,
))


def _fl2va(model_dir, inputs, options):
    if "prompt" not in inputs and "prompt_embeds" not in inputs:
        raise H3Error("parity fl2va: input tensor missing: prompt (or prompt_embeds)")
    prompt = np.asarray(inputs.get("prompt", np.zeros(0, np.uint8)))
    if prompt.dtype != np.uint8 or prompt.ndim != 1:
        raise H3Error("parity fl2va: 'prompt' must be a 1-D uint8 tensor of UTF-8 bytes")
    try:
        text = prompt.tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise H3Error(f"parity fl2va: prompt is not UTF-8 ({e})") from None
    first, last = _image(inputs, "image"), _image(inputs, "last_image")
    present = [n for n in ("first", "last")
               if (first if n == "first" else last) is not None or f"condition_latents_{n}" in inputs]
    if not present:
        raise H3Error("parity fl2va: give 'image' and/or 'last_image' (or their condition latents)")
    injected = {}
    for k, which in enumerate(present):
        for name, field in _PER_CONDITION.items():
            for key in (f"{name}_{k}", f"{name}_{which}"):
                if key in inputs:
                    arr = np.asarray(inputs[key], np.float32)
                    injected[f"{which}_{field}"] = arr[0] if arr.ndim == 5 else arr
    if "prompt_embeds" in inputs:
        emb = np.asarray(inputs["prompt_embeds"], np.float32)
        injected["text_states"] = emb[0] if emb.ndim == 3 else emb
        if "text_token_tags" in inputs:
            injected["text_tags"] = np.asarray(inputs["text_token_tags"]).astype(np.uint8)
    lat = np.asarray(inputs["latents"], np.float32)
    lat = lat[0] if lat.ndim == 5 else lat
    width, height = _canvas(inputs)
    with open_engine(model_dir, options) as eng:
        req = eng.request(text, width=width, height=height, frames=_int(inputs, "num_frames"),
                          steps=_int(inputs, "num_inference_steps"), seed=0, video_noise=lat,
                          audio_noise=np.asarray(inputs["audio_latents"], np.float32), first_frame=first,
                          last_frame=last, injected=injected)
        v, a = eng.run(req, decode=None).latents
    return {"latents": v[None], "audio_latents": a}


register(Stage(
    name="fl2va",
    doc="the fl2va workflow to the final latents, as diffusers' MiniMaxH3ModularPipeline(prompt, image, "
        "last_image, ..., output=['latents', 'audio_latents']); every random draw may be injected, per condition "
        "k in packed order (0, 1) or by name (first, last)",
    inputs={"prompt": "uint8 [bytes] UTF-8 (optional with prompt_embeds)",
            "image": "uint8 [H, W, 3] first keyframe (optional)",
            "last_image": "uint8 [H, W, 3] (optional)", "latents": "f32 [1, C, T, h, w] video noise",
            "audio_latents": "f32 [2, C_a, T_a] audio noise", "num_frames": "int [1]",
            "num_inference_steps": "int [1]", "height": "int [1] (optional)", "width": "int [1] (optional)",
            "condition_noise_k": "f32 [C, 1, h, w] the conditioning draw of condition k (optional)",
            "posterior_noise_k": "f32 [C, 1, h, w] the encoder's posterior draw (optional)",
            "condition_latents_k": "f32 [C, 1, h, w] instead of encoding keyframe k (optional)",
            "prompt_embeds": "f32 [n, hidden] instead of encoding the prompt (optional)",
            "text_token_tags": "int [n] with prompt_embeds (optional)"},
    outputs={"latents": "f32 [1, C, T, h, w]", "audio_latents": "f32 [2, C_a, T_a]"},
    run=_fl2va,
))
