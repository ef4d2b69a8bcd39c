"""Oracle helpers for the video VAE tests: diffusers' own decode step on a tiny video VAE, and a writer of only
the video VAE part of an official checkpoint (through tests/fixtures' mapping), for extra geometries and for
broken files. The shared session checkpoint (`tiny_ckpt`) comes from tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import torch

from tests.fixtures import official as F


def build_video_vae(config_name: str, seed: int):
    """The video VAE of fixture geometry `config_name`, randomised as build_models does (without building the
    text encoder and the DiT, which the video tests do not need)."""
    from diffusers import AutoencoderKLMiniMaxH3

    cfg = F.TINY_CONFIGS[config_name]["video_vae"]
    g = torch.Generator().manual_seed(int(seed) * 7919 + 2)
    latent = cfg["latent_channels"]
    mean = (torch.randn(latent, generator=g) * 0.5).tolist()
    std = (0.5 + 1.5 * torch.rand(latent, generator=g)).tolist()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        vae = AutoencoderKLMiniMaxH3(**cfg, latents_mean=tuple(mean), latents_std=tuple(std))
    F.randomize_parameters_(vae, g)
    return vae.eval().requires_grad_(False)


def write_video_vae(vae, root, drop: tuple[str, ...] = ()) -> Path:
    """Write `root`/FL2VA/video_vae in the official layout (fixtures' name mapping and configs); `drop` leaves
    tensors out. Returns the partition directory."""
    from safetensors.torch import save_file

    top, src = F.video_vae_official_configs(dict(vae.config))
    tensors = F.video_vae_state_dict_to_official(vae.state_dict(), int(vae.config.decoder_num_attention_heads))
    part = Path(root) / "FL2VA"
    d = part / "video_vae"
    (d / "source").mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(top, indent=1))
    (d / "source" / "config.json").write_text(json.dumps(src, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items() if k not in drop}, str(d / "source" / "model.safetensors"))
    return part


def _pixel_stats():
    """ImageNet mean / std as MiniMaxH3ModularPipeline declares them (constant properties)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    return MiniMaxH3ModularPipeline.pixel_mean.fget(None), MiniMaxH3ModularPipeline.pixel_std.fget(None)


@contextlib.contextmanager
def tiling(vae, tile_px: int | None = None, overlap_px: int | None = None, untiled: bool = False):
    """Set diffusers' tile geometry for the block (0/None = its defaults, 256 / 64) and restore it after: the
    session's models are shared with other tests."""
    saved = (vae.use_tiling, vae.tile_sample_min_height, vae.tile_sample_min_width,
             vae.tile_sample_min_overlap_height, vae.tile_sample_min_overlap_width)
    if untiled:
        vae.disable_tiling()
    else:
        vae.use_tiling = True
        vae.tile_sample_min_height = vae.tile_sample_min_width = tile_px or 256
        vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = overlap_px or 64
    try:
        yield vae
    finally:
        (vae.use_tiling, vae.tile_sample_min_height, vae.tile_sample_min_width,
         vae.tile_sample_min_overlap_height, vae.tile_sample_min_overlap_width) = saved


@torch.no_grad()
def reference_sample(vae, latents: np.ndarray) -> np.ndarray:
    """vae.decode() of the de-normalised latents: [3, F, H, W] (ImageNet-normalised space)."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    z = torch.from_numpy(latents).reshape(1, *latents.shape[-4:]) * std + mean
    return vae.decode(z, return_dict=False)[0][0].numpy()


@torch.no_grad()
def reference_videos(vae, latents: np.ndarray) -> np.ndarray:
    """diffusers' MiniMaxH3VideoDecodeStep itself (output_type="np"): [1, F, H, W, 3] in [0, 1]."""
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3VideoDecodeStep
    from diffusers.video_processor import VideoProcessor

    class Components:  # the attributes the step reads from its pipeline
        pass

    comp = Components()
    comp.vae = vae
    comp.video_processor = VideoProcessor(vae_scale_factor=16, do_normalize=False)
    comp.pixel_mean, comp.pixel_std = _pixel_stats()
    comp._execution_device = torch.device("cpu")
    state = PipelineState()
    state.set("latents", torch.from_numpy(latents).reshape(1, *latents.shape[-4:]))
    state.set("output_type", "np")
    _, state = MiniMaxH3VideoDecodeStep()(comp, state)
    return state.get("videos")


def to_uint8(videos: np.ndarray) -> np.ndarray:
    """The VideoProcessor's numpy_to_pil conversion."""
    return (videos * 255).round().astype("uint8")


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
