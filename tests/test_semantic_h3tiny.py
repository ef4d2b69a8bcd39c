"""Semantic suite of h3-tiny: the content checks themselves, and libh3 against diffusers on the trained model.

The checks (train/evaluate.py) measure foreground colour (nearest named colour), motion direction and extent from the
centroid track (>= 15 % of the canvas), dominant audio frequency (+-8 %), stereo pan vs the sounding object's x
(correlation >= 0.5) and clicks near bounces. They are validated here on ground-truth clips of the procedural world,
where every check must pass, and on clips whose content contradicts the prompt, where the matching check must fail.
h3-tiny itself must pass >= 90 % of the checks on the held-out prompts, rendered by libh3 at the defaults (20 steps,
128x128x22, seeds 42+k); tests/bench_semantic.py reports the same rate for libh3 and diffusers side by side.
"""

import dataclasses

import numpy as np
import pytest

from train import evaluate, world


def _spec_with(spec, **changes):
    return dataclasses.replace(spec, objects=(dataclasses.replace(spec.objects[0], **changes),))


HELDOUT = world.heldout_specs()


def test_enough_heldout_prompts():
    assert len(HELDOUT) >= 20
    assert all(world.is_heldout(s) for s in HELDOUT)


@pytest.mark.parametrize("i", range(len(HELDOUT)))
def test_every_check_passes_on_ground_truth(i):
    spec = HELDOUT[i]
    clip = world.make_clip(spec, 128, 128, 22, seed=i)
    res = evaluate.check(spec, clip.frames, clip.audio)["checks"]
    assert res and all(res.values()), (spec.caption, res)


def _first(pred):
    return next(s for s in HELDOUT if pred(s.objects[0]))


@pytest.mark.parametrize("check,pick,change", [
    ("colour", lambda o: True, lambda o: {"colour": "blue" if o.colour != "blue" else "green"}),
    ("motion", lambda o: o.motion == "moves right", lambda o: {"motion": "moves left"}),
    ("motion", lambda o: o.motion == "moves up", lambda o: {"motion": "stays still"}),
    ("pitch", lambda o: o.sound == "low hum", lambda o: {"sound": "high beep"}),
    ("pitch", lambda o: o.sound == "mid tone", lambda o: {"sound": "no sound"}),
])
def test_a_check_fails_when_the_content_contradicts_the_prompt(check, pick, change):
    spec = _first(pick)
    clip = world.make_clip(spec, 128, 128, 22, seed=3)
    wrong = _spec_with(spec, **change(spec.objects[0]))
    res = evaluate.check(wrong, clip.frames, clip.audio)["checks"]
    assert res[check] is False, (spec.caption, wrong.caption, res)


def test_pan_check_fails_with_swapped_channels():
    spec = _first(lambda o: o.motion in ("moves left", "moves right") and o.sound != "no sound")
    clip = world.make_clip(spec, 128, 128, 22, seed=2)
    assert evaluate.check(spec, clip.frames, clip.audio)["checks"]["pan"]
    assert not evaluate.check(spec, clip.frames, clip.audio[::-1].copy())["checks"]["pan"]


def test_clicks_check_needs_clicks():
    spec = _first(lambda o: o.motion == "bounces")
    clip = world.make_clip(spec, 128, 128, 22, seed=1)
    assert evaluate.check(spec, clip.frames, clip.audio)["checks"]["clicks"]
    silent = np.zeros_like(clip.audio)
    assert not evaluate.check(spec, clip.frames, silent)["checks"]["clicks"]


def test_libh3_matches_diffusers_on_h3tiny():
    """Same weights, same prompt, same initial noise: libh3's render equals diffusers' pipeline, and so do the
    semantic judgments."""
    from h3ctl import Engine
    from tests import semantic_run as S
    from tests.pipeline_oracle import diffusers_pipeline, rel_l2

    models, tok = S.diffusers_models()
    pipe = diffusers_pipeline(models, tok)
    with Engine(threads=2) as eng:
        for k, spec in enumerate(HELDOUT[:3]):
            v, a = S.noise(eng, spec.caption, seed=42 + k)
            ours_f, ours_a = S.libh3_render(eng, spec.caption, 20, 42 + k)
            ref_f, ref_a = S.diffusers_render(pipe, spec.caption, 20, v, a)
            # the end-to-end tolerance of the pipeline parity test; frames may differ by one uint8 rounding step
            assert rel_l2(ours_f, ref_f) <= 1e-3 and np.abs(ours_f.astype(int) - ref_f).max() <= 1
            assert rel_l2(ours_a, ref_a) <= 1e-3
            assert S.score(spec, ours_f, ours_a) == S.score(spec, ref_f, ref_a)


def test_h3tiny_passes_90_percent_of_checks_on_heldout_prompts():
    """The acceptance bar of h3-tiny: held-out (colour, shape) and (motion, sound) pairs never seen in training."""
    from h3ctl import Engine
    from tests import semantic_run as S

    with Engine(threads=2) as eng:
        results = [evaluate.check(spec, *S.libh3_render(eng, spec.caption, 20, 42 + k))
                   for k, spec in enumerate(HELDOUT)]
    summary = evaluate.summarize(results)
    print(f"semantic: {summary['passed']}/{summary['total']} = {100 * summary['pass_rate']:.1f} % "
          f"{summary['per_check']}")
    assert len(HELDOUT) >= 20
    assert summary["pass_rate"] >= 0.90, summary["per_check"]


