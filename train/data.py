"""Dataset helpers shared by the h3-tiny training stages: parallel rendering of `world` clips, pixel/latent
conversions the diffusers pipeline uses, and encoding a rendered set to normalised latents.

Training data only ever comes from ``world.dataset_item(i, seed, split="train")`` (the held-out attribute combinations
never occur there); evaluation uses ``world.heldout_specs()`` / ``split="heldout"``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import world  # noqa: E402
from train.models import AUDIO_SAMPLES, FRAMES, HEIGHT, IMAGENET_MEAN, IMAGENET_STD, WIDTH  # noqa: E402


def _render(args):
    i, seed, split, want_video = args
    spec, clip = world.dataset_item(i, seed, split, WIDTH, HEIGHT, FRAMES)
    return i, (clip.frames if want_video else None), clip.audio, world.caption_line(spec), world.caption_ir(spec)


def render(n: int, seed: int = 0, split: str = "train", workers: int | None = None, video: bool = True,
           start: int = 0, log=print) -> dict:
    """Render items ``start .. start+n-1`` of ``iter_dataset(seed, split)`` in parallel.

    Returns {"frames": uint8 [n, F, H, W, 3] (if video), "audio": f32 [n, 2, S], "line": [str], "ir": [str]}.
    """
    if split != "train" and split != "heldout":
        raise ValueError(split)
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    frames = np.empty((n, FRAMES, HEIGHT, WIDTH, 3), np.uint8) if video else None
    audio = np.empty((n, 2, AUDIO_SAMPLES), np.float32)
    line, ir = [None] * n, [None] * n
    t0 = time.time()
    jobs = [(start + k, seed, split, video) for k in range(n)]
    if workers <= 1:
        it = map(_render, jobs)
        pool = None
    else:
        pool = mp.get_context("fork").Pool(workers)
        it = pool.imap_unordered(_render, jobs, chunksize=16)
    for i, fr, au, ln, irc in it:
        k = i - start
        if video:
            frames[k] = fr
        audio[k] = au
        line[k], ir[k] = ln, irc
    if pool is not None:
        pool.close()
        pool.join()
    log(f"rendered {n} {split} clips (seed {seed}) in {time.time() - t0:.1f}s with {workers} workers")
    return {"frames": frames, "audio": audio, "line": line, "ir": ir}


def frames_to_pixels(frames_u8: torch.Tensor) -> torch.Tensor:
    """uint8 [B, F, H, W, 3] -> float [B, 3, F, H, W] in [0, 1]."""
    return frames_u8.permute(0, 4, 1, 2, 3).float().div_(255.0)


def imagenet_normalize(pixels: torch.Tensor) -> torch.Tensor:
    """[0, 1] pixels [B, 3, ...] -> the video VAE's input space."""
    shape = (1, 3) + (1,) * (pixels.dim() - 2)
    mean = torch.tensor(IMAGENET_MEAN, device=pixels.device, dtype=pixels.dtype).view(shape)
    std = torch.tensor(IMAGENET_STD, device=pixels.device, dtype=pixels.dtype).view(shape)
    return (pixels - mean) / std


def imagenet_denormalize(x: torch.Tensor) -> torch.Tensor:
    shape = (1, 3) + (1,) * (x.dim() - 2)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device, dtype=x.dtype).view(shape)
    std = torch.tensor(IMAGENET_STD, device=x.device, dtype=x.dtype).view(shape)
    return x * std + mean


@torch.no_grad()
def encode_video(vae, frames_u8: np.ndarray, batch: int = 32, device="cpu", autocast: bool = False) -> torch.Tensor:
    """Posterior means (un-normalised) [N, 24, T, h, w] float32 on CPU."""
    out = []
    for s in range(0, len(frames_u8), batch):
        x = torch.from_numpy(np.ascontiguousarray(frames_u8[s:s + batch])).to(device)
        x = imagenet_normalize(frames_to_pixels(x))
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            post = vae.encode(x).latent_dist
        out.append(post.mean.float().cpu())
    return torch.cat(out)


def keyframe_posterior_noise(shape=(1, 24, 1, 8, 8)) -> torch.Tensor:
    """The draw of ``encode_vae_condition``'s ``posterior.sample(torch.Generator().manual_seed(42))``: a fresh CPU
    generator per keyframe, so every keyframe of one latent shape gets this same tensor."""
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(tuple(shape), generator=torch.Generator().manual_seed(42), device=torch.device("cpu"),
                        dtype=torch.float32)


@torch.no_grad()
def encode_keyframes(vae, frames_u8: np.ndarray, batch: int = 256, device="cpu") -> torch.Tensor:
    """diffusers' ``encode_vae_condition`` for single keyframes, batched: uint8 [N, H, W, 3] -> normalised conditioning
    latents [N, C, 1, h, w] float32 on CPU. pixels / 255, ImageNet normalisation, the spatial encoder alone (one
    frame), the posterior *sampled* with the seed-42 draw, rounded through float16, then (z - latents_mean) /
    latents_std. Runs in float32 with TF32 off (inference's arithmetic), whatever the caller's settings."""
    dev = torch.device(device)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    out = []
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        eps = None
        for s in range(0, len(frames_u8), batch):
            x = torch.from_numpy(np.ascontiguousarray(frames_u8[s:s + batch])).to(dev)
            x = x.permute(0, 3, 1, 2)[:, :, None]                                   # [b, 3, 1, H, W] uint8
            x = (x.to(torch.float32).div(255.0) - torch.tensor(IMAGENET_MEAN, device=dev).view(1, -1, 1, 1, 1)) \
                / torch.tensor(IMAGENET_STD, device=dev).view(1, -1, 1, 1, 1)
            post = vae.encode(x, return_dict=False)[0]
            if eps is None:
                eps = keyframe_posterior_noise((1,) + tuple(post.mean.shape[1:])).to(dev)
            z = (post.mean + post.std * eps).to(torch.float16).float().cpu()
            out.append((z - mean) / std)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return torch.cat(out)


@torch.no_grad()
def encode_audio(vae, audio: np.ndarray, batch: int = 64, device="cpu") -> torch.Tensor:
    """Posterior means (un-normalised) [N, 2, 32, T_a] float32 on CPU; stereo sides folded into the batch."""
    out = []
    for s in range(0, len(audio), batch):
        x = torch.from_numpy(np.ascontiguousarray(audio[s:s + batch])).to(device)
        b = x.shape[0]
        z = vae.encode(x.reshape(b * 2, 1, -1)).latent_dist.mode().float()
        out.append(z.reshape(b, 2, z.shape[1], z.shape[2]).cpu())
    return torch.cat(out)


def channel_stats(latents: torch.Tensor, channel_dim: int) -> tuple[list[float], list[float]]:
    """Per-channel mean / std over every other axis."""
    x = latents.transpose(0, channel_dim).reshape(latents.shape[channel_dim], -1).double()
    return x.mean(1).tolist(), x.std(1).clamp_min(1e-6).tolist()


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return 10 * np.log10(1.0 / max(mse, 1e-12))
