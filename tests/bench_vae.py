"""VAE decode benchmarks: libh3 next to diffusers 0.42.1 on the same checkpoint, on CPU, with the same thread count.

    PYTHONPATH=python python tests/bench_vae.py [--sections video] [--threads N] [--reps R]

Each section builds its own random checkpoint in the official layout (written through tests/fixtures' mapping),
decodes the same latents with both engines and prints one table row per case: milliseconds per clip for each,
the ratio diffusers / libh3 and the rel-L2 between the two outputs. Sections are plain functions returning rows;
add one to SECTIONS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, os.path.join(ROOT, "python")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _best_ms(fn, reps: int) -> tuple[float, float]:
    """Best wall-clock and process-CPU milliseconds over `reps` runs (CPU time stays meaningful when the machine
    is shared and wall time is not)."""
    wall = cpu = float("inf")
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t)
        cpu = min(cpu, time.process_time() - c)
    return wall * 1e3, cpu * 1e3


# ---- video --------------------------------------------------------------------------------------------------------

# A decoder with the released proportions (head dim 64, ffn x4, 4 registers, rope on 48 of 64 dims) scaled to
# 8 heads and 4 layers so a CPU run takes seconds; the encoder is the fixtures' tiny one (not timed).
VIDEO_BENCH_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=24, block_out_channels=(8, 16, 16, 32),
    layers_per_block=1, spatial_downsample_factors=(2, 2, 2, 2), temporal_downsample_factors=(1, 2, 2, 1),
    norm_num_groups=4, norm_eps=1e-6, spatial_padding_mode="reflect",
    decoder_num_layers=4, decoder_num_attention_heads=8, decoder_attention_head_dim=64,
    decoder_num_register_tokens=4, decoder_ffn_mult=4, decoder_rope_theta=100.0,
    decoder_rope_dim_ratio=0.75, decoder_norm_eps=1e-5, clip_length=17, token_drop=3,
)

# (label, latent frames T, latent h, latent w): one 256 px tile; 2 x 1 blended 256 px tiles; 2 windows.
VIDEO_CASES = [
    ("256x256, 22 frames (1 tile)", 7, 16, 16),
    ("256x384, 22 frames (2 tiles)", 7, 16, 24),
    ("256x256, 39 frames (2 windows)", 12, 16, 16),
]


def video(threads: int, reps: int) -> list[dict]:
    import torch
    from diffusers import AutoencoderKLMiniMaxH3

    from h3ctl.parity import vae_video as PV
    from h3ctl.context import Context
    from tests import vvae_oracle as O
    from tests.fixtures import official as F

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(**VIDEO_BENCH_VAE, latents_mean=tuple((torch.randn(24, generator=g) * 0.5).tolist()),
                                 latents_std=tuple((0.5 + torch.rand(24, generator=g)).tolist()))
    F.randomize_parameters_(vae, g)
    vae.eval().requires_grad_(False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        part = O.write_video_vae(vae, tmp)
        with Context(part, threads=threads) as ctx:
            for label, T, h, w in VIDEO_CASES:
                lat = np.random.default_rng(T).standard_normal((24, T, h, w), dtype=np.float32)
                out = {}

                def run_h3():
                    out["h3"] = PV.decode(ctx, lat, raw=True, want_rgb=False)[1]

                def run_ref():
                    out["ref"] = O.reference_sample(vae, lat)

                run_h3()  # warm: page in the weights, size the pool's scratch
                ms_h3, cpu_h3 = _best_ms(run_h3, reps)
                ms_ref, cpu_ref = _best_ms(run_ref, reps)
                rows.append(dict(section="video", case=label, libh3_ms=ms_h3, diffusers_ms=ms_ref,
                                 libh3_cpu_ms=cpu_h3, diffusers_cpu_ms=cpu_ref,
                                 rel_l2=O.rel_l2(out["h3"], out["ref"])))
    return rows


SECTIONS = {"video": video}


def print_table(rows: list[dict], threads: int) -> None:
    """Wall ms per clip and the diffusers / libh3 ratio, then the same for process CPU time."""
    head = (f"{'section':8} {'case':32} {'libh3 ms':>9} {'diffusers':>10} {'ratio':>6} "
            f"{'libh3 cpu':>10} {'diff. cpu':>10} {'ratio':>6} {'rel-L2':>8}")
    print(f"CPU, {threads} thread(s) each; ms per clip (best of the timed runs); ratio = diffusers / libh3")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['section']:8} {r['case']:32} {r['libh3_ms']:9.0f} {r['diffusers_ms']:10.0f} "
              f"{r['diffusers_ms'] / r['libh3_ms']:6.2f} {r['libh3_cpu_ms']:10.0f} {r['diffusers_cpu_ms']:10.0f} "
              f"{r['diffusers_cpu_ms'] / r['libh3_cpu_ms']:6.2f} {r['rel_l2']:8.1e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 8))
    ap.add_argument("--reps", type=int, default=2, help="timed runs per case (best is kept)")
    args = ap.parse_args(argv)
    rows = []
    for name in args.sections.split(","):
        if name not in SECTIONS:
            ap.error(f"unknown section '{name}' (have {', '.join(SECTIONS)})")
        rows += SECTIONS[name](args.threads, args.reps)
    print_table(rows, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
