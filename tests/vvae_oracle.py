"""Oracle helpers for the video VAE tests: a tiny random diffusers AutoencoderKLMiniMaxH3 written in
the official MiniMax-H3 layout, and diffusers' own decode step run on it.

Temporary home of the official-layout writer until tests/fixtures lands on main (then the tests use
its make_checkpoint / read_official_to_diffusers and this writer goes away).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

TINY = dict(
    in_channels=3, out_channels=3, latent_channels=24, block_out_channels=(8, 16, 16, 32),
    layers_per_block=2, spatial_downsample_factors=(2, 2, 2, 2), temporal_downsample_factors=(1, 2, 2, 1),
    norm_num_groups=4, norm_eps=1e-6, spatial_padding_mode="reflect",
    decoder_num_layers=2, decoder_num_attention_heads=2, decoder_attention_head_dim=16,
    decoder_num_register_tokens=4, decoder_ffn_mult=4, decoder_rope_theta=100.0,
    decoder_rope_dim_ratio=0.75, decoder_norm_eps=1e-5, clip_length=17, token_drop=3,
)
# Odd widths: 3 heads, 2 registers, ffn_mult 2, 3 layers.
ODD = dict(TINY, block_out_channels=(8, 16, 24, 24), layers_per_block=1, decoder_num_layers=3,
           decoder_num_attention_heads=3, decoder_num_register_tokens=2, decoder_ffn_mult=2)


def build_vae(cfg: dict, seed: int):
    """A diffusers video VAE whose decoder parameters are all random (layer scales included)."""
    from diffusers import AutoencoderKLMiniMaxH3

    g = torch.Generator().manual_seed(seed)
    C = cfg["latent_channels"]
    mean = (torch.randn(C, generator=g) * 0.5).tolist()
    std = (torch.rand(C, generator=g) + 0.5).tolist()
    vae = AutoencoderKLMiniMaxH3(**cfg, latents_mean=tuple(mean), latents_std=tuple(std)).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if not (name.startswith("decoder.") or name.startswith("post_quant_conv.")):
                continue
            if name.endswith("scale1") or name.endswith("scale2"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "register_tokens" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:  # matrices: fan-in scaled; proj_out wider so the output also hits the clamp
                fan_in = p[0].numel()
                k = 3.0 if name.startswith("decoder.proj_out") else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * (k / math.sqrt(fan_in)))
    return vae


def official_tensors(vae) -> dict[str, torch.Tensor]:
    """diffusers state dict -> official video_vae/source tensors (decoder part + post_quant_conv)."""
    sd = vae.state_dict()
    heads = vae.config.decoder_num_attention_heads
    out = {}
    for name, t in sd.items():
        if name.startswith("decoder.proj_in."):
            out["decoder.x_embedder." + name[len("decoder.proj_in."):]] = t
        elif ".attn.to_q." in name:
            q, k, v = (sd[name.replace(".to_q.", f".to_{x}.")] for x in "qkv")
            dh = q.shape[0] // heads
            parts = [x.reshape(heads, dh, *x.shape[1:]) for x in (q, k, v)]
            out[name.replace(".to_q.", ".to_qkv.")] = torch.stack(parts, 1).reshape(3 * heads * dh, *q.shape[1:])
        elif ".attn.to_k." in name or ".attn.to_v." in name:
            continue
        elif ".attn.to_out.0." in name:
            out[name.replace(".to_out.0.", ".to_out.")] = t
        elif ".ff.net.0.proj." in name:
            up, gate = t.chunk(2, 0)
            out[name.replace(".ff.net.0.proj.", ".ff.w1.")] = torch.cat([gate, up], 0)
        elif ".ff.net.2." in name:
            out[name.replace(".ff.net.2.", ".ff.w2.")] = t
        else:
            out[name] = t  # encoder.* (names unused by decoding), quant_conv, post_quant_conv, ...
    out["decoder.mask_token"] = torch.zeros(1, 1, sd["decoder.register_tokens"].shape[-1])
    return {k: v.contiguous().float() for k, v in out.items()}


def write_official(vae, root: Path, drop: tuple[str, ...] = ()) -> Path:
    """Write FL2VA/video_vae in the official layout; `drop` removes tensors (for error tests)."""
    from safetensors.torch import save_file

    c = vae.config
    d = Path(root) / "FL2VA" / "video_vae"
    (d / "source").mkdir(parents=True, exist_ok=True)
    top = {"_class_name": "MiniMaxH3VideoVAE", "latent_channels": c.latent_channels,
           "latents_mean": list(c.latents_mean), "latents_std": list(c.latents_std), "source_path": "source",
           "source_safetensors_path": "model.safetensors", "vae_clip_length": c.clip_length,
           "vae_token_drop": c.token_drop, "vae_tile_size": 256, "vae_tile_overlap_min": 64}
    src = {"_class_name": "AutoencoderKLLegacy", "z_channels": c.latent_channels, "out_ch": c.out_channels,
           "space_down": list(c.spatial_downsample_factors), "time_down": list(c.temporal_downsample_factors),
           "vae_ratio": math.prod(c.spatial_downsample_factors),
           "vae_ratio_t": math.prod(c.temporal_downsample_factors),
           "vit_decoder_kwargs": {"num_layers": c.decoder_num_layers, "heads": c.decoder_num_attention_heads,
                                  "dim_head": c.decoder_attention_head_dim, "rope_theta": c.decoder_rope_theta,
                                  "rope_dim_ratio": c.decoder_rope_dim_ratio,
                                  "num_register_tokens": c.decoder_num_register_tokens,
                                  "ffn_mult": c.decoder_ffn_mult, "eps": c.decoder_norm_eps}}
    (d / "config.json").write_text(json.dumps(top, indent=1))
    (d / "source" / "config.json").write_text(json.dumps(src, indent=1))
    tensors = {k: v for k, v in official_tensors(vae).items() if k not in drop}
    save_file(tensors, str(d / "source" / "model.safetensors"))
    return Path(root)


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def set_tiling(vae, tile_px: int | None, overlap_px: int | None, untiled: bool = False) -> None:
    if untiled:
        vae.disable_tiling()
        return
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = tile_px or 256
    vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = overlap_px or 64


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
    comp.pixel_mean, comp.pixel_std = IMAGENET_MEAN, IMAGENET_STD
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
