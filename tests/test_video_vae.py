"""libh3 video VAE decoding vs diffusers 0.42.1 (the oracle), on tiny random checkpoints in the official layout.

Compared quantities:
  * `sample`: AutoencoderKLMiniMaxH3.decode(latents * std + mean) -> [3, F, H, W] (libh3 with H3_VIDEO_RAW);
  * `videos`: MiniMaxH3VideoDecodeStep(output_type="np") run itself -> [1, F, H, W, 3] in [0, 1]
    (libh3's float output and the `video_decode` parity stage);
  * uint8 frames: the VideoProcessor's (videos * 255).round().astype(uint8).
Tolerances: rel-L2 <= 1e-5 for single-tile decodes, <= 1e-4 where tiles blend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYDIR = os.path.join(ROOT, "python")
for p in (ROOT, PYDIR):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402  (test extra)
import diffusers  # noqa: E402,F401

from h3ctl.parity import vae_video as PV  # noqa: E402
from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from tests import vvae_oracle as O  # noqa: E402

# One torch thread: the reference decodes are tiny, and on a shared machine OpenMP threads contending for cores
# made them 10x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tiny_models, tiny_ckpt):
    """The session's tiny checkpoint (official layout, F32 VAE) and the diffusers video VAE it was written from."""
    return tiny_models["video_vae"], tiny_ckpt


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    vae = O.build_video_vae("odd", seed=1)
    return vae, O.write_video_vae(vae, tmp_path_factory.mktemp("vvae_odd"))


def latents(C, T, h, w, seed=0):
    return np.random.default_rng(seed).standard_normal((C, T, h, w), dtype=np.float32)


def check_parity(vae, root, lat, *, tile=0, overlap=0, untiled=False, tol=1e-5, threads=2):
    with O.tiling(vae, tile, overlap, untiled):
        ref_sample = O.reference_sample(vae, lat)
        ref_videos = O.reference_videos(vae, lat)
    with Context(root, threads=threads) as ctx:
        _, sample = PV.decode(ctx, lat, tile_px=tile, overlap_px=overlap, untiled=untiled, raw=True, want_rgb=False)
        rgb, videos = PV.decode(ctx, lat, tile_px=tile, overlap_px=overlap, untiled=untiled)
    assert sample.shape == ref_sample.shape and videos[None].shape == ref_videos.shape
    e_sample, e_videos = O.rel_l2(sample, ref_sample), O.rel_l2(videos[None], ref_videos)
    print(f"parity: video_decode T={lat.shape[1]} {lat.shape[2] * 16}x{lat.shape[3] * 16} tile={tile or 'cfg'} "
          f"untiled={untiled}: sample rel-L2 {e_sample:.2e}, videos rel-L2 {e_videos:.2e} (tol {tol:g})")
    assert e_sample <= tol, f"vae.decode sample rel-L2 {e_sample:.3g} > {tol}"
    assert e_videos <= tol, f"decode-step videos rel-L2 {e_videos:.3g} > {tol}"
    # uint8: libh3 rounds its own floats exactly as the VideoProcessor does ...
    assert np.array_equal(rgb, O.to_uint8(videos))
    # ... so against diffusers only values sitting on a .5 boundary may differ, by one step.
    ref_u8 = O.to_uint8(ref_videos[0])
    diff = np.abs(rgb.astype(np.int16) - ref_u8)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    return e_sample, e_videos


# ---- parity ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T,frames", [(7, 22), (12, 39), (17, 56)])
def test_parity_single_tile(tiny, T, frames):
    vae, root = tiny
    lat = latents(24, T, 4, 6, seed=T)  # 64 x 96 px: smaller than one 256 px tile
    with Context(root) as ctx:
        assert PV.decode_shape(ctx, T, 4, 6) == (frames, 64, 96)
    check_parity(vae, root, lat, tol=1e-5)


def test_parity_untiled(tiny):
    vae, root = tiny
    check_parity(vae, root, latents(24, 12, 6, 10, seed=3), untiled=True, tol=1e-5)


@pytest.mark.parametrize("T,h,w,tile,overlap", [
    (7, 6, 10, 64, 32),   # 96 x 160 px: 2 x 4 tiles, visited column by column
    (12, 6, 10, 64, 16),  # 2 x 3 tiles, slack spread over the overlaps
    (17, 6, 10, 64, 32),  # 3 windows
    (12, 10, 6, 64, 32),  # 160 x 96 px portrait: 4 x 2 tiles, visited row by row
])
def test_parity_blended_tiles(tiny, T, h, w, tile, overlap):
    """Tiles blended in both directions (and windows cross-faded)."""
    vae, root = tiny
    check_parity(vae, root, latents(24, T, h, w, seed=10 + T + h), tile=tile, overlap=overlap, tol=1e-4)


