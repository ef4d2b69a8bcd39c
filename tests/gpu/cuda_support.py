"""Shared pieces of the GPU tests: the skip rule, diffusers in bf16 on the GPU, and inputs as its pipeline gives them.

The skip rule: every GPU test module calls `require_libh3_cuda()` before importing anything heavy, so on a machine
where libh3's CUDA backend is not available (CI) the module is skipped with the backend's own reason. Tests that
compare with diffusers also need torch with CUDA (`torch_cuda` fixture) and diffusers itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from h3ctl import _lib


def require_libh3_cuda() -> dict:
    """Skip the calling module unless h3_backends_json says CUDA is available; returns the cuda entry."""
    try:
        cuda = _lib.backends()["cuda"]
    except _lib.H3Error as e:  # a libh3 that cannot even be loaded cannot run these tests either
        cuda = {"available": False, "reason": str(e)}
    if not cuda.get("available"):
        reason = f"libh3's CUDA backend is not available: {cuda.get('reason') or 'no reason given'}"
        print(f"skip: {reason}")
        pytest.skip(reason, allow_module_level=True)
    return cuda


def require_torch_cuda():
    """torch with a GPU and diffusers, for the comparisons (skips the test otherwise)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA device: the diffusers comparison needs one")
    pytest.importorskip("diffusers", reason="diffusers is the oracle of the comparison")
    return torch


def torch_device():
    """Where the diffusers side runs: the GPU libh3 uses (ordinal 0)."""
    import torch

    return torch.device("cuda", 0)


def denoise_both(ca, cb, T: int, h: int, w: int, n_text: int, seed: int, steps: int):
    """The same random transformer inputs (text states, video and audio latents of T x h x w) denoised for `steps`
    grid points on two contexts of one model: (initial video latents, (video, audio) of ca, (video, audio) of cb)."""
    from h3ctl import transformer as tr

    cfg = tr._config(ca)
    rng = np.random.default_rng(seed)
    pe = rng.standard_normal((n_text, cfg["text_dim"])).astype(np.float32)
    lat = rng.standard_normal((cfg["latents_dim"], T, h, w)).astype(np.float32)
    aud = rng.standard_normal((2, cfg["audio_latents_dim"], 4 * T)).astype(np.float32)
    return lat, tr.denoise(ca, pe, lat, aud, steps)[:2], tr.denoise(cb, pe, lat, aud, steps)[:2]


def velocity_vs(c_ref, c, T: int, h: int, w: int, n_text: int, seed: int):
    """One forward (2 grid points) of the same random inputs on two contexts of one model: the rel-L2 of c's video and
    audio velocity (output minus input) against c_ref's, and c's outputs (for a determinism check)."""
    from h3ctl import transformer as tr

    cfg = tr._config(c_ref)
    rng = np.random.default_rng(seed)
    pe = rng.standard_normal((n_text, cfg["text_dim"])).astype(np.float32)
    lat = rng.standard_normal((cfg["latents_dim"], T, h, w)).astype(np.float32)
    aud = rng.standard_normal((2, cfg["audio_latents_dim"], 4 * T)).astype(np.float32)
    v0, a0, _ = tr.denoise(c_ref, pe, lat, aud, 2)
    v1, a1, _ = tr.denoise(c, pe, lat, aud, 2)
    again = tr.denoise(c, pe, lat, aud, 2)
    same = np.array_equal(v1, again[0]) and np.array_equal(a1, again[1])
    return rel_l2(v1 - lat, v0 - lat), rel_l2(a1 - aud, a0 - aud), same


