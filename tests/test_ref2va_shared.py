"""The shared-weight Ref2VA partition (h3-tiny's form, to fit its package budget).

Ref2VA/ holds model_index.json and transformer/ only: transformer/model.safetensors carries the tensors the Ref2VA
fine-tune changed (the main blocks' attention: qkv_proj, out_proj, q_norm, k_norm) and its index maps every other
tensor to "../../FL2VA/transformer/<file>". The folders Ref2VA/ lacks (text_encoder, tokenizer, video_vae,
audio_vae) are FL2VA's.

* A render with an image and an audio reference on the shared form is byte-identical to the same checkpoint with a
  full Ref2VA copy (every component duplicated), and differs from one on FL2VA's transformer (the Ref2VA tensors are
  read); diffusers' converter builds the same transformer from both forms (its own index reader refuses shard names
  with a path separator, so the fixtures' reader resolves them); `h3ctl info --ref2va` says where each component
  comes from; the fallback is per folder (a folder Ref2VA/ has is its own), the processor settings included.
* Refused, one line, exit 2, nothing written: shard names outside the one allowed form ("../x.safetensors",
  "../../Ref2VA/transformer/x", "/abs/x", "../../FL2VA/transformer/../../x"), the allowed form anywhere but a
  Ref2VA transformer opened as such, a missing shared shard, a tensor listed for the shared shard but absent there,
  a Ref2VA/ without transformer/.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.h3cli import assert_clean_error, run

W, H, FRAMES, STEPS, SEED = 64, 64, 22, 3, 4
PROMPT = "a red circle moves right on a black background, a high beep"
H3CTL = {"reference_image_short_edge": 64, "canvas_short_edge": 64, "canvas_max_pixels": 64 * 112}


@pytest.fixture(scope="module")
def forms(tiny_models, tmp_path_factory):
    """(full, shared, fl_only, ref_transformer): the same FL2VA/ and Ref2VA transformer written with a full Ref2VA
    copy, in the shared form, and with Ref2VA/ a copy of FL2VA/ (FL2VA's transformer)."""
    import torch

    from tests.fixtures import load_component_tensors, write_ref2va_copy, write_shared_ref2va

    ref = copy.deepcopy(tiny_models["transformer"])
    g = torch.Generator().manual_seed(77)
    with torch.no_grad():  # a "fine-tune" of the main blocks' attention only
        for name, p in ref.named_parameters():
            if name.startswith("transformer_blocks.") and ".attn." in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05 * (p.std() if p.numel() > 1 else 1.0))

    full = write_ref2va_copy(tiny_models, tmp_path_factory.mktemp("ref2va_full"), ref, H3CTL, "official")
    mi = full / "Ref2VA" / "model_index.json"

    shared = tmp_path_factory.mktemp("ref2va_shared")
    shutil.copytree(full / "FL2VA", shared / "FL2VA")
    shutil.copytree(full / "tokenizer", shared / "tokenizer")
    write_shared_ref2va(shared, load_component_tensors(full / "Ref2VA" / "transformer"), extra_index=H3CTL)
    assert json.loads((shared / "Ref2VA" / "model_index.json").read_text()) == json.loads(mi.read_text())
    assert sorted(p.name for p in (shared / "Ref2VA").iterdir()) == ["model_index.json", "transformer"]

    fl_only = tmp_path_factory.mktemp("ref2va_fl")
    shutil.copytree(full / "FL2VA", fl_only / "FL2VA")
    shutil.copytree(full / "FL2VA", fl_only / "Ref2VA")
    shutil.copy(mi, fl_only / "Ref2VA" / "model_index.json")
    return full, shared, fl_only, ref


def _picture(seed, h, w):
    from tests.test_fl2va import keyframe

    return keyframe(seed, h, w)


def _sound(seed, seconds=0.5, rate=32000):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 330 * t)[None] + 0.05 * rng.standard_normal((2, t.size))).astype(np.float32)


def _render(root, device="cpu"):
    from h3ctl import Engine

    refs = [_picture(31, 80, 120), {"audio": _sound(32), "sample_rate": 32000}]
    with Engine(root, threads=2, ref2va=True, device=device) as eng:
        r = eng.render(PROMPT, width=W, height=H, frames=FRAMES, steps=STEPS, seed=SEED, references=refs)
    return r.frames, r.audio


def test_render_is_byte_identical_to_the_full_copy(forms):
    full, shared, fl_only, _ = forms
    fv, fa = _render(full)
    sv, sa = _render(shared)
    assert fv.shape == sv.shape and fa.shape == sa.shape
    assert fv.tobytes() == sv.tobytes() and fa.tobytes() == sa.tobytes()
    # the test would see Ref2VA's own tensors ignored: FL2VA's transformer renders other pixels and sound
    ov, oa = _render(fl_only)
    dv, da = np.abs(ov.astype(np.int16) - fv), np.abs(oa - fa)
    print(f"shared Ref2VA: byte-identical to the full copy; FL2VA's transformer instead: pixels differ by up to "
          f"{dv.max()} ({(dv > 0).mean():.0%} of them), audio by up to {da.max():.2e}")
    assert (dv > 0).mean() > 0.05 and da.max() > 1e-5