def test_parity_padded_latent_count(tiny):
    """T = 9 is not 5n + 2: diffusers repeats the last latent and cuts the extra frames (30 frames)."""
    vae, root = tiny
    with Context(root) as ctx:
        assert PV.decode_shape(ctx, 9, 3, 5)[0] == 30
        assert PV.decode_shape(ctx, 3, 3, 5)[0] == 9
        with pytest.raises(H3Error, match="at least 3"):
            PV.decode_shape(ctx, 2, 3, 5)
    check_parity(vae, root, latents(24, 9, 6, 6, seed=9), tile=64, overlap=32, tol=1e-4)


def test_parity_odd_config(odd):
    """3 heads, 2 registers, ffn_mult 2, 3 layers; tiles 48 px with the slack spread over the overlaps."""
    vae, root = odd
    check_parity(vae, root, latents(24, 12, 5, 7, seed=5), tile=48, overlap=16, tol=1e-4)


def test_default_tiling_matches_diffusers_default(tiny):
    """No options: 256 px tiles, 64 px overlap, as diffusers' on-by-default tiling (288 x 64 px -> 2 x 1 tiles)."""
    vae, root = tiny
    check_parity(vae, root, latents(24, 7, 18, 4, seed=4), tol=1e-4)


# ---- determinism, callbacks -------------------------------------------------------------------------------------


def test_threads_bitwise_identical(tiny):
    _, root = tiny
    lat = latents(24, 12, 6, 10, seed=21)
    outs = []
    for threads in (1, 2, 3):
        with Context(root, threads=threads) as ctx:
            rgb, videos = PV.decode(ctx, lat, tile_px=64, overlap_px=16)
            _, sample = PV.decode(ctx, lat, tile_px=64, overlap_px=16, raw=True, want_rgb=False)
        outs.append((rgb.tobytes(), videos.tobytes(), sample.tobytes()))
    assert outs[0] == outs[1] == outs[2]


def test_progress_and_cancel(tiny):
    _, root = tiny
    lat = latents(24, 12, 6, 10, seed=2)
    seen = []
    with Context(root, threads=1) as ctx:
        PV.decode(ctx, lat, tile_px=64, overlap_px=32, progress=lambda ph, d, t: seen.append((ph, d, t)))
        assert seen == [("video_decode", i, 16) for i in range(17)]  # 0, then 2 windows x 2 x 4 tiles
        with pytest.raises(H3Error, match="cancelled") as ei:
            PV.decode(ctx, lat, tile_px=64, overlap_px=32, progress=lambda ph, d, t: d == 3)
        assert ei.value.code == 6


def test_invalid_requests(tiny):
    _, root = tiny
    lat = latents(24, 7, 4, 4)
    with Context(root) as ctx:
        with pytest.raises(H3Error, match="24"):
            PV.decode(ctx, latents(16, 7, 4, 4))
        with pytest.raises(H3Error, match="multiples of 16"):
            PV.decode(ctx, lat, tile_px=40, overlap_px=16)
        with pytest.raises(H3Error, match="smaller than the tile"):
            PV.decode(ctx, lat, tile_px=32, overlap_px=32)


# ---- memory -----------------------------------------------------------------------------------------------------


def test_workspace_bounded_by_tile_and_window(tiny):
    """The library's own accounting: the workspace does not grow with the number of frames, and for a large
    canvas it is a small fraction of the float video (it holds one tile, the overlap strips and the 5 frames the
    temporal cross-fade needs)."""
    _, root = tiny
    with Context(root) as ctx:
        ws = {T: PV.decode_workspace(ctx, T, 48, 48, tile_px=64, overlap_px=16) for T in (7, 12, 32, 107)}
        assert ws[12] == ws[32] == ws[107]
        assert ws[7] < ws[12]  # a single window keeps no frames for a cross-fade
        F, H, W = PV.decode_shape(ctx, 107, 48, 48)
        float_video = F * H * W * 3 * 4
        assert ws[107] * 15 < float_video
        # The untiled decode holds the whole window: far more than the tiled one.
        assert PV.decode_workspace(ctx, 7, 48, 48, untiled=True) > 4 * ws[7]


