"""libh3 video VAE encoding vs diffusers 0.42.1 (the oracle), on tiny random video VAEs written in the official
layout, and once on h3-tiny's own encoder weights.

Compared quantities:
  * `mean`, `logvar`: AutoencoderKLMiniMaxH3.encode(pixels).latent_dist.mean / .logvar (the log-variance clamped
    to [-30, 20]) -> [C, Tl, h, w] (h3_video_encode);
  * condition latents: diffusers' own `encode_vae_condition` (uint8 -> ImageNet -> encode -> posterior sample with
    the generator seeded 42 -> float16 -> latents_mean / latents_std), with libh3 given the same posterior noise
    (drawn here exactly as DiagonalGaussianDistribution.sample draws it) -> [C, Tl, h, w].
Tolerances: rel-L2 <= 1e-5 (f32) for mean and logvar, single tiles and blended tiles alike; the condition latents
go through a float16 rounding, so a few elements may sit one float16 step apart: rel-L2 <= 1e-4, at most 1% of
the elements differing at all, and none by more than one float16 step.
"""

from __future__ import annotations

import os
import subprocess
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

from h3ctl.parity import vae_encode as PE  # noqa: E402
from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from tests import vvae_oracle as O  # noqa: E402

torch.set_num_threads(1)  # the reference encodes are tiny; OpenMP threads contend on a shared machine

TOL = 1e-5
TOL_COND = 1e-4  # the float16 rounding: an element one float16 step off weighs up to ~5e-4 / sqrt(elements)
H3_TINY = os.path.join(PYDIR, "h3ctl", "models", "h3-tiny")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The fixture geometry `tiny` (4 levels, the released down-sampling pattern truncated, 2 ResNet blocks)."""
    vae = O.build_video_vae("tiny", seed=3)
    return vae, O.write_video_vae(vae, tmp_path_factory.mktemp("venc_tiny"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """`wide`: the released 6-level structure (levels 4 and 5 without a downsampler)."""
    vae = O.build_video_vae("wide", seed=4)
    return vae, O.write_video_vae(vae, tmp_path_factory.mktemp("venc_wide"))


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """`odd`: non-power-of-two channels (8, 16, 24, 24), one ResNet block per level."""
    vae = O.build_video_vae("odd", seed=5)
    return vae, O.write_video_vae(vae, tmp_path_factory.mktemp("venc_odd"))


def pixels(T, H, W, seed=0):
    """ImageNet-normalised-looking pixels: uniform [0, 1) through the ImageNet statistics."""
    x = np.random.default_rng(seed).random((3, T, H, W), dtype=np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None, None]
    return (x - mean) / std


@torch.no_grad()
def reference(vae, x, tile=0, overlap=0, untiled=False):
    with O.tiling(vae, tile, overlap, untiled):
        post = vae.encode(torch.from_numpy(x)[None]).latent_dist
    return post.mean[0].numpy(), post.logvar[0].numpy()


def check(vae, root, x, *, tile=0, overlap=0, untiled=False, threads=2):
    ref_mean, ref_logvar = reference(vae, x, tile, overlap, untiled)
    with Context(root, threads=threads) as ctx:
        shape = PE.encode_shape(ctx, *x.shape[1:], tile_px=tile, overlap_px=overlap, untiled=untiled)
        mean, logvar = PE.encode(ctx, x, tile_px=tile, overlap_px=overlap, untiled=untiled)
    assert shape == mean.shape == logvar.shape == ref_mean.shape, (shape, mean.shape, ref_mean.shape)
    e_mean, e_logvar = O.rel_l2(mean, ref_mean), O.rel_l2(logvar, ref_logvar)
    print(f"parity: video_encode T={x.shape[1]} {x.shape[3]}x{x.shape[2]} tile={tile or 'cfg'} untiled={untiled} "
          f"-> {list(mean.shape)}: mean rel-L2 {e_mean:.2e}, logvar rel-L2 {e_logvar:.2e} (tol {TOL:g})")
    assert e_mean <= TOL and e_logvar <= TOL
    return mean, logvar


# ---- parity: single frames --------------------------------------------------------------------------------------


@pytest.mark.parametrize("H,W", [(64, 64), (48, 80), (37, 50)])
def test_single_frame(tiny, H, W):
    """One frame -> one latent frame through the spatial encoder; 37 x 50 is valid but no multiple of 16."""
    vae, root = tiny
    check(vae, root, pixels(1, H, W, seed=H + W))


def test_single_frame_default_tiles(tiny):
    """Wider than the config's 256 px tile: two tiles blended over their (widened) overlap."""
    vae, root = tiny
    mean, _ = check(vae, root, pixels(1, 48, 304, seed=1))
    assert mean.shape == (24, 1, 3, 19)


