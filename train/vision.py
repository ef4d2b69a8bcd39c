"""The keyframe side of the FL2VA presentation, as diffusers' ``MiniMaxH3FL2VATextEncoderStep`` builds it, for training
and sampling h3-tiny with first/last-frame anchors.

diffusers (``modular_pipelines/minimax_h3/encoders.py``) encodes an anchored request's text as

    for k, keyframe:  tokenizer("<Picture k+1>: ")  (tag text)  + <|vision_start|> <|image_pad|> x n <|vision_end|>
                      (tag video)
    then              tokenizer(prompt)  (tag text)

(no chat template, no special tokens), with the keyframes through the processor's image processor and Qwen3-VL's
vision tower; ``get_qwen3vl_prompt_embeds`` runs ``text_encoder.model(input_ids, mm_token_type_ids, pixel_values,
image_grid_thw, ...)`` and reads ``hidden_states[layer]``. A lone last frame is keyframe 1 ("<Picture 1>: "): the text
side does not say which end a keyframe anchors, only the DiT's rotary time does.

Image processor: h3-tiny ships no ``processor/`` config, so, like libh3 (``tests/test_vision_tower.py``:
``DEFAULT_PROC``), we use Qwen3-VL's published one: patch 16, temporal patch 2, merge 2, pixel bounds 65,536 ..
16,777,216, mean = std = 0.5. transformers' Qwen2-VL processor (torchvision backend) does ``smart_resize`` (a 128x128
keyframe is *upscaled* to 256x256: 16x16 patches -> 64 merged tokens), ``tvF.resize(BICUBIC, antialias=True)`` (on a
CPU uint8 tensor that is torch's own uint8 ``F.interpolate(bicubic, antialias=True)``), rescale 1/255, normalise,
patchify. :func:`resize_keyframes` + :func:`pixel_values` do exactly that, batched (checked against transformers' PIL
processor with ``do_resize=False`` by :func:`selftest`).

Training needs the tower on hundreds of keyframes per step, and transformers' vision attention (non-flash) loops over
images in Python. Every keyframe here has the same grid, so :func:`vision_features` runs the tower's own submodules
batched (one SDPA call per block, transformers' own position-embedding / rotary helpers) and :class:`TextEncoder`
feeds the language model exactly what ``Qwen3VLModel.forward`` feeds it (image embeddings scattered at the pad
tokens, deepstack features, M-RoPE positions from the model's own ``get_rope_index``). :func:`selftest` checks both
against ``text_encoder.model(...)`` through diffusers' ``get_qwen3vl_prompt_embeds``.

    python -m train.vision          # selftest (CPU, a few seconds)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Qwen3-VL's published preprocessor_config.json (what libh3 uses when a model ships none).
PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=65536, max_pixels=16777216,
                 image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
TEXT_TAG, VIDEO_TAG = 1, 0


# ---------------------------------------------------------------------------------------------------------------------
# Image processor
# ---------------------------------------------------------------------------------------------------------------------


def resized_size(height: int, width: int, proc: dict = PROCESSOR) -> tuple[int, int]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    factor = proc["patch_size"] * proc["merge_size"]
    return tuple(smart_resize(int(height), int(width), factor, proc["min_pixels"], proc["max_pixels"]))


def resize_keyframes(frames: np.ndarray, proc: dict = PROCESSOR) -> np.ndarray:
    """uint8 [N, H, W, 3] (same size) -> uint8 [N, h, w, 3] as the processor's torchvision resize makes them."""
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    h, w = resized_size(frames.shape[1], frames.shape[2], proc)
    if (h, w) == tuple(frames.shape[1:3]):
        return frames.copy()
    t = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
    out = F.interpolate(t, size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    return out.permute(0, 2, 3, 1).contiguous().numpy()


def grid_thw(height: int, width: int, proc: dict = PROCESSOR) -> tuple[int, int, int]:
    """The (t, h, w) patch grid of a *resized* keyframe."""
    return 1, height // proc["patch_size"], width // proc["patch_size"]


def tokens_per_image(height: int, width: int, proc: dict = PROCESSOR) -> int:
    _, gh, gw = grid_thw(height, width, proc)
    return gh * gw // proc["merge_size"] ** 2


def pixel_values(resized: torch.Tensor, proc: dict = PROCESSOR) -> torch.Tensor:
    """uint8 [N, h, w, 3] (resized keyframes, any device) -> float32 [N * gh * gw, 3 * tp * ps * ps]: rescale,
    normalise and the Qwen2-VL patch layout (a single image is repeated over the temporal patch)."""
    n, h, w, c = resized.shape
    ps, tp, ms = proc["patch_size"], proc["temporal_patch_size"], proc["merge_size"]
    mean = torch.tensor(proc["image_mean"], device=resized.device).view(1, c, 1, 1)
    std = torch.tensor(proc["image_std"], device=resized.device).view(1, c, 1, 1)
    x = (resized.permute(0, 3, 1, 2).float() * (1.0 / 255.0) - mean) / std          # [N, C, h, w]
    x = x[:, None].expand(n, tp, c, h, w)                                              # temporal repeat
    gh, gw = h // ps, w // ps
    x = x.reshape(n, tp, c, gh // ms, ms, ps, gw // ms, ms, ps)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)                                           # n, bh, bw, mh, mw, c, tp, p, p
    return x.reshape(n * gh * gw, c * tp * ps * ps).contiguous()


def processor_stub(tokenizer_json_or_ids):
    """A ``Qwen3VLProcessor`` carrying only what ``get_qwen3vl_prompt_embeds`` reads (``create_mm_token_type_ids``),
    as tests/pipeline_oracle.py builds it (the real one needs torchvision for its image processor)."""
    from transformers import Qwen3VLProcessor

    ids = tokenizer_json_or_ids
    proc = object.__new__(Qwen3VLProcessor)
    proc.image_token_ids = [ids[IMAGE_PAD]]
    proc.video_token_ids = [ids["<|video_pad|>"]]
    proc.audio_token_ids = []
    return proc


# ---------------------------------------------------------------------------------------------------------------------
# Presentation (token ids + modality tags)
# ---------------------------------------------------------------------------------------------------------------------


class Presentation:
    """Token ids and tags of the FL2VA presentation for a tokenizers.Tokenizer (prefix for n keyframes, cached)."""

    def __init__(self, tokenizer, image_tokens: int):
        self.tok = tokenizer
        self.image_tokens = int(image_tokens)
        self.vs, self.pad, self.ve = (tokenizer.token_to_id(t) for t in (VISION_START, IMAGE_PAD, VISION_END))
        if None in (self.vs, self.pad, self.ve):
            raise ValueError("tokenizer lacks the Qwen vision tokens")
        self._prefix = {}

    def prefix(self, n_keyframes: int) -> tuple[list[int], list[int]]:
        if n_keyframes not in self._prefix:
            ids, tags = [], []
            for k in range(n_keyframes):
                label = self.tok.encode(f"<Picture {k + 1}>: ", add_special_tokens=False).ids
                vision = [self.vs] + [self.pad] * self.image_tokens + [self.ve]
                ids += label + vision
                tags += [TEXT_TAG] * len(label) + [VIDEO_TAG] * len(vision)
            self._prefix[n_keyframes] = (ids, tags)
        return self._prefix[n_keyframes]

    def __call__(self, prompt_ids: list[int], n_keyframes: int) -> tuple[list[int], list[int]]:
        ids, tags = self.prefix(n_keyframes)
        return ids + list(prompt_ids), tags + [TEXT_TAG] * len(prompt_ids)


# ---------------------------------------------------------------------------------------------------------------------
# Vision tower, batched over same-size images
# ---------------------------------------------------------------------------------------------------------------------


def _vision_constants(visual, grid: tuple, device):
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

    g = torch.tensor([list(grid)], device=device)
    idx, w = get_vision_interpolation_indices_and_weights(
        g, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=visual.config.spatial_merge_size)
    pos_ids = get_vision_position_ids(g, visual.spatial_merge_size)
    return idx, w, pos_ids


def vision_features(visual, pixels: torch.Tensor, n_images: int, grid: tuple):
    """Qwen3VLVisionModel.forward for ``n_images`` images of one grid, batched: returns (merged embeddings
    [n * tokens, out], [deepstack features [n * tokens, out], ...]) in image order."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    idx, w, pos_ids = _vision_constants(visual, grid, pixels.device)
    hidden = visual.patch_embed(pixels)                                               # [n * P, D]
    pos = (visual.pos_embed(idx) * w[:, :, None]).sum(1)                              # [P, D]
    P = pos.shape[0]
    hidden = (hidden.view(n_images, P, -1) + pos.to(hidden.dtype))                    # [n, P, D]
    cos, sin = visual.rotary_pos_emb(hidden, pos_ids)                                 # [P, hd]
    deepstack = []
    for layer, blk in enumerate(visual.blocks):
        attn = blk.attn
        x = blk.norm1(hidden)
        q, k, v = attn.qkv(x).reshape(n_images, P, 3, attn.num_heads, -1).permute(2, 0, 1, 3, 4).unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)                            # [n, P, H, hd]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           scale=attn.scaling)
        hidden = hidden + attn.proj(o.transpose(1, 2).reshape(n_images, P, -1))
        hidden = hidden + blk.mlp(blk.norm2(hidden))
        if layer in visual.deepstack_visual_indexes:
            merger = visual.deepstack_merger_list[visual.deepstack_visual_indexes.index(layer)]
            deepstack.append(merger(hidden.reshape(n_images * P, -1)))
    return visual.merger(hidden.reshape(n_images * P, -1)), deepstack


# ---------------------------------------------------------------------------------------------------------------------
# Text encoder with keyframes
# ---------------------------------------------------------------------------------------------------------------------


class TextEncoder:
    """``hidden_states[cond_layer]`` of the Qwen3-VL conditioner for a batch of presentations that share one token
    layout (same ids positions of the vision blocks), keyframes through the vision tower; text-only batches go through
    ``dit_core.encode_text`` unchanged."""

    def __init__(self, text_encoder, cond_layer: int, image_hw: tuple, proc: dict = PROCESSOR):
        self.te = text_encoder
        self.cond_layer = int(cond_layer)
        self.proc = proc
        self.grid = grid_thw(*image_hw, proc)
        self.image_token_id = text_encoder.config.image_token_id
        self.batched = True  # False: transformers' own forward on the batch (exact, slow: per-image attention loop)
        self._pos = {}

    def reference(self, ids: torch.Tensor, pixels: torch.Tensor, n_keyframes: int) -> torch.Tensor:
        """What ``get_qwen3vl_prompt_embeds`` runs, on a whole batch: ``text_encoder.model(...)``."""
        B = ids.shape[0]
        out = self.te.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                            mm_token_type_ids=(ids == self.image_token_id).long(),
                            pixel_values=pixels.to(self.te.model.visual.dtype),
                            image_grid_thw=torch.tensor([list(self.grid)] * (B * n_keyframes), device=ids.device),
                            use_cache=False, output_hidden_states=True)
        return out.hidden_states[self.cond_layer]

    @torch.no_grad()
    def check(self, ids: torch.Tensor, pixels: torch.Tensor, n_keyframes: int, atol: float = 1e-4) -> float:
        """Max |batched - reference| on one batch (float32, autocast off); falls back to the reference path (and
        says so) when they differ, e.g. under another transformers version."""
        dev_type = ids.device.type
        with torch.autocast(dev_type, enabled=False):
            a = self(ids, pixels, n_keyframes).float()
            b = self.reference(ids, pixels, n_keyframes).float()
        err = float((a - b).abs().max())
        if not err <= atol:
            self.batched = False
        return err

    def positions(self, ids_row: torch.Tensor, n_images: int) -> torch.Tensor:
        """M-RoPE position ids [3, 1, L] from the model's own ``get_rope_index`` (cached per layout of image pads)."""
        mm = (ids_row == self.image_token_id).long()[None]
        key = (n_images, mm.shape[1], mm.cpu().numpy().tobytes())  # positions depend on where the image pads sit
        if key not in self._pos:
            model = self.te.model
            kw = dict(input_ids=ids_row[None], image_grid_thw=torch.tensor([list(self.grid)] * n_images,
                                                                             device=ids_row.device),
                      attention_mask=torch.ones_like(ids_row)[None])
            if "mm_token_type_ids" in inspect.signature(model.get_rope_index).parameters:
                kw["mm_token_type_ids"] = mm
            self._pos[key] = model.get_rope_index(**kw)[0]
        return self._pos[key]

    def __call__(self, ids: torch.Tensor, pixels: torch.Tensor | None, n_keyframes: int) -> torch.Tensor:
        from train import dit_core

        if n_keyframes == 0:
            return dit_core.encode_text(self.te, ids, self.cond_layer)
        if not self.batched:
            return self.reference(ids, pixels, n_keyframes)
        B, L = ids.shape
        model = self.te.model
        lm = model.language_model
        embeds = model.get_input_embeddings()(ids)
        merged, deepstack = vision_features(model.visual, pixels.to(model.visual.dtype), B * n_keyframes, self.grid)
        mask = ids == self.image_token_id                                                  # [B, L]
        embeds = embeds.masked_scatter(mask[..., None], merged.to(embeds.dtype))
        pos = self.positions(ids[0], n_keyframes).expand(3, B, L)
        out = lm(input_ids=None, inputs_embeds=embeds, position_ids=pos, attention_mask=torch.ones_like(ids),
                 visual_pos_masks=mask, deepstack_visual_embeds=deepstack, use_cache=False,
                 output_hidden_states=True)
        return out.hidden_states[self.cond_layer]


# ---------------------------------------------------------------------------------------------------------------------
# Reference (diffusers) path, for sampling and checks
# ---------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def diffusers_prompt_embeds(text_encoder, tokenizer, prompt: str, keyframes: list, cond_layer: int,
                            proc: dict = PROCESSOR, device="cpu", dtype=None):
    """diffusers' FL2VA text step for one request: (prompt_embeds [1, L, D], tags [L] long, token ids).
    ``keyframes``: uint8 [H, W, 3] arrays in packed order (first, then last); ``tokenizer``: tokenizers.Tokenizer."""
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

    ids_map = {t: tokenizer.token_to_id(t) for t in (IMAGE_PAD, "<|video_pad|>")}
    vision_inputs = {}
    n_tok = 0
    if keyframes:
        resized = resize_keyframes(np.stack([np.asarray(k) for k in keyframes]), proc)
        vision_inputs = {"pixel_values": pixel_values(torch.from_numpy(resized), proc),
                         "image_grid_thw": torch.tensor([list(grid_thw(*resized.shape[1:3], proc))] * len(keyframes))}
        n_tok = tokens_per_image(*resized.shape[1:3], proc)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    ids, tags = Presentation(tokenizer, n_tok)(prompt_ids, len(keyframes))
    if not ids:  # an empty prompt becomes the single pad token (as h3.c does)
        ids, tags = [tokenizer.token_to_id("<|endoftext|>")], [TEXT_TAG]
    emb = get_qwen3vl_prompt_embeds(text_encoder, processor_stub(ids_map), ids, vision_inputs,
                                    text_encoder_layer=cond_layer, device=torch.device(device),
                                    dtype=dtype or text_encoder.dtype)
    return emb, torch.tensor(tags, dtype=torch.long), ids


def selftest(text_encoder=None, tokenizer_json: str | None = None, atol: float = 2e-5) -> float:
    """Checks (CPU): pixel_values vs transformers' PIL processor; the presentation vs transformers' Qwen2TokenizerFast;
    TextEncoder (batched vision + language model) vs diffusers' get_qwen3vl_prompt_embeds item by item, for 1 and 2
    keyframes on the shipped tokenizer. Returns the max abs error of the embeddings."""
    from train import tokenizer as tk
    from train import world
    from train.models import COND_LAYER, build_text_encoder

    shipped = ROOT / "python" / "h3ctl" / "models" / "h3-tiny" / "FL2VA"
    if tokenizer_json is None:
        tokenizer_json = (shipped / "tokenizer" / "tokenizer.json").read_text()
    tok = tk.load(tokenizer_json)
    torch.manual_seed(0)
    if text_encoder is None:
        text_encoder = build_text_encoder(tokenizer_json)
        with torch.no_grad():  # give the (otherwise fresh) tower non-trivial weights
            for p in text_encoder.model.visual.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    te = text_encoder.float().eval()

    # 1. pixel values vs transformers' PIL processor on already-resized images
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    specs = world.heldout_specs()[:3]
    clips = [world.make_clip(s, 128, 128, 22, 7000 + k) for k, s in enumerate(specs)]
    frames = np.stack([c.frames[0] for c in clips] + [c.frames[-1] for c in clips])
    resized = resize_keyframes(frames)
    assert resized.shape[1:3] == (256, 256), resized.shape
    pil = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, do_resize=False,
                                   image_mean=list(PROCESSOR["image_mean"]), image_std=list(PROCESSOR["image_std"]))
    ref = pil(images=list(resized), return_tensors="pt")
    got = pixel_values(torch.from_numpy(resized))
    perr = float((ref["pixel_values"].float() - got).abs().max())
    assert ref["image_grid_thw"].tolist() == [[1, 16, 16]] * len(frames), ref["image_grid_thw"]
    assert perr < 1e-5, f"pixel_values differ from transformers by {perr}"
    # batched resize == one at a time
    assert np.array_equal(resize_keyframes(frames[:1]), resized[:1])

    # 2. presentation vs transformers' tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tk.load(tokenizer_json))
    pres = Presentation(tok, tokens_per_image(256, 256))
    assert pres.image_tokens == 64
    for k in (1, 2):
        assert fast(f"<Picture {k}>: ", add_special_tokens=False)["input_ids"] == tok.encode(
            f"<Picture {k}>: ", add_special_tokens=False).ids

    # 3. batched text encoder vs diffusers, 1 and 2 keyframes, two items (same prompt, other keyframes) per batch
    enc = TextEncoder(te, COND_LAYER, (256, 256))
    prompt = clips[0].caption_ir
    prompt_ids = tok.encode(prompt, add_special_tokens=False).ids
    err = 0.0
    for n_kf in (1, 2):
        kfs = [([c.frames[0], c.frames[-1]] if n_kf == 2 else [c.frames[-1]]) for c in clips[:2]]
        refs = [diffusers_prompt_embeds(te, tok, prompt, k, COND_LAYER)[0] for k in kfs]
        ids = torch.tensor([pres(prompt_ids, n_kf)[0]] * len(kfs))
        px = pixel_values(torch.from_numpy(resize_keyframes(np.stack([f for k in kfs for f in k]))))
        with torch.no_grad():
            got = enc(ids, px, n_kf)
        for b in range(len(kfs)):
            assert got.shape[1] == refs[b].shape[1], (got.shape, refs[b].shape)
            err = max(err, float((got[b] - refs[b][0]).abs().max()))
        assert float((refs[0] - refs[1]).abs().max()) > 1e-3  # the keyframes do reach the embeddings
    if err > atol:
        raise AssertionError(f"batched keyframe text encoder differs from diffusers by {err}")
    return err


if __name__ == "__main__":
    print("max |batched - diffusers| =", selftest())
