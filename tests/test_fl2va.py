"""First / last frame conditioning (FL2VA) against diffusers 0.42.1's fl2va workflow.

* keyframe preprocessing: PIL's Lanczos bit for bit, the canvas rule (resolve_canvas_size), and the placement of
  MiniMaxH3ResizeStep (stretch / cover-crop) through the `keyframes` parity stage;
* the packed layout's last-keyframe time (numpy's pairwise sum) for every frame count up to 140 and a few large ones;
* the whole workflow (resize, Qwen3-VL with its vision tower, the keyframe VAE encoder, conditioning noise, layout,
  loop) on random-weight fixture models for first only, last only and both, through the `fl2va` parity stage with
  diffusers' random draws injected: final latents within 1e-3 rel-L2; and the layout and sampler alone, with
  diffusers' own prompt embeddings and condition latents fed to both sides;
* libh3's own noise streams for keyframes (keyframe.h), the Python API (path or array), the CLI;
* malformed image files through the decoder: one H3Error naming the file, never anything else.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from h3ctl import Engine, _lib, media
from h3ctl._lib import H3Error
from tests.fl2va_oracle import fl2va_pipeline, rel_l2, run_core, run_fl2va
from tests.h3cli import run as cli

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "python" / "h3ctl" / "models" / "h3-tiny"
PROMPT = "a red circle moves right on a black background, a high beep"
TOL = 1e-3


def keyframe(seed: int, h: int, w: int) -> np.ndarray:
    """A smooth gradient with noise: content a resampler and an encoder both have to get right."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    smooth = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(h + w - 2, 1)], -1)
    return np.clip(smooth + rng.normal(0, 35, (h, w, 3)), 0, 255).astype(np.uint8)


def h3_resize(img: np.ndarray, w: int, h: int, cover: int = 0) -> np.ndarray:
    out = np.empty((h, w, 3), np.uint8)
    img = np.ascontiguousarray(img)
    _lib.check(_lib.lib().h3_keyframe_resize(img.ctypes.data_as(_lib.c_uint8_p), img.shape[1], img.shape[0], w, h,
                                             cover, out.ctypes.data_as(_lib.c_uint8_p)))
    return out


def h3_canvas(ctx, w: int, h: int) -> tuple[int, int]:
    cw, ch = ctypes.c_int(), ctypes.c_int()
    _lib.check(_lib.lib().h3_keyframe_canvas(ctx.ptr, w, h, ctypes.byref(cw), ctypes.byref(ch)))
    return cw.value, ch.value


def run_stage(name: str, model: Path, inputs: dict, tmp_path: Path) -> dict:
    from h3ctl import parity, stages  # noqa: F401  (stages registers the stages)

    src, dst = tmp_path / f"{name}_in.safetensors", tmp_path / f"{name}_out.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in inputs.items()}, str(src))
    parity.run(name, str(model), str(src), str(dst), {"threads": 2})
    return load_file(str(dst))


# ---- keyframe preprocessing --------------------------------------------------------------------------------------


def test_lanczos_matches_pil_bit_for_bit():
    """Both pass orders of Pillow 13 (vertical first when the height shrinks by more than twice as many pixels as
    the width), up- and downscaling, one axis only, the 1:4 / 4:1 extremes."""
    from PIL import Image

    rng = np.random.default_rng(7)
    cases = [(64, 48, 160, 128), (171, 130, 157, 86), (42, 106, 36, 29), (103, 79, 85, 49), (9, 36, 148, 30),
             (120, 30, 512, 128), (30, 120, 32, 128), (50, 40, 50, 17), (50, 40, 93, 40), (7, 5, 1344, 768)]
    for _ in range(120):
        w, h = (int(v) for v in rng.integers(4, 180, 2))
        if 4 * h >= w and 4 * w >= h:
            cases.append((w, h, *(int(v) for v in rng.integers(4, 260, 2))))
    for i, (w, h, W, H) in enumerate(cases):
        img = keyframe(i, h, w) if i % 2 else (rng.random((h, w, 3)) * 255).astype(np.uint8)
        ref = np.asarray(Image.fromarray(img).resize((W, H), Image.Resampling.LANCZOS))
        got = h3_resize(img, W, H)
        assert np.array_equal(got, ref), f"{w}x{h} -> {W}x{H}: {int((got != ref).sum())} values differ"