def test_peak_memory_measured(tiny):
    """Decode 56 frames of 384 x 384 into uint8 in a fresh process (no torch) and measure the peak RSS growth
    during the call (Linux: VmHWM reset through /proc/self/clear_refs): it must stay near the reported
    workspace, far below the float video it never holds."""
    assert os.path.exists("/proc/self/clear_refs"), "this measurement needs Linux (/proc/self/clear_refs)"
    _, root = tiny
    code = textwrap.dedent(f"""
        import ctypes, json, re, numpy as np
        import h3ctl._lib as L
        from h3ctl.context import Context
        from h3ctl.parity import vae_video as PV

        def kib(key):
            return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

        lat = np.random.default_rng(0).standard_normal((24, 17, 24, 24), dtype=np.float32)
        with Context({str(root)!r}, threads=2) as ctx:
            F, H, W = PV.decode_shape(ctx, 17, 24, 24)
            ws = PV.decode_workspace(ctx, 17, 24, 24, tile_px=64, overlap_px=16)
            PV.decode(ctx, lat[:, :7, :4, :4], tile_px=64, overlap_px=16)  # start the pool, size its scratch
            rgb = np.ones((F, H, W, 3), np.uint8)  # the caller's output, touched before measuring
            o = PV._opts(64, 16)
            open("/proc/self/clear_refs", "w").write("5")  # peak RSS := current RSS
            before = kib("VmRSS")
            rc = L.lib().h3_video_decode(ctx.ptr, lat.ctypes.data_as(L.c_float_p), 24, 17, 24, 24,
                                         ctypes.byref(o), rgb.ctypes.data_as(L.c_uint8_p), None)
            peak = kib("VmHWM")
        print(json.dumps(dict(rc=rc, grow=(peak - before) * 1024, ws=ws, float_video=F * H * W * 3 * 4,
                              mean=float(rgb.mean()))))
    """)
    env = dict(os.environ, PYTHONPATH=PYDIR)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"peak RSS growth {r['grow'] / 2**20:.1f} MiB, workspace {r['ws'] / 2**20:.1f} MiB, "
          f"float video {r['float_video'] / 2**20:.1f} MiB")
    assert r["rc"] == 0 and 0 < r["mean"] < 255
    assert r["float_video"] > 90e6
    assert r["grow"] >= r["ws"] // 2, r  # the measurement sees the workspace being used ...
    assert r["grow"] <= r["ws"] + 8 * 2**20, r  # ... and little else (GEMM scratch, page granularity)
    assert r["grow"] * 4 < r["float_video"], r


# ---- the parity stage and its CLI -------------------------------------------------------------------------------


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=PYDIR)
    return subprocess.run([sys.executable, "-m", "h3ctl", *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_stage_matches_decode_step(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    vae, root = tiny
    lat = latents(24, 7, 6, 6, seed=8)[None]
    save_file({"latents": lat}, str(tmp_path / "in.safetensors"))
    r = run_cli("parity", "video_decode", "--model", str(root), "--inputs", str(tmp_path / "in.safetensors"),
                "--out", str(tmp_path / "out.safetensors"), "--threads", "2")
    assert r.returncode == 0, r.stderr
    videos = load_file(str(tmp_path / "out.safetensors"))["videos"]
    ref = O.reference_videos(vae, lat)  # diffusers' default tiling
    assert videos.shape == ref.shape == (1, 22, 96, 96, 3)
    assert O.rel_l2(videos, ref) <= 1e-5


def test_cli_bad_inputs(tiny, tmp_path):
    from safetensors.numpy import save_file

    vae, root = tiny
    save_file({"latents": latents(16, 7, 4, 4)[None]}, str(tmp_path / "bad.safetensors"))
    out = tmp_path / "out.safetensors"
    r = run_cli("parity", "video_decode", "--model", str(root), "--inputs", str(tmp_path / "bad.safetensors"),
                "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "16 channels" in r.stderr
    assert not out.exists()

    broken = O.write_video_vae(vae, tmp_path / "broken", drop=("decoder.transformer_blocks.1.ff.w1.weight",))
    save_file({"latents": latents(24, 7, 4, 4)[None]}, str(tmp_path / "ok.safetensors"))
    r = run_cli("parity", "video_decode", "--model", str(broken), "--inputs", str(tmp_path / "ok.safetensors"),
                "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "decoder.transformer_blocks.1.ff.w1.weight" in r.stderr and "missing" in r.stderr
    assert not out.exists()
