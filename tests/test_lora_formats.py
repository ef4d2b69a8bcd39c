"""Few-step LoRA formats (docs/few-step.md) against a numpy reference of the same math on random weights.

Each released format is written here as a synthetic file of its documented layout (the released files are not
downloadable here), at h3-tiny's shapes on a random all-f32 checkpoint:
  - larryvrh's Turbo LoRA: bare original names, fused qkv_proj lora_B rows [q_all; k_all; v_all], fc1 [gate; up];
  - alibaba-pai's PDD Acc LoRA: diffusers names with `.lora_down` / `.lora_up`, metadata lora_alpha / lora_rank /
    pdd_num_steps, and a bank of interval output heads (proj_out / audio_proj_out [n, out, hidden]), also in
    ComfyUI's converted form (`final_layer.video_out.set_weight` [n * out, hidden]);
  - FastVideo's FastH3 LoRA: low-rank A/B plus whole-parameter `.diff` / `.diff_b` / `.set_weight`.
The reference merges in numpy (rows permuted into the released per-head-interleaved qkv layout, fc1's halves, alpha /
rank) and writes the merged checkpoint; libh3 merging the file at load must render what libh3 renders from that
checkpoint. PDD's heads change per step: each step is checked on its own from the LoRA render's latents, against a
checkpoint whose heads numpy fused for that step (the sigma-length-weighted mean of the interval heads it spans).
"""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from h3ctl import Engine, schedules
from tests.h3cli import assert_clean_error, run as run_cli

PROMPT = "a red circle moves right on a black background, a high beep"
W, H, F = 64, 96, 22


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.fixtures import build_models, write_official

    part = write_official(build_models("tiny", seed=7), tmp_path_factory.mktemp("lf") / "m", dtype="f32")
    with safe_open(str(part / "transformer" / "model.safetensors"), "np") as st:
        weights = {k: st.get_tensor(k) for k in st.keys()}
    cfg = json.loads((part / "transformer" / "config.json").read_text())
    return part, weights, cfg


def root(part):
    return part.parent


def write_model(part, weights, root, index_extra=None):
    """A copy of the model holding partition `part` whose transformer holds `weights` (the rest linked); its root."""
    root.mkdir(parents=True)
    for entry in part.parent.iterdir():
        if entry.name != part.name:
            os.symlink(entry, root / entry.name)
    out = root / part.name
    out.mkdir()
    for entry in part.iterdir():
        if entry.name == "transformer":
            continue
        if entry.name == "model_index.json" and index_extra:
            idx = json.loads(entry.read_text())
            idx.setdefault("h3ctl", {}).update(index_extra)
            (out / entry.name).write_text(json.dumps(idx))
        else:
            os.symlink(entry, out / entry.name)
    (out / "transformer").mkdir()
    shutil.copy(part / "transformer" / "config.json", out / "transformer" / "config.json")
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in weights.items()},
              str(out / "transformer" / "model.safetensors"))
    return root


def stacked_to_interleaved(rows_stacked, heads, head_dim):
    """[q_all; k_all; v_all] rows -> the released per-head [q_h; k_h; v_h] order."""
    a = heads * head_dim
    q, k, v = rows_stacked[:a], rows_stacked[a:2 * a], rows_stacked[2 * a:]
    parts = [np.concatenate([q[h * head_dim:(h + 1) * head_dim], k[h * head_dim:(h + 1) * head_dim],
                             v[h * head_dim:(h + 1) * head_dim]]) for h in range(heads)]
    return np.concatenate(parts)


def qkv_part_rows(part_index, heads, head_dim):
    """Released qkv rows of diffusers' to_q / to_k / to_v (part 0 / 1 / 2), in that module's row order."""
    return np.array([h * 3 * head_dim + part_index * head_dim + d for h in range(heads) for d in range(head_dim)])


def render(model, **kw):
    with Engine(model, threads=2) as eng:
        r = eng.render(PROMPT, W, H, F, seed=11, **kw)
    return r.frames.astype(np.float64), r.audio.astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def rng_mat(rng, shape, s=0.15):
    return (rng.standard_normal(shape) * s).astype(np.float32)