def _diffusers_keyframes(first, last, width, height, short_edge, max_pixels):
    from types import SimpleNamespace

    from diffusers.image_processor import VaeImageProcessor
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3ResizeStep
    from PIL import Image

    comps = SimpleNamespace(image_processor=VaeImageProcessor(vae_scale_factor=16), canvas_multiple=32,
                            config=SimpleNamespace(canvas_short_edge=short_edge, canvas_max_pixels=max_pixels))
    state = PipelineState()
    for name, img in (("image", first), ("last_image", last)):
        state.set(name, None if img is None else Image.fromarray(img))
    state.set("height", height)
    state.set("width", width)
    MiniMaxH3ResizeStep()(comps, state)
    return state.get("width"), state.get("height"), [np.asarray(k) for k in state.get("keyframes")]


@pytest.mark.parametrize("case", [("first", None), ("last", None), ("both", (96, 64)), ("both", None),
                                  ("both-tall", (64, 128)), ("first", (160, 96))])
def test_keyframes_stage_matches_the_resize_step(case, tmp_path):
    """h3-tiny's canvas rule (short edge 128, 256 x 256 pixels) given to diffusers' step as its configs; the
    follower cover-cropped with round() sizes and (resized - canvas) // 2 offsets."""
    which, size = case
    first = keyframe(1, 75, 131) if which != "last" else None
    last = keyframe(2, 90, 70) if which != "first" else None
    if which == "both-tall":
        last = keyframe(3, 33, 131)
    width, height = size if size else (None, None)
    ew, eh, expected = _diffusers_keyframes(first, last, width, height, 128, 256 * 256)
    inputs = {k: v for k, v in (("image", first), ("last_image", last)) if v is not None}
    if size:
        inputs.update(width=np.array([width]), height=np.array([height]))
    got = run_stage("keyframes", TINY, inputs, tmp_path)
    assert (int(got["width"][0]), int(got["height"][0])) == (ew, eh)
    for i, exp in enumerate(expected):
        assert np.array_equal(got[f"keyframe_{i}"], exp), f"keyframe {i} differs"


def test_canvas_rule_matches_resolve_canvas_size(tiny_ckpt_f32):
    """The release's rule (a model without an h3ctl block) and h3-tiny's; then the refusals."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    from h3ctl.context import Context

    rng = np.random.default_rng(3)
    sizes = [(1, 1), (4, 1), (1, 4), (16, 9), (9, 16), (1999, 768), (1920, 1080), (768, 1344), (3, 2), (2, 3)]
    sizes += [(int(a), int(b)) for a, b in rng.integers(1, 5000, (300, 2)) if 4 * b >= a and 4 * a >= b]
    for model, short, cap in ((tiny_ckpt_f32.parent, 768, 768 * 1344), (TINY, 128, 256 * 256)):
        with Context(model, threads=1) as ctx:
            for w, h in sizes:
                eh, ew = resolve_canvas_size(w, h, 32, short, cap)
                assert h3_canvas(ctx, w, h) == (ew, eh), (model.name, w, h)
            for w, h, needle in ((5, 1, "1:4 to 4:1"), (100, 401, "1:4 to 4:1"), (0, 10, "empty"),
                                 (9000, 8000, "megapixels")):
                with pytest.raises(H3Error, match=needle):
                    h3_canvas(ctx, w, h)


def test_last_keyframe_time_is_numpy_pairwise():
    """t = L + sum(spans) - 5/3 with numpy's pairwise sum, which differs from a running sum in the last bit from 16
    latent frames on: the whole layout against diffusers' build_packed_sequence."""
    import torch
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    from h3ctl import transformer as tr
    from h3ctl.context import Context

    with Context(TINY, threads=1) as ctx:
        for T in list(range(1, 141)) + [247, 513, 1234]:
            tags = np.ones(9, np.int64)
            tags[2:5] = 0
            ref = MiniMaxH3PrepareLayoutStep.build_packed_sequence(torch.from_numpy(tags), T, 2, 4, 3, (1, 2, 2), 2,
                                                                   2, 0, ("first", "last"))
            got = tr.packed_layout(ctx, 9, T, 2, 4, 3, text_tags=tags.astype(np.uint8), anchors=("first", "last"))
            assert np.array_equal(got["position_ids"], ref[0].numpy()), T
            assert np.array_equal(got["token_tags"], ref[1].numpy()), T


