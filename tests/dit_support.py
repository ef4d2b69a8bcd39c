"""Oracle helpers for the transformer tests, on top of the shared fixtures (tests/fixtures).

The shared `build_models` builds all four components; the transformer tests need many DiT geometries and nothing
else, so they build the DiT alone with the same pieces: `TINY_CONFIGS[name]["transformer"]`,
`randomize_parameters_`, and the official layout of `dit_state_dict_to_official` / `dit_official_config` /
`official_dit_dtype`. The reference model is always the checkpoint *read back* through diffusers' own converter
(`convert_minimax_h3_transformer_checkpoint_to_diffusers(..., qkv_layout="interleaved")`, as
`read_official_to_diffusers` does), so libh3's reading of the official layout is checked against diffusers' reading
of it, and a BF16 checkpoint's reference holds exactly the BF16-rounded weights upcast to f32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.fixtures import official as fx

DIT_CONFIGS = {name: dict(fx.TINY_CONFIGS[name]["transformer"]) for name in ("tiny", "odd", "wide")}


def build_dit(kwargs: dict, seed: int):
    """A diffusers MiniMaxH3Transformer3DModel (f32, eval) randomised like the shared fixtures."""
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MiniMaxH3Transformer3DModel(**kwargs).eval()
    fx.randomize_parameters_(model, torch.Generator().manual_seed(seed))
    return model


def official_tensors(model, dtype: str = "official") -> dict[str, torch.Tensor]:
    off = fx.dit_state_dict_to_official(model.state_dict(), int(model.config.num_attention_heads),
                                        model.rope.inv_freq.clone())
    return {n: t.to(fx.official_dit_dtype(n, dtype)).contiguous() for n, t in off.items()}


def write_checkpoint(model, root, dtype: str = "official", shifts=(12.0, 3.0), tensors=None) -> Path:
    """Write `model` as `root/FL2VA/{model_index.json, transformer/}` (the transformer alone); returns `root`."""
    from safetensors.torch import save_file

    root = Path(root)
    tdir = root / "FL2VA" / "transformer"
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / "config.json").write_text(json.dumps(fx.dit_official_config(dict(model.config)), indent=2))
    (root / "FL2VA" / "model_index.json").write_text(json.dumps(
        {"_class_name": "MiniMaxH3Pipeline",
         "_minimax_h3": {"sigma_shift_scales": {"video": shifts[0], "audio": shifts[1]}}}))
    save_file(tensors if tensors is not None else official_tensors(model, dtype), str(tdir / "model.safetensors"),
              metadata={"format": "pt"})
    return root


def read_back(root):
    """The transformer of `root` (a model root or a partition folder) in diffusers, f32, via diffusers' converter."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    root = Path(root)
    pdir = root / "FL2VA" if (root / "FL2VA").is_dir() else root
    tdir = pdir / "transformer"
    cfg = fx.dit_diffusers_config(json.loads((tdir / "config.json").read_text()))
    sd = {k: v.float() for k, v in fx.load_component_tensors(tdir).items()}
    conv = convert_minimax_h3_transformer_checkpoint_to_diffusers(sd, config=dict(cfg), qkv_layout="interleaved")
    model = MiniMaxH3Transformer3DModel(**cfg).eval()
    missing, unexpected = model.load_state_dict(conv, strict=True)
    assert not missing and not unexpected
    return model


# ---- diffusers' side of a t2va request -----------------------------------------------------------------------------


def t2va_layout(model, n_text, lat_t, lat_h, lat_w, audio_lat, text_tags=None, anchors=()):
    """diffusers' packed layout (MiniMaxH3PrepareLayoutStep.build_packed_sequence)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    tags = torch.ones(n_text, dtype=torch.long) if text_tags is None else torch.as_tensor(text_tags, dtype=torch.long)
    return MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        tags, lat_t, lat_h, lat_w, audio_lat, tuple(model.config.patch_size), 2, 2, 0, tuple(anchors))


def diffusers_denoise(model, prompt_embeds, latents, audio_latents, steps, shifts=(12.0, 3.0)):
    """diffusers' t2va loop (denoise.py): two MiniMaxH3Scheduler, one forward per step, generated rows stepped.

    latents: [1, C, T, H, W]; audio_latents: [2, C_a, T_a]. Returns the final (latents, audio_latents) the
    AfterDenoise step produces.
    """
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3SetTimestepsStep, patchify_video_latents)

    _, C, T, Hh, Ww = latents.shape
    Ta = audio_latents.shape[-1]
    pos, tags, vidx, aidx, tidx, ncv, nca = t2va_layout(model, prompt_embeds.shape[1], T, Hh, Ww, Ta)
    sched, asched = MiniMaxH3Scheduler(shift=shifts[0]), MiniMaxH3Scheduler(shift=shifts[1])
    sched.set_timesteps(steps)
    asched.set_timesteps(steps)
    plan = [MiniMaxH3SetTimestepsStep.build_row_timesteps(vidx, aidx, ncv, nca, tidx.numel(), float(t), float(ta),
                                                           max(float(t), 0.999), 1.0)
            for t, ta in zip(sched.timesteps, asched.timesteps)]
    x = patchify_video_latents(latents.float(), tuple(model.config.patch_size))
    a = audio_latents.float().permute(0, 2, 1).reshape(-1, audio_latents.shape[1])
    with torch.no_grad():
        for i, t in enumerate(sched.timesteps):
            ts, tsi = plan[i]
            v, av = model(hidden_states=x[None], audio_hidden_states=a[None], encoder_hidden_states=prompt_embeds,
                          timestep=ts, timestep_indices=tsi, token_tags=tags, position_ids=pos, video_indices=vidx,
                          audio_indices=aidx, text_indices=tidx, return_dict=False)
            x[ncv:] = sched.step(v[0, ncv:].float(), t, x[ncv:], return_dict=False)[0]
            a[nca:] = asched.step(av[0, nca:].float(), asched.timesteps[i], a[nca:], return_dict=False)[0]
    ph, pw = model.config.patch_size[1:]
    rows = x.reshape(1, T, Hh // ph, Ww // pw, C, 1, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
    lat = rows.reshape(1, C, T, Hh, Ww).contiguous()
    aud = a.reshape(2, Ta, -1).permute(0, 2, 1).contiguous()
    return lat, aud


def rel_l2(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
