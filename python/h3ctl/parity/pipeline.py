"""Parity stage `pipeline`: prompt + injected noise -> decoded video and stereo audio, end to end."""

from __future__ import annotations

import numpy as np

from .._lib import H3Error
from . import Stage, open_engine, register


def _scalar(inputs, name, default=None):
    if name not in inputs:
        if default is None:
            raise H3Error(f"parity pipeline: input tensor missing: {name}")
        return default
    v = np.asarray(inputs[name])
    if v.size != 1 or v.dtype.kind not in "iu":
        raise H3Error(f"parity pipeline: '{name}' must be one integer, got {v.dtype} {list(v.shape)}")
    return int(v.reshape(-1)[0])


def _run(model_dir, inputs, options):
    prompt = np.asarray(inputs["prompt"])
    if prompt.dtype != np.uint8 or prompt.ndim != 1:
        raise H3Error("parity pipeline: 'prompt' must be a 1-D uint8 tensor of UTF-8 bytes")
    try:
        text = prompt.tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise H3Error(f"parity pipeline: prompt is not UTF-8 ({e})") from None
    lat = np.asarray(inputs["latents"], dtype=np.float32)
    alat = np.asarray(inputs["audio_latents"], dtype=np.float32)
    if lat.ndim == 5:
        if lat.shape[0] != 1:
            raise H3Error(f"parity pipeline: latents must be [1, C, T, h, w], got {list(lat.shape)}")
        lat = lat[0]
    with open_engine(model_dir, options) as eng:
        req = eng.request(text, width=_scalar(inputs, "width"), height=_scalar(inputs, "height"),
                          frames=_scalar(inputs, "num_frames"), steps=_scalar(inputs, "num_inference_steps"), seed=0,
                          video_noise=lat, audio_noise=alat)
        res = eng.run(req, decode="f32")
    return {"videos": res.frames[None], "audio": res.audio[None]}


register(Stage(
    name="pipeline",
    doc="t2va end to end with injected noise, as diffusers' MiniMaxH3ModularPipeline(prompt, height, width, "
        "num_frames, num_inference_steps, latents, audio_latents, output_type='np')",
    inputs={"prompt": "uint8 [bytes] UTF-8", "latents": "f32 [1, C, T, H/16, W/16] video noise",
            "audio_latents": "f32 [2, C_a, T_a] audio noise", "height": "int [1]", "width": "int [1]",
            "num_frames": "int [1]", "num_inference_steps": "int [1]"},
    outputs={"videos": "f32 [1, F, H, W, 3] in [0, 1]", "audio": "f32 [1, 2, samples]"},
    run=_run,
))
