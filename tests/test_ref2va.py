"""Ref2VA (references: image, video, audio) against diffusers 0.42.1's ref2va workflow.

* the packed layout (positions, tags, indices, row timesteps) against diffusers'
  `MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence` and `build_row_timesteps`, called directly, for
  mixes of image / video (with and without a soundtrack) / audio references with synthetic shapes: bit-exact;
* bad layouts refused with a message;
* requests: the checks before any work, the 16:9 default canvas and each image's encoding size (the model's
  reference short edge, sides rounded half-to-even to 32);
* the whole workflow with image references (setup resize with PIL's Lanczos, the `"<Picture k>: "` presentation
  through Qwen3-VL's vision tower, the reference encoder, conditioning noise, layout, loop on the Ref2VA
  transformer) against diffusers on random-weight fixture models, diffusers' draws injected: final latents within
  1e-3 rel-L2 for one image and for two images of different aspects; libh3's own noise streams;
* audio references, and video references (with and without a soundtrack, mixed with an image and an audio clip:
  24 fps resample, canvas of their own aspect, Qwen3-VL video blocks at 2 fps, VAE chunks, soundtrack rows) against
  the same workflow; the video presentation's token ids; the video plan (canvas, 24 fps frames, latent frames)
  against diffusers' rules; bad videos through the Engine and the CLI (one line, exit 2, nothing written).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from h3ctl import _lib
from h3ctl._lib import H3Error

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "python" / "h3ctl" / "models" / "h3-tiny"


def _diffusers_layout(tags, refs, T, H, W, Ta):
    """diffusers' layout of synthetic references: latents of the given shapes (only shapes are read)."""
    import torch
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (MiniMaxH3Ref2VAPrepareLayoutStep,
                                                                      MiniMaxH3SetTimestepsStep)

    objs, cond, audio = [], [], []
    for kind, t, h, w, ta in refs:
        objs.append(SimpleNamespace(kind=kind, has_audio=ta > 0))
        if kind != "audio":
            cond.append(torch.zeros(1, 4, t, h, w))
        if ta:
            audio.append(torch.zeros(2 * ta, 3))
    out = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
        torch.from_numpy(tags), objs, cond, audio, T, H, W, Ta, (1, 2, 2), 2, 2, 0)
    pos, tok, vix, aix, tix, ncv, nca = out
    # Row timesteps at a video / audio step of 0.5 / 0.25 (visual references max(t, 0.999), reference audio 1.0).
    uniq, inv = MiniMaxH3SetTimestepsStep.build_row_timesteps(vix, aix, ncv, nca, tix.numel(), 0.5, 0.25, 0.999, 1.0)
    return {"position_ids": pos.numpy(), "token_tags": tok.numpy(), "video_indices": vix.numpy(),
            "audio_indices": aix.numpy(), "text_indices": tix.numpy(), "n_condition": np.array([ncv, nca]),
            "row_t": uniq.numpy()[inv.numpy()]}


CASES = [
    [("image", 1, 4, 6, 0)],
    [("image", 1, 6, 4, 0), ("image", 1, 8, 8, 0)],
    [("audio", 0, 0, 0, 7), ("image", 1, 4, 4, 0)],
    [("video", 17, 2, 4, 0)],
    [("video", 7, 4, 2, 9), ("audio", 0, 0, 0, 5), ("image", 1, 2, 2, 0)],
    [("video", 2, 2, 2, 40), ("video", 16, 4, 4, 3)],                      # soundtrack longer / shorter than video
    [("image", 1, 4, 4, 0)] * 9 + [("video", 3, 2, 2, 2), ("audio", 0, 0, 0, 1), ("audio", 0, 0, 0, 4)],
]


