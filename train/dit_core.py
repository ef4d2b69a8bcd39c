"""The packed-sequence plumbing shared by DiT training and sampling, built on diffusers' own pipeline helpers.

* Layout: ``MiniMaxH3PrepareLayoutStep.build_packed_sequence`` (``[text | audio | video]`` rows, fp64 (t, h, w)
  positions, modality tags) for a given text length at 128x128x22, cached per length.
* Row timesteps: ``MiniMaxH3SetTimestepsStep.build_row_timesteps`` decides which rows read the video timestep and
  which the audio one (text rows read the video timestep); the training forward generalises its
  ``(timestep, timestep_indices)`` pair to one pair *per batch item*.
* Video rows: ``patchify_video_latents`` (the PrepareLatents patchify) and its inverse from the AfterDenoise step;
  audio rows: channel-major ``[2, 32, T] -> [2T, 32]`` as PrepareLatents/AfterDenoise pack them.
* Text: ``hidden_states[cond_layer]`` of ``text_encoder.model`` on ``tokenizer(prompt, add_special_tokens=False)``
  with ``mm_token_type_ids`` = 0, exactly what ``get_qwen3vl_prompt_embeds`` runs (no chat template).

``batched_forward`` is diffusers' ``MiniMaxH3Transformer3DModel.forward`` with per-item timesteps (diffusers shares
one layout *and* one timestep table across the batch); it uses the model's own submodules and is checked against
``model.forward`` item by item in ``tests``/``--selftest``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from train.models import AUDIO_LATENTS, LATENT_FRAMES, LATENT_HW  # noqa: E402

MODALITIES = 3  # MINIMAX_H3_MODALITY_NUM
VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2
PATCH = (1, 2, 2)
AUDIO_CHANNELS = 2


def _steps():
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
    )

    return MiniMaxH3PrepareLayoutStep, MiniMaxH3SetTimestepsStep


class Layout:
    """Packed layout for text length ``L`` at the h3-tiny shape (7 x 8 x 8 video latents, 37 audio latents)."""

    def __init__(self, num_text: int, device, num_latent_frames=LATENT_FRAMES, latent_hw=LATENT_HW,
                 num_audio=AUDIO_LATENTS):
        layout_step, ts_step = _steps()
        tags = torch.full((num_text,), TEXT_TAG, dtype=torch.long)
        (pos, token_tags, video_idx, audio_idx, text_idx, n_cond_v, n_cond_a) = layout_step.build_packed_sequence(
            tags, num_latent_frames, latent_hw, latent_hw, num_audio, PATCH, AUDIO_CHANNELS, AUDIO_TAG, VIDEO_TAG)
        assert n_cond_v == 0 and n_cond_a == 0
        # Which rows read which timestep: ask diffusers' planner with two distinct sentinel values.
        uniq, inv = ts_step.build_row_timesteps(video_idx, audio_idx, 0, 0, num_text, 0.25, 0.75, 0.25, 1.0)
        assert uniq.tolist() == [0.25, 0.75]
        self.num_text = num_text
        self.seq_len = pos.shape[0]
        self.position_ids = pos.to(device)
        self.token_tags = token_tags.to(device)
        self.video_indices = video_idx.to(device)
        self.audio_indices = audio_idx.to(device)
        self.text_indices = text_idx.to(device)
        self.row_slot = inv.to(device)  # 0: video timestep (video + text rows), 1: audio timestep
        self.shape = (num_latent_frames, latent_hw, latent_hw, num_audio)

    def kwargs(self) -> dict:
        return dict(token_tags=self.token_tags, position_ids=self.position_ids, video_indices=self.video_indices,
                    audio_indices=self.audio_indices, text_indices=self.text_indices)

    def row_timesteps(self, t_video: float, t_audio: float):
        """The (timestep, timestep_indices) pair diffusers' SetTimesteps step builds for one step."""
        _, ts_step = _steps()
        u, i = ts_step.build_row_timesteps(self.video_indices.cpu(), self.audio_indices.cpu(), 0, 0, self.num_text,
                                           float(t_video), float(t_audio), float(t_video), 1.0)
        return u.to(self.position_ids.device), i.to(self.position_ids.device)


