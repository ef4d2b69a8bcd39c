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

FL2VA (first/last-frame anchors): ``Layout(L, dev, anchors=("first", "last"), text_tags=...)`` is diffusers'
``build_packed_sequence(..., keyframe_anchors)``: ``[text | keyframe rows (16 per keyframe at 8x8 latents) | audio |
video]``, the keyframe rows on the target (h, w) grid at rotary time L ("first") / L + (5/3)(F-1) ("last"), tag video;
the text tags mark the vision blocks of the presentation as video (see ``train/vision.py``). The rows read three
timesteps: video (target video + text), audio, and the conditioning one ``max(t_video, 0.999)``
(``MiniMaxH3SetTimestepsStep``), asked of ``build_row_timesteps`` with sentinels. ``condition_rows`` noises keyframe
latents with the scheduler's own ``scale_noise`` at ``keyframe_noise_aug`` = 0.999 and patchifies them.
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


KEYFRAME_NOISE_AUG = 0.999  # MiniMaxH3ModularPipeline.keyframe_noise_aug
_SENTINELS = {0: 0.25, 1: 0.75, 2: 0.5, 3: 0.125}  # slot -> distinct value asked of build_row_timesteps


class Layout:
    """Packed layout for text length ``L`` at the h3-tiny shape (7 x 8 x 8 video latents, 37 audio latents), with
    optional keyframe anchors (diffusers' ``keyframe_anchors``: "first" / "last", packed order) and per-row text tags
    (default: all text)."""

    def __init__(self, num_text: int, device, num_latent_frames=LATENT_FRAMES, latent_hw=LATENT_HW,
                 num_audio=AUDIO_LATENTS, anchors: tuple = (), text_tags=None):
        layout_step, _ = _steps()
        if text_tags is None:
            tags = torch.full((num_text,), TEXT_TAG, dtype=torch.long)
        else:
            tags = torch.as_tensor(text_tags, dtype=torch.long).cpu()
            assert tags.shape == (num_text,)
        anchors = tuple(anchors)
        packed = layout_step.build_packed_sequence(
            tags, num_latent_frames, latent_hw, latent_hw, num_audio, PATCH, AUDIO_CHANNELS, AUDIO_TAG, VIDEO_TAG,
            anchors)
        assert packed[6] == 0
        self.anchors = anchors
        self._set(packed, num_text, device)
        self.shape = (num_latent_frames, latent_hw, latent_hw, num_audio)

    def _set(self, packed, num_text: int, device) -> None:
        """Keep diffusers' packed layout (positions, tags, video / audio / text indices, leading conditioning video
        and audio rows) and which timestep slot each row reads, asked of ``build_row_timesteps`` with sentinels:
        0 video (target video + text rows), 1 audio, 2 visual conditioning rows, 3 audio reference rows."""
        _, ts_step = _steps()
        pos, token_tags, video_idx, audio_idx, text_idx, n_cond_v, n_cond_a = packed
        uniq, inv = ts_step.build_row_timesteps(video_idx, audio_idx, n_cond_v, n_cond_a, num_text, _SENTINELS[0],
                                                _SENTINELS[1], _SENTINELS[2], _SENTINELS[3])
        slot_of = {v: k for k, v in _SENTINELS.items()}
        lut = torch.tensor([slot_of[float(u)] for u in uniq.tolist()], dtype=torch.long)
        self.num_text = num_text
        self.num_cond_rows = int(n_cond_v)
        self.num_cond_audio_rows = int(n_cond_a)
        self.seq_len = pos.shape[0]
        self.position_ids = pos.to(device)
        self.token_tags = token_tags.to(device)
        self.video_indices = video_idx.to(device)
        self.audio_indices = audio_idx.to(device)
        self.text_indices = text_idx.to(device)
        self.row_slot = lut[inv].to(device)

    def kwargs(self) -> dict:
        return dict(token_tags=self.token_tags, position_ids=self.position_ids, video_indices=self.video_indices,
                    audio_indices=self.audio_indices, text_indices=self.text_indices)

    def row_timesteps(self, t_video: float, t_audio: float):
        """The (timestep, timestep_indices) pair diffusers' SetTimesteps step builds for one step."""
        _, ts_step = _steps()
        u, i = ts_step.build_row_timesteps(self.video_indices.cpu(), self.audio_indices.cpu(), self.num_cond_rows,
                                           self.num_cond_audio_rows, self.num_text, float(t_video), float(t_audio),
                                           max(float(t_video), KEYFRAME_NOISE_AUG), 1.0)
        return u.to(self.position_ids.device), i.to(self.position_ids.device)