def test_turbo_lora_fused_qkv_stacked_rows(base, tmp_path):
    """larryvrh's Turbo layout: bare original names; qkv lora_B rows [q_all; k_all; v_all] (the ComfyUI order), mapped
    onto the released per-head order; a shared lora_A; an .alpha."""
    part, weights, cfg = base
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    rng = np.random.default_rng(1)
    t, ref = {}, dict(weights)
    r = 8
    for name in ["blocks.0.attn.qkv_proj", "blocks.1.attn.qkv_proj", "blocks.1.mlp.fc1", "blocks.0.mlp.fc2",
                 "token_refiner.blocks.1.attn.qkv_proj"]:
        out_f, in_f = weights[name + ".weight"].shape
        A, B = rng_mat(rng, (r, in_f)), rng_mat(rng, (out_f, r))
        t[f"{name}.lora_A.weight"], t[f"{name}.lora_B.weight"] = A, B
        scale = 1.0
        if name == "blocks.1.mlp.fc1":
            t[f"{name}.alpha"] = np.array(4.0, np.float32)
            scale = 4.0 / r
        delta = (B.astype(np.float64) @ A.astype(np.float64)) * scale
        if name.endswith("qkv_proj"):
            delta = stacked_to_interleaved(delta, heads, hd)
        ref[name + ".weight"] = (weights[name + ".weight"].astype(np.float64) + delta).astype(np.float32)
    lora = tmp_path / "turbo.safetensors"
    save_file(t, str(lora))
    merged = write_model(part, ref, tmp_path / "ref")
    ours = render(root(part), steps=5, schedule="turbo-544p", lora=[str(lora)])
    want = render(merged, steps=5, schedule="turbo-544p")
    plain = render(root(part), steps=5, schedule="turbo-544p")
    ev, ea = rel(ours[0], want[0]), rel(ours[1], want[1])
    print(f"turbo LoRA vs numpy merge: video {ev:.2e}, audio {ea:.2e}")
    assert ev <= 1e-4 and ea <= 1e-4
    assert rel(plain[1], want[1]) > 100 * max(ea, 1e-7)  # the LoRA changes the render well past the tolerance
    # the interleaved reading of the same rows is a different model: the order is what the test pins
    wrong = dict(weights)
    for name in ["blocks.0.attn.qkv_proj"]:
        d = t[f"{name}.lora_B.weight"].astype(np.float64) @ t[f"{name}.lora_A.weight"].astype(np.float64)
        wrong[name + ".weight"] = (weights[name + ".weight"] + d).astype(np.float32)
    assert rel(ours[1], want[1]) < rel(ours[1], render(write_model(part, {**ref, **{k: wrong[k] for k in [
        "blocks.0.attn.qkv_proj.weight"]}}, tmp_path / "wrong"), steps=5, schedule="turbo-544p")[1])


def test_turbo_lora_matches_diffusers_loader(base, tmp_path):
    """The same unprefixed Turbo layout through diffusers' own MiniMaxH3LoraLoaderMixin (which reads larryvrh's
    file as it is): libh3's merge renders what diffusers' LoRA renders from the same noise."""
    pytest.importorskip("peft", reason="diffusers loads LoRA weights through peft (the test extra installs it)")
    import torch

    from tests.fixtures import build_models
    from tests.pipeline_oracle import diffusers_pipeline, rel_l2, run as run_diffusers

    part, weights, _ = base
    rng = np.random.default_rng(2)
    t = {}
    for name in ["blocks.0.attn.qkv_proj", "blocks.1.mlp.fc1", "blocks.1.attn.out_proj"]:
        out_f, in_f = weights[name + ".weight"].shape
        t[f"{name}.lora_A.weight"], t[f"{name}.lora_B.weight"] = rng_mat(rng, (8, in_f)), rng_mat(rng, (out_f, 8))
    lora = tmp_path / "turbo.safetensors"
    save_file(t, str(lora))
    with Engine(root(part), threads=2) as eng:
        eng.prepare(PROMPT, W, H, F, steps=4, seed=11)
        v, a = eng.latents()
        ours = eng.render(PROMPT, W, H, F, steps=4, seed=11, lora=[str(lora)])
        eng.prepare(PROMPT, W, H, F, steps=4, seed=11, lora=[str(lora)])
        while eng.step() > 0:
            pass
        px = eng.decode_video_f32()
    pipe = diffusers_pipeline(build_models("tiny", seed=7), part / "tokenizer")
    pipe.load_lora_weights({k: torch.from_numpy(x) for k, x in t.items()}, adapter_name="turbo")
    ref_video, ref_audio = run_diffusers(pipe, PROMPT, W, H, F, 4, v, a)
    ev, ea = rel_l2(px, ref_video[0]), rel_l2(ours.audio, ref_audio[0])
    print(f"turbo LoRA vs diffusers: video {ev:.2e}, audio {ea:.2e}")
    assert ev <= 1e-3 and ea <= 1e-3


