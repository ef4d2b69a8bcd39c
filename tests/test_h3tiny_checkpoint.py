"""The shipped h3-tiny checkpoint (python/h3ctl/models/h3-tiny/): official MiniMax-H3 layout, loads in diffusers /
transformers through the fixtures' reader, released dtypes, architecture ties, size limit, tokenizer structure.

Needs the test extras (torch, diffusers, transformers, tokenizers); the checkpoint itself is part of the package.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "python" / "h3ctl" / "models" / "h3-tiny"
PART = MODEL / "FL2VA"
MAX_BYTES = 60_000_000

import torch  # noqa: E402  (the test extra installs torch, diffusers, transformers, tokenizers)


def _read(rel: str) -> dict:
    return json.loads((PART / rel).read_text())


@pytest.fixture(scope="module")
def loaded():
    from tests.fixtures import read_official_to_diffusers

    return read_official_to_diffusers(PART)


def test_layout_and_size():
    for rel in ("model_index.json", "transformer/config.json", "transformer/model.safetensors",
                "text_encoder/config.json", "text_encoder/model.safetensors.index.json", "tokenizer/tokenizer.json",
                "tokenizer/tokenizer_config.json", "video_vae/config.json", "video_vae/source/config.json",
                "video_vae/source/model.safetensors", "audio_vae/config.json", "audio_vae/metadata.json",
                "audio_vae/model.safetensors"):
        assert (PART / rel).is_file(), rel
    assert (MODEL / "tokenizer" / "tokenizer.json").read_bytes() == (PART / "tokenizer" / "tokenizer.json").read_bytes()
    assert (MODEL / "MODEL_CARD.md").is_file()
    total = sum(f.stat().st_size for f in MODEL.rglob("*") if f.is_file())
    assert total <= MAX_BYTES, f"h3-tiny is {total} bytes (limit {MAX_BYTES})"
    assert len(list((PART / "audio_vae").glob("*.safetensors"))) == 1
    assert not (PART.parent / "Ref2VA").exists()


def test_dtypes_match_the_release():
    from safetensors import safe_open

    from tests.fixtures import DIT_F32_PREFIXES, load_component_tensors

    with safe_open(str(PART / "transformer" / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for n in names:
            want = torch.float32 if n.startswith(DIT_F32_PREFIXES) else torch.bfloat16
            assert f.get_slice(n).get_dtype() == {torch.float32: "F32", torch.bfloat16: "BF16"}[want], n
    assert "rope.inv_freq" in names and any(n.endswith("attn.qkv_proj.weight") for n in names)
    for t in load_component_tensors(PART / "text_encoder").values():
        assert t.dtype == torch.bfloat16
    for comp in ("video_vae/source", "audio_vae"):
        for t in load_component_tensors(PART / comp).values():
            assert t.dtype == torch.float32


def test_configs_tie_together():
    t = _read("transformer/config.json")
    te = _read("text_encoder/config.json")
    v_top, v_src = _read("video_vae/config.json"), _read("video_vae/source/config.json")
    a_top, a_meta = _read("audio_vae/config.json"), _read("audio_vae/metadata.json")["metadata"]["kwargs"]
    text = te["text_config"]
    layer = te["minimax_h3_conditioning_layer"]
    assert 0 < layer < text["num_hidden_layers"]
    assert t["text_dim"] == text["hidden_size"] == te["vision_config"]["out_hidden_size"]
    assert t["latents_dim"] == v_top["latent_channels"] == 24 and len(v_top["latents_mean"]) == 24
    assert t["audio_latents_dim"] == a_top["latent_channels"] == 32 and len(a_top["latents_std"]) == 32
    assert t["adaln_out_features"] == 18 * t["hidden_size"] and t["patch_size"] == [1, 2, 2]
    assert 6 * t["rope_inv_freq_len"] <= t["attention_head_dim"]
    assert math.prod(v_src["space_down"]) == 16 and math.prod(v_src["time_down"]) == 4
    assert v_top["vae_clip_length"] == 17 and v_top["vae_token_drop"] == 3
    assert math.prod(a_meta["encoder_rates"]) == 800 == math.prod(a_meta["decoder_rates"])
    assert a_meta["decoder_dim"] // 2 ** len(a_meta["decoder_rates"]) >= 1
    assert all(s > 0 for s in v_top["latents_std"]) and all(s > 0 for s in a_top["latents_std"])


def test_tokenizer_structure():
    from tokenizers import Tokenizer

    doc = json.loads((PART / "tokenizer" / "tokenizer.json").read_text())
    assert doc["normalizer"] == {"type": "NFC"}
    pre = doc["pre_tokenizer"]["pretokenizers"]
    assert pre[0]["type"] == "Split" and pre[0]["behavior"] == "Isolated" and "\\p{L}" in pre[0]["pattern"]["Regex"]
    assert pre[1]["type"] == "ByteLevel" and pre[1]["add_prefix_space"] is False and pre[1]["use_regex"] is False
    assert doc["decoder"]["type"] == "ByteLevel" and doc["model"]["type"] == "BPE"
    vocab = doc["model"]["vocab"]
    assert vocab["A"] == 32 and vocab["!"] == 0 and 400 <= len(vocab) <= 1000
    added = {t["content"]: t["id"] for t in doc["added_tokens"]}
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"):
        assert name in added and added[name] >= len(vocab)
    tok = Tokenizer.from_str(json.dumps(doc))
    prompt = "a red triangle moves left on a black background, a high beep"
    ids = tok.encode(prompt, add_special_tokens=False).ids
    assert tok.decode(ids) == prompt and len(ids) <= 16  # caption words are whole tokens
    assert tok.encode("<|im_start|>", add_special_tokens=False).ids == [added["<|im_start|>"]]
    te = _read("text_encoder/config.json")
    assert te["text_config"]["vocab_size"] >= max(added.values()) + 1
    assert te["image_token_id"] == added["<|image_pad|>"] and te["vision_start_token_id"] == added["<|vision_start|>"]


def test_loads_in_diffusers_and_runs(loaded):
    """Strict load through diffusers' converter / transformers, then one conditioned DiT forward at 128x128x22."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
    )
    from tokenizers import Tokenizer

    from tests.fixtures import conditioning_layer

    te, dit = loaded["text_encoder"], loaded["transformer"]
    tok = Tokenizer.from_str(loaded["tokenizer_json"])
    ids = tok.encode("a blue circle moves right on a white background, a high beep", add_special_tokens=False).ids
    input_ids = torch.tensor([ids])
    layer = conditioning_layer(te)
    with torch.no_grad():
        out = te.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                       mm_token_type_ids=torch.zeros_like(input_ids), use_cache=False, output_hidden_states=True)
        text = out.hidden_states[layer]
        assert text.shape == (1, len(ids), dit.config.text_dim) and torch.isfinite(text).all()
        L = len(ids)
        pos, tags, vi, ai, ti, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            torch.ones(L, dtype=torch.long), 7, 8, 8, 37, (1, 2, 2), 2, 2, 0)
        u, idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(vi, ai, 0, 0, L, 0.3, 0.6, 0.3, 1.0)
        g = torch.Generator().manual_seed(0)
        v, a = dit(hidden_states=torch.randn(1, 112, 96, generator=g), audio_hidden_states=torch.randn(1, 74, 32,
                   generator=g), encoder_hidden_states=text, timestep=u, timestep_indices=idx, token_tags=tags,
                   position_ids=pos, video_indices=vi, audio_indices=ai, text_indices=ti, return_dict=False)
    assert v.shape == (1, 112, 96) and a.shape == (1, 74, 32)
    assert torch.isfinite(v).all() and torch.isfinite(a).all() and v.abs().mean() > 0.01
    vv, av = loaded["video_vae"], loaded["audio_vae"]
    assert vv.spatial_compression_ratio == 16 and vv.temporal_compression_ratio == 4 and av.hop_length == 800


def test_runtime_package_does_not_import_training_code():
    for py in (ROOT / "python" / "h3ctl").rglob("*.py"):
        src = py.read_text()
        assert not re.search(r"^\s*(from|import)\s+train\b", src, re.M), py