def test_diffusers_builds_the_same_transformer(forms):
    import torch
    from diffusers.utils.hub_utils import _get_checkpoint_shard_files

    from tests.fixtures import read_official_transformer

    full, shared, _, ref = forms
    tdir = shared / "Ref2VA" / "transformer"
    # diffusers 0.42.1's own index reader refuses any shard name with a path separator
    with pytest.raises(ValueError, match="path separator"):
        _get_checkpoint_shard_files(str(tdir), str(tdir / "model.safetensors.index.json"))
    a = read_official_transformer(full / "Ref2VA" / "transformer").state_dict()
    b = read_official_transformer(tdir).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fl = read_official_transformer(full / "FL2VA" / "transformer").state_dict()
    changed = {k for k in a if not torch.equal(a[k], fl[k])}
    assert changed and all(k.startswith("transformer_blocks.") and ".attn." in k for k in changed)
    # and the weights are the fine-tuned module's, as the release stores them (BF16)
    want = ref.state_dict()
    assert all(torch.equal(b[k], want[k].to(torch.bfloat16).float()) for k in changed)


def test_info_says_where_components_come_from(forms):
    full, shared, _, _ = forms
    proc = run("info", "-d", shared, "--ref2va", "--json")
    assert proc.returncode == 0, proc.stderr
    comps = json.loads(proc.stdout)["components"]
    for name in ("text_encoder", "tokenizer", "video_vae", "audio_vae"):
        assert comps[name]["shared_from"] == "FL2VA" and "/FL2VA/" in comps[name]["dir"], name
    tr = comps["transformer"]
    assert "shared_from" not in tr and tr["dir"].endswith("Ref2VA/transformer")
    own = json.loads((shared / "Ref2VA" / "transformer" / "model.safetensors.index.json").read_text())["weight_map"]
    n_own = sum(v == "model.safetensors" for v in own.values())
    assert tr["tensors"] == len(own) and tr["tensors_shared_from_FL2VA"] == len(own) - n_own and n_own > 0
    ref_full = json.loads(run("info", "-d", full, "--ref2va", "--json").stdout)["components"]
    assert tr["bytes"] == ref_full["transformer"]["bytes"]
    assert not any("shared_from" in c or "tensors_shared_from_FL2VA" in c for c in ref_full.values())
    text = run("info", "-d", shared, "--ref2va")
    assert text.returncode == 0 and "audio_vae (shared from FL2VA)" in text.stdout
    assert f"transformer ({len(own) - n_own} tensors from FL2VA)" in text.stdout


def test_fallback_is_per_folder(forms, tmp_path):
    """A folder Ref2VA/ has is its own; only the missing ones are FL2VA's."""
    root = tmp_path / "model"
    shutil.copytree(forms[1], root)
    shutil.copytree(root / "FL2VA" / "audio_vae", root / "Ref2VA" / "audio_vae")
    proc = run("info", "-d", root, "--ref2va", "--json")
    assert proc.returncode == 0, proc.stderr
    comps = json.loads(proc.stdout)["components"]
    assert "shared_from" not in comps["audio_vae"] and comps["audio_vae"]["dir"].endswith("Ref2VA/audio_vae")
    assert all(comps[n]["shared_from"] == "FL2VA" for n in ("text_encoder", "tokenizer", "video_vae"))


def test_processor_settings_are_fl2vas(forms, tmp_path):
    """Ref2VA/ has no processor/ either: the image processor settings are FL2VA's (rows of a vision block)."""
    import ctypes

    from h3ctl import _lib
    from h3ctl.context import Context
    from tests.test_vision_tower import DEFAULT_PROC

    def rows(root, ref2va):
        with Context(root, threads=1, ref2va=ref2va) as ctx:
            return _lib.check(_lib.lib().h3_text_image_rows(ctx.ptr, b"p", 1, (ctypes.c_int * 1)(256),
                                                            (ctypes.c_int * 1)(256)))

    root = tmp_path / "model"
    shutil.copytree(forms[1], root)
    (root / "FL2VA" / "processor").mkdir()
    (root / "FL2VA" / "processor" / "preprocessor_config.json").write_text(json.dumps(
        {**DEFAULT_PROC, "size": {"shortest_edge": 1024, "longest_edge": 64 * 64}}))
    small, plain = rows(root, True), rows(forms[1], True)
    assert small == rows(root, False) and small < plain


# ---- refused ---------------------------------------------------------------------------------------------------

