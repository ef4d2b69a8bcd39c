"""h3-tiny's semantic pass rate and render time against the number of model evaluations, per sigma grid.

    python tests/bench_few_step.py [--prompts 27] [--evals 2,4,8,20] [--schedules h3,turbo-768p]
                                   [--threads 2]

The base model only: h3-tiny is not step-distilled, so this is the floor a few-step student has to beat (issue #26's
table of steps against quality and time). Each cell renders the held-out prompts of train/world.py with libh3 on the
CPU (128 x 128 x 22, seeds 42 + k) and scores them with train/evaluate.py's checks (colour, motion, pitch, pan,
clicks); time is the mean wall time of one render, encode to decode, on this machine.
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
    args = ap.parse_args(argv)
    evals = [int(x) for x in args.evals.split(",")]
    scheds = args.schedules.split(",")

    from h3ctl import Engine
    from tests import semantic_run as S
    from train import evaluate

    specs = S.heldout(args.prompts)
    table = {}
    with Engine(threads=args.threads) as eng:
        for sched in scheds:
            for n in evals:
                results, t = [], 0.0
                for k, spec in enumerate(specs):
                    t0 = time.perf_counter()
                    r = eng.render(spec.caption, S.W, S.H, S.FRAMES, steps=n + 1, seed=42 + k, schedule=sched)
                    t += time.perf_counter() - t0
                    results.append(evaluate.check(spec, r.frames, r.audio))
                s = evaluate.summarize(results)
                table[(sched, n)] = (s, t / len(specs))
                print(f"{sched:<12} {n:>3} evaluations: {s['passed']}/{s['total']} ({100 * s['pass_rate']:.1f} %) "
                      f"{t / len(specs):.2f} s per render  {s['per_check']}", flush=True)
    print(f"\n| schedule | " + " | ".join(f"{n} evaluations" for n in evals) + " |")
    print("|---|" + "---|" * len(evals))
    for sched in scheds:
        cells = []
        for n in evals:
            s, t = table[(sched, n)]
            cells.append(f"{100 * s['pass_rate']:.1f} % ({s['passed']}/{s['total']}), {t:.2f} s")
        print(f"| {sched} | " + " | ".join(cells) + " |")
    print(f"\nh3-tiny (base, not distilled), {len(specs)} held-out prompts, 128x128x22, {args.threads} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