@pytest.mark.parametrize("H,W,tile,overlap", [(112, 144, 64, 32), (80, 100, 48, 16)])
def test_single_frame_blended_tiles(tiny, H, W, tile, overlap):
    """A grid of small tiles (both axes blended), the last tiles stopping at the frame's edge in the second."""
    vae, root = tiny
    check(vae, root, pixels(1, H, W, seed=H), tile=tile, overlap=overlap)


def test_untiled(tiny):
    vae, root = tiny
    check(vae, root, pixels(1, 96, 112, seed=4), untiled=True)


# ---- parity: frame stacks ---------------------------------------------------------------------------------------


def test_clip_17_frames(tiny):
    """One 17-frame clip: 5 latent frames, of which token_drop (3) are dropped."""
    vae, root = tiny
    mean, _ = check(vae, root, pixels(17, 32, 48, seed=7))
    assert mean.shape[1] == 2


def test_two_clips_padded(tiny):
    """22 frames: two clips, the second padded by repeating frame 21 -> 2 x 5 - 3 = 7 latent frames."""
    vae, root = tiny
    mean, _ = check(vae, root, pixels(22, 32, 32, seed=8))
    assert mean.shape[1] == 7


def test_clip_blended_tiles(tiny):
    vae, root = tiny
    check(vae, root, pixels(17, 48, 80, seed=9), tile=32, overlap=16)


def test_wide_released_structure(wide):
    vae, root = wide
    check(vae, root, pixels(1, 64, 48, seed=10))
    check(vae, root, pixels(17, 32, 32, seed=11))


def test_odd_config(odd):
    vae, root = odd
    check(vae, root, pixels(1, 48, 64, seed=12), tile=32, overlap=16)
    check(vae, root, pixels(5, 32, 48, seed=13))


def test_too_small_tile_refused_like_diffusers(odd):
    """56 px in 32 px tiles leaves a 24 px tile; its 3 px at level 3 downsample to 1 (the downsampler gives
    floor(n / 2), not the ceil its docstring says), which conv_out cannot reflect-pad: diffusers raises, and libh3
    refuses the request before any work."""
    vae, root = odd
    x = pixels(1, 40, 56, seed=12)
    with pytest.raises(RuntimeError, match="Padding size should be less than"):
        reference(vae, x, 32, 16)
    with Context(root) as ctx, pytest.raises(H3Error, match="24x32-pixel tile is too small for the encoder"):
        PE.encode(ctx, x, tile_px=32, overlap_px=16)


def test_threads_bitwise_identical(tiny):
    _, root = tiny
    x = pixels(5, 48, 64, seed=14)
    outs = []
    for threads in (1, 2, 3):
        with Context(root, threads=threads) as ctx:
            mean, logvar = PE.encode(ctx, x, tile_px=32, overlap_px=16)
        outs.append(mean.tobytes() + logvar.tobytes())
    assert outs[0] == outs[1] == outs[2]


# ---- the condition latent ---------------------------------------------------------------------------------------


