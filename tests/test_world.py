"""Tests for train/world.py, the synthetic audiovisual training world (pure numpy, fast)."""

import itertools
import os
import re
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from train import world as w  # noqa: E402
from train.world import ObjectSpec, Spec, make_clip, parse_caption  # noqa: E402
from train.evaluate import dominant_hz, frame_pan  # noqa: E402  (the semantic suite's own measures)

SR = w.SAMPLE_RATE


def one(shape="circle", colour="red", motion="moves right", sound="no sound", bg="black"):
    return Spec(bg, (ObjectSpec(shape, colour, motion, sound),))


# ---------------------------------------------------------------------------------------------
# Measurement helpers (the same measurements semantic tests apply to generated clips)
# ---------------------------------------------------------------------------------------------


def fg_mask(frames, bg_rgb):
    return np.any(frames != np.asarray(bg_rgb, np.uint8), axis=-1)


def coverage(frames, bg_rgb, rgb):
    """Per-pixel object coverage in [0, 1] recovered from the anti-aliased blend."""
    bg = np.asarray(bg_rgb, np.float64)
    d = np.asarray(rgb, np.float64) - bg
    c = int(np.argmax(np.abs(d)))
    return np.clip((frames[..., c].astype(np.float64) - bg[c]) / d[c], 0.0, 1.0)


def weighted_centroids(a):
    """a: [F, H, W] weights -> [F, 2] (x, y) in continuous pixel coordinates."""
    F, H, W = a.shape
    xs = np.arange(W) + 0.5
    ys = np.arange(H) + 0.5
    tot = a.sum(axis=(1, 2))
    return np.stack([(a.sum(axis=1) * xs).sum(1) / tot, (a.sum(axis=2) * ys).sum(1) / tot], 1)


# ---------------------------------------------------------------------------------------------
# Determinism, shapes, validation
# ---------------------------------------------------------------------------------------------


def _clip_bytes(c):
    parts = [c.frames.tobytes(), c.audio.tobytes(), c.caption.encode(), c.caption_ir.encode(),
             repr(c.truth.bounce_frames).encode(), repr(c.truth.click_samples).encode()]
    for o in c.truth.objects:
        parts += [o.boxes.tobytes(), o.centroids.tobytes(), o.pan.tobytes()]
    return b"".join(parts)


def test_deterministic_byte_identical():
    spec = Spec("gray", (ObjectSpec("triangle", "orange", "bounces", "high beep"),
                         ObjectSpec("square", "blue", "moves left", "low hum")))
    a, b = make_clip(spec, seed=7), make_clip(spec, seed=7)
    assert _clip_bytes(a) == _clip_bytes(b)
    assert _clip_bytes(a) != _clip_bytes(make_clip(spec, seed=8))
    d1 = [(s, _clip_bytes(c)) for s, c in w.iter_dataset(3, seed=5)]
    d2 = [(s, _clip_bytes(c)) for s, c in w.iter_dataset(3, seed=5)]
    assert d1 == d2
    s, c = w.dataset_item(2, seed=5)
    assert (s, _clip_bytes(c)) == d1[2]


@pytest.mark.parametrize("W,H,F", [(128, 128, 22), (96, 64, 5), (64, 80, 39), (160, 96, 1)])
def test_shapes_dtypes(W, H, F):
    spec = Spec("navy", (ObjectSpec("circle", "yellow", "moves up", "mid tone"),
                         ObjectSpec("square", "white", "bounces", "no sound")))
    c = make_clip(spec, W, H, F, seed=1)
    assert c.frames.shape == (F, H, W, 3) and c.frames.dtype == np.uint8
    S = int(round(F / 24 * 40)) * 800
    assert S == w.audio_samples(F)
    assert c.audio.shape == (2, S) and c.audio.dtype == np.float32
    assert np.all(np.abs(c.audio) <= 1.0)
    assert not c.truth.overlap
    for o in c.truth.objects:
        assert o.boxes.shape == (F, 4) and o.centroids.shape == (F, 2) and o.pan.shape == (F,)
        assert np.all(o.boxes[:, :2] >= 0) and np.all(o.boxes[:, 2] <= W)
        assert np.all(o.boxes[:, 3] <= H)
        assert 0.2 <= o.size / min(W, H) <= 0.3
    assert w.audio_samples(22) == 29600