def pdd_file(weights, cfg, rng, n=32, rank=8, alpha=4.0, comfy=False):
    """A PDD Acc LoRA of the released layout (diffusers names, .lora_down/.lora_up, metadata, a head bank)."""
    t = {}
    trunk = {"transformer_blocks.0.attn.to_q": "blocks.0.attn.qkv_proj", "transformer_blocks.1.attn.to_v":
             "blocks.1.attn.qkv_proj", "transformer_blocks.1.ff.net.0.proj": "blocks.1.mlp.fc1",
             "transformer_blocks.0.attn.to_out.0": "blocks.0.attn.out_proj",
             "token_refiner.refiner_blocks.0.ff.net.2": "token_refiner.blocks.0.mlp.fc2"}
    a = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    for dname, oname in trunk.items():
        out_f, in_f = weights[oname + ".weight"].shape
        if dname.endswith(("to_q", "to_v")):
            out_f = a
        t[dname + ".lora_down"], t[dname + ".lora_up"] = rng_mat(rng, (rank, in_f)), rng_mat(rng, (out_f, rank))
    hid = cfg["hidden_size"]
    vw, vb = weights["final_layer.video_out.weight"], weights["final_layer.video_out.bias"]
    aw, ab = weights["final_layer.audio_out.weight"], weights["final_layer.audio_out.bias"]
    bank = {"proj_out.weight": vw[None] + rng_mat(rng, (n, *vw.shape), 0.3),
            "proj_out.bias": vb[None] + rng_mat(rng, (n, *vb.shape), 0.3),
            "audio_proj_out.weight": aw[None] + rng_mat(rng, (n, *aw.shape), 0.3),
            "audio_proj_out.bias": ab[None] + rng_mat(rng, (n, *ab.shape), 0.3)}
    assert bank["proj_out.weight"].shape[2] == hid
    if comfy:
        t["final_layer.video_out.set_weight"] = bank["proj_out.weight"].reshape(-1, hid)
        t["final_layer.video_out.set_bias"] = bank["proj_out.bias"].reshape(-1)
        t["final_layer.audio_out.set_weight"] = bank["audio_proj_out.weight"].reshape(-1, hid)
        t["final_layer.audio_out.set_bias"] = bank["audio_proj_out.bias"].reshape(-1)
    else:
        t.update(bank)
    meta = {"pdd_num_steps": str(n), "pdd_block_size": "4", "lora_rank": str(rank), "lora_alpha": str(alpha),
            "lora_targets": "to_q,to_k,to_v,to_out.0,ff.net.0.proj,ff.net.2,adaln_proj.linear"}
    return t, meta, trunk, bank


def pdd_trunk_reference(weights, cfg, t, trunk, rank, alpha):
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    ref = dict(weights)
    for dname, oname in trunk.items():
        d = (t[dname + ".lora_up"].astype(np.float64) @ t[dname + ".lora_down"].astype(np.float64)) * (alpha / rank)
        w = ref[oname + ".weight"].astype(np.float64).copy()
        if dname.endswith("to_q"):
            w[qkv_part_rows(0, heads, hd)] += d
        elif dname.endswith("to_v"):
            w[qkv_part_rows(2, heads, hd)] += d
        elif dname.endswith("ff.net.0.proj"):  # diffusers [up; gate] -> fc1 [gate; up]
            half = d.shape[0] // 2
            w += np.concatenate([d[half:], d[:half]])
        else:
            w += d
        ref[oname + ".weight"] = w.astype(np.float32)
    return ref


