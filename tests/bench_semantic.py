"""h3-tiny's semantic pass rate on held-out prompts, through libh3 and through diffusers (same weights, same noise).

    python tests/bench_semantic.py [--prompts 27] [--steps 20] [--threads 2]

Prints one row per prompt (check outcomes for both engines) and the totals; the acceptance bar of the h3-tiny issue
is >= 90 % of checks passing at 20 steps and 128x128x22.
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
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from h3ctl import Engine
    from tests import semantic_run as S
    from tests.pipeline_oracle import diffusers_pipeline
    from train import evaluate

    torch.set_num_threads(args.threads)
    models, tok = S.diffusers_models()
    pipe = diffusers_pipeline(models, tok)
    rows, ours_all, ref_all = [], [], []
    t_ours = t_ref = 0.0
    with Engine(threads=args.threads) as eng:
        for k, spec in enumerate(S.heldout(args.prompts)):
            seed = 42 + k
            v, a = S.noise(eng, spec.caption, seed)
            t = time.perf_counter()
            f, au = S.libh3_render(eng, spec.caption, args.steps, seed)
            t_ours += time.perf_counter() - t
            t = time.perf_counter()
            rf, ra = S.diffusers_render(pipe, spec.caption, args.steps, v, a)
            t_ref += time.perf_counter() - t
            ours, ref = evaluate.check(spec, f, au), evaluate.check(spec, rf, ra)
            ours_all.append(ours)
            ref_all.append(ref)
            mark = lambda r: " ".join(f"{c}:{'ok' if ok else 'NO'}" for c, ok in r["checks"].items())  # noqa: E731
            print(f"{spec.caption}\n    libh3     {mark(ours)}\n    diffusers {mark(ref)}", flush=True)
    so, sr = evaluate.summarize(ours_all), evaluate.summarize(ref_all)
    print(f"\n{'check':<8}{'libh3':>10}{'diffusers':>12}")
    for c in so["per_check"]:
        print(f"{c:<8}{so['per_check'][c]:>10}{sr['per_check'][c]:>12}")
    print(f"{'all':<8}{so['passed']}/{so['total']} ({100 * so['pass_rate']:.1f} %)   "
          f"{sr['passed']}/{sr['total']} ({100 * sr['pass_rate']:.1f} %)")
    print(f"render time: libh3 {t_ours / len(ours_all):.2f} s, diffusers {t_ref / len(ref_all):.2f} s per prompt "
          f"({args.steps} steps, {args.threads} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