# ---- the workflow against diffusers ------------------------------------------------------------------------------

W, H, FRAMES, STEPS = 96, 64, 22, 4


@pytest.fixture(scope="module")
def oracle(tiny_models, tiny_ckpt_f32):
    return fl2va_pipeline(tiny_models, tiny_ckpt_f32 / "tokenizer")


@pytest.mark.parametrize("case", ["first", "last", "both"])
def test_pipeline_matches_diffusers(case, oracle, tiny_models, tiny_ckpt_f32, tmp_path):
    first = keyframe(11, 80, 120) if case != "last" else None
    last = keyframe(12, 72, 96) if case != "first" else None  # another aspect: the cover crop cuts rows
    rng = np.random.default_rng(5)
    v = rng.standard_normal((24, 7, H // 16, W // 16)).astype(np.float32)
    a = rng.standard_normal((2, 32, 37)).astype(np.float32)
    ref = run_fl2va(oracle, PROMPT, FRAMES, STEPS, v, a, image=first, last_image=last, width=W, height=H, seed=9)
    n = len(ref["condition_latents"])
    inputs = {"prompt": np.frombuffer(PROMPT.encode(), np.uint8).copy(), "latents": v[None], "audio_latents": a,
              "width": np.array([W]), "height": np.array([H]), "num_frames": np.array([FRAMES]),
              "num_inference_steps": np.array([STEPS])}
    inputs.update({k: img for k, img in (("image", first), ("last_image", last)) if img is not None})
    for k in range(n):
        inputs[f"condition_noise_{k}"] = ref["cond_noise"][k]
        inputs[f"posterior_noise_{k}"] = ref["posterior_noise"][k]
    got = run_stage("fl2va", tiny_ckpt_f32.parent, inputs, tmp_path)
    ev, ea = rel_l2(got["latents"][0], ref["latents"]), rel_l2(got["audio_latents"], ref["audio_latents"])

    # The layout and the sampler alone: diffusers' conditioning given to both sides.
    names = [x for x, img in (("first", first), ("last", last)) if img is not None]
    core = {f"condition_latents_{x}": ref["condition_latents"][k] for k, x in enumerate(names)}
    core.update({f"condition_noise_{k}": ref["cond_noise"][k] for k in range(n)})
    core.update(prompt_embeds=ref["prompt_embeds"], text_token_tags=ref["text_token_tags"].astype(np.int64))
    core.update({k: inputs[k] for k in ("latents", "audio_latents", "width", "height", "num_frames",
                                       "num_inference_steps")})
    got_core = run_stage("fl2va", tiny_ckpt_f32.parent, core, tmp_path)
    cv, ca = run_core(tiny_models, ref["prompt_embeds"], ref["text_token_tags"], names, ref["condition_latents"], W,
                      H, FRAMES, STEPS, v, a, seed=9)
    assert np.array_equal(cv, ref["latents"])  # the core step alone reproduces the workflow
    lv, la = rel_l2(got_core["latents"][0], cv), rel_l2(got_core["audio_latents"], ca)
    print(f"parity: fl2va {case} {W}x{H}x{FRAMES} {STEPS} steps: latents rel-L2 video {ev:.2e}, audio {ea:.2e}; "
          f"layout + sampler alone {lv:.2e} / {la:.2e}")
    assert ev <= TOL and ea <= TOL and lv <= TOL and la <= TOL
    if case != "both":
        return
    # the test would notice conditioning that was ignored: without it the latents are far off
    bare, _ = run_core(tiny_models, ref["prompt_embeds"], ref["text_token_tags"], names,
                       [0 * c for c in ref["condition_latents"]], W, H, FRAMES, STEPS, v, a, seed=9)
    assert rel_l2(bare, ref["latents"]) > 100 * max(ev, 1e-7)


# ---- libh3's own noise, the API, the CLI --------------------------------------------------------------------------


def _noise(seed, stream, shape):
    out = np.empty(shape, np.float32)
    _lib.check(_lib.lib().h3_noise_fill(seed, stream, 0, out.ctypes.data_as(_lib.c_float_p), out.size))
    return out


def test_noise_streams(tiny_ckpt_f32):
    """Without injected noise a keyframe's conditioning noise is stream 2 + k under the request's seed (k in packed
    order) and its posterior noise seed 42, stream 16 whatever the seed (keyframe.h)."""
    first, last = keyframe(21, 64, 96), keyframe(22, 64, 96)

    def final(eng, **kw):
        eng.prepare(PROMPT, W, H, FRAMES, steps=3, seed=77, **kw)
        while eng.step() > 0:
            pass
        return eng.latents()[0]

    shape = (24, 1, H // 16, W // 16)
    with Engine(tiny_ckpt_f32.parent, threads=2) as eng:
        plain = final(eng, first_frame=first, last_frame=last)
        inj = {"first_noise": _noise(77, 2, shape), "last_noise": _noise(77, 3, shape),
               "first_posterior_noise": _noise(42, 16, shape), "last_posterior_noise": _noise(42, 16, shape)}
        assert np.array_equal(final(eng, first_frame=first, last_frame=last, injected=inj), plain)
        inj["last_noise"] = _noise(77, 4, shape)
        assert not np.array_equal(final(eng, first_frame=first, last_frame=last, injected=inj), plain)
        lone = final(eng, last_frame=last)  # a lone last frame is condition 0: stream 2
        assert np.array_equal(final(eng, last_frame=last, injected={"last_noise": _noise(77, 2, shape)}), lone)
        with pytest.raises(H3Error, match="first_latent must have shape"):
            eng.prepare(PROMPT, W, H, FRAMES, steps=3, first_frame=first,
                        injected={"first_latent": np.zeros((24, 1, 2, 2), np.float32)})
        with pytest.raises(H3Error, match="last_noise given without the last frame"):
            eng.prepare(PROMPT, W, H, FRAMES, steps=3, first_frame=first, injected={"last_noise": inj["last_noise"]})


def test_engine_takes_paths_or_arrays_and_the_canvas_follows_the_keyframe(tmp_path):
    from PIL import Image

    img = keyframe(31, 96, 128)  # 4:3 -> h3-tiny's rule gives 160 x 128
    Image.fromarray(img).save(tmp_path / "k.png")
    with Engine(threads=2) as eng:
        a = eng.render(PROMPT, steps=3, first_frame=tmp_path / "k.png")
        b = eng.render(PROMPT, steps=3, first_frame=img)
        c = eng.render(PROMPT, steps=3, last_frame=str(tmp_path / "k.png"))
        t2va = eng.render(PROMPT, 160, 128, steps=3)
    assert a.frames.shape == (22, 128, 160, 3) and np.array_equal(a.frames, b.frames)
    assert a.audio.tobytes() == b.audio.tobytes()
    assert not np.array_equal(a.frames, c.frames) and not np.array_equal(a.frames, t2va.frames)
    assert a.info["prompt_tokens"] > t2va.info["prompt_tokens"]  # the vision block's rows


def test_cli_renders_with_keyframes(tmp_path):
    from PIL import Image

    Image.fromarray(keyframe(41, 64, 64)).save(tmp_path / "a.webp", lossless=True)
    Image.fromarray(keyframe(42, 90, 200)).save(tmp_path / "b.jpg", quality=92)
    out = tmp_path / "o.mp4"
    proc = cli("render", "-p", PROMPT, "--first-frame", tmp_path / "a.webp", "--last-frame", tmp_path / "b.jpg",
               "--steps", "3", "-q", "-o", out, "--wav", tmp_path / "o.wav")
    assert proc.returncode == 0, proc.stderr
    assert "128x128" in proc.stdout and out.stat().st_size > 1000  # 1:1 first frame -> h3-tiny's 128 x 128
    assert "128x128" in media.probe_mp4(out)["video"]


# ---- the image decoder under malformed input -------------------------------------------------------------------


def _files(tmp_path):
    from PIL import Image

    img = Image.fromarray(keyframe(51, 48, 64))
    out = {}
    for ext, kw in (("png", {}), ("jpg", {"quality": 90}), ("webp", {"lossless": True})):
        p = tmp_path / f"ok.{ext}"
        img.save(p, **kw)
        out[ext] = p.read_bytes()
    return out


def test_image_decoder_reads_what_pil_reads(tmp_path):
    from PIL import Image

    ref = keyframe(51, 48, 64)
    for ext, data in _files(tmp_path).items():
        p = tmp_path / f"r.{ext}"
        p.write_bytes(data)
        got = media.read_image(p)
        want = np.asarray(Image.open(p).convert("RGB"))
        tol = 3 if ext == "jpg" else 0  # ffmpeg's and libjpeg's YCbCr conversions differ by a few levels
        assert got.shape == want.shape and int(np.abs(got.astype(int) - want).max()) <= tol, ext
        if ext != "jpg":
            assert np.array_equal(got, ref)
    for mode in ("L", "P", "RGBA", "LA"):
        p = tmp_path / f"m{mode}.png"
        Image.fromarray(ref).convert(mode).save(p)
        assert np.array_equal(media.read_image(p), np.asarray(Image.open(p).convert("RGB"))), mode


def test_malformed_images_fail_with_one_error(tmp_path):
    """Truncations at many points, byte flips, noise, empty and text files, animations, sizes out of range: each
    either decodes to the right shape (a flip in a harmless byte) or raises H3Error naming the file."""
    from PIL import Image

    rng = np.random.default_rng(8)
    cases: list[tuple[str, bytes, bool]] = []  # (name, bytes, must fail)
    for ext, data in _files(tmp_path).items():
        for cut in np.linspace(0, len(data) - 16, 9).astype(int):
            cases.append((f"cut{cut}.{ext}", data[:cut], True))
        for i in range(6):
            b = bytearray(data)
            for pos in rng.integers(8, len(b), 3):
                b[pos] ^= int(rng.integers(1, 256))
            cases.append((f"flip{i}.{ext}", bytes(b), False))
    cases += [("noise.png", rng.bytes(4000), True), ("empty.jpg", b"", True),
              ("text.png", b"hello, not an image\n" * 20, True), ("header.png", b"\x89PNG\r\n\x1a\n", True)]
    frames = [Image.fromarray(keyframe(60 + i, 40, 40)) for i in range(3)]
    for ext in ("gif", "webp", "png"):
        p = tmp_path / f"anim.{ext}"
        frames[0].save(p, save_all=True, append_images=frames[1:])
        cases.append((f"anim.{ext}", p.read_bytes(), True))
    for name, size in (("thin.png", (130, 30)), ("huge.png", (8200, 8200))):
        p = tmp_path / name
        Image.new("1", size).save(p)
        cases.append((name, p.read_bytes(), True))
    for name, data, must_fail in cases:
        p = tmp_path / name
        p.write_bytes(data)
        try:
            got = media.read_image(p, "first frame")
        except H3Error as e:
            msg = str(e)
            assert "\n" not in msg and str(p) in msg and msg.startswith("first frame"), msg
            continue
        assert not must_fail, f"{name} decoded"
        assert got.shape == (48, 64, 3) and got.dtype == np.uint8
