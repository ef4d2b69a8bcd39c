"""Stage 1c: per-channel latents_mean / latents_std of both VAEs over an encoded training set.

Video: posterior means of 128x128x22 clips ([24, 7, 8, 8] each), stats over (clip, t, h, w).
Audio: posterior means (what MiniMax-H3 consumes) of both stereo sides ([32, 37] each), stats over (clip, side, t).
Writes ``latent_stats.json`` into the run directory (the configs' ``latents_mean`` / ``latents_std``).

    python -m train.latent_stats --run train/runs/vae --clips 2000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from train import data  # noqa: E402
from train.common import Logger, device_of, load_weights  # noqa: E402
from train.models import build_audio_vae, build_video_vae  # noqa: E402


def load_audio_vae(vae_run: Path, device, stats: dict | None = None):
    """The run's audio VAE, frozen (F32 or BF16 files: load_state_dict casts into the F32 module)."""
    av = build_audio_vae(latents_mean=stats and stats["audio_mean"], latents_std=stats and stats["audio_std"])
    av.load_state_dict(load_weights(vae_run, "audio_vae", "model"))
    return av.to(device).eval().requires_grad_(False)


def load_vaes(vae_run: Path, device, stats: dict | None = None):
    vv = build_video_vae(latents_mean=stats and stats["video_mean"], latents_std=stats and stats["video_std"])
    vv.load_state_dict(load_weights(vae_run, "video_vae", "model"))
    return vv.to(device).eval().requires_grad_(False), load_audio_vae(vae_run, device, stats)


def compute(vae_run: Path, clips: int, seed: int, device, workers=None, log=print) -> dict:
    vv, av = load_vaes(vae_run, device)
    d = data.render(clips, seed=seed, split="train", workers=workers, log=log)
    zv = data.encode_video(vv, d["frames"], device=device, autocast=torch.device(device).type == "cuda")
    za = data.encode_audio(av, d["audio"], device=device)
    vm, vs = data.channel_stats(zv, 1)
    am, as_ = data.channel_stats(za, 2)
    return {"video_mean": vm, "video_std": vs, "audio_mean": am, "audio_std": as_, "clips": clips, "seed": seed}


def compute_audio(vae_run: Path, clips: int, seed: int, device, workers=None, log=print) -> dict:
    """Audio statistics only: for a retrained audio VAE next to an unchanged video VAE."""
    av = load_audio_vae(vae_run, device)
    d = data.render(clips, seed=seed, split="train", workers=workers, video=False, log=log)
    am, as_ = data.channel_stats(data.encode_audio(av, d["audio"], device=device), 2)
    return {"audio_mean": am, "audio_std": as_}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="train/runs/vae")
    ap.add_argument("--clips", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=300)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--video-stats-from", default=None,
                    help="latent_stats.json whose video statistics are kept (the video VAE did not change); only "
                         "the audio statistics are computed")
    args = ap.parse_args(argv)
    run = Path(args.run)
    log = Logger(run / "latent_stats.log")
    if args.video_stats_from:
        stats = json.loads(Path(args.video_stats_from).read_text())
        stats.update(compute_audio(run, args.clips, args.seed, device_of(args.device), args.workers, log))
        stats["audio_clips"], stats["audio_seed"] = args.clips, args.seed
    else:
        stats = compute(run, args.clips, args.seed, device_of(args.device), args.workers, log)
    (run / "latent_stats.json").write_text(json.dumps(stats, indent=1))
    fmt = lambda v: " ".join(f"{x:.3f}" for x in v)  # noqa: E731
    log(f"video mean {fmt(stats['video_mean'])}\nvideo std  {fmt(stats['video_std'])}")
    log(f"audio mean {fmt(stats['audio_mean'])}\naudio std  {fmt(stats['audio_std'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
