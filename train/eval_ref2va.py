"""Semantic checks of h3-tiny's Ref2VA partition through libh3 (issue #15 item 5).

27 held-out requests (``train.refs.heldout_ref_cases``): a reference picture of the object (its colour and shape are
only in the picture) and, when the object sounds, a reference clip (its pitch is only in the clip); the prompt says
the motion and the background. Each render (seed 42 + k, 128x128x22, 20 steps) is checked for colour, shape, motion,
pitch (or silence), and pan / bounce clicks where they apply (``train/evaluate.py``).

    python -m train.eval_ref2va [--model DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from train import evaluate, refs, world  # noqa: E402


def check_case(case: refs.RefCase, frames, audio) -> dict:
    """evaluate.check (colour, motion, pitch or silence, pan, clicks) plus the shape of the object."""
    got = evaluate.check(case.spec, frames, audio)
    shape = evaluate.shape_of(evaluate.fg_mask(frames, world.BACKGROUND_RGB[case.spec.background]))
    got["checks"]["shape"] = shape == case.spec.objects[0].shape
    got["measures"]["shape"] = shape
    return got


def references_of(case: refs.RefCase) -> list:
    rr = [case.image()]
    if case.audio_ref:
        rr.append({"audio": case.audio(), "sample_rate": world.SAMPLE_RATE})
    return rr


def run(model_dir=None, n: int = 27, threads: int = 2, steps: int = 20, width: int = 128, height: int = 128) -> dict:
    """Render the held-out cases (seed 42 + k) and check them: {"cases", "standard" (the text-only suite's checks:
    colour, motion, pitch, pan, clicks), "shape", "all"} with evaluate.summarize's counts."""
    from h3ctl import Engine

    rows = []
    with Engine(model_dir=model_dir, threads=threads, ref2va=True) as eng:
        for k, case in enumerate(refs.heldout_ref_cases()[:n]):
            out = eng.render(case.prompt, width=width, height=height, frames=22, steps=steps, seed=42 + k,
                             references=references_of(case))
            rows.append({"prompt": case.prompt, "spec": case.spec.to_dict(), **check_case(case, out.frames,
                                                                                          out.audio)})
    return {"cases": rows, "standard": evaluate.summarize(rows, keep=lambda c: c != "shape"),
            "shape": evaluate.summarize(rows, keep=lambda c: c == "shape"), "all": evaluate.summarize(rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--n", type=int, default=27)
    ap.add_argument("--json", default=None)
    ap.add_argument("--size", default="128x128", help="canvas WxH (Ref2VA's own default for h3-tiny is 224x128)")
    a = ap.parse_args(argv)
    w, h = (int(x) for x in a.size.split("x"))
    res = run(a.model, a.n, width=w, height=h)
    for r in res["cases"]:
        bad = [k for k, v in r["checks"].items() if not v]
        o = r["spec"]["objects"][0]
        print(f"{'ok ' if not bad else 'BAD'} {r['prompt'][:64]:64s} {o['colour']:6s} {o['shape']:8s} "
              f"{o['sound']:9s} got {r['measures'].get('colour')} {r['measures'].get('shape')} {bad}")
    for name in ("standard", "shape", "all"):
        v = res[name]
        print(f"Ref2VA held-out {name} checks: {v['passed']}/{v['total']} = {100 * v['pass_rate']:.1f} % "
              f"{v['per_check']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
