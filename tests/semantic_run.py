"""Render world prompts with libh3 (the embedded h3-tiny) and with diffusers' modular pipeline on the same weights
and the same injected noise, and score both with the semantic checks of train/evaluate.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h3ctl import Engine
from h3ctl.engine import EMBEDDED_MODEL
from train import evaluate, world

W = H = 128
FRAMES = 22


def heldout(n: int):
    specs = world.heldout_specs()
    return specs[:n]


def noise(engine: Engine, prompt: str, seed: int):
    """libh3's own initial noise for (prompt, seed), read back so diffusers can start from the same tensors."""
    engine.prepare(prompt, W, H, FRAMES, steps=2, seed=seed)
    return engine.latents()


def libh3_render(engine: Engine, prompt: str, steps: int, seed: int):
    r = engine.render(prompt, W, H, FRAMES, steps=steps, seed=seed)
    return r.frames, r.audio


def diffusers_models():
    from tests.fixtures import read_official_to_diffusers

    part = Path(EMBEDDED_MODEL) / "FL2VA"
    return read_official_to_diffusers(part), part / "tokenizer"


def diffusers_render(pipe, prompt: str, steps: int, v: np.ndarray, a: np.ndarray):
    from tests.pipeline_oracle import run

    video, audio = run(pipe, prompt, W, H, FRAMES, steps, v, a)
    frames = np.round(np.clip(video[0], 0, 1) * 255).astype(np.uint8)
    return frames, audio[0]


def score(spec, frames, audio):
    return evaluate.check(spec, frames, audio)["checks"]