def test_validation():
    with pytest.raises(ValueError):
        make_clip(one(colour="white", bg="white"))
    with pytest.raises(ValueError):
        make_clip(Spec("black", (ObjectSpec("circle", "red", "bounces"),
                                 ObjectSpec("square", "red", "bounces"))))
    with pytest.raises(ValueError):
        make_clip(Spec("black", (ObjectSpec("circle", "red", "bounces", "low hum"),
                                 ObjectSpec("square", "blue", "bounces", "low hum"))))
    with pytest.raises(ValueError):
        make_clip(one(motion="spins"))


# ---------------------------------------------------------------------------------------------
# Video semantics
# ---------------------------------------------------------------------------------------------


COLOUR_CASES = [("red", "black", "circle"), ("yellow", "white", "square"),
                ("white", "navy", "triangle"), ("purple", "gray", "circle"),
                ("green", "white", "triangle"), ("orange", "navy", "square"),
                ("blue", "black", "triangle")]


@pytest.mark.parametrize("colour,bg,shape", COLOUR_CASES)
def test_foreground_colour_is_spec_colour(colour, bg, shape):
    c = make_clip(one(shape, colour, "moves down", bg=bg), seed=3)
    m = fg_mask(c.frames, w.BACKGROUND_RGB[bg])
    px = c.frames[m]
    vals, counts = np.unique(px, axis=0, return_counts=True)
    assert tuple(int(v) for v in vals[np.argmax(counts)]) == w.COLOUR_RGB[colour]
    assert counts.max() / len(px) > 0.6  # pure interior, anti-aliased rim only
    # Coverage-weighted centroid equals the analytic centroid (triangles included).
    cov = coverage(c.frames, w.BACKGROUND_RGB[bg], w.COLOUR_RGB[colour])
    np.testing.assert_allclose(weighted_centroids(cov), c.truth.objects[0].centroids, atol=0.35)
    # Object area ~ 20-30 % of the canvas side.
    side = np.sqrt(m[0].sum() / {"circle": np.pi / 4, "square": 1.0, "triangle": 0.5}[shape])
    assert 0.19 * 128 <= side <= 0.31 * 128


EXPECT = {"moves left": (-1, 0), "moves right": (1, 0), "moves up": (0, -1), "moves down": (0, 1)}


@pytest.mark.parametrize("motion", w.MOTIONS)
def test_motion_extent_and_direction(motion):
    for seed in range(3):
        W, H = (128, 128) if seed < 2 else (160, 96)
        c = make_clip(one("square", "green", motion, bg="black"), W, H, 22, seed=seed)
        m = fg_mask(c.frames, (0, 0, 0)).astype(np.float64)
        cen = weighted_centroids(m)
        np.testing.assert_allclose(cen, c.truth.objects[0].centroids, atol=0.5)
        disp = (cen[-1] - cen[0]) / np.array([W, H])
        ext = (cen.max(0) - cen.min(0)) / np.array([W, H])
        if motion in EXPECT:
            ax = 0 if EXPECT[motion][0] else 1
            sign = EXPECT[motion][ax]
            assert disp[ax] * sign >= 0.40          # generator travels >= 42 %
            assert np.all(np.diff(cen[:, ax]) * sign > 0)  # monotone
            assert ext[1 - ax] < 0.03
        elif motion == "stays still":
            assert np.all(ext < 0.03)
        else:  # bounces
            assert ext[1] >= 0.15 and ext[0] < 0.03
            bf = c.truth.objects[0].bounce_frames
            assert len(bf) >= 1 and bf == c.truth.bounce_frames
            # bounce frames are the local maxima of y (lowest points), touching the floor
            floor = cen[:, 1].max()
            for f in bf:
                assert abs(cen[f, 1] - floor) < 0.5
                if 0 < f < 21:
                    assert cen[f - 1, 1] < cen[f, 1] > cen[f + 1, 1]