def fused_head(bank_w, bank_b, s0, s1, shift):
    """The step s0 -> s1's head: the mean of the interval heads weighted by the sigma length each shares with it,
    on the bank's grid shift * b / (1 + (shift - 1) b), b = linspace(1, 0, n + 1) in float64."""
    n = bank_w.shape[0]
    b = np.linspace(1.0, 0.0, n + 1)
    g = shift * b / (1 + (shift - 1) * b)
    ov = np.clip(np.minimum(s0, g[:-1]) - np.maximum(s1, g[1:]), 0, None)
    assert abs(ov.sum() - (s0 - s1)) < 1e-9
    wts = ov / (s0 - s1)
    return (np.tensordot(wts, bank_w.astype(np.float64), 1).astype(np.float32),
            np.tensordot(wts, bank_b.astype(np.float64), 1).astype(np.float32))


@pytest.mark.parametrize("comfy", [False, True], ids=["released", "comfy-converted"])
def test_pdd_heads_per_step(base, tmp_path, comfy):
    part, weights, cfg = base
    rng = np.random.default_rng(3)
    rank, alpha = 8, 4.0
    t, meta, trunk, bank = pdd_file(weights, cfg, rng, rank=rank, alpha=alpha, comfy=comfy)
    lora = tmp_path / "pdd.safetensors"
    save_file(t, str(lora), metadata=meta)
    steps = 5
    sv, sa = schedules.sigmas("pdd", steps)
    # the LoRA render, its latents after every step (its grid is the one the file declares: no schedule given)
    lat = []
    with Engine(root(part), threads=2) as eng:
        eng.prepare(PROMPT, W, H, F, steps=steps, seed=11, lora=[str(lora)])
        lat.append(eng.latents())
        while True:
            left = eng.step()
            lat.append(eng.latents())
            if left <= 0:
                break
    assert len(lat) == steps
    trunk_ref = pdd_trunk_reference(weights, cfg, t, trunk, rank, alpha)
    for s in range(steps - 1):
        ref = dict(trunk_ref)
        ref["final_layer.video_out.weight"], ref["final_layer.video_out.bias"] = fused_head(
            bank["proj_out.weight"], bank["proj_out.bias"], float(sv[s]), float(sv[s + 1]), 12.0)
        ref["final_layer.audio_out.weight"], ref["final_layer.audio_out.bias"] = fused_head(
            bank["audio_proj_out.weight"], bank["audio_proj_out.bias"], float(sa[s]), float(sa[s + 1]), 3.0)
        model = write_model(part, ref, tmp_path / f"step{s}")
        grid = (np.array([sv[s], sv[s + 1]], np.float32), np.array([sa[s], sa[s + 1]], np.float32))
        with Engine(model, threads=2) as eng:
            eng.prepare(PROMPT, W, H, F, seed=11, video_noise=lat[s][0], audio_noise=lat[s][1], sigmas=grid)
            eng.step()
            v, a = eng.latents()
        ev, ea = rel(v, lat[s + 1][0]), rel(a, lat[s + 1][1])
        moved = rel(lat[s][1], lat[s + 1][1])
        print(f"PDD step {s} ({sv[s]:.4f} -> {sv[s + 1]:.4f}): video {ev:.2e}, audio {ea:.2e} (step moved {moved:.2e})")
        assert ev <= 1e-5 and ea <= 1e-5
        assert moved > 1e-3  # the step did something the check can see
        if s == 1:  # the neighbouring step's heads are a different model at this tolerance
            other = dict(ref)
            other["final_layer.video_out.weight"], other["final_layer.video_out.bias"] = fused_head(
                bank["proj_out.weight"], bank["proj_out.bias"], float(sv[s - 1]), float(sv[s]), 12.0)
            with Engine(write_model(part, other, tmp_path / "other"), threads=2) as eng:
                eng.prepare(PROMPT, W, H, F, seed=11, video_noise=lat[s][0], audio_noise=lat[s][1], sigmas=grid)
                eng.step()
                v2, _ = eng.latents()
            assert rel(v2, lat[s + 1][0]) > 100 * max(ev, 1e-7)


