"""Named sigma grids for few-step (distilled) models (docs/few-step.md); libh3 computes them (core/schedule.c).

`h3ctl render --schedule NAME` or `Engine.request(schedule=NAME)`; by default a model or LoRA that declares one
(model_index.json "h3ctl": {"schedule": NAME}, LoRA metadata "h3ctl_schedule", a PDD head bank) gets its own.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import _lib
from ._lib import H3Error

# What each grid is for (the order libh3 lists them in).
ABOUT = {
    "h3": "MiniMaxH3Scheduler with the model's shifts (the release: 12 / 3)",
    "turbo-544p": "shifts 12 / 3: lightx2v Minimax-h3-Turbo 544p (v0.1 / v1.0), larryvrh Turbo LoRA",
    "turbo-768p": "shifts 6 / 3: lightx2v Minimax-h3-Turbo v1.0 768p",
    "pdd": "shifts 12 / 3: alibaba-pai Acc LoRAs (euler + simple; its heads switch per step)",
    "h3c-lowstep": "h3.c's low-step grid: base 1 - i/E in f32, shifts 12 / 3, terminal 0",
}


def names() -> list[str]:
    out, i = [], 0
    while True:
        n = _lib.lib().h3_schedule_name(i)
        if n is None:
            return out
        out.append(n.decode())
        i += 1


def sigmas(name: str, steps: int, shift_video: float = 12.0, shift_audio: float = 3.0):
    """(video, audio) float32 sigma grids of `steps` points (terminal 0 included) of schedule `name`."""
    v = np.zeros(max(int(steps), 1), np.float32)
    a = np.zeros_like(v)
    n = _lib.lib().h3_schedule_sigmas(name.encode(), int(steps), float(shift_video), float(shift_audio),
                                      v.ctypes.data_as(_lib.c_float_p), a.ctypes.data_as(_lib.c_float_p))
    if n < 0:
        raise H3Error(_lib.last_error() or f"schedule {name!r}: error {n}")
    return v[:n].copy(), a[:n].copy()


def declared(engine, req) -> str | None:
    """The schedule a request's model or LoRA files declare (libh3 h3_schedule_declared), or None."""
    buf = ctypes.create_string_buffer(64)
    rc = _lib.lib().h3_schedule_declared(engine._ctx.ptr, ctypes.byref(getattr(req, "c", req)), buf, 64)  # a Request or its h3_request
    if rc < 0:
        raise H3Error(_lib.last_error() or f"schedule: error {rc}")
    return buf.value.decode() if rc else None