def test_two_objects_separate_and_tracked():
    for motions in itertools.product(["moves right", "bounces", "moves down"], repeat=2):
        spec = Spec("white", (ObjectSpec("circle", "red", motions[0]),
                              ObjectSpec("triangle", "blue", motions[1])))
        c = make_clip(spec, seed=11)
        assert not c.truth.overlap
        for o in c.truth.objects:
            cov = coverage(c.frames, (255, 255, 255), o.rgb)
            # only this object's colour: mask pixels of the other object out
            other = [p for p in c.truth.objects if p is not o][0]
            cov[np.all(c.frames == np.asarray(other.rgb, np.uint8), axis=-1)] = 0
            near = np.zeros_like(cov)
            for f, (x0, y0, x1, y1) in enumerate(o.boxes):
                near[f, max(int(y0) - 1, 0):int(np.ceil(y1)) + 1,
                     max(int(x0) - 1, 0):int(np.ceil(x1)) + 1] = 1
            np.testing.assert_allclose(weighted_centroids(cov * near), o.centroids, atol=0.5)
        a, b = (o.boxes for o in c.truth.objects)
        sep = (a[:, 2] < b[:, 0]) | (b[:, 2] < a[:, 0]) | (a[:, 3] < b[:, 1]) | (b[:, 3] < a[:, 1])
        assert sep.all()


# ---------------------------------------------------------------------------------------------
# Audio semantics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sound", ["low hum", "mid tone", "high beep"])
@pytest.mark.parametrize("motion", ["stays still", "moves left", "bounces"])
def test_dominant_frequency(sound, motion):
    c = make_clip(one("circle", "red", motion, sound), seed=2)
    hz = dominant_hz(c.audio.astype(np.float64).sum(0))
    assert abs(hz / w.SOUND_HZ[sound] - 1) <= 0.03
    assert c.truth.objects[0].freq == w.SOUND_HZ[sound]


def test_silent_object_is_silent():
    c = make_clip(one("circle", "red", "moves right", "no sound"), seed=0)
    assert np.all(c.audio == 0) and c.truth.objects[0].freq is None