def test_fastvideo_diff_and_set_weight(base, tmp_path):
    """FastH3's layout: low-rank A/B beside whole-parameter .diff (a weight delta), .diff_b (a bias delta) and
    .set_weight (a replacement), in diffusers' names (rows mapped as for the low-rank halves) and the original ones."""
    part, weights, cfg = base
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    a = heads * hd
    rng = np.random.default_rng(4)
    t, ref = {}, {k: v.astype(np.float64) for k, v in weights.items()}
    # low rank (diffusers names, rank 8)
    out_f, in_f = weights["blocks.0.attn.out_proj.weight"].shape
    A, B = rng_mat(rng, (8, in_f)), rng_mat(rng, (out_f, 8))
    t["transformer_blocks.0.attn.to_out.0.lora_A.weight"], t["transformer_blocks.0.attn.to_out.0.lora_B.weight"] = A, B
    ref["blocks.0.attn.out_proj.weight"] += B.astype(np.float64) @ A.astype(np.float64)
    # .diff on to_k (one third of the fused qkv rows) and on ff.net.0.proj (halves swapped)
    dk = rng_mat(rng, (a, cfg["hidden_size"]), 0.05)
    t["transformer_blocks.1.attn.to_k.diff"] = dk
    ref["blocks.1.attn.qkv_proj.weight"][qkv_part_rows(1, heads, hd)] += dk
    fc1 = weights["blocks.1.mlp.fc1.weight"]
    df = rng_mat(rng, fc1.shape, 0.05)
    t["transformer_blocks.1.ff.net.0.proj.diff"] = df
    half = fc1.shape[0] // 2
    ref["blocks.1.mlp.fc1.weight"] += np.concatenate([df[half:], df[:half]])
    # .diff_b on biases: the video head (diffusers proj_out) and the context embedder
    db = rng_mat(rng, weights["final_layer.video_out.bias"].shape, 0.2)
    t["proj_out.diff_b"] = db
    ref["final_layer.video_out.bias"] += db
    dc = rng_mat(rng, weights["condition_proj.bias"].shape, 0.2)
    t["context_embedder.diff_b"] = dc
    ref["condition_proj.bias"] += dc
    # .set_weight (original names) then a delta on the same weight: the set applies first
    sw = rng_mat(rng, weights["blocks.0.mlp.fc2.weight"].shape, 0.05)
    t["diffusion_model.blocks.0.mlp.fc2.set_weight"] = sw
    A2, B2 = rng_mat(rng, (8, sw.shape[1])), rng_mat(rng, (sw.shape[0], 8))
    t["diffusion_model.blocks.0.mlp.fc2.lora_down.weight"], t["diffusion_model.blocks.0.mlp.fc2.lora_up.weight"] = A2, B2
    ref["blocks.0.mlp.fc2.weight"] = sw.astype(np.float64) + B2.astype(np.float64) @ A2.astype(np.float64)
    lora = tmp_path / "fasth3.safetensors"
    save_file(t, str(lora))
    merged = write_model(part, {k: v.astype(np.float32) for k, v in ref.items()}, tmp_path / "ref")
    ours = render(root(part), steps=5, lora=[str(lora)])
    want = render(merged, steps=5)
    plain = render(root(part), steps=5)
    ev, ea = rel(ours[0], want[0]), rel(ours[1], want[1])
    print(f"FastH3 LoRA vs numpy merge: video {ev:.2e}, audio {ea:.2e}")
    assert ev <= 1e-4 and ea <= 1e-4
    assert rel(plain[1], want[1]) > 100 * max(ea, 1e-7)
    # the LoRA's scale applies to deltas, not to a set: at scale 0 only the set remains
    zero = dict(weights)
    zero["blocks.0.mlp.fc2.weight"] = sw
    got0 = render(root(part), steps=5, lora=[f"{lora}:0"])
    want0 = render(write_model(part, zero, tmp_path / "ref0"), steps=5)
    assert rel(got0[1], want0[1]) <= 1e-4


