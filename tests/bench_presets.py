"""Cost and quality of every speed knob alone and of every preset, on h3-tiny over the held-out prompts.

    PYTHONPATH=python python tests/bench_presets.py [--prompts 27] [--steps 20] [--threads 2] [--only reuse,fast]
                                                    [--json out.json]

For each prompt (seed 42 + k, 128x128x22) the reference render (every knob off) and each configuration run back to
back on the same engine, so load on the machine hits them alike. Per configuration: transformer evaluations and
block-stack runs per render, transformer time (libh3's time inside the steps) and wall time of Engine.render,
speed-up of both against the reference (ratio of the sums), PSNR and SSIM of the frames and log-spectral distance
of the audio against the reference render from the same noise (tests/quality.py), and the semantic pass rate of
train/evaluate.py's checks. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

W = H = 128
FRAMES = 22

# Each knob alone, at the settings the presets draw on, then the presets.
CONFIGS: list[tuple[str, dict]] = [
    ("reuse 2", {"reuse": 2}),
    ("reuse 3", {"reuse": 3}),
    ("reuse 4", {"reuse": 4}),
    ("reuse 6", {"reuse": 6}),
    ("reuse 9", {"reuse": 9}),
    ("core reuse 2", {"core_reuse": 2}),
    ("core reuse 3", {"core_reuse": 3}),
    ("layers 5 gate", {"layers": 5}),
    ("layers 5 uniform", {"layers": 5, "layer_policy": "uniform"}),
    ("layers 4 gate", {"layers": 4}),
    ("layers 4 uniform", {"layers": 4, "layer_policy": "uniform"}),
    ("token reduction", {"token_reduction": True}),
    ("render 96x96", {"render_size": "96x96"}),
    ("render 64x64", {"render_size": "64x64"}),
    ("cache 0.1", {"cache_threshold": 0.1}),
    ("cache 0.2", {"cache_threshold": 0.2}),
    ("cache 0.3", {"cache_threshold": 0.3}),
    ("cache 0.4", {"cache_threshold": 0.4}),
    ("preset balanced", {"preset": "balanced"}),
    ("preset fast", {"preset": "fast"}),
    ("preset draft", {"preset": "draft"}),
    # h3-tiny's few-step student: its own 4 evaluations (steps=None lets the preset's count win)
    ("preset tiny-fast", {"preset": "tiny-fast", "steps": None}),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=27)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", help="comma-separated substrings: run the configurations whose name holds one")
    ap.add_argument("--json", help="also write every number to this file")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.steps < 2:
        ap.error("--prompts must be >= 1 and --steps >= 2")

    from h3ctl import Engine
    from tests import quality
    from train import evaluate, world

    configs = CONFIGS
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        configs = [c for c in CONFIGS if any(k in c[0] for k in keys)]
        if not configs:
            ap.error(f"--only {args.only!r} matches no configuration")
    names = ["reference"] + [c[0] for c in configs]
    acc = {n: {"evals": 0, "blocks": 0, "tms": 0.0, "wall": 0.0, "psnr": [], "ssim": [], "lsd": [], "checks": []}
           for n in names}
    specs = world.heldout_specs()[: args.prompts]
    with Engine(threads=args.threads) as eng:
        for k, spec in enumerate(specs):
            seed = 42 + k
            eng.prepare(spec.caption, W, H, FRAMES, steps=2, seed=seed)  # the prompt's encoding, cached untimed
            ref = None
            for name, kw in [("reference", {})] + configs:
                t0 = time.perf_counter()
                r = eng.render(spec.caption, W, H, FRAMES, seed=seed, **{"steps": args.steps, **kw})
                wall = time.perf_counter() - t0
                a = acc[name]
                a["evals"] += r.transformer["evaluations"]
                a["blocks"] += r.transformer["block_runs"]
                a["tms"] += r.transformer["time_ms"]
                a["wall"] += wall
                a["checks"].append(evaluate.check(spec, r.frames, r.audio))
                if ref is None:
                    ref = r
                a["psnr"].append(quality.psnr(r.frames, ref.frames))
                a["ssim"].append(quality.ssim(r.frames, ref.frames))
                a["lsd"].append(quality.log_spectral_distance(r.audio, ref.audio))
            print(f"[{k + 1}/{len(specs)}] {spec.caption}", file=sys.stderr, flush=True)

    n = len(specs)
    base = acc["reference"]
    rows = []
    for name in names:
        a = acc[name]
        s = evaluate.summarize(a["checks"])
        finite = [v for v in a["psnr"] if math.isfinite(v)]
        rows.append({
            "config": name,
            "evaluations": a["evals"] / n,
            "block_runs": a["blocks"] / n,
            "transformer_ms": a["tms"] / n,
            "wall_s": a["wall"] / n,
            "speedup": base["tms"] / a["tms"] if a["tms"] else float("nan"),
            "wall_speedup": base["wall"] / a["wall"] if a["wall"] else float("nan"),
            "psnr": float(sum(finite) / len(finite)) if len(finite) == len(a["psnr"]) else float("inf"),
            "ssim": sum(a["ssim"]) / n,
            "lsd_db": sum(a["lsd"]) / n,
            "semantic": s["pass_rate"],
            "semantic_passed": f"{s['passed']}/{s['total']}",
        })
    print(f"\nh3-tiny, {W}x{H}x{FRAMES}, {args.steps} steps, {args.threads} threads, {n} held-out prompts "
          f"(seeds 42..{41 + n}); quality against the reference render from the same noise\n")
    print("| configuration | evaluations | block runs | transformer ms | speed-up | wall s | wall speed-up | "
          "PSNR dB | SSIM | audio LSD dB | semantic |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        psnr = "exact" if math.isinf(r["psnr"]) else f"{r['psnr']:.1f}"
        print(f"| {r['config']} | {r['evaluations']:.1f} | {r['block_runs']:.1f} | {r['transformer_ms']:.0f} | "
              f"{r['speedup']:.2f}x | {r['wall_s']:.2f} | {r['wall_speedup']:.2f}x | {psnr} | {r['ssim']:.3f} | "
              f"{r['lsd_db']:.2f} | {100 * r['semantic']:.1f} % ({r['semantic_passed']}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": n, "steps": args.steps, "threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