@pytest.mark.parametrize("sound", ["low hum", "mid tone", "high beep"])
@pytest.mark.parametrize("motion", ["moves left", "moves right"])
def test_pan_follows_x(sound, motion):
    c = make_clip(one("square", "white", motion, sound, bg="gray"), seed=4)
    pan, energy = frame_pan(c.audio, 22)
    ok = energy > 0.1 * energy.max()
    assert ok.sum() >= 6
    x = c.truth.objects[0].centroids[:, 0]
    assert np.corrcoef(pan[ok], x[ok])[0, 1] >= 0.9
    np.testing.assert_allclose(c.truth.objects[0].pan, x / 128, atol=1e-6)
    # energetic frames sit at the equal-power pan of the truth x (window-averaged)
    np.testing.assert_allclose(pan[ok], (x / 128)[ok], atol=0.03)
    gl, gr = w.pan_gains(np.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(gl ** 2 + gr ** 2, 1.0)


def test_two_sounds_two_pitches():
    spec = Spec("black", (ObjectSpec("circle", "red", "moves left", "mid tone"),
                          ObjectSpec("square", "green", "moves right", "high beep")))
    c = make_clip(spec, seed=0)
    mag = np.abs(np.fft.rfft(c.audio.astype(np.float64).sum(0)))
    hz = np.fft.rfftfreq(c.audio.shape[1], 1.0 / SR)
    top2 = sorted(hz[np.argsort(mag)[-2:]])
    assert abs(top2[0] - 440) < 5 and abs(top2[1] - 880) < 5


@pytest.mark.parametrize("sound", ["no sound", "high beep", "low hum"])
def test_click_at_each_bounce(sound):
    for seed in range(3):
        c = make_clip(one("circle", "yellow", "bounces", sound), seed=seed)
        bf, cs = c.truth.bounce_frames, c.truth.click_samples
        assert len(bf) >= 1 and len(cs) == len(bf)
        mono = c.audio.astype(np.float64).sum(0)
        hp = np.diff(mono, 2)  # crude high-pass
        blk = 64  # 2 ms
        e = (hp[: len(hp) // blk * blk] ** 2).reshape(-1, blk).sum(1)
        near = np.zeros(len(e), bool)
        for f, s0 in zip(bf, cs):
            assert s0 == round(f / 24 * SR)
            near[max(s0 // blk - 3, 0): s0 // blk + 5] = True
        floor = e[~near].max() + 1e-9
        for s0 in cs:
            assert e[max(s0 // blk - 1, 0): s0 // blk + 3].max() > 10 * floor


# ---------------------------------------------------------------------------------------------
# Captions
# ---------------------------------------------------------------------------------------------


def test_caption_templates():
    spec = Spec("black", (ObjectSpec("circle", "red", "moves right", "high beep"),))
    assert spec.caption == "a red circle moves right on a black background, a high beep"
    two = Spec("black", (ObjectSpec("circle", "red", "moves right", "high beep"),
                         ObjectSpec("square", "blue", "stays still", "low hum")))
    assert two.caption == ("a red circle moves right and a blue square stays still on a black "
                           "background, a high beep and a low hum")
    assert two.caption_ir == (
        "Scene: a red circle and a blue square on a black background\n"
        "Action: the red circle moves right; the blue square stays still\n"
        "Camera: static\n"
        "Look: flat 2d shapes, solid colours, clean edges\n"
        "Audio: a high beep from the red circle; a low hum from the blue square")
    s3 = Spec("gray", (ObjectSpec("square", "orange", "bounces"),
                       ObjectSpec("circle", "green", "moves up", "mid tone")))
    assert s3.caption == ("an orange square bounces and a green circle moves up on a gray "
                          "background, a mid tone from the green circle")
    assert s3.caption_ir.endswith(
        "Audio: a mid tone from the green circle; a click at each bounce")
    assert one(sound="no sound").caption.endswith(", silent")
    assert one(motion="bounces").caption_ir.endswith("Audio: a click at each bounce")
    assert one().caption_ir.endswith("Audio: silent")
    c = make_clip(two, seed=0)
    assert (c.caption, c.caption_ir) == (two.caption, two.caption_ir)


def test_captions_parse_back_and_use_known_words():
    rng = np.random.default_rng(0)
    words = set(w.caption_words())
    for _ in range(400):
        spec = w.sample_spec(rng, split="any")
        for cap in (w.caption_line(spec), w.caption_ir(spec)):
            assert parse_caption(cap) == spec.to_dict(), cap
            assert set(re.findall(r"[A-Za-z0-9]+", cap)) <= words
            assert set(re.sub(r"[A-Za-z0-9 ]", "", cap)) <= set(w.CAPTION_PUNCT)
        assert Spec.from_dict(spec.to_dict()) == spec


def test_parse_caption_partial():
    assert parse_caption("A red circle moves right") == {
        "objects": [{"colour": "red", "shape": "circle", "motion": "moves right"}]}
    assert parse_caption("an orange triangle on a grey background, silent") == {
        "background": "gray",
        "objects": [{"colour": "orange", "shape": "triangle", "sound": "no sound"}]}
    p = parse_caption("a red circle and a blue square on a white background, a low hum")
    assert all("sound" not in o for o in p["objects"])  # ambiguous: not attributed
    p = parse_caption("a red circle and a blue square, a low hum from the blue square")
    assert [o["sound"] for o in p["objects"]] == ["no sound", "low hum"]


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------


def test_train_never_heldout_and_covers_every_value():
    specs = list(w.iter_specs(2000, seed=0, split="train"))
    assert not any(w.is_heldout(s) for s in specs)
    seen = {k: set() for k in ("bg", "shape", "colour", "motion", "sound")}
    pairs_cs, pairs_ms = set(), set()
    n2 = 0
    for s in specs:
        s.validate()
        n2 += len(s.objects) == 2
        seen["bg"].add(s.background)
        for o in s.objects:
            seen["shape"].add(o.shape), seen["colour"].add(o.colour)
            seen["motion"].add(o.motion), seen["sound"].add(o.sound)
            pairs_cs.add((o.colour, o.shape)), pairs_ms.add((o.motion, o.sound))
    assert seen == {"bg": set(w.BACKGROUNDS), "shape": set(w.SHAPES), "colour": set(w.COLOURS),
                    "motion": set(w.MOTIONS), "sound": set(w.SOUNDS)}
    assert not pairs_cs & set(w.HELDOUT_COLOUR_SHAPE)
    assert not pairs_ms & set(w.HELDOUT_MOTION_SOUND)
    # every non-held-out pair does occur
    assert len(pairs_cs) == 21 - len(w.HELDOUT_COLOUR_SHAPE)
    assert len(pairs_ms) == 24 - len(w.HELDOUT_MOTION_SOUND)
    assert 0.3 < n2 / 2000 < 0.5
    rng = np.random.default_rng(1)
    assert not any(w.is_heldout(w.sample_spec(rng)) for _ in range(500))  # default = train
    # iter_dataset yields exactly the iter_specs specs
    assert [s for s, _ in w.iter_dataset(3, seed=0, width=32, height=32, frames=5)] == specs[:3]


def test_heldout_split_and_prompts():
    assert all(w.is_heldout(s) for s in w.iter_specs(300, seed=0, split="heldout"))
    hs = w.heldout_specs()
    assert len(hs) >= 24 and len(set(hs)) == len(hs)
    for s in hs:
        s.validate()
        assert len(s.objects) == 1 and w.is_heldout(s) and w.heldout_pairs(s)
    objs = [s.objects[0] for s in hs]
    assert {o.motion for o in objs} == set(w.MOTIONS)
    assert {o.sound for o in objs} == set(w.SOUNDS)
    assert len({o.colour for o in objs}) >= 5
    assert {(o.motion, o.sound) for o in objs} >= set(w.HELDOUT_MOTION_SOUND)
    assert {(o.colour, o.shape) for o in objs} >= set(w.HELDOUT_COLOUR_SHAPE)


def test_describe_attributes():
    d = w.describe_attributes()
    assert d["motions"] == list(w.MOTIONS) and len(d["colours"]) == 7
    assert set(d["colour_rgb"]) == set(d["colours"])


# ---------------------------------------------------------------------------------------------
# Hygiene and speed
# ---------------------------------------------------------------------------------------------


def test_runtime_package_never_imports_train():
    pkg = os.path.join(ROOT, "python", "h3ctl")
    pat = re.compile(r"^\s*(from\s+train\b|import\s+train\b)|train\.world", re.M)
    for dirpath, _, files in os.walk(pkg):
        for fn in files:
            if fn.endswith(".py"):
                with open(os.path.join(dirpath, fn), encoding="utf-8") as fh:
                    assert not pat.search(fh.read()), fn
    src = open(os.path.join(ROOT, "train", "world.py"), encoding="utf-8").read()
    assert not re.search(r"^\s*(import|from)\s+(torch|PIL|scipy|h3ctl)\b", src, re.M)


def test_speed():
    spec = Spec("gray", (ObjectSpec("triangle", "red", "moves right", "high beep"),))
    make_clip(spec, seed=0)
    t0 = time.perf_counter()
    for i in range(5):
        make_clip(spec, seed=i)
    dt = (time.perf_counter() - t0) / 5
    assert dt < 0.15, dt  # target < 50 ms; loose bound for a shared CPU
