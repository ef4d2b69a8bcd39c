"""Stage 1a: train the h3-tiny video VAE (diffusers AutoencoderKLMiniMaxH3) on world clips.

Training goes through diffusers' own ``encode`` / ``decode`` on whole 128x128x22 clips, so the temporal chunking the
pipeline uses (22 frames -> padded to 2 x 17-frame encoder chunks -> 10 latents, ``token_drop`` 3 -> 7 latents; the
decoder's 7-latent window -> 28 frames, pre-padding cut, 5-frame cross-fade -> 22 frames) is trained as used.

Loss, in [0, 1] pixel space (the VAE works in ImageNet-normalised space; the pipeline un-normalises and clamps):
``L1 + MSE`` (object pixels weighted x4: pixel (0,0) of every frame is always background in this world) ``+ 0.5 *``
L1 of spatial finite differences (edges) ``+ kl_weight * KL`` (mean per latent element, posterior sampled).
Reports PSNR on held-out clips. Resumable (``--run`` dir), seeded, CUDA bf16 autocast or CPU.

    python -m train.train_video_vae --run train/runs/vae --minutes 6 --clips 6000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import data  # noqa: E402
from train.common import Budget, Logger, Saver, StepStats, device_of, fast_cuda, load_state  # noqa: E402
from train.common import lr_at, optimizer_step, seed_all  # noqa: E402
from train.models import build_video_vae  # noqa: E402

NAME = "video_vae"


def loss_fn(vae, x_u8: torch.Tensor, kl_weight: float, gen: torch.Generator | None = None):
    target = data.frames_to_pixels(x_u8)                    # [B, 3, F, H, W] in [0, 1]
    x = data.imagenet_normalize(target)
    post = vae.encode(x).latent_dist
    mean, logvar = post.mean.float(), post.logvar.float()
    z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, device=mean.device, generator=gen)
    rec = data.imagenet_denormalize(vae.decode(z).sample.float())
    bg = target[:, :, :, :1, :1]
    fg = ((target - bg).abs().amax(dim=1, keepdim=True) > 1e-3).float()
    w = 1.0 + 3.0 * fg
    err = rec - target
    l1 = (err.abs() * w).mean() / w.mean()
    l2 = (err.pow(2) * w).mean() / w.mean()
    gx = (rec[..., :, 1:] - rec[..., :, :-1]) - (target[..., :, 1:] - target[..., :, :-1])
    gy = (rec[..., 1:, :] - rec[..., :-1, :]) - (target[..., 1:, :] - target[..., :-1, :])
    grad = gx.abs().mean() + gy.abs().mean()
    kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()
    loss = l1 + l2 + 0.5 * grad + kl_weight * kl
    return loss, {"l1": l1.detach(), "l2": l2.detach(), "grad": grad.detach(), "kl": kl.detach()}, rec


@torch.no_grad()
def evaluate(vae, frames_u8: np.ndarray, device, autocast: bool) -> dict:
    vae.eval()
    ps, fg_ps = [], []
    for s in range(0, len(frames_u8), 8):
        x = torch.from_numpy(frames_u8[s:s + 8]).to(device)
        target = data.frames_to_pixels(x)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            z = vae.encode(data.imagenet_normalize(target)).latent_dist.mean
            rec = data.imagenet_denormalize(vae.decode(z).sample.float()).clamp(0, 1)
        for b in range(target.shape[0]):
            ps.append(data.psnr(rec[b], target[b]))
            bg = target[b, :, :, :1, :1]
            m = ((target[b] - bg).abs().amax(0) > 1e-3)
            if m.any():
                e = ((rec[b] - target[b]) ** 2).mean(0)[m].mean()
                fg_ps.append(float(10 * torch.log10(1.0 / e.clamp_min(1e-12))))
    vae.train()
    return {"psnr": float(np.mean(ps)), "psnr_object": float(np.mean(fg_ps)) if fg_ps else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="train/runs/vae")
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget (summed over resumes)")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--clips", type=int, default=6000, help="training clips rendered up front")
    ap.add_argument("--eval-clips", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--kl-weight", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-seed", type=int, default=100)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--save-every", type=float, default=90.0, help="seconds")
    ap.add_argument("--deadline", type=float, default=None,
                    help="absolute wall-clock time (epoch seconds) at which to stop and save, whatever the budget")
    args = ap.parse_args(argv)

    run = Path(args.run)
    log = Logger(run / f"{NAME}.log")
    dev = device_of(args.device)
    autocast = dev.type == "cuda"
    fast_cuda(dev)
    seed_all(args.seed)

    vae = build_video_vae().to(dev).train()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    meta = load_state(run, NAME, {"model": vae}, opt) or {"step": 0, "elapsed": 0.0}
    log(f"[{NAME}] device {dev} params {sum(p.numel() for p in vae.parameters()):,} resume step {meta['step']}")

    train = data.render(args.clips, seed=args.data_seed, split="train", workers=args.workers, log=log)["frames"]
    heldout = data.render(args.eval_clips, seed=args.data_seed, split="heldout", workers=args.workers,
                          log=log)["frames"]
    frames_t = torch.from_numpy(train)  # CPU uint8, pinned batches below
    rng = np.random.default_rng(args.seed + meta["step"])
    gen = torch.Generator(device=dev).manual_seed(args.seed + meta["step"])

    budget = Budget(args.minutes * 60, args.max_steps, meta["elapsed"], meta["step"],
                    deadline=args.deadline)
    stats, saver = StepStats(50), Saver(run, NAME, {"model": vae}, opt, args.save_every)
    while not budget.done():
        idx = rng.integers(0, len(frames_t), args.batch)
        x = frames_t[idx]
        if rng.random() < 0.5:
            x = x.flip(3)
        if rng.random() < 0.5:
            x = x.flip(2)
        x = x.to(dev, non_blocking=True)
        lr = lr_at(args.lr, budget.fraction, budget.step, warmup=200)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss, parts, _ = loss_fn(vae, x, args.kl_weight, gen)
        gn = optimizer_step(opt, loss, vae.parameters(), lr)
        budget.step += 1
        rows = stats.add(budget.step, [loss, *parts.values(), gn])
        if rows is not None:
            a = rows.mean(0).tolist()
            psnr_train = 10 * np.log10(1 / max(a[2], 1e-12))
            log(f"[{NAME}] step {budget.step} t {budget.elapsed:.0f}s lr {lr:.2e} loss {a[0]:.4f} l1 {a[1]:.4f} "
                f"l2 {a[2]:.5f} (~{psnr_train:.1f} dB) grad {a[3]:.4f} kl {a[4]:.1f} gnorm {a[5]:.2f} "
                f"{stats.sec_per_step:.3f}s/step")
        saver.maybe(budget)
    ev = evaluate(vae, heldout, dev, autocast)
    saver.save(budget, eval_heldout=ev, args=vars(args))
    log(f"[{NAME}] done step {budget.step} held-out PSNR {ev['psnr']:.2f} dB (object pixels {ev['psnr_object']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