@torch.no_grad()
def reference_condition(vae, rgb):
    """diffusers' encode_vae_condition itself, and the posterior noise it drew (replayed: same generator, shape and
    dtype as DiagonalGaussianDistribution.sample)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition
    from diffusers.utils.torch_utils import randn_tensor

    px = torch.from_numpy(np.ascontiguousarray(rgb.transpose(3, 0, 1, 2)))[None]
    mean_stats, std_stats = O._pixel_stats()
    with O.tiling(vae):
        lat = encode_vae_condition(vae, px, mean_stats, std_stats)[0].numpy()
    eps = randn_tensor((1, *lat.shape), generator=torch.Generator().manual_seed(42), dtype=torch.float32)[0].numpy()
    return lat, eps


@pytest.mark.parametrize("T,H,W", [(1, 64, 80), (1, 48, 272), (17, 32, 32)])
def test_condition_latent(tiny, T, H, W):
    vae, root = tiny
    rgb = np.random.default_rng(T + H).integers(0, 256, (T, H, W, 3), dtype=np.uint8)
    ref, eps = reference_condition(vae, rgb)
    with Context(root, threads=2) as ctx:
        out = PE.encode_condition(ctx, rgb, eps=eps)
        drawn = PE.encode_condition(ctx, rgb)  # libh3's own noise: the same recipe, another draw
    assert out.shape == ref.shape
    both = np.isfinite(out) & np.isfinite(ref)
    err, differ = O.rel_l2(out[both], ref[both]), float(np.mean(out != ref))
    print(f"parity: vae_condition T={T} {W}x{H}: rel-L2 {err:.2e}, {differ:.2%} of elements not bit-identical")
    assert err <= TOL_COND and differ <= 0.01
    # An element that differs is one float16 step away: its f32 latent sat next to a float16 rounding boundary.
    m = np.array(vae.config.latents_mean, np.float32)[:, None, None, None]
    s = np.array(vae.config.latents_std, np.float32)[:, None, None, None]
    # Random weights can give log-variances at the clamp (std e^10), whose samples overflow float16 to inf in
    # diffusers: libh3 must overflow on the same elements.
    fin = np.isfinite(ref)
    assert np.array_equal(fin, np.isfinite(out)) and np.array_equal(out[~fin], ref[~fin])
    z, z_ref = (out * s + m)[fin], (ref * s + m)[fin]
    step = np.spacing(np.abs(z_ref).astype(np.float16)).astype(np.float32)
    # ... up to the float32 rounding of normalising and un-normalising here (|z| + |latents_mean| ulps).
    slack = 1e-6 * (np.abs(z_ref) + np.broadcast_to(np.abs(m), out.shape)[fin])
    assert np.all(np.abs(z - z_ref) <= 1.01 * step + slack)
    assert drawn.shape == ref.shape and np.all(np.isfinite(drawn)) and not np.array_equal(drawn, out)


def test_condition_f16_rounding(tiny):
    """The sampled latent goes through float16: every output times latents_std plus latents_mean is a float16
    value (up to the normalisation's own rounding)."""
    vae, root = tiny
    rgb = np.random.default_rng(1).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    with Context(root) as ctx:
        out = PE.encode_condition(ctx, rgb, eps=np.zeros((24, 1, 2, 2), np.float32))
        mean, _ = PE.encode(ctx, (rgb[0].astype(np.float32).transpose(2, 0, 1)[:, None] / 255
                                  - np.array([0.485, 0.456, 0.406], np.float32)[:, None, None, None])
                            / np.array([0.229, 0.224, 0.225], np.float32)[:, None, None, None])
    m = np.array(vae.config.latents_mean, np.float32)[:, None, None, None]
    s = np.array(vae.config.latents_std, np.float32)[:, None, None, None]
    # eps = 0: the latent is the mean rounded to float16, then normalised.
    expect = (mean.astype(np.float16).astype(np.float32) - m) / s
    assert np.array_equal(out, expect)


# ---- h3-tiny's real encoder -------------------------------------------------------------------------------------


def test_h3_tiny_weights_128():
    import json

    from diffusers import AutoencoderKLMiniMaxH3
    from safetensors.torch import load_file

    from tests.fixtures import official as F

    d = os.path.join(H3_TINY, "FL2VA", "video_vae")
    with open(os.path.join(d, "config.json")) as f:
        top = json.load(f)
    with open(os.path.join(d, "source", "config.json")) as f:
        src = json.load(f)
    cfg = F.video_vae_diffusers_config(top, src)
    vae = AutoencoderKLMiniMaxH3(**cfg).eval().requires_grad_(False)
    sd = F.video_vae_official_to_diffusers(load_file(os.path.join(d, "source", "model.safetensors")),
                                           int(cfg["decoder_num_attention_heads"]))
    vae.load_state_dict(sd, strict=True)
    check(vae, H3_TINY, pixels(1, 128, 128, seed=15))


# ---- errors -----------------------------------------------------------------------------------------------------


def test_missing_encoder_weights(tiny, tmp_path):
    """A video VAE without encoder tensors still decodes; encoding says what is missing."""
    vae, _ = tiny
    names = O.F.video_vae_state_dict_to_official(vae.state_dict(), int(vae.config.decoder_num_attention_heads))
    keys = [k for k in names if k.startswith(("encoder.", "quant_conv."))]
    root = O.write_video_vae(vae, tmp_path / "noenc", drop=tuple(keys))
    from h3ctl.parity import vae_video as PV

    with Context(root) as ctx:
        _, sample = PV.decode(ctx, np.zeros((24, 3, 2, 2), np.float32), raw=True, want_rgb=False)
        assert np.all(np.isfinite(sample))
        with pytest.raises(H3Error, match="model has no video VAE encoder weights") as ei:
            PE.encode(ctx, pixels(1, 32, 32))
        assert ei.value.code == 4
        with pytest.raises(H3Error, match="model has no video VAE encoder weights"):
            PE.encode_condition(ctx, np.zeros((32, 32, 3), np.uint8))


def test_one_missing_tensor(tiny, tmp_path):
    vae, _ = tiny
    root = O.write_video_vae(vae, tmp_path / "broken", drop=("encoder.down.2.block.1.conv2.weight",))
    with Context(root) as ctx, pytest.raises(H3Error, match=r"encoder\.down\.2\.block\.1\.conv2\.weight"):
        PE.encode(ctx, pixels(1, 32, 32))


def test_invalid_requests(tiny):
    _, root = tiny
    with Context(root) as ctx:
        with pytest.raises(H3Error, match="too small for the encoder"):
            PE.encode(ctx, pixels(1, 16, 64))  # the last level would see 1 x 4 pixels
        with pytest.raises(H3Error, match="impossible input shape"):
            PE.encode_shape(ctx, 0, 32, 32)
        with pytest.raises(H3Error, match="multiples of 16"):
            PE.encode(ctx, pixels(1, 64, 64), tile_px=40, overlap_px=16)
        with pytest.raises(H3Error, match="smaller than the tile"):
            PE.encode(ctx, pixels(1, 64, 64), tile_px=32, overlap_px=32)
        with pytest.raises(H3Error, match="3 channels"):
            PE.encode(ctx, np.zeros((4, 1, 32, 32), np.float32))
        with pytest.raises(H3Error, match="floating point"):
            PE.encode(ctx, np.zeros((3, 1, 32, 32), np.int32))
        with pytest.raises(H3Error, match="uint8"):
            PE.encode_condition(ctx, np.zeros((32, 32, 3), np.float32))
        with pytest.raises(H3Error, match="eps has shape"):
            PE.encode_condition(ctx, np.zeros((32, 32, 3), np.uint8), eps=np.zeros((24, 1, 3, 3), np.float32))


# ---- the parity stage and its CLI -------------------------------------------------------------------------------


def test_cli_stages(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    vae, root = tiny
    x = pixels(1, 48, 64, seed=16)
    rgb = np.random.default_rng(2).integers(0, 256, (1, 32, 48, 3), dtype=np.uint8)
    ref_lat, eps = reference_condition(vae, rgb)
    save_file({"pixels": x[None]}, str(tmp_path / "px.safetensors"))
    save_file({"pixels": np.ascontiguousarray(rgb.transpose(3, 0, 1, 2))[None], "eps": eps[None]},
              str(tmp_path / "cond.safetensors"))
    env = dict(os.environ, PYTHONPATH=PYDIR)
    for stage, inp in (("video_encode", "px"), ("vae_condition", "cond")):
        r = subprocess.run([sys.executable, "-m", "h3ctl", "parity", stage, "--model", str(root), "--inputs",
                            str(tmp_path / f"{inp}.safetensors"), "--out", str(tmp_path / f"{stage}.safetensors")],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
    enc = load_file(str(tmp_path / "video_encode.safetensors"))
    ref_mean, ref_logvar = reference(vae, x)
    assert O.rel_l2(enc["mean"][0], ref_mean) <= TOL and O.rel_l2(enc["logvar"][0], ref_logvar) <= TOL
    lat = load_file(str(tmp_path / "vae_condition.safetensors"))["latents"]
    assert lat.shape == (1, *ref_lat.shape) and O.rel_l2(lat[0], ref_lat) <= TOL
