"""The shipped h3-tiny checkpoint (python/h3ctl/models/h3-tiny/): official MiniMax-H3 layout, loads in diffusers /
transformers through the fixtures' reader, released dtypes, architecture ties, size limit, tokenizer structure.

h3-tiny's Ref2VA/ partition, when present, must be the shared-weight form (to fit the 60 MB package budget):
model_index.json (FL2VA's with partition "ref2va", tasks ["ref2va"], reference_image_short_edge 128 in its h3ctl
block) and transformer/ (FL2VA's config.json; model.safetensors with only the main blocks' attention tensors; an
index sending every other tensor to "../../FL2VA/transformer/model.safetensors"), nothing else. The checker is held
against fixture checkpoints in both directions (a good shared form passes, each breakage is named).

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
    # lora/: the few-step student's LoRA (presets.student_lora, tests/test_few_step_student.py), counted in the total
    assert sorted(p.name for p in MODEL.iterdir() if p.is_dir() and p.name != "lora") in (
        ["FL2VA", "tokenizer"], ["FL2VA", "Ref2VA", "tokenizer"])
    assert shared_ref2va_problems(MODEL, short_edge=128) == []


def shared_ref2va_problems(model: Path, short_edge: int | None = None) -> list[str]:
    """What keeps `model`/Ref2VA from being the shared-weight form (an empty list when it is, or when there is no
    Ref2VA/)."""
    from safetensors import safe_open

    from tests.fixtures.official import REF2VA_OWN_RE, SHARED_SHARD_PREFIX

    fl, ref = model / "FL2VA", model / "Ref2VA"
    if not ref.exists():
        return []
    out = []
    if sorted(p.name for p in ref.iterdir()) != ["model_index.json", "transformer"]:
        out.append(f"Ref2VA/ holds {sorted(p.name for p in ref.iterdir())}, not only model_index.json, transformer")
    tdir = ref / "transformer"
    names = sorted(p.name for p in tdir.iterdir()) if tdir.is_dir() else []
    if names != ["config.json", "model.safetensors", "model.safetensors.index.json"]:
        return out + [f"Ref2VA/transformer holds {names}"]
    mi, fl_mi = (json.loads((d / "model_index.json").read_text()) for d in (ref, fl))
    h3 = mi.get("_minimax_h3", {})
    if h3.get("partition") != "ref2va" or h3.get("tasks") != ["ref2va"]:
        out.append("model_index.json: _minimax_h3 must say partition 'ref2va', tasks ['ref2va']")
    want_h3ctl = {**fl_mi.get("h3ctl", {}), "reference_image_short_edge": short_edge or
                  mi.get("h3ctl", {}).get("reference_image_short_edge")}
    for k in ("reference_aspect_width", "reference_aspect_height"):  # the Ref2VA default canvas may be stated
        if k in mi.get("h3ctl", {}):
            want_h3ctl[k] = mi["h3ctl"][k]
    if mi.get("h3ctl") != want_h3ctl:
        out.append(f"model_index.json: h3ctl block {mi.get('h3ctl')} is not FL2VA's plus reference_image_short_edge")
    strip = lambda d: {k: v for k, v in d.items() if k not in ("_minimax_h3", "h3ctl")}  # noqa: E731
    if strip(mi) != strip(fl_mi) or {k: v for k, v in h3.items() if k not in ("partition", "tasks")} != \
            {k: v for k, v in fl_mi["_minimax_h3"].items() if k not in ("partition", "tasks")}:
        out.append("model_index.json differs from FL2VA's beyond partition, tasks and the h3ctl block")
    if (tdir / "config.json").read_bytes() != (fl / "transformer" / "config.json").read_bytes():
        out.append("Ref2VA/transformer/config.json is not FL2VA's")
    with safe_open(str(tdir / "model.safetensors"), "pt") as f:
        own = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    with safe_open(str(fl / "transformer" / "model.safetensors"), "pt") as f:
        base = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    extra = sorted(k for k in own if not REF2VA_OWN_RE.match(k))
    if extra:
        out.append(f"Ref2VA/transformer/model.safetensors holds tensors the fine-tune does not change: {extra[:3]}")
    if not own or any(base.get(k) != v for k, v in own.items()):
        out.append("Ref2VA's own tensors must be FL2VA tensors of the same dtype and shape")
    wm = json.loads((tdir / "model.safetensors.index.json").read_text()).get("weight_map", {})
    want = {k: "model.safetensors" if k in own else SHARED_SHARD_PREFIX + "model.safetensors" for k in base}
    if wm != want:
        bad = sorted(k for k in set(wm) | set(want) if wm.get(k) != want.get(k))
        out.append(f"Ref2VA/transformer/model.safetensors.index.json maps {bad[:3]} otherwise than the shared form")
    return out


def test_shared_ref2va_checker(tiny_models, tmp_path):
    """The checker on fixtures: the shared form passes; each departure from it is named."""
    import shutil

    from tests.fixtures import load_component_tensors, write_official, write_shared_ref2va
    from tests.fixtures.official import REF2VA_OWN_RE

    good = tmp_path / "good"
    write_official(tiny_models, good, dtype="official")
    fl_mi = json.loads((good / "FL2VA" / "model_index.json").read_text())
    fl_mi["h3ctl"] = {"default_width": 128}
    (good / "FL2VA" / "model_index.json").write_text(json.dumps(fl_mi))
    tensors = load_component_tensors(good / "FL2VA" / "transformer")
    tensors = {k: (v * 1.5).to(v.dtype) if REF2VA_OWN_RE.match(k) else v for k, v in tensors.items()}
    write_shared_ref2va(good, tensors, extra_index={"reference_image_short_edge": 128})
    assert shared_ref2va_problems(good, short_edge=128) == []
    assert shared_ref2va_problems(good, short_edge=64) != []

    def broken(edit):
        d = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        shutil.copytree(good, d)
        edit(d)
        return " | ".join(shared_ref2va_problems(d, short_edge=128))

    assert "not only model_index.json" in broken(
        lambda d: shutil.copytree(d / "FL2VA" / "audio_vae", d / "Ref2VA" / "audio_vae"))

    def full_copy(d):
        shutil.rmtree(d / "Ref2VA")
        write_official(tiny_models, d, dtype="official", partition="Ref2VA", write_root_tokenizer=False)
    assert "not only model_index.json" in broken(full_copy)

    def own_mlp(d):
        from safetensors.torch import load_file, save_file

        f = d / "Ref2VA" / "transformer" / "model.safetensors"
        sd = load_file(str(f))
        sd["blocks.0.mlp.fc1.weight"] = tensors["blocks.0.mlp.fc1.weight"]
        save_file(sd, str(f))
    assert "does not change" in broken(own_mlp)

    def wrong_task(d):
        f = d / "Ref2VA" / "model_index.json"
        mi = json.loads(f.read_text())
        mi["_minimax_h3"]["tasks"] = ["t2va", "ref2va"]
        f.write_text(json.dumps(mi))
    assert "tasks ['ref2va']" in broken(wrong_task)

    def drop_from_index(d):
        f = d / "Ref2VA" / "transformer" / "model.safetensors.index.json"
        idx = json.loads(f.read_text())
        idx["weight_map"].pop("rope.inv_freq")
        f.write_text(json.dumps(idx))
    assert "rope.inv_freq" in broken(drop_from_index)


def test_package_data_includes_every_h3_tiny_partition():
    """The wheel takes python/h3ctl whole (pyproject: packages = ["python/h3ctl"], no excludes there) and hatch leaves
    out only git-ignored paths: nothing under models/h3-tiny/ (Ref2VA/** included) may be ignored."""
    import subprocess
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]
    assert cfg["wheel"]["packages"] == ["python/h3ctl"]
    assert not any(k in cfg["wheel"] for k in ("exclude", "only-include", "include", "sources"))
    assert "python" in cfg["sdist"]["include"]
    assert not any("models" in e for e in cfg["sdist"].get("exclude", []))
    probes = [f"python/h3ctl/models/h3-tiny/{p}" for p in (
        "Ref2VA/model_index.json", "Ref2VA/transformer/config.json", "Ref2VA/transformer/model.safetensors",
        "Ref2VA/transformer/model.safetensors.index.json", "FL2VA/transformer/model.safetensors")]
    r = subprocess.run(["git", "check-ignore", "--no-index", *probes], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == "", r.stdout  # 1: none of them is ignored


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
    for t in load_component_tensors(PART / "video_vae/source").values():
        assert t.dtype == torch.float32
    # the audio encoder side may be BF16 (libh3 widens it at load; it makes room for Ref2VA/), the decoder is F32
    from tests.audio_vae_oracle import ENCODER_PREFIXES

    for name, t in load_component_tensors(PART / "audio_vae").items():
        assert t.dtype == torch.float32 or (t.dtype == torch.bfloat16 and name.startswith(ENCODER_PREFIXES)), name


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
    if (MODEL / "Ref2VA").exists():
        # the shared-weight Ref2VA transformer: diffusers' converter builds it (the fixtures' reader resolving the
        # index), it differs from FL2VA's in the attention weights only, and libh3 opens the partition
        from tests.fixtures import read_official_transformer
        from tests.h3cli import run

        ref = read_official_transformer(MODEL / "Ref2VA" / "transformer").state_dict()
        base = dit.state_dict()
        changed = {k for k in base if not torch.equal(base[k], ref[k])}
        assert changed and all(k.startswith("transformer_blocks.") and ".attn." in k for k in changed)
        proc = run("info", "-d", MODEL, "--ref2va", "--json")
        assert proc.returncode == 0, proc.stderr
        comps = json.loads(proc.stdout)["components"]
        assert all(comps[c].get("shared_from") == "FL2VA" for c in ("text_encoder", "video_vae", "audio_vae"))


def test_runtime_package_does_not_import_training_code():
    for py in (ROOT / "python" / "h3ctl").rglob("*.py"):
        src = py.read_text()
        assert not re.search(r"^\s*(from|import)\s+train\b", src, re.M), py