def heldout_quality(name: str, renders, reference):
    """h3-tiny's semantic suite over its held-out renders (train.world's specs, in order) and how far their frames and
    audio are from `reference` (the bf16 renders of the same noise), printed for the docs; returns (summary,
    per-prompt frame PSNR)."""
    from train import evaluate, world

    specs = world.heldout_specs()
    s = evaluate.summarize([evaluate.check(spec, f, a) for spec, (f, a) in zip(specs, renders)])
    from tests import quality

    ps = [psnr(x[0], y[0]) for x, y in zip(renders, reference)]
    ss = [quality.ssim(x[0], y[0]) for x, y in zip(renders, reference)]
    au = [rel_l2(x[1], y[1]) for x, y in zip(renders, reference)]
    print(f"semantic: cuda {name} {s['passed']}/{s['total']} = {100 * s['pass_rate']:.1f} % {s['per_check']}")
    print(f"{name}: h3-tiny frames vs bf16 over {len(specs)} prompts: PSNR min {min(ps):.1f} dB, mean "
          f"{np.mean(ps):.1f} dB; SSIM min {min(ss):.4f}, mean {np.mean(ss):.4f}; audio rel-L2 max {max(au):.2e}")
    return s, ps


def psnr(a, b) -> float:
    """PSNR in dB of 8-bit frames a against b (99 for identical frames: a finite number that averages)."""
    from tests import quality

    return min(quality.psnr(a, b), 99.0)


