"""Stage 1b: train the h3-tiny audio VAE (diffusers AutoencoderKLMiniMaxH3Audio) on world soundtracks.

The VAE is mono, as released: each stereo clip gives two batch items (left, right). Training runs diffusers'
``encode`` (posterior sampled) and ``decode`` on random crops (default 16 latents = 0.4 s) with a random gain.
Loss: ``10 L1 + 100 MSE (waveform) + MR-STFT`` (spectral convergence + L1 of log(|X| + 1e-3 n) at FFT sizes
2048/1024/512/256/128, hop n/4, Hann) ``+ kl_weight * KL`` (mean per latent element; the posterior's second head predicts log std).
Reports SNR, log-spectral distance, dominant-frequency agreement and click-onset recall on full held-out clips.

    python -m train.train_audio_vae --run train/runs/vae --minutes 6 --clips 6000
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

from train import data, world  # noqa: E402
from train.common import Budget, Logger, Saver, StepStats, device_of, fast_cuda, load_state  # noqa: E402
from train.common import lr_at, optimizer_step, seed_all  # noqa: E402
from train.models import build_audio_vae, init_audio_vae_  # noqa: E402

NAME = "audio_vae"
FFTS = (2048, 1024, 512, 256, 128)


def mrstft(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """pred/target [B, S] -> spectral convergence + log-magnitude L1, averaged over resolutions."""
    total = 0.0
    for n in FFTS:
        win = torch.hann_window(n, device=pred.device)
        P = torch.stft(pred, n, n // 4, window=win, return_complex=True).abs()
        T = torch.stft(target, n, n // 4, window=win, return_complex=True).abs()
        sc = torch.linalg.norm(T - P) / torch.linalg.norm(T).clamp_min(1e-3)
        # log-magnitude with a floor ~37 dB under a full-scale tone's peak: a tiny floor (1e-5) makes every
        # near-silent bin of a pure tone dominate the loss and the decoder learns silence (seen on the device)
        eps = 1e-3 * n
        mag = (torch.log(P + eps) - torch.log(T + eps)).abs().mean()
        total = total + sc + mag
    return total / len(FFTS)


def loss_fn(vae, x: torch.Tensor, kl_weight: float, gen=None):
    """x [B, 1, S] mono waveforms."""
    post = vae.encode(x).latent_dist
    mean, logs = post.mean.float(), post.logs.float()
    z = mean + torch.exp(logs) * torch.randn(mean.shape, device=mean.device, generator=gen)
    y = vae.decode(z).sample.float()[..., : x.shape[-1]]
    l1 = (y - x).abs().mean()
    l2 = (y - x).pow(2).mean()
    spec = mrstft(y[:, 0], x[:, 0])
    kl = 0.5 * (mean.pow(2) + torch.exp(2 * logs) - 1.0 - 2 * logs).mean()
    loss = 10.0 * l1 + 100.0 * l2 + spec + kl_weight * kl
    return loss, {"l1": l1.detach(), "l2": l2.detach(), "stft": spec.detach(), "kl": kl.detach()}


def _dominant_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1.0 / world.SAMPLE_RATE)[int(np.argmax(spec))])


def _click_env(x: np.ndarray) -> np.ndarray:
    """High-pass (first difference) energy in 2 ms hops."""
    d = np.diff(x, prepend=x[:1]) ** 2
    hop = 64
    n = len(d) // hop
    return d[: n * hop].reshape(n, hop).sum(1)


@torch.no_grad()
def evaluate(vae, audio: np.ndarray, device) -> dict:
    vae.eval()
    x = torch.from_numpy(audio).to(device)
    b = x.shape[0]
    y = vae(x.reshape(b * 2, 1, -1)).sample.float().reshape(b, 2, -1).cpu().numpy()
    vae.train()
    snr, lsd, hz_ok, hz_n, click_hits, click_n = [], [], 0, 0, 0, 0
    for i in range(b):
        t2, p2 = audio[i].astype(np.float64), y[i].astype(np.float64)
        e = (t2 ** 2).sum()
        if e > 1.0:  # skip silent clips (RMS below ~0.004)
            snr.append(10 * np.log10(e / max(((t2 - p2) ** 2).sum(), 1e-12)))
        for c in range(2):
            t, p = t2[c], p2[c]
            if (t ** 2).sum() < 1.0:
                continue
            T = np.abs(np.fft.rfft(t)) + 1e-6
            P = np.abs(np.fft.rfft(p)) + 1e-6
            lsd.append(float(np.sqrt(np.mean((20 * np.log10(P / T)) ** 2))))
            ft, fp = _dominant_hz(t), _dominant_hz(p)
            hz_n += 1
            hz_ok += abs(fp - ft) <= 0.08 * max(ft, 1.0)
    # clicks: the strongest high-pass bursts of the target should be in the prediction too (within 10 ms)
    for i in range(b):
        tm = audio[i].mean(0)
        pm = y[i].mean(0)
        et, ep = _click_env(tm), _click_env(pm)
        if et.max() < 1e-3:
            continue
        peaks = np.where(et > 0.3 * et.max())[0]
        if len(peaks) == 0:
            continue
        click_n += 1
        k = int(peaks[0])
        lo, hi = max(0, k - 5), k + 6
        click_hits += ep[lo:hi].max() > 0.3 * ep.max()
    return {"snr_db": float(np.mean(snr)) if snr else float("nan"),
            "lsd_db": float(np.mean(lsd)) if lsd else float("nan"),
            "dominant_hz_match": hz_ok / max(hz_n, 1), "click_recall": click_hits / max(click_n, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="train/runs/vae")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--clips", type=int, default=6000)
    ap.add_argument("--eval-clips", type=int, default=32)
    ap.add_argument("--batch", type=int, default=48, help="mono crops per step")
    ap.add_argument("--crop-latents", type=int, default=16)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--kl-weight", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--data-seed", type=int, default=200)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--save-every", type=float, default=90.0)
    ap.add_argument("--bigvgan-init", action="store_true", help="N(0, 0.01) decoder init (slow start; default: "
                    "diffusers' init)")
    ap.add_argument("--p-sounding", type=float, default=0.8, help="fraction of crops from non-silent channels")
    ap.add_argument("--p-hard", type=float, default=0.0,
                    help="fraction of crops from clips with a beep or bounce clicks (the sounds a short run misses)")
    ap.add_argument("--init-from", default=None,
                    help="dir with audio_vae-model*.safetensors to start from when the run dir has no checkpoint "
                         "(weights only, fresh optimizer)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--deadline", type=float, default=None,
                    help="absolute wall-clock time (epoch seconds) at which to stop and save, whatever the budget")
    args = ap.parse_args(argv)

    run = Path(args.run)
    log = Logger(run / f"{NAME}.log")
    dev = device_of(args.device)
    fast_cuda(dev)
    seed_all(args.seed)

    vae = build_audio_vae()
    if args.bigvgan_init:
        init_audio_vae_(vae)
    vae = vae.to(dev).train()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.lr, betas=(0.8, 0.99), weight_decay=0.0)
    meta = load_state(run, NAME, {"model": vae}, opt)
    if meta is None and args.init_from:
        from train.common import load_weights

        vae.load_state_dict(load_weights(Path(args.init_from), NAME, "model"))  # BF16 files are cast on load
        log(f"[{NAME}] initialised from {args.init_from}")
    meta = meta or {"step": 0, "elapsed": 0.0}
    log(f"[{NAME}] device {dev} params {sum(p.numel() for p in vae.parameters()):,} resume step {meta['step']}")

    rendered = data.render(args.clips, seed=args.data_seed, split="train", workers=args.workers, video=False, log=log)
    train = rendered["audio"]
    # the 880 Hz beep and the bounce clicks are what a short run drops first (both decoded as silence once):
    # --p-hard draws that share of crops from the clips whose caption names them (both stereo sides)
    hard_clip = np.array(["beep" in c or "click" in c for c in rendered["line"]])
    hard = np.flatnonzero(np.repeat(hard_clip, 2))
    heldout = data.render(args.eval_clips, seed=args.data_seed, split="heldout", workers=args.workers, video=False,
                          log=log)["audio"]
    mono = torch.from_numpy(train.reshape(-1, train.shape[-1])).to(dev)   # [2N, S] on the device
    S = mono.shape[1]
    sounding = torch.nonzero(mono.pow(2).sum(1) > 1.0).flatten().cpu().numpy()
    log(f"[{NAME}] {len(sounding)}/{mono.shape[0]} sounding channels, {len(hard)} with a beep or clicks")
    crop = args.crop_latents * 800
    rng = np.random.default_rng(args.seed + meta["step"])
    gen = torch.Generator(device=dev).manual_seed(args.seed + meta["step"])

    budget = Budget(args.minutes * 60, args.max_steps, meta["elapsed"], meta["step"],
                    deadline=args.deadline)
    stats, saver = StepStats(50), Saver(run, NAME, {"model": vae}, opt, args.save_every)
    ar = torch.arange(crop, device=dev)
    while not budget.done():
        rows = rng.integers(0, mono.shape[0], args.batch)
        pick = rng.random(args.batch) < args.p_sounding
        rows[pick] = sounding[rng.integers(0, len(sounding), int(pick.sum()))]
        if args.p_hard > 0 and len(hard):
            pick = rng.random(args.batch) < args.p_hard
            rows[pick] = hard[rng.integers(0, len(hard), int(pick.sum()))]
        rows = torch.from_numpy(rows).to(dev)
        starts = torch.from_numpy(rng.integers(0, S - crop + 1, args.batch)).to(dev)
        x = mono[rows[:, None], starts[:, None] + ar[None]]
        gain = torch.from_numpy(rng.uniform(0.4, 2.0, (args.batch, 1)).astype(np.float32)).to(dev)
        x = (x * gain).clamp(-1, 1)[:, None]
        lr = lr_at(args.lr, budget.fraction, budget.step, warmup=args.warmup)
        loss, parts = loss_fn(vae, x, args.kl_weight, gen)
        gn = optimizer_step(opt, loss, vae.parameters(), lr)
        budget.step += 1
        rows = stats.add(budget.step, [loss, *parts.values(), gn])
        if rows is not None:
            a = rows.mean(0).tolist()
            log(f"[{NAME}] step {budget.step} t {budget.elapsed:.0f}s lr {lr:.2e} loss {a[0]:.4f} l1 {a[1]:.5f} "
                f"l2 {a[2]:.5f} stft {a[3]:.4f} kl {a[4]:.2f} gnorm {a[5]:.2f} {stats.sec_per_step:.3f}s/step")
        saver.maybe(budget)
    ev = evaluate(vae, heldout, dev)
    saver.save(budget, eval_heldout=ev, args=vars(args))
    log(f"[{NAME}] done step {budget.step} held-out {ev}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