class LayoutCache(dict):
    def __init__(self, device):
        super().__init__()
        self.device = device

    def __missing__(self, num_text: int) -> Layout:
        lay = Layout(num_text, self.device)
        self[num_text] = lay
        return lay


def patchify(video: torch.Tensor) -> torch.Tensor:
    """[B, 24, T, H, W] -> [B, T*(H/2)*(W/2), 96] with diffusers' PrepareLatents patchify."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    b = video.shape[0]
    rows = patchify_video_latents(video, PATCH)
    return rows.view(b, -1, rows.shape[-1])


def unpatchify(rows: torch.Tensor, channels: int = 24, num_latent_frames=LATENT_FRAMES, latent_hw=LATENT_HW):
    """Inverse of :func:`patchify` ([B, N, 96] -> [B, 24, T, H, W]), as the AfterDenoise step does it."""
    pt, ph, pw = PATCH
    b = rows.shape[0]
    x = rows.reshape(b, num_latent_frames // pt, latent_hw // ph, latent_hw // pw, channels, pt, ph, pw)
    x = x.permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(b, channels, num_latent_frames, latent_hw, latent_hw).contiguous()


def audio_to_rows(audio: torch.Tensor) -> torch.Tensor:
    """[B, 2, 32, T] -> channel-major rows [B, 2T, 32] (all left steps, then all right steps)."""
    b, c, d, t = audio.shape
    return audio.permute(0, 1, 3, 2).reshape(b, c * t, d)


def rows_to_audio(rows: torch.Tensor, num_audio=AUDIO_LATENTS) -> torch.Tensor:
    """[B, 2T, 32] -> [B, 2, 32, T]."""
    b = rows.shape[0]
    return rows.reshape(b, AUDIO_CHANNELS, num_audio, rows.shape[-1]).permute(0, 1, 3, 2).contiguous()


def encode_text(text_encoder, input_ids: torch.Tensor, cond_layer: int) -> torch.Tensor:
    """``hidden_states[cond_layer]`` of the Qwen3-VL language model for text-only ids [B, L]."""
    out = text_encoder.model(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        mm_token_type_ids=torch.zeros_like(input_ids),
        use_cache=False,
        output_hidden_states=True,
    )
    return out.hidden_states[cond_layer]


def _param_dtype(module) -> torch.dtype:
    return next(module.parameters()).dtype


def batched_forward(model, video_rows: torch.Tensor, audio_rows: torch.Tensor, text: torch.Tensor,
                    t_video: torch.Tensor, t_audio: torch.Tensor, layout: Layout):
    """diffusers' MiniMaxH3Transformer3DModel.forward, with one (video t, audio t) pair per batch item.

    video_rows [B, Nv, 96], audio_rows [B, Na, 32], text [B, L, text_dim], t_video/t_audio [B] (t = 1 - sigma).
    Returns (video velocity [B, Nv, 96], audio velocity [B, Na, 32]).
    """
    B = video_rows.shape[0]
    dev_type = video_rows.device.type
    rotary_emb = model.rope(layout.position_ids)
    # The released F32 islands (patch projections, time embedder, output heads) stay F32 under autocast.
    with torch.autocast(dev_type, enabled=False):
        video_embeds = model.proj_in(video_rows.to(_param_dtype(model.proj_in)))
        audio_embeds = model.audio_proj_in(audio_rows.to(_param_dtype(model.audio_proj_in)))
    text_embeds = model.token_refiner(model.context_embedder(text.to(_param_dtype(model.context_embedder))))
    S = layout.seq_len
    hidden = text_embeds.new_zeros((B, S, text_embeds.shape[-1]))
    hidden = hidden.index_copy(1, layout.text_indices, text_embeds)
    hidden = hidden.index_copy(1, layout.video_indices, video_embeds.to(text_embeds.dtype))
    hidden = hidden.index_copy(1, layout.audio_indices, audio_embeds.to(text_embeds.dtype))

    timesteps = torch.stack([t_video, t_audio], dim=1).reshape(-1).float()          # [B*2], item-major
    with torch.autocast(dev_type, enabled=False):
        temb = model.time_embedder(model.time_proj(timesteps).to(_param_dtype(model.time_embedder)))
    item = torch.arange(B, device=hidden.device)[:, None]
    ts_index = item * 2 + layout.row_slot[None, :]                                   # [B, S]
    adaln_index = (ts_index * MODALITIES + layout.token_tags[None, :]).reshape(-1)   # [B*S]

    def pick(table):  # [B*2*3, H] -> [B, S, H]
        return table.index_select(0, adaln_index).view(B, S, -1)

    for block in model.transformer_blocks:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(temb)
        norm = block.norm1(hidden) * (1.0 + pick(scale_msa)) + pick(shift_msa)
        hidden = hidden + pick(gate_msa) * block.attn(norm, rotary_emb)
        norm = block.norm2(hidden) * (1.0 + pick(scale_mlp)) + pick(shift_mlp)
        hidden = hidden + pick(gate_mlp) * block.ff(norm)

    no = model.norm_out
    shift, scale = no.linear(F.silu(temb).to(_param_dtype(no.linear))).chunk(2, dim=-1)   # [B*2, H]
    ts_flat = ts_index.reshape(-1)
    hidden = no.norm(hidden) * (1.0 + scale.index_select(0, ts_flat).view(B, S, -1)) + shift.index_select(
        0, ts_flat).view(B, S, -1)
    hidden = hidden.to(_param_dtype(model.proj_out))
    with torch.autocast(dev_type, enabled=False):
        video_out = model.proj_out(hidden.index_select(1, layout.video_indices))
        audio_out = model.audio_proj_out(hidden.index_select(1, layout.audio_indices))
    return video_out, audio_out


def selftest(model=None, device="cpu", atol=2e-5) -> float:
    """Check batched_forward against diffusers' forward, item by item (different t per item). Returns max error."""
    from train.models import build_transformer

    torch.manual_seed(0)
    if model is None:
        model = build_transformer().to(device).eval()
        with torch.no_grad():  # non-trivial AdaLN / heads
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
    L = 5
    lay = Layout(L, device)
    B = 3
    video = torch.randn(B, 24, LATENT_FRAMES, LATENT_HW, LATENT_HW, device=device)
    audio = torch.randn(B, 2, 32, AUDIO_LATENTS, device=device)
    text = torch.randn(B, L, model.config.text_dim, device=device)
    tv = torch.tensor([0.1, 0.5, 0.9], device=device)
    ta = torch.tensor([0.3, 0.5, 0.0], device=device)
    vr, ar = patchify(video), audio_to_rows(audio)
    with torch.no_grad():
        bv, ba = batched_forward(model, vr, ar, text, tv, ta, lay)
        err = 0.0
        for b in range(B):
            u, idx = lay.row_timesteps(float(tv[b]), float(ta[b]))
            ov, oa = model(hidden_states=vr[b:b + 1], audio_hidden_states=ar[b:b + 1],
                           encoder_hidden_states=text[b:b + 1], timestep=u, timestep_indices=idx,
                           return_dict=False, **lay.kwargs())
            err = max(err, float((ov - bv[b:b + 1]).abs().max()), float((oa - ba[b:b + 1]).abs().max()))
    assert torch.equal(unpatchify(vr), video) and torch.equal(rows_to_audio(ar), audio)
    if err > atol:
        raise AssertionError(f"batched_forward differs from diffusers forward by {err}")
    return err


if __name__ == "__main__":
    print("max |batched - diffusers| =", selftest())