def _index(root: Path) -> Path:
    return root / "Ref2VA" / "transformer" / "model.safetensors.index.json"


def _remap(shard_name):
    """Map the first tensor of FL2VA's shard to `shard_name` instead."""
    def edit(root):
        f = _index(root)
        idx = json.loads(f.read_text())
        name = next(k for k, v in idx["weight_map"].items() if v.startswith("../../FL2VA/"))
        idx["weight_map"][name] = shard_name
        f.write_text(json.dumps(idx))
        return ["--ref2va"], ["model.safetensors.index.json", f"'{shard_name}'", "not a file in"]
    edit.__name__ = f"names {shard_name!r}"
    return edit


def _missing_shared_shard(root):
    (root / "FL2VA" / "transformer" / "model.safetensors").rename(root / "FL2VA" / "transformer" / "moved")
    return ["--ref2va"], ["shared shard '../../FL2VA/transformer/model.safetensors'", "is missing"]


def _listed_but_absent(root):
    f = _index(root)
    idx = json.loads(f.read_text())
    idx["weight_map"]["blocks.0.attn.extra.weight"] = "../../FL2VA/transformer/model.safetensors"
    f.write_text(json.dumps(idx))
    return ["--ref2va"], ["'blocks.0.attn.extra.weight' is listed but not in shard ../../FL2VA/transformer/"]


def _own_tensor_moved_to_shared(root):
    """A tensor Ref2VA stores itself, mapped to FL2VA's file: both files hold it."""
    f = _index(root)
    idx = json.loads(f.read_text())
    name = next(k for k, v in idx["weight_map"].items() if v == "model.safetensors")
    idx["weight_map"][name] = "../../FL2VA/transformer/model.safetensors"
    f.write_text(json.dumps(idx))
    return ["--ref2va"], [f"'{name}'", "duplicate name across shards"]


def _shared_form_in_fl2va(root):
    """The allowed form is a Ref2VA transformer's only: FL2VA's own index may not use it."""
    st = root / "FL2VA" / "transformer" / "model.safetensors"
    idx = json.loads(_index(root).read_text())
    (root / "FL2VA" / "transformer" / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "../../FL2VA/transformer/" + st.name for k in idx["weight_map"]}}))
    return [], ["FL2VA/transformer/model.safetensors.index.json", "'../../FL2VA/transformer/model.safetensors'",
                "not a file in"]


def _ref2va_dir_opened_directly(root):
    """Ref2VA/ given as the model directory is a plain partition: its index may not reach outside it."""
    return ["-d", str(root / "Ref2VA")], ["'../../FL2VA/transformer/model.safetensors'", "not a file in"]


def _no_transformer(root):
    shutil.rmtree(root / "Ref2VA" / "transformer")
    return ["--ref2va"], ["Ref2VA: no transformer/ folder", "needs its own transformer"]


REFUSED = [_remap("../x.safetensors"), _remap("../../Ref2VA/transformer/x.safetensors"), _remap("/abs/x"),
           _remap("../../FL2VA/transformer/../../x"), _remap("../../FL2VA/transformer/"), _missing_shared_shard,
           _listed_but_absent, _own_tensor_moved_to_shared, _shared_form_in_fl2va, _ref2va_dir_opened_directly,
           _no_transformer]


@pytest.mark.parametrize("case", REFUSED, ids=[c.__name__.strip("_") for c in REFUSED])
def test_refused(case, forms, tmp_path):
    root = tmp_path / "model"
    shutil.copytree(forms[1], root)
    args, needles = case(root)
    if "-d" not in args:
        args = ["-d", str(root)] + args
    before = sorted(str(q) for q in tmp_path.rglob("*"))
    assert_clean_error(run("info", *args), *needles)
    assert sorted(str(q) for q in tmp_path.rglob("*")) == before  # nothing written


def test_render_refused_without_ref2va_transformer(forms, tmp_path):
    """The CLI render with a reference: one line, exit 2, no output file."""
    from PIL import Image

    root = tmp_path / "model"
    shutil.copytree(forms[1], root)
    shutil.rmtree(root / "Ref2VA" / "transformer")
    Image.fromarray(_picture(41, 64, 64)).save(tmp_path / "a.png")
    out = tmp_path / "o.mp4"
    proc = run("render", "-d", root, "-p", PROMPT, "--size", "64x64", "--steps", "2", "--ref-image",
               tmp_path / "a.png", "-o", out)
    assert_clean_error(proc, "no transformer/ folder")
    assert not out.exists()


def test_fl2va_unaffected(forms):
    """Opened without the Ref2VA option the same directory is FL2VA's, nothing shared."""
    _, shared, _, _ = forms
    proc = run("info", "-d", shared, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["partition"] == "FL2VA" and info["ref2va_present"]
    assert not any("shared_from" in c or "tensors_shared_from_FL2VA" in c for c in info["components"].values())
