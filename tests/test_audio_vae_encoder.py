"""libh3 audio VAE encoding vs diffusers 0.42.1 (the oracle), on small random audio VAEs written in the official
layout, and once on h3-tiny's own encoder weights.

Compared quantities:
  * `mean`: AutoencoderKLMiniMaxH3Audio.encode(pcm[:, None]).latent_dist.mode() -> [channels, C, frames]
    (h3_audio_encode: each channel a batch item of the mono VAE, zero-padded to a multiple of the hop);
  * Ref2VA rows: MiniMaxH3Ref2VAEncodeStep's (mode.transpose(1, 2) - latents_mean) / latents_std reshaped to
    [channels * frames, C] (h3_audio_latent_rows).
Tolerance: rel-L2 <= 1e-5 (f32) for both.

A checkpoint whose encoder-side tensors (encoder.*, pre_block.*, mean_proj.*, logs_proj.*) are BF16 (h3-tiny's, to
fit its package budget) is held against diffusers loaded from the same BF16-rounded weights in f32, at the same
tolerance; the rounding itself moves the output by far more than that, so BF16 read as anything else would show.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYDIR = os.path.join(ROOT, "python")
for p in (ROOT, PYDIR):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402  (test extra)

from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.parity import audio_encode as PA  # noqa: E402
from tests.audio_vae_oracle import (ENCODER_PREFIXES, bf16_encoder_, build_audio_vae, rel_l2, threads,  # noqa: E402
                                    write_audio_vae)

TOL = 1e-5
H3_TINY = os.path.join(PYDIR, "h3ctl", "models", "h3-tiny")


@pytest.fixture(scope="module")
def vaes(tmp_path_factory):
    out = {}
    for name in ("tiny", "weird"):
        model = build_audio_vae(name, seed=5)
        out[name] = (model, write_audio_vae(model, tmp_path_factory.mktemp(f"aenc_{name}")))
    return out


def pcm_for(channels: int, samples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / 32000.0
    tone = 0.4 * np.sin(2 * np.pi * (220 + 110 * np.arange(channels))[:, None] * t)
    return (tone + 0.1 * rng.standard_normal((channels, samples))).astype(np.float32)


def diffusers_mean(model, pcm: np.ndarray) -> np.ndarray:
    with threads(1), torch.no_grad():
        return model.encode(torch.from_numpy(pcm)[:, None]).latent_dist.mode().numpy()


def diffusers_rows(model, mean: np.ndarray) -> np.ndarray:
    """The normalisation and layout lines of MiniMaxH3Ref2VAEncodeStep."""
    mu = torch.tensor(model.config.latents_mean).view(1, 1, -1)
    sd = torch.tensor(model.config.latents_std).view(1, 1, -1)
    lat = torch.from_numpy(mean).transpose(1, 2)
    return ((lat - mu) / sd).reshape(-1, model.config.latent_channels).numpy()


def check(model, root, pcm, what):
    ref = diffusers_mean(model, pcm)
    with Context(root, threads=2) as ctx:
        got = PA.encode(ctx, pcm)
        rows = PA.latent_rows(ctx, got)
    assert got.shape == ref.shape
    err = rel_l2(got, ref)
    rerr = rel_l2(rows, diffusers_rows(model, ref))
    print(f"parity: audio_encode {what}: mean rel-L2 {err:.3g}, rows rel-L2 {rerr:.3g}")
    assert err <= TOL and rerr <= TOL
    return got


# (config, channels, samples): mono and stereo; lengths odd, below one hop, not a multiple of the hop, exact.
CASES = [("tiny", 1, 1601), ("tiny", 2, 2399), ("tiny", 2, 800), ("tiny", 1, 37), ("weird", 2, 1001),
         ("weird", 1, 60)]


@pytest.mark.parametrize("name,channels,samples", CASES, ids=[f"{n}-{c}ch-{s}" for n, c, s in CASES])
def test_parity_with_diffusers(vaes, name, channels, samples):
    model, root = vaes[name]
    check(model, root, pcm_for(channels, samples, seed=samples), f"{name} {channels}ch {samples} samples")


def test_shape_and_channels_are_independent(vaes):
    """Stereo = two mono items: the right channel encodes as it does alone."""
    model, root = vaes["tiny"]
    pcm = pcm_for(2, 1700, seed=1)
    with Context(root, threads=2) as ctx:
        assert PA.encode_shape(ctx, 1700) == (32, 3)
        both = PA.encode(ctx, pcm)
        right = PA.encode(ctx, pcm[1])
    assert np.array_equal(both[1], right[0])


def test_thread_count_does_not_change_a_bit(vaes):
    model, root = vaes["tiny"]
    pcm = pcm_for(2, 3203, seed=2)
    outs = []
    for n in (1, 3):
        with Context(root, threads=n) as ctx:
            outs.append(PA.encode(ctx, pcm))
    assert np.array_equal(outs[0], outs[1])


def test_parity_stage(vaes):
    from h3ctl.parity import STAGES

    model, root = vaes["tiny"]
    pcm = pcm_for(2, 2000, seed=4)
    out = STAGES["audio_encode"].run(str(root), {"audio": pcm[:, None]}, {})
    ref = diffusers_mean(model, pcm)
    assert rel_l2(out["mean"], ref) <= TOL
    assert rel_l2(out["rows"], diffusers_rows(model, ref)) <= TOL


@pytest.mark.parametrize("name,channels,samples", [("tiny", 2, 2399), ("weird", 1, 1001)])
def test_bf16_encoder_weights(name, channels, samples, tmp_path):
    import copy

    from safetensors import safe_open

    model = build_audio_vae(name, seed=6)
    root = write_audio_vae(model, tmp_path / "bf16", encoder_bf16=True)
    with safe_open(str(root / "FL2VA" / "audio_vae" / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert {d for k, d in dtypes.items() if k.startswith(ENCODER_PREFIXES)} == {"BF16"}
    assert {d for k, d in dtypes.items() if not k.startswith(ENCODER_PREFIXES)} == {"F32"}
    pcm = pcm_for(channels, samples, seed=samples)
    rounded = bf16_encoder_(copy.deepcopy(model))
    got = check(rounded, root, pcm, f"{name} {channels}ch {samples} samples, BF16 encoder weights")
    # the rounding is visible: against the unrounded weights libh3's output is far outside the tolerance
    assert rel_l2(got, diffusers_mean(model, pcm)) > 20 * TOL


def test_f16_encoder_weights_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    root = write_audio_vae(build_audio_vae("tiny", seed=6), tmp_path / "f16", encoder_bf16=True)
    f = root / "FL2VA" / "audio_vae" / "model.safetensors"
    sd = load_file(str(f))
    sd["pre_block.attn.v_bias"] = sd["pre_block.attn.v_bias"].to(torch.float16)
    save_file(sd, str(f))
    with Context(root, threads=1) as ctx:
        with pytest.raises(H3Error, match="'pre_block.attn.v_bias' is F16, expected F32 or BF16"):
            PA.encode(ctx, pcm_for(1, 900, 0))


def test_h3_tiny_weights():
    from diffusers import AutoencoderKLMiniMaxH3Audio
    from safetensors.torch import load_file

    from tests.fixtures import official as F

    d = os.path.join(H3_TINY, "FL2VA", "audio_vae")
    with open(os.path.join(d, "config.json")) as f:
        top = json.load(f)
    with open(os.path.join(d, "metadata.json")) as f:
        meta = json.load(f)
    vae = AutoencoderKLMiniMaxH3Audio(**F.audio_vae_diffusers_config(top, meta)).eval().requires_grad_(False)
    vae.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=True)
    check(vae, H3_TINY, pcm_for(2, 32000 + 123, seed=7), "h3-tiny 2ch 1 s + 123")


# ---- errors -----------------------------------------------------------------------------------------------------


def test_bad_input(vaes):
    _, root = vaes["tiny"]
    with Context(root, threads=1) as ctx:
        with pytest.raises(H3Error, match="samples per channel must be between 1"):
            PA.encode(ctx, np.zeros((2, 0), np.float32))
        with pytest.raises(H3Error, match="3 channels; the audio VAE encodes mono"):
            PA.encode(ctx, np.zeros((3, 900), np.float32))
        with pytest.raises(H3Error, match="floating point"):
            PA.encode(ctx, np.zeros((1, 900), np.int16))
        with pytest.raises(H3Error, match="audio rows: 3 channels"):
            PA.latent_rows(ctx, np.zeros((3, 32, 2), np.float32))


def test_missing_encoder_weights(vaes, tmp_path):
    """A VAE without encoder tensors still loads; encoding says what is missing."""
    model, _ = vaes["tiny"]
    root = write_audio_vae(model, tmp_path / "noenc", drop="encoder.block.0.weight_v")
    with Context(root, threads=1) as ctx:
        with pytest.raises(H3Error, match="model has no audio VAE encoder weights .*encoder.block.0.weight_v"):
            PA.encode(ctx, pcm_for(1, 900, 0))
    root = write_audio_vae(model, tmp_path / "noattn", drop="pre_block.attn.v_bias")
    with Context(root, threads=1) as ctx:
        with pytest.raises(H3Error, match="pre_block.attn.v_bias"):
            PA.encode(ctx, pcm_for(1, 900, 0))
