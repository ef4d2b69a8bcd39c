"""diffusers oracle for the audio VAE decoder, shared by tests/test_audio_vae.py and tests/bench_vae_audio.py.

* `build_audio_vae(name)`: an `AutoencoderKLMiniMaxH3Audio` with seeded random parameters (the fixtures' scheme,
  `randomize_parameters_`), latents_mean/std, and per-activation perturbed resampling filters (diffusers stores one
  filter pair per alias-free activation, all equal at init; perturbing them shows which ones an engine reads).
* `write_audio_vae(model, root)`: the official `root/FL2VA/audio_vae/` folder (config.json, metadata.json with the
  h3ctl extensions where needed, model.safetensors = the diffusers state dict unchanged, F32).
* `diffusers_decode(model, latents)`: diffusers' own `MiniMaxH3AudioDecodeStep` on [2, C, Ta] -> [1, 2, samples].
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import torch

from tests.fixtures import TINY_CONFIGS
from tests.fixtures.official import audio_vae_official_configs, randomize_parameters_

# Non-released geometry on purpose: kernels off the 2u - u%2 rule (stage 2 has (k - u) odd, so it emits one extra
# sample), two resblocks with their own dilations, and stage widths 12 and 6 that are not multiples of 8.
WEIRD = dict(encoder_dim=4, encoder_rates=(4, 5, 3), latent_dim=64, latent_channels=32, num_attention_heads=1,
             decoder_dim=24, decoder_rates=(4, 5, 3), decoder_kernel_sizes=(9, 5, 8), resblock_kernel_sizes=(5, 3),
             resblock_dilation_sizes=((1, 2), (3, 4)), sampling_rate=24000)
# The released geometry is diffusers' defaults.
CONFIGS = {"tiny": TINY_CONFIGS["tiny"]["audio_vae"], "odd": TINY_CONFIGS["odd"]["audio_vae"],
           "wide": TINY_CONFIGS["wide"]["audio_vae"], "weird": WEIRD, "release": {}}


class threads:
    """torch intra-op threads inside the block (restored afterwards)."""

    def __init__(self, n: int):
        self.want = n

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(self.want)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def build_audio_vae(name: str, seed: int = 0, post_gain: float = 1.0):
    from diffusers import AutoencoderKLMiniMaxH3Audio
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3_audio import MiniMaxH3AudioActivation1d

    cfg = dict(CONFIGS[name])
    g = torch.Generator().manual_seed(1000 + seed)
    latent = cfg.get("latent_channels", 32)
    mean = (torch.randn(latent, generator=g) * 0.5).tolist()
    std = (0.5 + 1.5 * torch.rand(latent, generator=g)).tolist()
    with threads(1), torch.no_grad():
        model = AutoencoderKLMiniMaxH3Audio(**cfg, latents_mean=mean, latents_std=std)
        randomize_parameters_(model, g)
        for mod in model.decoder.modules():
            if isinstance(mod, MiniMaxH3AudioActivation1d):
                mod.upsample.filter.add_(torch.randn(mod.upsample.filter.shape, generator=g) * 0.01)
                mod.downsample.lowpass.filter.add_(torch.randn(mod.downsample.lowpass.filter.shape, generator=g) * 0.01)
        model.decoder.conv_post.weight_g.mul_(post_gain)
    return model.eval()


#: The audio VAE's encoder-side tensors (what h3-tiny may store as BF16); everything else is the decoder's.
ENCODER_PREFIXES = ("encoder.", "pre_block.", "mean_proj.", "logs_proj.")


def bf16_encoder_(model):
    """Round the encoder-side parameters of `model` through bfloat16, in place (what a BF16 file holds, in f32)."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if k.startswith(ENCODER_PREFIXES) and v.is_floating_point():
                v.copy_(v.to(torch.bfloat16).float())
    return model


def write_audio_vae(model, root: Path, drop: str | None = None, reshape: dict | None = None,
                    encoder_bf16: bool = False) -> Path:
    """Write root/FL2VA/audio_vae; `drop` leaves a tensor out, `reshape` {name: shape} replaces tensors with ones,
    `encoder_bf16` stores the encoder-side tensors (ENCODER_PREFIXES) as BF16 (the decoder stays F32)."""
    from safetensors.torch import save_file

    root = Path(root)
    d = root / "FL2VA" / "audio_vae"
    d.mkdir(parents=True, exist_ok=True)
    top, meta = audio_vae_official_configs(dict(model.config))
    (d / "config.json").write_text(json.dumps(top))
    (d / "metadata.json").write_text(json.dumps(meta))
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items() if k != drop}
    if encoder_bf16:
        sd = {k: v.to(torch.bfloat16) if k.startswith(ENCODER_PREFIXES) else v for k, v in sd.items()}
    for k, shape in (reshape or {}).items():
        sd[k] = torch.ones(shape)
    save_file(sd, str(d / "model.safetensors"))
    return root


def diffusers_decode(model, latents: np.ndarray, num_threads: int = 1) -> np.ndarray:
    """diffusers' MiniMaxH3AudioDecodeStep on [2, C, Ta] -> audio [1, 2, samples]."""
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3AudioDecodeStep

    components = types.SimpleNamespace(audio_vae=model, _execution_device=torch.device("cpu"),
                                       audio_sampling_rate=model.config.sampling_rate)
    state = PipelineState()
    state.set("audio_latents", torch.from_numpy(latents))
    with threads(num_threads):
        _, state = MiniMaxH3AudioDecodeStep()(components, state)
    return state.get("audio").numpy()


def rel_l2(a, b) -> float:
    return float(np.linalg.norm((np.asarray(a) - b).ravel()) / max(np.linalg.norm(np.asarray(b).ravel()), 1e-30))


def latents_for(model, frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, model.config.latent_channels, frames)).astype(np.float32)