def rel_l2(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---- diffusers in bf16 -------------------------------------------------------------------------------------------


def keep_in_fp32(model, name: str) -> bool:
    """diffusers' rule for `_keep_in_fp32_modules` under from_pretrained(torch_dtype=...): a parameter stays f32 when
    one of the dotted components of its name is listed (proj_in, audio_proj_in, time_embedder, proj_out, ...)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    return any(part in keep for part in name.split("."))


def diffusers_bf16(model, device):
    """The model as `MiniMaxH3Transformer3DModel.from_pretrained(..., torch_dtype=torch.bfloat16)` holds it: bf16
    except the f32 islands, on `device`. (Cast here rather than reloaded: from_pretrained's keep-in-fp32 path
    needs accelerate, and the cast is the same rounding.)"""
    import copy

    import torch

    m = copy.deepcopy(model)
    for name, p in m.named_parameters():
        p.data = p.data.to(torch.float32 if keep_in_fp32(m, name) else torch.bfloat16)
    return m.to(device).eval()


def check_dtypes_match_official(model_bf16) -> None:
    """The bf16 model's dtypes are exactly the official checkpoint's (BF16 with F32 islands), so libh3 reading the
    official file and diffusers see the same numbers."""
    import torch

    from tests.fixtures import official as fx

    for name, p in model_bf16.named_parameters():
        off = fx._dit_name_to_official(name.replace(".attn.to_q.", ".attn.qkv_proj."))
        if ".attn.to_k." in name or ".attn.to_v." in name:
            continue
        want = fx.official_dit_dtype(off, "official")
        assert p.dtype == want, (name, off, p.dtype, want)
    assert model_bf16.rope.inv_freq.dtype == torch.float32


def bf16_round(x):
    """f32 values rounded to bf16 and back (what a bf16 text encoder hands the transformer, seen as f32)."""
    import torch

    return torch.as_tensor(x).to(torch.bfloat16).to(torch.float32)


# ---- inputs -------------------------------------------------------------------------------------------------------


def forward_inputs(model, n_text, T, H, W, Ta, seed=0, anchors=(), text_tags=None, shuffle=False, step=5, steps=20):
    """diffusers forward kwargs (batch 1, on the CPU) for a t2va/fl2va layout at grid point `step` of a `steps`
    schedule, with the row timesteps the pipeline's SetTimesteps step builds (conditioning rows at 0.999 / 1.0).
    Latent rows are f32 and prompt embeddings bf16-rounded, as the pipeline gives them."""
    import torch
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

    from tests import dit_support as ds

    pos, tags, vidx, aidx, tidx, ncv, nca = ds.t2va_layout(model, n_text, T, H, W, Ta, text_tags, anchors)
    sv, sa = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    sv.set_timesteps(steps)
    sa.set_timesteps(steps)
    t, ta = float(sv.timesteps[step]), float(sa.timesteps[step])
    ts, tsi = MiniMaxH3SetTimestepsStep.build_row_timesteps(vidx, aidx, ncv, nca, n_text, t, ta, max(t, 0.999), 1.0)
    L = pos.shape[0]
    if shuffle:  # any row order: the forward must only follow the indices
        perm = torch.randperm(L, generator=torch.Generator().manual_seed(seed + 7))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(L)
        pos, tags, tsi = pos[perm], tags[perm], tsi[perm]
        vidx, aidx, tidx = inv[vidx], inv[aidx], inv[tidx]
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    P = cfg.in_channels * cfg.patch_size[1] * cfg.patch_size[2]
    return dict(
        hidden_states=torch.randn(1, vidx.numel(), P, generator=g),
        audio_hidden_states=torch.randn(1, aidx.numel(), cfg.audio_in_channels, generator=g),
        encoder_hidden_states=bf16_round(torch.randn(1, n_text, cfg.text_dim, generator=g)),
        timestep=ts, timestep_indices=tsi, token_tags=tags, position_ids=pos, video_indices=vidx,
        audio_indices=aidx, text_indices=tidx)


def run_diffusers(model, kw, device):
    """One forward of a (bf16, on-device) diffusers model; the prompt goes in as bf16, as the pipeline's does."""
    import torch

    dk = {k: v.to(device) for k, v in kw.items()}
    dk["encoder_hidden_states"] = dk["encoder_hidden_states"].to(torch.bfloat16)
    with torch.no_grad():
        v, a = model(**dk, return_dict=False)
    return v[0].float().cpu().numpy(), a[0].float().cpu().numpy()


def run_libh3(ctx, kw):
    from h3ctl import transformer as tr

    np_kw = {k: (v[0] if k.endswith("states") else v).numpy() for k, v in kw.items()}
    return tr.forward(ctx, **np_kw)


def diffusers_denoise(model, prompt_embeds, latents, audio_latents, steps, device, shifts=(12.0, 3.0)):
    """diffusers' t2va loop on `device` as its modular pipeline runs it: the latent rows stay f32 and are stepped by
    two MiniMaxH3Scheduler in f32, the transformer (bf16 here) sees them as they are and the prompt in bf16.
    latents [1, C, T, H, W], audio_latents [2, C_a, T_a] (CPU). Returns the final (latents, audio_latents), CPU f32."""
    import torch
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3SetTimestepsStep, patchify_video_latents)

    from tests import dit_support as ds

    _, C, T, Hh, Ww = latents.shape
    Ta = audio_latents.shape[-1]
    pos, tags, vidx, aidx, tidx, ncv, nca = ds.t2va_layout(model, prompt_embeds.shape[1], T, Hh, Ww, Ta)
    sched, asched = MiniMaxH3Scheduler(shift=shifts[0]), MiniMaxH3Scheduler(shift=shifts[1])
    sched.set_timesteps(steps)
    asched.set_timesteps(steps)
    plan = [MiniMaxH3SetTimestepsStep.build_row_timesteps(vidx, aidx, ncv, nca, tidx.numel(), float(t), float(ta),
                                                           max(float(t), 0.999), 1.0)
            for t, ta in zip(sched.timesteps, asched.timesteps)]
    x = patchify_video_latents(latents.float(), tuple(model.config.patch_size)).to(device)
    a = audio_latents.float().permute(0, 2, 1).reshape(-1, audio_latents.shape[1]).to(device)
    pe = prompt_embeds.to(device, torch.bfloat16)
    lay = dict(token_tags=tags.to(device), position_ids=pos.to(device), video_indices=vidx.to(device),
               audio_indices=aidx.to(device), text_indices=tidx.to(device))
    with torch.no_grad():
        for i, t in enumerate(sched.timesteps):
            ts, tsi = plan[i]
            v, av = model(hidden_states=x[None], audio_hidden_states=a[None], encoder_hidden_states=pe,
                          timestep=ts.to(device), timestep_indices=tsi.to(device), return_dict=False, **lay)
            x[ncv:] = sched.step(v[0, ncv:].float(), t, x[ncv:], return_dict=False)[0]
            a[nca:] = asched.step(av[0, nca:].float(), asched.timesteps[i], a[nca:], return_dict=False)[0]
    ph, pw = model.config.patch_size[1:]
    rows = x.cpu().reshape(1, T, Hh // ph, Ww // pw, C, 1, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return rows.reshape(1, C, T, Hh, Ww).contiguous(), a.cpu().reshape(2, Ta, -1).permute(0, 2, 1).contiguous()