def test_turbo_checkpoint_loads_as_a_model(base, tmp_path):
    """A Turbo checkpoint in the official layout is a model: it opens as one, and the grid its model_index.json
    declares is the one it runs (the same render as naming that grid, not the default one)."""
    part, weights, _ = base
    model = write_model(part, weights, tmp_path / "turbo", index_extra={"schedule": "turbo-768p"})
    declared = render(model, steps=5)
    named = render(root(part), steps=5, schedule="turbo-768p")
    default = render(root(part), steps=5)
    assert np.array_equal(declared[1], named[1]) and np.array_equal(declared[0], named[0])
    assert not np.array_equal(declared[1], default[1])


# ---- bad input: one line, exit 2, before any work, nothing written --------------------------------------------

def bad(tmp_path, lora_tensors, *needles, model=None, extra=(), metadata=None):
    lora = tmp_path / "bad.safetensors"
    save_file(lora_tensors, str(lora), metadata=metadata)
    out = tmp_path / "out.mp4"
    args = ["render", "-p", "x", "-o", out, "--lora", lora, "--steps", "5", *extra]
    if model is not None:
        args += ["--model-dir", model.parent]
    proc = run_cli(*args)
    assert_clean_error(proc, *needles)
    assert not out.exists()


def test_lora_for_another_model_refused(tmp_path):
    # the released H3's Turbo shapes on h3-tiny: qkv lora_B 21504 x 64 against a 1152-row weight
    t = {"blocks.0.attn.qkv_proj.lora_A.weight": np.zeros((64, 5376), np.float32),
         "blocks.0.attn.qkv_proj.lora_B.weight": np.zeros((21504, 64), np.float32)}
    bad(tmp_path, t, "bad.safetensors", "blocks.0.attn.qkv_proj", "21504")


def test_lora_rank_mismatch_refused(tmp_path):
    t = {"blocks.0.mlp.fc2.lora_A.weight": np.zeros((8, 704), np.float32),
         "blocks.0.mlp.fc2.lora_B.weight": np.zeros((256, 4), np.float32)}
    bad(tmp_path, t, "blocks.0.mlp.fc2", "rank mismatch")


def test_lora_metadata_rank_mismatch_refused(tmp_path):
    t = {"transformer_blocks.0.ff.net.2.lora_down": np.zeros((8, 704), np.float32),
         "transformer_blocks.0.ff.net.2.lora_up": np.zeros((256, 8), np.float32)}
    bad(tmp_path, t, "lora_rank 16", metadata={"lora_rank": "16"})


def test_pdd_bank_of_another_model_refused(tmp_path):
    t = {"proj_out.weight": np.zeros((32, 96, 5376), np.float32), "proj_out.bias": np.zeros((32, 96), np.float32),
         "audio_proj_out.weight": np.zeros((32, 32, 5376), np.float32),
         "audio_proj_out.bias": np.zeros((32, 32), np.float32)}
    bad(tmp_path, t, "PDD head", "proj_out.weight")


def test_pdd_bank_incomplete_refused(tmp_path):
    t = {"proj_out.weight": np.zeros((32, 96, 256), np.float32), "proj_out.bias": np.zeros((32, 96), np.float32)}
    bad(tmp_path, t, "audio_proj_out.weight")


def test_diff_of_wrong_shape_refused(tmp_path):
    t = {"transformer_blocks.0.attn.to_k.diff": np.zeros((1152, 256), np.float32)}  # to_k holds 384 rows
    bad(tmp_path, t, "to_k.diff", "1152")


def test_unknown_whole_parameter_target_refused(tmp_path):
    t = {"blocks.0.attn.qkv_proj.diff_b": np.zeros((1152,), np.float32)}  # H3's qkv_proj has no bias
    bad(tmp_path, t, "qkv_proj.bias")