@pytest.mark.parametrize("refs", CASES, ids=[f"refs{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("target", [(3, 4, 6, 5), (22, 2, 2, 1)])
def test_layout_matches_diffusers(refs, target):
    from h3ctl.context import Context
    from h3ctl.references import ref2va_layout

    rng = np.random.default_rng(len(refs))
    n_text = 11
    tags = np.ones(n_text, np.int64)
    tags[3:3 + rng.integers(1, 6)] = 0
    T, H, W, Ta = target
    ref = _diffusers_layout(tags, refs, T, H, W, Ta)
    with Context(TINY, threads=1) as ctx:
        got = ref2va_layout(ctx, n_text, refs, T, H, W, Ta, text_tags=tags)
    for key in ("position_ids", "token_tags", "video_indices", "audio_indices", "text_indices", "n_condition"):
        assert np.array_equal(got[key], ref[key]), key
    # libh3's roles -> the timestep diffusers assigns each row
    row_t = np.array([0.5, 0.25, 0.999, 1.0], np.float32)[got["roles"]]
    assert np.array_equal(row_t, ref["row_t"])


def test_layout_check_value():
    """The facts page's check: 116 text rows, then an image, a video with sound, an audio clip -> target t0 = 267."""
    from h3ctl.context import Context
    from h3ctl.references import ref2va_layout

    refs = [("image", 1, 128, 128, 0), ("video", 17, 48, 84, 100), ("audio", 0, 0, 0, 50)]
    tags = np.ones(116, np.int64)
    ref = _diffusers_layout(tags, refs, 31, 48, 84, 100)
    with Context(TINY, threads=1) as ctx:
        got = ref2va_layout(ctx, 116, refs, 31, 48, 84, 100, text_tags=tags)
    assert np.array_equal(got["position_ids"], ref["position_ids"])
    assert got["position_ids"][got["video_indices"][-1], 0] >= 267
    target_first = got["video_indices"][int(got["n_condition"][0])]
    assert got["position_ids"][target_first, 0] == 267.0


@pytest.mark.parametrize("refs,msg", [
    ([], "1 to 12 references"),
    ([("image", 1, 4, 4, 0)] * 13, "1 to 12 references"),
    ([("image", 2, 4, 4, 0)], "1 frame for an image"),
    ([("image", 1, 3, 4, 0)], "multiples of the patch"),
    ([("audio", 0, 0, 0, 0)], "audio latents"),
    ([(7, 1, 4, 4, 0)], "has kind 7"),
])
def test_layout_refuses(refs, msg):
    from h3ctl.context import Context
    from h3ctl.references import ref2va_layout

    with Context(TINY, threads=1) as ctx, pytest.raises(H3Error, match=msg):
        ref2va_layout(ctx, 5, refs or [("image", 1, 4, 4, 0)][:0], 3, 4, 4, 2)


# ---- requests with references: checks before any work ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_with_ref2va(tmp_path_factory):
    """h3-tiny with a Ref2VA/ partition that links to its FL2VA/ (FL2VA's model_index.json: the release's rules for
    references, unlike h3-tiny's own Ref2VA/; the checks only need its presence)."""
    d = tmp_path_factory.mktemp("tiny_ref2va")
    for p in TINY.iterdir():
        if p.name != "Ref2VA":
            (d / p.name).symlink_to(p)
    (d / "Ref2VA").symlink_to(TINY / "FL2VA")
    return d


@pytest.fixture(scope="module")
def tiny_fl2va_only(tmp_path_factory):
    """h3-tiny without its Ref2VA/ partition."""
    d = tmp_path_factory.mktemp("tiny_fl2va")
    for p in TINY.iterdir():
        if p.name != "Ref2VA":
            (d / p.name).symlink_to(p)
    return d


def _img(h, w):
    return np.full((h, w, 3), 128, np.uint8)


@pytest.mark.parametrize("refs,msg", [
    ([_img(40, 60)] * 10, "at most 9 image references"),
    ([_img(10, 50)], "1:4"),
    ([("video", _img(4, 4))], "must be a path or a dict {'frames'"),
    ([("movie", _img(4, 4))], "'movie' is not a reference kind"),
    ([{"frames": np.zeros((12, 40, 60, 3), np.uint8)}],
     "12 frames at 24 fps .* so it needs at least 13 frames at 24 fps"),
    ([{"frames": np.zeros((9, 40, 60, 3), np.uint8), "fps": 18.0}], r"12 frames at 24 fps \(9 frames at 18 fps\)"),
    ([{"frames": np.zeros((20, 40, 60, 3), np.uint8), "fps": 0.0}], "frame rate 0"),
    ([{"frames": np.zeros((20, 10, 50, 3), np.uint8)}], "1:4"),
    ([{"frames": np.zeros((20, 40, 60), np.uint8)}], "frames must be uint8"),
    ([{"frames": np.zeros((20, 40, 60, 3), np.uint8), "audio": np.zeros(800, np.float32)}],
     "a soundtrack needs its 'sample_rate'"),
    ([{"frames": np.zeros((20, 40, 60, 3), np.uint8)}] * 4, "at most 3 video references"),
    ([{"frames": np.zeros((20, 40, 60, 3), np.uint8), "audio": np.zeros(800, np.float32), "sample_rate": 2000}],
     "reference 1 \\(audio\\): audio resample: input rate 2000 Hz is outside 4000 .. 384000 Hz"),
    ([("audio", _img(4, 4))], "must be a path or a dict"),
    ([_img(40, 60), {"audio": _img(4, 4), "sample_rate": 32000}], "must be a float mono or stereo"),
    ([{"audio": np.zeros(800, np.float32), "sample_rate": 32000}], "needs at least one image or video reference"),
    ([_img(40, 60), {"audio": np.zeros((2, 0), np.float32), "sample_rate": 32000}], "no audio samples"),
    ([_img(40, 60)] + [{"audio": np.zeros(800, np.float32), "sample_rate": 32000}] * 4,
     "at most 3 audio references"),
    ([_img(40, 60), {"audio": np.zeros(800, np.float32), "sample_rate": 2000}],
     "reference 2 \\(audio\\): audio resample: input rate 2000 Hz is outside 4000 .. 384000 Hz"),
    ([_img(40, 60), {"audio": np.zeros(800, np.float32), "sample_rate": 44100.0}], "sample_rate must be a whole"),
    ([_img(40, 60), {"audio": np.zeros(800, np.float32)}], "must be a path or a dict"),
])
def test_request_refused(tiny_with_ref2va, refs, msg):
    from h3ctl import Engine

    with Engine(tiny_with_ref2va, threads=1, ref2va=True) as eng, pytest.raises(H3Error, match=msg):
        eng.plan(eng.request("x", references=refs))


def test_request_refuses_more_than_12(tiny_with_ref2va):
    from h3ctl import Engine

    refs = [_img(40, 60)] * 9 + [{"frames": np.zeros((20, 40, 60, 3), np.uint8)}] * 3 + [
        {"audio": np.zeros(800, np.float32), "sample_rate": 32000}]
    with Engine(tiny_with_ref2va, threads=1, ref2va=True) as eng, \
            pytest.raises(H3Error, match=r"references: 13 given \(1 to 12"):
        eng.plan(eng.request("x", references=refs))


def test_video_reference_plan(tiny_with_ref2va):
    """A video's 24 fps frame count, canvas (the canvas rule at its own aspect: h3-tiny's short edge 128) and latent
    frames (its first 17n + 5 frames, n >= 1, in 17-frame chunks: 5 latents a chunk, the last 3 dropped) for a
    request of 22 and of 56 frames; diffusers' resample rule (np.repeat over floor(i * 24 / fps + 0.5) slots)."""
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size
    from h3ctl import Engine

    with Engine(tiny_with_ref2va, threads=1, ref2va=True) as eng:
        for (w, h, n, fps, render) in [(60, 40, 30, 30.0, 22), (40, 60, 13, 24.0, 22), (64, 48, 50, 29.97, 56),
                                       (96, 40, 70, 24.0, 56), (50, 50, 17, 12.5, 56), (48, 80, 9, 10.0, 22),
                                       (64, 64, 2, 0.001, 22)]:  # 2 frames held 1000 s each: truncated, not looped
            got = eng.reference_video_size(w, h, n, fps, render)
            idx = np.arange(n)
            frames = MiniMaxH3Ref2VASetupStep._normalize_video_condition(
                np.broadcast_to(idx[:, None, None, None].astype(np.uint8), (n, 1, 1, 3)), fps, render, 1, 1,
                1 << 30, 24.0)
            t24 = frames.shape[0]
            ch, cw = resolve_canvas_size(w, h, 32, 128, 65536)  # h3-tiny: short edge 128, max_pixels 65536
            snapped = max(1, (t24 - 5) // 17) * 17 + 5
            enc = min(t24, snapped)
            lat = 5 * -(-enc // 17) - 3
            assert got == (cw, ch, t24, lat), (w, h, n, fps, render)


def test_request_needs_the_ref2va_partition(tiny_with_ref2va, tiny_fl2va_only):
    from h3ctl import Engine

    with Engine(tiny_fl2va_only, threads=1) as eng, pytest.raises(H3Error, match="no Ref2VA/ folder"):
        eng.plan(eng.request("x", references=[_img(40, 60)]))
    with Engine(tiny_with_ref2va, threads=1) as eng, pytest.raises(H3Error, match="open the model with the Ref2VA"):
        eng.plan(eng.request("x", references=[_img(40, 60)]))


def test_plan_defaults_to_16_9_and_sizes_references(tiny_with_ref2va):
    """References never set the canvas: 16:9 by h3-tiny's rule (short edge 128 -> 224 x 128). Each image's encoding
    size is diffusers' rule with the model's edge (h3-tiny: 2048 * 128 / 768 -> 341), rounded half-to-even to 32."""
    from h3ctl import Engine

    with Engine(tiny_with_ref2va, threads=1, ref2va=True) as eng:
        info = eng.plan(eng.request("x", references=[_img(40, 60), _img(60, 40)]))
        assert (info["width"], info["height"]) == (224, 128)
        edge = round(128 * 2048 / 768)
        for w, h in ((60, 40), (40, 60), (50, 40), (400, 100), (33, 129)):
            s = edge / min(w, h)
            want = (max(32, round(w * s / 32) * 32), max(32, round(h * s / 32) * 32))
            assert eng.reference_size(w, h) == want, (w, h)


def test_h3tiny_ref2va_renders_squares_at_its_reference_edge():
    """h3-tiny's own Ref2VA/ (model_index.json h3ctl block): trained on 128 x 128 clips and 128-pixel references, it
    says reference_image_short_edge 128 and reference_aspect 1:1, so a request without a size plans 128 x 128 and a
    4:3 reference encodes at 160 x 128 (instead of the release's 16:9 canvas and 2048-scaled edge)."""
    from h3ctl import Engine

    with Engine(TINY, threads=1, ref2va=True) as eng:
        info = eng.plan(eng.request("x", references=[_img(60, 80)]))
        assert (info["width"], info["height"]) == (128, 128)
        assert eng.reference_size(80, 60) == (160, 128)


def test_reference_aspect_needs_both_keys(tmp_path):
    """reference_aspect_width / _height replace 16:9 only together (one alone keeps 16:9)."""
    import json

    from h3ctl import Engine

    for extra, want in (({"reference_aspect_width": 4, "reference_aspect_height": 3}, (160, 128)),
                        ({"reference_aspect_width": 1}, (224, 128)), ({}, (224, 128))):
        d = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for p in TINY.iterdir():
            if p.name != "Ref2VA":
                (d / p.name).symlink_to(p)
        (d / "Ref2VA").mkdir()
        (d / "Ref2VA" / "transformer").symlink_to(TINY / "FL2VA" / "transformer")
        mi = json.loads((TINY / "FL2VA" / "model_index.json").read_text())
        mi["h3ctl"] = {**mi["h3ctl"], **extra}
        (d / "Ref2VA" / "model_index.json").write_text(json.dumps(mi))
        with Engine(d, threads=1, ref2va=True) as eng:
            info = eng.plan(eng.request("x", references=[_img(40, 60)]))
            assert (info["width"], info["height"]) == want, extra


def test_cli_without_ref2va_folder(tmp_path, tiny_fl2va_only):
    import subprocess
    import sys

    from PIL import Image

    Image.fromarray(_img(40, 60)).save(tmp_path / "a.png")
    out = tmp_path / "o.mp4"
    r = subprocess.run([sys.executable, "-m", "h3ctl", "render", "-d", str(tiny_fl2va_only), "-p", "x", "--ref-image",
                        str(tmp_path / "a.png"), "-o", str(out)], capture_output=True, text=True, cwd=ROOT / "python")
    assert r.returncode == 2 and "Ref2VA/" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


# ---- the workflow against diffusers ------------------------------------------------------------------------------

W, H, FRAMES, STEPS, SEED = 96, 64, 22, 4, 9
REF_EDGE = 64  # the fixture's reference short edge (the release's 2048 would make the CPU oracle far too slow)
CANVAS = (64, 64 * 112)  # the fixture's canvas rule (short edge, max pixels): what a video reference is put on
PROMPT = "a red circle moves right on a black background, a high beep"
TOL = 1e-3


@pytest.fixture(scope="module")
def ref2va_ckpt(tiny_models, tmp_path_factory):
    """The random-weight fixture in the official layout with a Ref2VA/ partition: the same components, another
    transformer (seed 1), and the reference short edge in its model_index.json "h3ctl" block."""
    from tests.fixtures import build_models, write_ref2va_copy

    ref_transformer = build_models("tiny", seed=1)["transformer"]
    d = write_ref2va_copy(tiny_models, tmp_path_factory.mktemp("h3_tiny_ref2va"), ref_transformer,
                          {"reference_image_short_edge": REF_EDGE, "canvas_short_edge": CANVAS[0],
                           "canvas_max_pixels": CANVAS[1]}, "f32")
    return d, ref_transformer


def _picture(seed, h, w):
    from tests.test_fl2va import keyframe

    return keyframe(seed, h, w)


@pytest.mark.parametrize("case", ["one", "two"])
def test_pipeline_matches_diffusers(case, ref2va_ckpt, tiny_models, tiny_ckpt_f32):
    """diffusers' ref2va workflow (setup resize, Qwen3-VL presentation, reference encoder, conditioning noise, layout,
    loop on transformer_ref) vs libh3 with diffusers' draws injected: final latents within 1e-3 rel-L2. "two": a
    landscape image shrunk and a portrait one enlarged (100 x 56 -> 64 x 128), so the blocks have different grids."""
    from h3ctl import Engine
    from tests.fl2va_oracle import rel_l2
    from tests.ref2va_oracle import ref2va_pipeline, run_ref2va

    d, ref_transformer = ref2va_ckpt
    images = [_picture(11, 80, 120)] + ([_picture(12, 100, 56)] if case == "two" else [])
    rng = np.random.default_rng(5)
    v = rng.standard_normal((24, 7, H // 16, W // 16)).astype(np.float32)
    a = rng.standard_normal((2, 32, 37)).astype(np.float32)
    pipe = ref2va_pipeline(tiny_models, ref_transformer, tiny_ckpt_f32 / "tokenizer", REF_EDGE)
    ref = run_ref2va(pipe, PROMPT, images, FRAMES, STEPS, v, a, width=W, height=H, seed=SEED)
    inj = {}
    for k in range(len(images)):
        inj[f"reference_noise_{k}"] = ref["cond_noise"][k]
        inj[f"reference_posterior_noise_{k}"] = ref["posterior_noise"][k]
    with Engine(d, threads=2, ref2va=True) as eng:
        for im, c in zip(images, ref["condition_latents"]):
            assert eng.reference_size(im.shape[1], im.shape[0]) == (c.shape[3] * 16, c.shape[2] * 16)
        eng.prepare(PROMPT, W, H, FRAMES, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a, references=images,
                    injected=inj)
        while eng.step() > 0:
            pass
        gv, ga = eng.latents()
    ev, ea = rel_l2(gv, ref["latents"]), rel_l2(ga, ref["audio_latents"])
    print(f"parity: ref2va {case} image reference(s) {W}x{H}x{FRAMES} {STEPS} steps: latents rel-L2 video "
          f"{ev:.2e}, audio {ea:.2e}")
    assert ev <= TOL and ea <= TOL
    if case != "two":
        return
    # the test would notice references that were ignored or misplaced: in the other order the latents are far off
    swapped = {f"reference_{kind}_{1 - k}": inj[f"reference_{kind}_{k}"] for kind in ("noise", "posterior_noise")
               for k in range(2)}
    with Engine(d, threads=2, ref2va=True) as eng:
        eng.prepare(PROMPT, W, H, FRAMES, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a,
                    references=images[::-1], injected=swapped)
        while eng.step() > 0:
            pass
        assert rel_l2(eng.latents()[0], ref["latents"]) > 100 * max(ev, 1e-7)


def test_own_noise_streams(ref2va_ckpt):
    """Without injected draws reference k's conditioning noise is stream 2 + k under the request's seed and its
    posterior noise seed 42, stream 16 (as for keyframes); a reference's draw of the wrong shape is refused."""
    from h3ctl import Engine

    def noise(seed, stream, shape):
        out = np.empty(shape, np.float32)
        _lib.check(_lib.lib().h3_noise_fill(seed, stream, 0, out.ctypes.data_as(_lib.c_float_p), out.size))
        return out

    d, _ = ref2va_ckpt
    images = [_picture(21, 64, 96), _picture(22, 100, 56)]
    shapes = [(24, 1, 64 // 16, 96 // 16), (24, 1, 128 // 16, 64 // 16)]

    def final(eng, **kw):
        eng.prepare(PROMPT, W, H, FRAMES, steps=3, seed=77, references=images, **kw)
        while eng.step() > 0:
            pass
        return eng.latents()[0]

    with Engine(d, threads=2, ref2va=True) as eng:
        plain = final(eng)
        inj = {f"reference_noise_{k}": noise(77, 2 + k, s) for k, s in enumerate(shapes)}
        inj.update({f"reference_posterior_noise_{k}": noise(42, 16, s) for k, s in enumerate(shapes)})
        assert np.array_equal(final(eng, injected=inj), plain)
        inj["reference_noise_1"] = noise(77, 5, shapes[1])
        assert not np.array_equal(final(eng, injected=inj), plain)
        with pytest.raises(H3Error, match="reference_noise_0 must have shape"):
            final(eng, injected={"reference_noise_0": np.zeros((24, 1, 2, 2), np.float32)})


AUDIO_CASES = {"image+audio": ["image", "audio"], "image,audio,image": ["image", "audio", "image"],
               "audio(mono),image,audio": ["mono", "image", "audio"]}


def _sound(seed, channels, seconds, rate=32000):
    """A deterministic test waveform: a few tones and some noise, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    w = [0.4 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) + 0.05 * rng.standard_normal(t.size)
         for _ in range(channels)]
    return np.asarray(w, np.float32)


@pytest.mark.parametrize("case", list(AUDIO_CASES))
def test_pipeline_with_audio_matches_diffusers(case, ref2va_ckpt, tiny_models, tiny_ckpt_f32):
    """diffusers' ref2va workflow with audio references (32 kHz, one longer than the render so it is truncated to
    FRAMES / 24 s, one mono duplicated to stereo) vs libh3 with diffusers' visual draws injected: final latents
    within 1e-3 rel-L2; the audio rows are encoded (posterior mode), normalised, never noised, t = 1.0."""
    from h3ctl import Engine
    from tests.fl2va_oracle import rel_l2
    from tests.ref2va_oracle import ref2va_pipeline, run_ref2va

    d, ref_transformer = ref2va_ckpt
    items, ours, n_img = [], [], 0
    for j, kind in enumerate(AUDIO_CASES[case]):
        if kind == "image":
            im = _picture(31 + n_img, 80, 120) if n_img == 0 else _picture(32, 100, 56)
            n_img += 1
            items.append(im)
            ours.append(im)
        else:
            w = _sound(40 + j, 1 if kind == "mono" else 2, 1.3 if j == 1 else 0.55)
            items.append(("audio", w, 32000))
            ours.append({"audio": w, "sample_rate": 32000})
    rng = np.random.default_rng(6)
    v = rng.standard_normal((24, 7, H // 16, W // 16)).astype(np.float32)
    a = rng.standard_normal((2, 32, 37)).astype(np.float32)
    pipe = ref2va_pipeline(tiny_models, ref_transformer, tiny_ckpt_f32 / "tokenizer", REF_EDGE)
    ref = run_ref2va(pipe, PROMPT, items, FRAMES, STEPS, v, a, width=W, height=H, seed=SEED)
    inj, k = {}, 0
    for i, it in enumerate(items):  # the draws are per visual reference; the keys are request positions
        if not isinstance(it, tuple):
            inj[f"reference_noise_{i}"] = ref["cond_noise"][k]
            inj[f"reference_posterior_noise_{i}"] = ref["posterior_noise"][k]
            k += 1
    with Engine(d, threads=2, ref2va=True) as eng:
        eng.prepare(PROMPT, W, H, FRAMES, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a, references=ours,
                    injected=inj)
        n_text = eng.render_info()["prompt_tokens"]
        while eng.step() > 0:
            pass
        gv, ga = eng.latents()
    assert n_text == ref["prompt_embeds"].shape[0]
    ev, ea = rel_l2(gv, ref["latents"]), rel_l2(ga, ref["audio_latents"])
    print(f"parity: ref2va {case} {W}x{H}x{FRAMES} {STEPS} steps: latents rel-L2 video {ev:.2e}, audio {ea:.2e}")
    assert ev <= TOL and ea <= TOL
    if case != "image+audio":
        return
    # the audio reference is not ignored: another waveform moves the result far off
    ours[1] = {"audio": _sound(99, 2, 0.55), "sample_rate": 32000}
    with Engine(d, threads=2, ref2va=True) as eng:
        eng.prepare(PROMPT, W, H, FRAMES, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a, references=ours,
                    injected=inj)
        while eng.step() > 0:
            pass
        assert rel_l2(eng.latents()[1], ref["audio_latents"]) > 100 * max(ea, 1e-7)


def test_cli_ref_audio(ref2va_ckpt, tmp_path):
    """`--ref-image` / `--ref-audio` keep their order among all references (it is the model's reading order); a
    render with them (a 16-bit WAV decoded by the bundled ffmpeg at the model's rate) writes the sound the Engine
    renders for the same references and preset; an audio file that does not exist fails with one line."""
    import subprocess
    import sys

    from PIL import Image

    from h3ctl import Engine, media
    from h3ctl.cli import build_parser
    from h3ctl.presets import DEFAULT_PRESET

    args = build_parser().parse_args(["render", "-p", "x", "--ref-image", "a.png", "--ref-audio", "s.wav",
                                      "--ref-image", "b.png", "-o", "o.mp4"])
    assert args.references == [("image", "a.png"), ("audio", "s.wav"), ("image", "b.png")]
    d, _ = ref2va_ckpt
    Image.fromarray(_picture(51, 64, 96)).save(tmp_path / "a.png")
    media.write_wav(tmp_path / "s.wav", _sound(52, 2, 0.5), 32000)
    base = [sys.executable, "-m", "h3ctl", "render", "-d", str(d), "-p", PROMPT, "--width", str(W), "--height",
            str(H), "--frames", str(FRAMES), "--steps", "3", "--seed", "5", "--threads", "2", "--overwrite",
            "-o", str(tmp_path / "o.mp4"), "--ref-image", str(tmp_path / "a.png")]
    r = subprocess.run(base + ["--ref-audio", str(tmp_path / "s.wav"), "--wav", str(tmp_path / "o.wav")],
                       capture_output=True, text=True, cwd=ROOT / "python")
    assert r.returncode == 0, r.stderr
    got = media.read_mp4_audio(tmp_path / "o.wav")
    with Engine(d, threads=2, ref2va=True) as eng:
        refs = [str(tmp_path / "a.png"), ("audio", str(tmp_path / "s.wav"))]
        want = [eng.render(PROMPT, width=W, height=H, frames=FRAMES, steps=3, seed=5, preset=DEFAULT_PRESET,
                           references=refs[:n]).audio for n in (2, 1)]
    # the WAV holds round(x * 32767) as 16-bit, which ffmpeg reads back as / 32768
    want = [np.clip(np.round(w * 32767.0), -32768, 32767) / 32768.0 for w in want]
    assert got.shape == want[0].shape and np.abs(got - want[0]).max() <= 1e-6
    assert np.abs(got - want[1]).max() > 1e-3  # without the audio reference the sound is another
    r = subprocess.run(base + ["--ref-audio", str(tmp_path / "none.wav")], capture_output=True, text=True,
                       cwd=ROOT / "python")
    assert r.returncode == 2 and "none.wav" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ---- video references against diffusers ------------------------------------------------------------------------

def _clip(seed, n, h, w, smooth=False):
    """A deterministic test clip: a bright square moving over a textured (or, `smooth`, a gradient: what survives
    H.264's 4:2:0 chroma) background, uint8 [n, h, w, 3]."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) // 2
    if smooth:
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 120 // w, y * 120 // h, (x + y) * 60 // (h + w) + 30], -1).astype(np.uint8)
    out = np.repeat(base[None], n, axis=0)
    for t in range(n):
        y, x = (3 * t) % max(1, h - 8), (5 * t) % max(1, w - 8)
        out[t, y:y + 8, x:x + 8] = (255, 200 - 5 * (t % 20), 40)
    return out


VIDEO_CASES = {
    # 30 fps -> 24 fps (frames dropped), stereo sound truncated to the render
    "video+sound": [("video", 61, 30, 48, 80, 30.0, 2)],
    # exactly 24 fps, 13 frames: no resample, fewer frames than the render, one VAE chunk (2 latents)
    "silent video": [("video", 62, 13, 40, 40, 24.0, 0)],
    # an image, a portrait video at 20 fps (frames repeated) with mono sound, an audio clip
    "image,video+sound,audio": [("image", 63), ("video", 64, 15, 80, 48, 20.0, 1), ("audio", 65)],
    # in a 39-frame render: 36 frames, 3 read at 2 fps (two blocks, the second padded), the VAE on the first 22
    "long video": [("video", 66, 36, 48, 64, 24.0, 2)],
}
VIDEO_FRAMES = {"long video": 39}


def _video_items(case):
    """(oracle items, libh3 references) of a VIDEO_CASES entry."""
    items, ours = [], []
    for spec in VIDEO_CASES[case]:
        if spec[0] == "image":
            im = _picture(spec[1], 80, 120)
            items.append(im)
            ours.append(im)
        elif spec[0] == "audio":
            w = _sound(spec[1], 2, 0.6)
            items.append(("audio", w, 32000))
            ours.append({"audio": w, "sample_rate": 32000})
        else:
            _, seed, n, h, w, fps, ch = spec
            frames = _clip(seed, n, h, w)
            sound = _sound(seed + 100, ch, 1.3) if ch else None
            items.append(("video", frames, fps, sound, 32000 if ch else None))
            ours.append({"frames": frames, "fps": fps, **({"audio": sound, "sample_rate": 32000} if ch else {})})
    return items, ours


@pytest.mark.parametrize("case", list(VIDEO_CASES))
def test_pipeline_with_video_matches_diffusers(case, ref2va_ckpt, tiny_models, tiny_ckpt_f32):
    """diffusers' ref2va workflow with video references (24 fps resample, truncation, Lanczos onto the canvas of the
    video's own aspect, the `"<Video k>: "` presentation with timestamped 2 fps blocks through Qwen3-VL's vision
    tower as video input, the VAE in 17-frame chunks, the soundtrack as audio rows before the video rows) vs libh3
    with diffusers' visual draws injected: the prompt rows and final latents within 1e-3 rel-L2."""
    from h3ctl import Engine
    from tests.fl2va_oracle import rel_l2
    from tests.ref2va_oracle import ref2va_pipeline, run_ref2va

    d, ref_transformer = ref2va_ckpt
    items, ours = _video_items(case)
    frames = VIDEO_FRAMES.get(case, FRAMES)
    with Engine(d, threads=1, ref2va=True) as eng:
        info = eng.plan(eng.request(PROMPT, W, H, frames, references=ours))
    rng = np.random.default_rng(7)
    v = rng.standard_normal((24, info["latent_frames"], H // 16, W // 16)).astype(np.float32)
    a = rng.standard_normal((2, info["audio_latent_channels"], info["audio_latents"])).astype(np.float32)
    pipe = ref2va_pipeline(tiny_models, ref_transformer, tiny_ckpt_f32 / "tokenizer", REF_EDGE, CANVAS)
    ref = run_ref2va(pipe, PROMPT, items, frames, STEPS, v, a, width=W, height=H, seed=SEED)
    inj, k = {}, 0
    for i, it in enumerate(items):  # the draws are per visual reference; the keys are request positions
        if not (isinstance(it, tuple) and it[0] == "audio"):
            inj[f"reference_noise_{i}"] = ref["cond_noise"][k]
            inj[f"reference_posterior_noise_{i}"] = ref["posterior_noise"][k]
            k += 1
    with Engine(d, threads=2, ref2va=True) as eng:
        visual = [it for it in items if not (isinstance(it, tuple) and it[0] == "audio")]
        for it, c in zip(visual, ref["condition_latents"]):
            if isinstance(it, tuple):  # a video: the canvas of its own aspect, 5n + 2 latent frames
                cw, ch, _, lt = eng.reference_video_size(it[1].shape[2], it[1].shape[1], it[1].shape[0], it[2],
                                                         frames)
                assert (lt, ch // 16, cw // 16) == c.shape[1:], (lt, ch, cw, c.shape)
        eng.prepare(PROMPT, W, H, frames, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a, references=ours,
                    injected=inj)
        n_text = eng.render_info()["prompt_tokens"]
        while eng.step() > 0:
            pass
        gv, ga = eng.latents()
    assert n_text == ref["prompt_embeds"].shape[0]
    ev, ea = rel_l2(gv, ref["latents"]), rel_l2(ga, ref["audio_latents"])
    print(f"parity: ref2va {case} {W}x{H}x{frames} {STEPS} steps: latents rel-L2 video {ev:.2e}, audio {ea:.2e}")
    assert ev <= TOL and ea <= TOL
    if case != "video+sound":
        return
    # the video and its sound are not ignored: other frames, or the sound dropped, move the result far off
    with Engine(d, threads=2, ref2va=True) as eng:
        for other in ({**ours[0], "frames": ours[0]["frames"][::-1].copy()},
                      {"frames": ours[0]["frames"], "fps": ours[0]["fps"]}):
            eng.prepare(PROMPT, W, H, FRAMES, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a,
                        references=[other], injected=inj)
            while eng.step() > 0:
                pass
            ov, oa = eng.latents()
            assert max(rel_l2(ov, ref["latents"]), rel_l2(oa, ref["audio_latents"])) > 100 * max(ev, ea, 1e-7)


def test_video_presentation_matches_diffusers(ref2va_ckpt, tiny_models, tiny_ckpt_f32, monkeypatch):
    """The presentation of a 40-frame video (4 frames sampled at 2 fps, two blocks "<0.2 seconds>", "<1.2
    seconds>") with sound, and of a 25-frame one at 25 fps (-> 24 frames: 2 sampled; its label "<Video 2>"): token
    ids and tags against diffusers' MiniMaxH3Ref2VATextEncoderStep, fed the setup step's normalised frames."""
    import torch
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3 import encoders
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3VideoReference
    from h3ctl import Engine
    from tests.ref2va_oracle import ref2va_pipeline

    d, ref_transformer = ref2va_ckpt
    pipe = ref2va_pipeline(tiny_models, ref_transformer, tiny_ckpt_f32 / "tokenizer", REF_EDGE, CANVAS)
    frames = 56
    clips = [(_clip(71, 40, 64, 96), 24.0, _sound(73, 2, 0.5)), (_clip(72, 25, 96, 64), 25.0, None)]
    seen = {}
    real = encoders.get_qwen3vl_prompt_embeds

    def spy(text_encoder, processor, token_ids, vision_inputs=None, **kw):
        seen["ids"] = list(token_ids)
        return real(text_encoder, processor, token_ids, vision_inputs, **kw)

    monkeypatch.setattr(encoders, "get_qwen3vl_prompt_embeds", spy)
    norm = [MiniMaxH3VideoReference(frames=MiniMaxH3Ref2VASetupStep._normalize_video_condition(
        c, fps, frames, 32, CANVAS[0], CANVAS[1], 24.0), fps=24.0, audio=None if s is None else torch.from_numpy(s),
        sample_rate=None if s is None else 32000) for c, fps, s in clips]
    state = PipelineState()
    state.set("prompt", PROMPT)
    state.set("normalized_references", norm)
    with torch.no_grad():
        _, state = encoders.MiniMaxH3Ref2VATextEncoderStep()(pipe, state)
    tags = state.get("text_token_tags").numpy()
    text = pipe.tokenizer.decode(seen["ids"])
    assert "<Audio 1>: <Video 1>: <0.2 seconds>" in text and "<1.2 seconds>" in text and "<Video 2>: " in text
    with Engine(d, threads=2, ref2va=True) as eng:
        eng.prepare(PROMPT, W, H, frames, steps=2, seed=1, references=[
            {"frames": c, "fps": fps, **({} if s is None else {"audio": s, "sample_rate": 32000})}
            for c, fps, s in clips])
        ids = eng.prompt_tokens()
    assert list(ids) == seen["ids"]
    assert len(tags) == len(ids) and (tags == 0).sum() > 0


def test_cli_ref_video(ref2va_ckpt, tmp_path):
    """`--ref-video` (with its sound) / `--ref-silent-video` keep their place among all references; a file is
    decoded with the bundled ffmpeg (frames, rate, soundtrack at its own rate) and renders what the Engine renders for the
    same decoded media; a missing, a malformed and a too-short video, and more than 3 videos, fail with one line,
    exit 2 and nothing written."""
    from h3ctl import Engine, media
    from h3ctl.cli import build_parser
    from h3ctl.presets import DEFAULT_PRESET
    from tests.h3cli import assert_clean_error, run

    args = build_parser().parse_args(["render", "-p", "x", "--ref-video", "v.mp4", "--ref-image", "a.png",
                                      "--ref-silent-video", "s.mp4", "--ref-audio", "s.wav", "-o", "o.mp4"])
    assert args.references == [("video", "v.mp4"), ("image", "a.png"), ("silent_video", "s.mp4"), ("audio", "s.wav")]
    d, _ = ref2va_ckpt
    clip = _clip(81, 20, 48, 80, smooth=True)
    media.write_mp4(tmp_path / "v.mp4", clip, _sound(82, 2, 1.0), 32000)
    frames, fps, pcm, rate = media.read_video(tmp_path / "v.mp4")
    assert frames.shape == clip.shape and fps == 24.0 and rate == 32000 and pcm.shape[0] == 2 and pcm.shape[1] >= 28000
    assert np.abs(frames.astype(int) - clip).mean() < 4  # lossy H.264, measured against the source
    base = ["render", "-d", d, "-p", PROMPT, "--width", W, "--height", H, "--frames", FRAMES, "--steps", 2,
            "--seed", 5, "--threads", 2, "--overwrite"]
    out = tmp_path / "o.wav"
    r = run(*base, "--ref-video", tmp_path / "v.mp4", "--wav", out, "-o", "")
    assert r.returncode == 0, r.stderr
    got = media.read_mp4_audio(out)
    with Engine(d, threads=2, ref2va=True) as eng:
        want = [eng.render(PROMPT, width=W, height=H, frames=FRAMES, steps=2, seed=5, preset=DEFAULT_PRESET,
                           references=[(kind, str(tmp_path / "v.mp4"))]).audio for kind in ("video", "silent_video")]
    want = [np.clip(np.round(w * 32767.0), -32768, 32767) / 32768.0 for w in want]
    assert got.shape == want[0].shape and np.abs(got - want[0]).max() <= 1e-6
    assert np.abs(got - want[1]).max() > 1e-3  # without its sound the render is another
    # bad input: one line, exit 2, nothing written
    (tmp_path / "bad.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    media.write_mp4(tmp_path / "short.mp4", clip[:12], None, 32000)
    o = tmp_path / "x.mp4"
    for extra, needles in [(["--ref-video", tmp_path / "none.mp4"], ["none.mp4", "no such file"]),
                           (["--ref-video", tmp_path / "bad.mp4"], ["bad.mp4", "cannot be decoded as video"]),
                           (["--ref-silent-video", tmp_path / "short.mp4"], ["reference 1 (video)", "at least 13"]),
                           (["--ref-video", tmp_path / "v.mp4"] * 4, ["at most 3 video references"]),
                           (["--ref-image", tmp_path / "a.png"] * 9 + ["--ref-video", tmp_path / "v.mp4"] * 3
                            + ["--ref-audio", tmp_path / "s.wav"], ["13 given (1 to 12"])]:
        if not (tmp_path / "a.png").exists():
            from PIL import Image

            Image.fromarray(_picture(83, 64, 96)).save(tmp_path / "a.png")
            media.write_wav(tmp_path / "s.wav", _sound(84, 2, 0.5), 32000)
        r = run(*base, *extra, "-o", o)
        assert_clean_error(r, *needles)
        assert not o.exists()


def test_engine_video_files(tiny_with_ref2va, tmp_path):
    """Engine references by path: a video whose sound is at 44.1 kHz decodes to 44.1 kHz stereo (libh3 resamples
    it as an audio reference) at its container's rate (NTSC 30000/1001 recovered exactly from ffmpeg's "29.97 fps"); ("silent_video", path)
    drops the sound; a malformed file, a missing one and a file without video are refused with one message."""
    from h3ctl import Engine, media

    clip = _clip(91, 15, 40, 64, smooth=True)
    media.write_mp4(tmp_path / "a.mp4", clip, _sound(92, 2, 0.5, rate=44100), 44100)
    frames, fps, pcm, rate = media.read_video(tmp_path / "a.mp4")
    assert frames.shape == clip.shape and fps == 24.0 and rate == 44100
    assert pcm.shape[0] == 2 and abs(pcm.shape[1] - 22050) <= 1600  # 0.5 s (+ the AAC priming) at 44.1 kHz
    assert media._video_rate("Stream #0:0: Video: h264, yuv420p, 64x40, 29.97 fps, 29.97 tbr") == 30000 / 1001
    assert media._video_rate("Stream #0:0: Video: h264, yuv420p, 64x40, 12.5 fps, 12.5 tbr") == 12.5
    (tmp_path / "bad.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    media.write_wav(tmp_path / "s.wav", _sound(93, 2, 0.3), 32000)
    with Engine(tiny_with_ref2va, threads=1, ref2va=True) as eng:
        req = eng.request("x", references=[("silent_video", str(tmp_path / "a.mp4"))])
        ref = ctypes_ref(req, 0)
        assert (ref.kind, ref.frames, ref.width, ref.height, ref.fps, bool(ref.pcm)) == (1, 15, 64, 40, 24.0, False)
        ref = ctypes_ref(eng.request("x", references=[("video", str(tmp_path / "a.mp4"))]), 0)
        assert bool(ref.pcm) and ref.channels == 2 and ref.sample_rate == 44100
        for path, msg in [("bad.mp4", "cannot be decoded as video"), ("none.mp4", "no such file"),
                          ("s.wav", "cannot be decoded as video: no video stream")]:
            with pytest.raises(H3Error, match=f"reference video 1: .*{path}: {msg}"):
                eng.request("x", references=[("video", str(tmp_path / path))])


def ctypes_ref(req, k):
    """The k-th h3_reference of a request built by Engine.request."""
    import ctypes

    return ctypes.cast(req.references, ctypes.POINTER(_lib.H3Reference))[k]