def condition_rows(keyframe_latents: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """[B, K, 24, 1, h, w] normalised keyframe latents + noise of the same shape -> [B, K * (h/2) * (w/2), 96]: each
    keyframe noised to t = 0.999 by ``MiniMaxH3Scheduler.scale_noise`` and patchified, in packed order
    (MiniMaxH3PrepareConditionLatentsStep)."""
    from diffusers import MiniMaxH3Scheduler

    b, k = keyframe_latents.shape[:2]
    noised = MiniMaxH3Scheduler(shift=12.0).scale_noise(keyframe_latents.float(), KEYFRAME_NOISE_AUG, noise.float())
    return patchify(noised.reshape(b * k, *noised.shape[2:])).reshape(b, -1, noised.shape[2] * 4)


class LayoutCache(dict):
    def __init__(self, device):
        super().__init__()
        self.device = device

    def __missing__(self, key) -> Layout:
        """key: text length (text-only) or (text length, anchors, text tags tuple)."""
        if isinstance(key, tuple):
            num_text, anchors, tags = key
            lay = Layout(num_text, self.device, anchors=anchors, text_tags=list(tags))
        else:
            lay = Layout(key, self.device)
        self[key] = lay
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

    video_rows [B, Nv, 96] (keyframe condition rows first, as the layout orders them), audio_rows [B, Na, 32],
    text [B, L, text_dim], t_video/t_audio [B] (t = 1 - sigma); condition rows read max(t_video, 0.999), Ref2VA's
    audio reference rows (``refs.RefLayout``: audio_rows holds them first) t = 1.
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

    t_video, t_audio = t_video.float(), t_audio.float()
    t_cond = t_video.clamp_min(KEYFRAME_NOISE_AUG)
    # slots: video (target video + text), audio, visual conditioning rows, audio reference rows (Ref2VA, t = 1)
    timesteps = torch.stack([t_video, t_audio, t_cond, torch.ones_like(t_video)], dim=1).reshape(-1)  # [B*4]
    with torch.autocast(dev_type, enabled=False):
        temb = model.time_embedder(model.time_proj(timesteps).to(_param_dtype(model.time_embedder)))
    item = torch.arange(B, device=hidden.device)[:, None]
    ts_index = item * 4 + layout.row_slot[None, :]                                   # [B, S]
    adaln_index = (ts_index * MODALITIES + layout.token_tags[None, :]).reshape(-1)   # [B*S]

    def pick(table):  # [B*4*3, H] -> [B, S, H]
        return table.index_select(0, adaln_index).view(B, S, -1)

    for block in model.transformer_blocks:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(temb)
        norm = block.norm1(hidden) * (1.0 + pick(scale_msa)) + pick(shift_msa)
        hidden = hidden + pick(gate_msa) * block.attn(norm, rotary_emb)
        norm = block.norm2(hidden) * (1.0 + pick(scale_mlp)) + pick(shift_mlp)
        hidden = hidden + pick(gate_mlp) * block.ff(norm)

    no = model.norm_out
    shift, scale = no.linear(F.silu(temb).to(_param_dtype(no.linear))).chunk(2, dim=-1)   # [B*4, H]
    ts_flat = ts_index.reshape(-1)
    hidden = no.norm(hidden) * (1.0 + scale.index_select(0, ts_flat).view(B, S, -1)) + shift.index_select(
        0, ts_flat).view(B, S, -1)
    hidden = hidden.to(_param_dtype(model.proj_out))
    with torch.autocast(dev_type, enabled=False):
        video_out = model.proj_out(hidden.index_select(1, layout.video_indices))
        audio_out = model.audio_proj_out(hidden.index_select(1, layout.audio_indices))
    return video_out, audio_out


@torch.no_grad()
def _forward_error(model, vr, ar, text, tv, ta, lay) -> float:
    """max |batched_forward - diffusers' forward|, item by item with each item's own timesteps."""
    bv, ba = batched_forward(model, vr, ar, text, tv, ta, lay)
    err = 0.0
    for b in range(vr.shape[0]):
        u, idx = lay.row_timesteps(float(tv[b]), float(ta[b]))
        ov, oa = model(hidden_states=vr[b:b + 1], audio_hidden_states=ar[b:b + 1], encoder_hidden_states=text[b:b + 1],
                       timestep=u, timestep_indices=idx, return_dict=False, **lay.kwargs())
        err = max(err, float((ov - bv[b:b + 1]).abs().max()), float((oa - ba[b:b + 1]).abs().max()))
    return err


def selftest(model=None, device="cpu", atol=2e-5) -> float:
    """Check batched_forward against diffusers' forward, item by item (different t per item), for a text-only layout
    for anchored ones (first, last, both; vision-block tags in the text) and for Ref2VA ones (an image reference,
    with and without an audio reference). Returns the max error."""
    from train.models import build_transformer

    torch.manual_seed(0)
    if model is None:
        model = build_transformer().to(device).eval()
        with torch.no_grad():  # non-trivial AdaLN / heads
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
    B = 3
    tv = torch.tensor([0.1, 0.5, 0.9995], device=device)
    ta = torch.tensor([0.3, 0.5, 0.0], device=device)
    err = 0.0
    for anchors in ((), ("first",), ("last",), ("first", "last")):
        L = 5 if not anchors else 9
        tags = None if not anchors else [1, 1, 0, 0, 0, 0, 1, 1, 1]
        lay = Layout(L, device, anchors=anchors, text_tags=tags)
        assert lay.num_cond_rows == 16 * len(anchors)
        video = torch.randn(B, 24, LATENT_FRAMES, LATENT_HW, LATENT_HW, device=device)
        audio = torch.randn(B, 2, 32, AUDIO_LATENTS, device=device)
        text = torch.randn(B, L, model.config.text_dim, device=device)
        vr, ar = patchify(video), audio_to_rows(audio)
        if anchors:
            kf = torch.randn(B, len(anchors), 24, 1, LATENT_HW, LATENT_HW, device=device)
            vr = torch.cat([condition_rows(kf, torch.randn_like(kf)), vr], dim=1)
        err = max(err, _forward_error(model, vr, ar, text, tv, ta, lay))
    # Ref2VA: an image reference (16 rows, max(t, 0.999)) and an audio reference (74 rows, t = 1) before the targets
    from train.refs import RefLayout

    for audio_ref in (False, True):
        lay = RefLayout([1, 1, 0, 0, 0, 0, 1, 1, 1, 1], audio_ref, device)
        vr = torch.cat([condition_rows(torch.randn(B, 1, 24, 1, LATENT_HW, LATENT_HW, device=device),
                                       torch.randn(B, 1, 24, 1, LATENT_HW, LATENT_HW, device=device)),
                        patchify(torch.randn(B, 24, LATENT_FRAMES, LATENT_HW, LATENT_HW, device=device))], dim=1)
        ar = audio_to_rows(torch.randn(B, 2, 32, AUDIO_LATENTS * (2 if audio_ref else 1), device=device))
        text = torch.randn(B, 10, model.config.text_dim, device=device)
        err = max(err, _forward_error(model, vr, ar, text, tv, ta, lay))
    assert torch.equal(unpatchify(patchify(video)), video) and torch.equal(
        rows_to_audio(audio_to_rows(audio)), audio)
    # condition rows: diffusers' PrepareConditionLatents arithmetic on one keyframe
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    z, e = torch.randn(1, 24, 1, 8, 8), torch.randn(1, 24, 1, 8, 8)
    ref = patchify_video_latents(MiniMaxH3Scheduler(shift=12.0).scale_noise(z, 0.999, e), PATCH)
    assert torch.equal(condition_rows(z[:, None], e[:, None])[0], ref)
    if err > atol:
        raise AssertionError(f"batched_forward differs from diffusers forward by {err}")
    return err


if __name__ == "__main__":
    print("max |batched - diffusers| =", selftest())
