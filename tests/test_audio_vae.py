"""Audio VAE decoding (libh3 `h3_audio_decode`, stage `audio_decode`) against diffusers 0.42.1.

The oracle is diffusers' own `MiniMaxH3AudioDecodeStep` (de-normalisation with latents_mean/std, then
`AutoencoderKLMiniMaxH3Audio.decode` on the two stereo sides as a batch) run on tiny random models written in the
official layout (identity mapping of the diffusers state dict). Every alias-free activation gets its own perturbed
resampling filters, so agreement also shows that each activation's stored filters are the ones used.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
import torch  # noqa: E402  (test extra)
import diffusers  # noqa: E402,F401

from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.parity.vae_audio import audio_decode, audio_info, audio_samples  # noqa: E402
from tests.audio_vae_oracle import build_audio_vae, diffusers_decode, latents_for, rel_l2, write_audio_vae  # noqa: E402

REL_TOL = 1e-5
H3_E_CANCELLED = 6


@pytest.fixture(scope="module")
def vaes(tmp_path_factory):
    out = {}
    for name in ("tiny", "odd", "weird"):
        model = build_audio_vae(name)
        out[name] = (model, write_audio_vae(model, tmp_path_factory.mktemp(f"avae_{name}")))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Parity
# ---------------------------------------------------------------------------------------------------------------

# 37 frames ~ 22 video frames at 24 fps, 93 ~ 56 frames (the default 864x480x56 render).
CASES = [("tiny", 1), ("tiny", 37), ("tiny", 93), ("odd", 1), ("odd", 22), ("weird", 1), ("weird", 13)]


@pytest.mark.parametrize("name,frames", CASES, ids=[f"{n}-Ta{f}" for n, f in CASES])
def test_parity_with_diffusers(vaes, name, frames):
    model, root = vaes[name]
    lat = latents_for(model, frames, seed=frames)
    ref = diffusers_decode(model, lat)
    with Context(root, threads=2) as ctx:
        pcm = audio_decode(ctx, lat)
    assert ref.shape == (1,) + pcm.shape
    # The random weights keep the waveform well inside [-1, 1], so this measures the network, not the clamp.
    assert np.mean(np.abs(ref) >= 1.0) < 0.01
    err = rel_l2(pcm[None], ref)
    print(f"parity: audio_decode {name} Ta={frames}: rel-L2 {err:.3g}, max abs {np.abs(pcm[None] - ref).max():.3g}")
    assert err <= REL_TOL


def test_clipping_matches(tmp_path):
    # A 40x conv_post gain drives most samples past +-1: the clamp must give exactly +-1 where diffusers does.
    from unittest import mock

    model = build_audio_vae("odd", seed=3, post_gain=40.0)
    root = write_audio_vae(model, tmp_path)
    lat = latents_for(model, 11, seed=5)
    ref = diffusers_decode(model, lat)[0]
    with mock.patch.object(torch, "clamp", lambda x, min, max: x):  # the waveform before the clamp
        pre = diffusers_decode(model, lat)[0]
    with Context(root, threads=2) as ctx:
        pcm = audio_decode(ctx, lat)
    assert np.array_equal(ref, np.clip(pre, -1, 1))
    over, under = np.abs(pre) > 1 + 1e-4, np.abs(pre) < 1 - 1e-4  # clear of the rounding-ambiguous edge
    assert over.mean() > 0.2 and under.mean() > 0.05
    assert np.array_equal(pcm[over], np.sign(pre[over])) and np.abs(pcm).max() <= 1.0
    assert np.all(np.abs(pcm[under]) < 1.0)
    assert rel_l2(pcm[under], ref[under]) <= REL_TOL and rel_l2(pcm, ref) <= REL_TOL


def test_cli_parity_stage(vaes, tmp_path):
    from safetensors.numpy import load_file, save_file

    model, root = vaes["odd"]
    lat = latents_for(model, 9, seed=9)
    save_file({"audio_latents": lat}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    proc = _cli("parity", "audio_decode", "--model", str(root), "--inputs", str(tmp_path / "in.safetensors"),
                "--out", str(out), "--threads", "2")
    assert proc.returncode == 0, proc.stderr
    audio = load_file(str(out))["audio"]
    ref = diffusers_decode(model, lat)
    assert audio.shape == ref.shape and audio.dtype == np.float32
    assert rel_l2(audio, ref) <= REL_TOL


# ---------------------------------------------------------------------------------------------------------------
# Determinism, geometry, progress
# ---------------------------------------------------------------------------------------------------------------


def test_thread_count_does_not_change_a_bit(vaes):
    model, root = vaes["tiny"]
    lat = latents_for(model, 37, seed=1)
    outs = []
    for threads in (1, 2, 3):
        with Context(root, threads=threads) as ctx:
            outs.append(audio_decode(ctx, lat).tobytes())
    assert outs[0] == outs[1] == outs[2]


def test_info_and_samples(vaes):
    with Context(vaes["tiny"][1]) as ctx:
        assert audio_info(ctx) == {"latent_channels": 32, "sample_rate": 32000, "hop": 800}
        assert [audio_samples(ctx, f) for f in (1, 37, 93)] == [800, 29600, 74400]
        with pytest.raises(H3Error):
            audio_samples(ctx, 0)
        est = ctx.memory_estimate(864, 480, 56, 64)["phases"]["audio_decode"]
        assert est["pcm"] == 2 * 4 * 800 * round(56 / 24 * 40) and est["activations"] > 0 and est["weights"] > 0
    with Context(vaes["weird"][1]) as ctx:
        # (k - u) odd in the last stage: ConvTranspose1d yields u * L + 1 samples there, as in torch.
        assert audio_samples(ctx, 13) == 796 == diffusers_decode(vaes["weird"][0], latents_for(vaes["weird"][0], 13, 0)).shape[-1]


def test_progress_and_cancel(vaes):
    model, root = vaes["odd"]
    lat = latents_for(model, 4, seed=2)
    seen = []
    with Context(root, threads=1) as ctx:
        audio_decode(ctx, lat, progress=lambda d, t: seen.append((d, t)))
        # permille of the work: non-decreasing, ending at 1000 of 1000
        assert seen and seen[-1] == (1000, 1000) and all(b[0] >= a[0] for a, b in zip(seen, seen[1:]))
        assert len({d for d, _ in seen}) > 3
        with pytest.raises(H3Error) as e:
            audio_decode(ctx, lat, progress=lambda d, t: d > seen[2][0])
        assert e.value.code == H3_E_CANCELLED

        def boom(d, t):
            raise KeyError("from the callback")

        with pytest.raises(KeyError):
            audio_decode(ctx, lat, progress=boom)
        assert audio_decode(ctx, lat).shape == (2, 4 * 800)  # the context still works


# ---------------------------------------------------------------------------------------------------------------
# Bad input through the CLI: one line, exit 2, no output file
# ---------------------------------------------------------------------------------------------------------------


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "h3ctl", *args], capture_output=True, text=True, env=env)


def _bad_run(tmp_path, root, lat):
    from safetensors.numpy import save_file

    save_file({"audio_latents": lat}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    proc = _cli("parity", "audio_decode", "--model", str(root), "--inputs", str(tmp_path / "in.safetensors"),
                "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("h3ctl: error: "), proc.stderr
    assert not out.exists() and not list(tmp_path.glob("out.safetensors*"))
    return lines[0]


def test_bad_channel_count(vaes, tmp_path):
    msg = _bad_run(tmp_path, vaes["odd"][1], np.zeros((2, 31, 5), np.float32))
    assert "31 channels" in msg and "expects 32" in msg


def test_bad_latent_shape(vaes, tmp_path):
    msg = _bad_run(tmp_path, vaes["odd"][1], np.zeros((3, 32, 5), np.float32))
    assert "[2, channels, frames]" in msg


def test_missing_tensor(vaes, tmp_path):
    name = "decoder.resblocks.4.activations.3.upsample.filter"
    root = write_audio_vae(vaes["odd"][0], tmp_path / "m", drop=name)
    msg = _bad_run(tmp_path, root, np.zeros((2, 32, 5), np.float32))
    assert name in msg and "missing" in msg


def test_weight_g_shape_wrong(vaes, tmp_path):
    name = "decoder.ups.1.0.weight_g"
    root = write_audio_vae(vaes["odd"][0], tmp_path / "m", reshape={name: (12, 1, 1)})
    msg = _bad_run(tmp_path, root, np.zeros((2, 32, 5), np.float32))
    assert name in msg and "[12, 1, 1]" in msg and "[24, 1, 1]" in msg


def test_overflowing_rates_are_a_config_error(vaes, tmp_path):
    # 64^6 overflows int: the config reader must report it, not divide by a wrapped hop.
    import json

    root = write_audio_vae(vaes["odd"][0], tmp_path / "m")
    meta_path = root / "FL2VA" / "audio_vae" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["metadata"]["kwargs"].update(decoder_rates=[64] * 6, decoder_kernel_sizes=[128] * 6)
    meta_path.write_text(json.dumps(meta))
    msg = _bad_run(tmp_path, root, np.zeros((2, 32, 5), np.float32))
    assert "decoder hop" in msg
