"""Stage 8: fine-tune the h3-tiny video VAE's decoder side alone (post_quant_conv + the ViT decoder).

Why: first/last-frame anchors (FL2VA) are checked at PSNR >= 25 dB against the keyframe, and the shipped decoder's
own reconstruction of those frames is only 17-26 dB (stage 7 reached that ceiling). The encoder, quant_conv and the
latent statistics stay bit-identical, so the latent space every DiT checkpoint was trained on is unchanged and no DiT
retraining is needed: only what turns latents into pixels improves.

Data: world clips rendered up front and encoded once by the frozen encoder (posterior mean and std kept on the
device), so a step runs the decoder only. A step decodes ``z = mean + std * eps`` (the posterior sample, as stage 1
trained) for half of the batch and the posterior mean for the other half (what an anchored DiT converges to).
Loss in [0, 1] pixel space: ``MSE + 0.5 * L1 + 0.25 * L1 of spatial differences``; the first and last frames weigh
x4 (the anchored frames). Reports held-out PSNR (whole clip, first frame, last frame) before and after, in float32.

    python -m train.train_video_decoder --partition python/h3ctl/models/h3-tiny/FL2VA --run R --seconds 240
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import data  # noqa: E402
from train.common import Logger, device_of, fast_cuda, lr_at, optimizer_step, seed_all  # noqa: E402

NAME = "video_decoder"
ANCHOR_WEIGHT = 4.0  # first and last frames: what FL2VA's anchor check compares with the keyframes


def decoder_params(vae):
    """The trained side: everything the latents pass through after sampling."""
    return [p for n, p in vae.named_parameters() if n.startswith(("decoder.", "post_quant_conv."))]


@torch.no_grad()
def encode_clips(vae, frames_u8: np.ndarray, dev, batch: int = 32):
    """Posterior mean and std [N, C, T, h, w] of each clip (float32, TF32 off: inference's arithmetic)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    means, stds = [], []
    try:
        for s in range(0, len(frames_u8), batch):
            x = data.imagenet_normalize(data.frames_to_pixels(torch.from_numpy(frames_u8[s:s + batch]).to(dev)))
            post = vae.encode(x).latent_dist
            means.append(post.mean.float())
            stds.append(post.std.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return torch.cat(means), torch.cat(stds)


@torch.no_grad()
def evaluate(vae, mean: torch.Tensor, frames_u8: np.ndarray, dev) -> dict:
    """Held-out PSNR of the posterior-mean reconstruction, float32 (TF32 off): clip, first frame, last frame."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    vae.eval()
    clip, first, last = [], [], []
    try:
        for s in range(0, len(frames_u8), 16):
            target = data.frames_to_pixels(torch.from_numpy(frames_u8[s:s + 16]).to(dev))
            rec = data.imagenet_denormalize(vae.decode(mean[s:s + 16]).sample.float()).clamp(0, 1)
            rec = (rec * 255).round() / 255  # what a render writes
            for b in range(target.shape[0]):
                clip.append(data.psnr(rec[b], target[b]))
                first.append(data.psnr(rec[b, :, 0], target[b, :, 0]))
                last.append(data.psnr(rec[b, :, -1], target[b, :, -1]))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        vae.train()
    f = np.asarray(first + last)
    return {"psnr": float(np.mean(clip)), "first": float(np.mean(first)), "last": float(np.mean(last)),
            "anchor_frames_ge_25db": float(np.mean(f >= 25.0)), "anchor_min": float(f.min())}


def loss_fn(vae, z: torch.Tensor, target: torch.Tensor):
    rec = data.imagenet_denormalize(vae.decode(z).sample.float())
    err = rec - target
    w = torch.ones(target.shape[2], device=target.device)
    w[0] = w[-1] = ANCHOR_WEIGHT
    w = (w / w.mean()).view(1, 1, -1, 1, 1)
    l2 = (err.pow(2) * w).mean()
    l1 = (err.abs() * w).mean()
    gx = (rec[..., :, 1:] - rec[..., :, :-1]) - (target[..., :, 1:] - target[..., :, :-1])
    gy = (rec[..., 1:, :] - rec[..., :-1, :]) - (target[..., 1:, :] - target[..., :-1, :])
    grad = gx.abs().mean() + gy.abs().mean()
    return l2 + 0.5 * l1 + 0.25 * grad, l2.detach()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partition", default="python/h3ctl/models/h3-tiny/FL2VA",
                    help="official partition whose video VAE is fine-tuned")
    ap.add_argument("--run", default="train/runs/vdec")
    ap.add_argument("--seconds", type=float, default=240.0, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--clips", type=int, default=6000)
    ap.add_argument("--eval-clips", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--data-seed", type=int, default=800)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)

    from safetensors.torch import save_file

    from tests.fixtures.official import read_official_to_diffusers

    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    log = Logger(run / f"{NAME}.log")
    dev = device_of(args.device)
    autocast = dev.type == "cuda"
    seed_all(args.seed)

    vae = read_official_to_diffusers(Path(args.partition))["video_vae"].float().to(dev)
    frozen = {n: p.detach().clone() for n, p in vae.named_parameters() if not n.startswith(("decoder.", "post_quant_conv."))}
    vae.requires_grad_(False)
    params = decoder_params(vae)
    for p in params:
        p.requires_grad_(True)
    log(f"[{NAME}] device {dev}: training {sum(p.numel() for p in params):,} of "
        f"{sum(p.numel() for p in vae.parameters()):,} parameters (decoder + post_quant_conv)")

    t0 = time.time()
    train = data.render(args.clips, seed=args.data_seed, split="train", workers=args.workers, log=log)["frames"]
    held = data.render(args.eval_clips, seed=args.data_seed, split="heldout", workers=args.workers, log=log)["frames"]
    vae.eval()
    mean, std = encode_clips(vae, train, dev)
    hmean, _ = encode_clips(vae, held, dev)
    vae.train()
    frames_t = torch.from_numpy(train).to(dev)
    log(f"[{NAME}] rendered + encoded {len(train)} clips in {time.time() - t0:.0f}s; latents {tuple(mean.shape)}")
    before = evaluate(vae, hmean, held, dev)
    log(f"[{NAME}] held-out before: {before}")

    fast_cuda(dev)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    step, t_start, l2s = 0, time.time(), []
    while True:
        el = time.time() - t_start
        if el >= args.seconds or (args.max_steps is not None and step >= args.max_steps):
            break
        idx = torch.from_numpy(rng.integers(0, len(train), args.batch)).to(dev)
        z = mean[idx]
        half = args.batch // 2
        eps = torch.randn(z[:half].shape, device=dev, generator=gen)
        z = torch.cat([z[:half] + std[idx[:half]] * eps, z[half:]])
        target = data.frames_to_pixels(frames_t[idx])
        frac = el / args.seconds if args.max_steps is None else step / max(args.max_steps, 1)
        lr = lr_at(args.lr, frac, step, warmup=100)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss, l2 = loss_fn(vae, z, target)
        optimizer_step(opt, loss, params, lr)
        step += 1
        l2s.append(l2)
        if step % 200 == 0 or step == 1:
            m = float(torch.stack(l2s).mean())
            l2s = []
            log(f"[{NAME}] step {step} t {time.time() - t_start:.0f}s lr {lr:.2e} mse {m:.5f} (~{10 * np.log10(1 / m):.1f} dB)")
    after = evaluate(vae, hmean, held, dev)
    log(f"[{NAME}] done: {step} steps in {time.time() - t_start:.0f}s; held-out after: {after}")
    for n, p in vae.named_parameters():
        if n in frozen and not torch.equal(p, frozen[n]):
            raise SystemExit(f"{n} changed: the encoder side must stay frozen")
    # Only the trained side travels (the encoder side is the partition's, bit for bit): 13.7 MB in f32, under the
    # device's 16 MiB per returned file.
    sd = {k: v.detach().float().cpu().contiguous() for k, v in vae.state_dict().items()
          if k.startswith(("decoder.", "post_quant_conv."))}
    save_file(sd, str(run / "video_vae_ft.safetensors"))
    (run / "video_decoder-meta.json").write_text(__import__("json").dumps(
        {"steps": step, "seconds": time.time() - t_start, "before": before, "after": after, "args": vars(args)},
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
