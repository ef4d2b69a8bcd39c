"""h3-tiny's quality and render time against the number of model evaluations, per sigma grid, for the base model
and (with --lora) a few-step student.

    python tests/bench_few_step.py [--prompts 27] [--evals 2,4,8,20] [--schedules h3,turbo-768p] [--threads 2]
                                   [--lora FILE[:SCALE]] [--models base,student] [--anchored 27] [--fidelity]

Each cell renders the held-out prompts of train/world.py with libh3 on the CPU (128 x 128 x 22, seeds 42 + k) and
scores them with train/evaluate.py's checks (colour, motion, pitch, pan, clicks); time is the mean wall time of one
render, encode to decode, on this machine. `student` is the base model with the --lora file (the shipped few-step
LoRA of the tiny-fast preset by default, when it is installed). With --anchored N, the first N anchored held-out
cases (world.heldout_anchor_cases: first / last / both frames) too, scored by evaluate.check_anchored: the anchor
checks (PSNR >= 25 dB, colour, place per anchor) and the text checks apart. With --fidelity, the mean PSNR of the
text-only renders' frames against the base model's 20-evaluation render of the same prompt and seed (the ODE solution the
student was distilled from is closest to the finest render; higher is closer).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "python")):
    if p not in sys.path:
        sys.path.insert(0, p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=27)
    ap.add_argument("--evals", default="2,4,8,20", help="model evaluations per render (grid points - 1)")
    ap.add_argument("--schedules", default="h3,turbo-768p")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=None, help="base, student or both (default: base, and student when a LoRA "
                    "is given or installed)")
    ap.add_argument("--lora", default=None, help="the student's LoRA (default: the tiny-fast preset's)")
    ap.add_argument("--anchored", type=int, default=0, help="anchored held-out cases to score too (0..27)")
    ap.add_argument("--fidelity", action="store_true", help="PSNR of the frames against the base 20-evaluation "
                    "render of the same prompt and seed")
    args = ap.parse_args(argv)
    evals = [int(x) for x in args.evals.split(",")]
    scheds = args.schedules.split(",")

    import numpy as np

    from h3ctl import Engine, presets
    from tests import quality
    from tests import semantic_run as S
    from train import evaluate, world

    lora = args.lora or (presets.student_lora() if os.path.isfile(presets.student_lora()) else None)
    models = args.models.split(",") if args.models else (["base", "student"] if lora else ["base"])
    if "student" in models and not lora:
        ap.error("--models student needs --lora FILE (no few-step LoRA is installed)")
    specs = S.heldout(args.prompts)
    cases = world.heldout_anchor_cases(args.anchored) if args.anchored else []
    refs = {}  # (kind, k) -> the base 20-evaluation frames

    def render(eng, who, text, k, n, sched, kf):
        kw = dict(steps=n + 1, seed=42 + k, schedule=sched, **kf)
        if who == "student":
            kw["lora"] = [lora]
        return eng.render(text, S.W, S.H, S.FRAMES, **kw)

    table = {}
    with Engine(threads=args.threads) as eng:
        if args.fidelity:
            for k, spec in enumerate(specs):
                refs[("t", k)] = render(eng, "base", spec.caption, k, 20, "h3", {}).frames
        for who in models:
            for sched in scheds:
                for n in evals:
                    results, anch, t, ps = [], [], 0.0, []
                    for k, spec in enumerate(specs):
                        t0 = time.perf_counter()
                        r = render(eng, who, spec.caption, k, n, sched, {})
                        t += time.perf_counter() - t0
                        results.append(evaluate.check(spec, r.frames, r.audio))
                        if args.fidelity:
                            ps.append(quality.psnr(r.frames, refs[("t", k)]))
                    for k, case in enumerate(cases):
                        ref = case.clip()
                        kf = {"first_frame": ref.frames[0] if "first" in case.anchors else None,
                              "last_frame": ref.frames[-1] if "last" in case.anchors else None}
                        r = render(eng, who, case.prompt, k, n, sched, kf)
                        anch.append(evaluate.check_anchored(case.spec, r.frames, r.audio, ref.frames, case.anchors))
                    s = evaluate.summarize(results)
                    a = evaluate.summarize(anch, keep=lambda c: c.startswith(("first_", "last_"))) if anch else None
                    at = evaluate.summarize(anch, keep=lambda c: not c.startswith(("first_", "last_"))) if anch \
                        else None
                    fid = float(np.mean([p for p in ps if np.isfinite(p)])) if ps and any(
                        np.isfinite(p) for p in ps) else (float("inf") if ps else None)
                    table[(who, sched, n)] = (s, t / len(specs), a, at, fid)
                    print(f"{who:<8} {sched:<12} {n:>3} evaluations: {s['passed']}/{s['total']} "
                          f"({100 * s['pass_rate']:.1f} %) {t / len(specs):.2f} s per render  {s['per_check']}"
                          + (f"; anchored: anchor checks {a['passed']}/{a['total']} ({100 * a['pass_rate']:.1f} %) "
                             f"{a['per_check']}, text checks {at['passed']}/{at['total']}" if a else "")
                          + (f"; PSNR vs base 20: {fid:.1f} dB" if fid is not None else ""), flush=True)
    print(f"\n| model | schedule | " + " | ".join(f"{n} evaluations" for n in evals) + " |")
    print("|---|---|" + "---|" * len(evals))
    for who in models:
        for sched in scheds:
            cells = []
            for n in evals:
                s, t, a, at, fid = table[(who, sched, n)]
                c = f"{100 * s['pass_rate']:.1f} % ({s['passed']}/{s['total']})"
                if a:
                    c += f", anchors {100 * a['pass_rate']:.1f} % ({a['passed']}/{a['total']})"
                if fid is not None:
                    c += f", {fid:.1f} dB"
                cells.append(c + f", {t:.2f} s")
            print(f"| {who} | {sched} | " + " | ".join(cells) + " |")
    print(f"\nh3-tiny, {len(specs)} held-out prompts" + (f" + {len(cases)} anchored cases" if cases else "")
          + f", 128x128x22, {args.threads} threads" + (f"; student = base + {lora}" if "student" in models else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
