"""Oracle helpers for the transformer tests: tiny random diffusers DiTs written in the official layout.

Only the transformer is built and written (the test needs nothing else), so a checkpoint costs milliseconds.
The reference model is always the checkpoint *read back* through diffusers' own converter
(`convert_minimax_h3_transformer_checkpoint_to_diffusers(..., qkv_layout="interleaved")`), so the official layout
libh3 reads is checked against diffusers' reading of it, and a BF16 checkpoint's reference holds exactly the
BF16-rounded weights upcast to f32.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

# Transformer geometries (diffusers kwargs). "odd" rotates 12 of 16 head dims with 3 heads and odd widths; "wide"
# rotates 30 of 32 (rope_freq_dim 5: pairs d <-> d + 15) with hidden 128 and 4 heads.
DIT_CONFIGS = {
    "tiny": dict(num_attention_heads=2, attention_head_dim=32, hidden_size=64, num_layers=2, num_refiner_layers=2,
                 ffn_dim=128, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=48, freq_dim=16,
                 time_embed_hidden_dim=64, time_embed_dim=32, rope_freq_dim=4),
    "odd": dict(num_attention_heads=3, attention_head_dim=16, hidden_size=48, num_layers=3, num_refiner_layers=1,
                ffn_dim=72, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=40, freq_dim=10,
                time_embed_hidden_dim=56, time_embed_dim=24, rope_freq_dim=2),
    "wide": dict(num_attention_heads=4, attention_head_dim=32, hidden_size=128, num_layers=2, num_refiner_layers=2,
                 ffn_dim=320, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=64, freq_dim=32,
                 time_embed_hidden_dim=128, time_embed_dim=64, rope_freq_dim=5),
}

F32_PREFIXES = ("video_patch_proj.", "audio_patch_proj.", "time_embedder.", "final_layer.video_out.",
                "final_layer.audio_out.", "rope.inv_freq")


def build_dit(kwargs: dict, seed: int):
    """A diffusers MiniMaxH3Transformer3DModel (f32, eval) with every parameter drawn from a seeded generator."""
    from diffusers import MiniMaxH3Transformer3DModel

    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MiniMaxH3Transformer3DModel(**kwargs).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                t = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1])
            elif name.endswith("bias"):
                t = torch.randn(p.shape, generator=gen) * 0.05
            else:  # norm weights
                t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            p.copy_(t)
    return model


def _official_name(name: str) -> str:
    exact = {"proj_in.": "video_patch_proj.", "audio_proj_in.": "audio_patch_proj.", "proj_out.": "final_layer.video_out.",
             "audio_proj_out.": "final_layer.audio_out."}
    for k, v in exact.items():
        if name.startswith(k):
            return v + name[len(k):]
    name = name.replace("token_refiner.refiner_blocks.", "token_refiner.blocks.")
    if name.startswith("transformer_blocks."):
        name = "blocks." + name[len("transformer_blocks."):]
    for a, b in (("context_embedder.", "condition_proj."), ("time_embedder.linear_1.", "time_embedder.proj_in."),
                 ("time_embedder.linear_2.", "time_embedder.proj_out."), ("norm_out.norm.", "final_layer.norm."),
                 ("norm_out.linear.", "final_layer.adaln_proj.linear."), (".attn.norm_q.", ".attn.q_norm."),
                 (".attn.norm_k.", ".attn.k_norm."), (".attn.to_out.0.", ".attn.out_proj."),
                 (".ff.net.0.proj.", ".mlp.fc1."), (".ff.net.2.", ".mlp.fc2.")):
        name = name.replace(a, b)
    return name


def official_tensors(model, dtype: str = "official") -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    heads = model.config.num_attention_heads
    out = {}
    for name, t in sd.items():
        if ".attn.to_k." in name or ".attn.to_v." in name:
            continue
        if ".attn.to_q." in name:
            k = sd[name.replace(".to_q.", ".to_k.")]
            v = sd[name.replace(".to_q.", ".to_v.")]
            d = t.shape[0] // heads
            t = torch.stack([x.reshape(heads, d, -1) for x in (t, k, v)], 1).reshape(3 * heads * d, -1)
            name = name.replace(".to_q.", ".qkv_proj.")
        elif ".ff.net.0.proj." in name:  # diffusers [up; gate] -> official [gate; up]
            up, gate = t.chunk(2, 0)
            t = torch.cat([gate, up], 0)
        out[_official_name(name)] = t
    out["rope.inv_freq"] = model.rope.inv_freq.clone()
    cast = {}
    for n, t in out.items():
        dt = torch.float32 if dtype == "f32" or n.startswith(F32_PREFIXES) else torch.bfloat16
        cast[n] = t.to(dt).contiguous()
    return cast


def official_config(cfg) -> dict:
    return {
        "_class_name": "MiniMaxH3DiTModel", "hidden_size": cfg["hidden_size"], "num_layers": cfg["num_layers"],
        "token_refiner_num_layers": cfg["num_refiner_layers"], "num_attention_heads": cfg["num_attention_heads"],
        "attention_head_dim": cfg["attention_head_dim"], "ffn_hidden_size": cfg["ffn_dim"],
        "latents_dim": cfg["in_channels"], "audio_latents_dim": cfg["audio_in_channels"],
        "patch_size": list(cfg["patch_size"]), "text_dim": cfg["text_dim"], "timestep_input_dim": cfg["freq_dim"],
        "time_embed_hidden_size": cfg["time_embed_hidden_dim"], "time_embed_dim": cfg["time_embed_dim"],
        "adaln_out_features": 18 * cfg["hidden_size"], "final_adaln_out_features": 2 * cfg["hidden_size"],
        "rope_inv_freq_len": cfg["rope_freq_dim"], "rope_theta": float(cfg["rope_theta"]),
        "norm_eps": float(cfg["norm_eps"]), "qk_norm_eps": float(cfg["qk_norm_eps"]),
        "final_norm_eps": float(cfg["final_norm_eps"]),
    }


def write_checkpoint(model, root, dtype: str = "official", shifts=(12.0, 3.0), tensors=None) -> Path:
    """Write `model` as `root/FL2VA/{model_index.json, transformer/}`; returns `root`."""
    from safetensors.torch import save_file

    root = Path(root)
    tdir = root / "FL2VA" / "transformer"
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / "config.json").write_text(json.dumps(official_config(dict(model.config)), indent=2))
    (root / "FL2VA" / "model_index.json").write_text(json.dumps(
        {"_class_name": "MiniMaxH3Pipeline", "_minimax_h3": {"sigma_shift_scales": {"video": shifts[0], "audio": shifts[1]}}}))
    save_file(tensors if tensors is not None else official_tensors(model, dtype), str(tdir / "model.safetensors"),
              metadata={"format": "pt"})
    return root


def read_back(root):
    """The checkpoint under `root` loaded into diffusers (f32) through diffusers' own converter."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers
    from safetensors.torch import load_file

    tdir = Path(root) / "FL2VA" / "transformer"
    off = json.loads((tdir / "config.json").read_text())
    cfg = dict(num_attention_heads=off["num_attention_heads"], attention_head_dim=off["attention_head_dim"],
               hidden_size=off["hidden_size"], num_layers=off["num_layers"],
               num_refiner_layers=off["token_refiner_num_layers"], ffn_dim=off["ffn_hidden_size"],
               in_channels=off["latents_dim"], audio_in_channels=off["audio_latents_dim"],
               patch_size=tuple(off["patch_size"]), text_dim=off["text_dim"], freq_dim=off["timestep_input_dim"],
               time_embed_hidden_dim=off["time_embed_hidden_size"], time_embed_dim=off["time_embed_dim"],
               rope_freq_dim=off["rope_inv_freq_len"], rope_theta=off["rope_theta"])
    sd = {k: v.float() for k, v in load_file(str(tdir / "model.safetensors")).items()}
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