def test_h3tiny_follows_first_and_last_frame_anchors():
    """FL2VA on h3-tiny, rendered by libh3 on the CPU: the 27 held-out anchored cases (9 first, 9 last, 9 both; held-out
    prompts, keyframes from clips the model never saw). Per anchor, the generated frame must match its keyframe
    (PSNR >= 25 dB at 128x128, same foreground colour, object within 10 % of its place); every text-only check still
    applies, so the motion between the anchors must follow the prompt. Bars: >= 90 % of the anchor checks and >= 90 %
    of the text checks (the text-only bar)."""
    from h3ctl import Engine

    cases = world.heldout_anchor_cases()
    results = []
    with Engine(threads=2) as eng:
        for k, case in enumerate(cases):
            ref = case.clip()
            kf = {"first_frame": ref.frames[0] if "first" in case.anchors else None,
                  "last_frame": ref.frames[-1] if "last" in case.anchors else None}
            r = eng.render(case.prompt, seed=42 + k, steps=20, **kf)
            results.append(evaluate.check_anchored(case.spec, r.frames, r.audio, ref.frames, case.anchors))
    anchor = evaluate.summarize(results, keep=lambda name: name.startswith(("first_", "last_")))
    text = evaluate.summarize(results, keep=lambda name: not name.startswith(("first_", "last_")))
    print(f"anchored: anchor checks {anchor['passed']}/{anchor['total']} {anchor['per_check']}; "
          f"text checks {text['passed']}/{text['total']} {text['per_check']}")
    assert len(cases) == 27 and {c.mode for c in cases} == {"first", "last", "both"}
    assert anchor["pass_rate"] >= 0.90, anchor["per_check"]
    assert text["pass_rate"] >= 0.90, text["per_check"]


@pytest.mark.parametrize("i", range(0, 27, 4))
def test_shape_check_reads_ground_truth_and_fails_on_another_shape(i):
    """evaluate.shape_of names the object's shape on ground-truth clips, and the shape check fails on a clip of
    another shape (the Ref2VA checks below rely on it)."""
    spec = HELDOUT[i]
    shape = spec.objects[0].shape
    bg = world.BACKGROUND_RGB[spec.background]
    clip = world.make_clip(spec, 128, 128, 22, 100 + i)
    assert evaluate.shape_of(evaluate.fg_mask(clip.frames, bg)) == shape
    other = _spec_with(spec, shape=next(s for s in world.SHAPES if s != shape))
    wrong = world.make_clip(other, 128, 128, 22, 100 + i)
    assert evaluate.shape_of(evaluate.fg_mask(wrong.frames, bg)) != shape
    blank = np.broadcast_to(np.asarray(bg, np.uint8), clip.frames.shape)
    assert evaluate.shape_of(evaluate.fg_mask(blank, bg)) is None


def test_h3tiny_carries_references_into_the_render():
    """Ref2VA on h3-tiny (its shared-weight Ref2VA partition), rendered by libh3 on the CPU: the 27 held-out cases of
    train/refs.py. The prompt names only the motion and the background; the object's colour and shape are only in the
    reference picture and, for sounding objects, the pitch only in the reference clip. Bars: >= 85 % of the text-only
    suite's checks (colour, motion, pitch or silence, pan, clicks), and >= 90 % on colour and on pitch, which only the
    references can supply (the FL2VA transformer in the Ref2VA role gets colour 2/27). Shape: h3-tiny keeps it less
    reliably whatever asks for it (triangles come out round), so the bar is relative: the references must give the
    right shape within 3 cases of what the prompt naming it gives (same specs, same seeds), and above chance (9/27)."""
    from h3ctl import Engine
    from tests import semantic_run as S
    from train import eval_ref2va

    res = eval_ref2va.run()
    worded = 0
    with Engine(threads=2) as eng:
        for k, spec in enumerate(HELDOUT):
            frames, _ = S.libh3_render(eng, spec.caption, 20, 42 + k)
            mask = evaluate.fg_mask(frames, world.BACKGROUND_RGB[spec.background])
            worded += evaluate.shape_of(mask) == spec.objects[0].shape
    print(f"ref2va shape when the prompt names it: {worded}/27")
    for name in ("standard", "shape", "all"):
        v = res[name]
        print(f"ref2va {name}: {v['passed']}/{v['total']} = {100 * v['pass_rate']:.1f} % {v['per_check']}")
    per = {k: tuple(int(x) for x in v.split("/")) for k, v in res["standard"]["per_check"].items()}
    assert len(res["cases"]) == 27
    assert res["standard"]["pass_rate"] >= 0.85, per
    for check in ("colour", "pitch"):
        assert per[check][1] == 27 and per[check][0] >= 0.9 * 27, per
    shape = res["shape"]["passed"]
    assert shape > 9 and shape >= worded - 3, (shape, worded)
