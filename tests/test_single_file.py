"""Single-file components (ComfyUI's repackages; `--transformer FILE`, `Engine(transformer=...)`; docs/single-files.md).

h3-tiny's own weights are written here in each single-file form (tests/fixtures/single_file.py: [q;k;v] QKV, bare or
`model.diffusion_model.` names, fp8_scaled and int8_convrot made by the documented quantisation in numpy, the pruned
curve table) and read back through libh3:

* bf16: every tensor libh3 presents equals the official shard's byte for byte (build/tests/test_single_file compares
  the stores), and the render is byte-identical to the official layout's;
* fp8_scaled / int8_convrot (comfy_quant tensors, and the _quantization_metadata form): the dequantised weights equal
  the numpy reference of the documented math bit for bit, and the render equals, byte for byte (tolerance 0), the
  render of the official layout written with those dequantised weights (dequantise-then-compute);
* pruned: the modulation the table gives (float64 interpolation) and the denoised latents libh3 computes from the
  table (its AdaLN precompute) match the exact time embedder's within 1e-6 relative L2 (the table is linear
  interpolation at 1025 points of a smooth curve; full rank here, so only the interpolation differs; measured
  4e-7), and the render's frames stay within 2 levels of 255 (measured 1), audio within 1e-3 relative L2;
* the text encoder as one file (bf16 and int8_convrot) renders as the official shards (resp. the dequantised ones);
* bad input (a file of another model, truncated, an unknown variant, nvfp4, a LoRA, FL2VA and Ref2VA mixed, a text
  encoder of another size) ends with one line and exit 2 before any work, writing nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "python"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from h3ctl import Engine, H3Error  # noqa: E402
from h3ctl import components  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl.engine import default_model_dir  # noqa: E402
from tests.fixtures import single_file as sf  # noqa: E402
from tests.h3cli import assert_clean_error, run  # noqa: E402

TINY = default_model_dir()
SHAPE = dict(width=32, height=32, frames=22, steps=2)
PROMPT = "a red circle moves right on a black background, a high beep"
SEED = 3
COMPARE = ROOT / "build" / "tests" / "test_single_file"


@pytest.fixture(scope="module")
def tiny():
    return sf.load_transformer(TINY), sf.config(TINY)["num_attention_heads"]


@pytest.fixture(scope="module")
def official_render():
    with Engine(threads=2) as e:
        return e.render(PROMPT, seed=SEED, **SHAPE)


@pytest.fixture(scope="module")
def compare_tool():
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "build/tests/test_single_file"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return COMPARE


def render(model_dir=TINY, **files):
    with Engine(model_dir, threads=2, **files) as e:
        return e.render(PROMPT, seed=SEED, **SHAPE)


def same(a, b) -> bool:
    return np.array_equal(a.frames, b.frames) and np.array_equal(a.audio, b.audio)


def presented_equal(tool, single: Path, ref_tensors: dict, tmp: Path, heads: int) -> str:
    """Every tensor of ref_tensors equals what libh3 presents from `single`, byte for byte."""
    from safetensors.torch import save_file

    ref = tmp / "ref.safetensors"
    save_file({k: v.contiguous() for k, v in ref_tensors.items()}, str(ref))
    proc = subprocess.run([str(tool), str(single), str(ref), str(heads)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 differ" in proc.stdout
    return proc.stdout


def test_bf16_single_file(tiny, official_render, compare_tool, tmp_path):
    t, heads = tiny
    tens, meta, _ = sf.comfy_tensors(t, heads)
    bare = sf.write_single(tmp_path / "minimax_h3_fl2va_bf16.safetensors", tens, meta)
    out = presented_equal(compare_tool, bare, t, tmp_path, heads)
    assert f"{len(t)} tensors equal" in out and "QKV [q;k;v]" in out
    pre = sf.write_single(tmp_path / "prefixed_bf16.safetensors", tens, meta, prefix=True)
    presented_equal(compare_tool, pre, t, tmp_path, heads)
    assert same(render(transformer=pre), official_render)


def memfd_bytes() -> int:
    """Bytes the kernel holds for this process's single-file owned files (the memfds core/singlefile.c writes the
    transformed tensors into): the allocator's own count of widened memory."""
    seen = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:h3-single-file"):
                st = os.stat(f"/proc/self/fd/{fd}")  # the same memfd may be open twice (its /proc path reopened)
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        except OSError:
            continue
    return sum(seen.values())


def f32_dequantised(base_tensors, tens, meta, layers, heads):
    """base_tensors with each of `layers` as ComfyUI's dequantise-then-compute holds it before any narrowing:
    W = (q * s) @ H^T per group, computed in float64 and rounded once to F32 (official rows)."""
    out = dict(base_tensors)
    for base in layers:
        q = tens[base + ".weight"].numpy().astype(np.float64)
        s = tens[base + ".weight_scale"].numpy().astype(np.float64).reshape(-1, 1)
        spec = (json.loads(bytes(tens[base + ".comfy_quant"].tolist())) if base + ".comfy_quant" in tens
                else json.loads(meta["_quantization_metadata"])["layers"][base])
        g = spec.get("convrot_groupsize", 0) if spec.get("convrot") else 0
        n, k = q.shape
        w = q * s
        if g:
            w = (w.reshape(n, k // g, g) @ (sf.hadamard(g).T / np.sqrt(g))).reshape(n, k)
        w = torch.from_numpy(w.astype(np.float32))
        out[base + ".weight"] = sf.qkv_from_thirds(w, heads) if base.endswith(".attn.qkv_proj") else w
    return out


def denoised(model_dir=TINY, **files):
    cfg = sf.config(TINY)
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((7, cfg["text_dim"])).astype(np.float32)
    lat = rng.standard_normal((24, 3, 2, 2)).astype(np.float32)
    aud = rng.standard_normal((2, 32, 5)).astype(np.float32)
    with Engine(model_dir, threads=2, **files) as e:
        return tr.denoise(e._ctx, emb, lat, aud, 4)[:2]


def rel_l2(a, b) -> float:
    return max(float(np.linalg.norm(x - y) / np.linalg.norm(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("variant,metadata_form", [("fp8_scaled", False), ("int8_convrot", False),
                                                   ("int8_convrot", True)])
def test_quantised_single_file(tiny, compare_tool, tmp_path, monkeypatch, variant, metadata_form):
    t, heads = tiny
    tens, meta, refs = sf.comfy_tensors(t, heads, variant=variant, metadata_form=metadata_form)
    assert len(refs) == 6 * 5  # every block's qkv, out, fc1, fc2 and adaln projection
    if variant == "int8_convrot":
        groups = {json.loads(bytes(v.tolist()))["convrot_groupsize"] for k, v in tens.items() if k.endswith("quant")}
        assert metadata_form or groups == {64, 256}  # both released group sizes are exercised
    single = sf.write_single(tmp_path / f"minimax_h3_fl2va_{variant}.safetensors", tens, meta, prefix=True)
    deq = sf.dequantised_official(t, refs, heads)
    # the dequantised weights: numpy's reference bits, every one
    out = presented_equal(compare_tool, single, deq, tmp_path, heads)
    assert f"{len(t)} tensors equal" in out
    # the widening path (the only one for fp8 on the CPU; H3_QUANT_WIDEN=1 for int8): dequantise-then-compute,
    # the official layout holding the dequantised weights renders the same bytes
    if variant != "fp8_scaled":
        monkeypatch.setenv("H3_QUANT_WIDEN", "1")
    with Engine(TINY, threads=2, transformer=single) as e:
        c = e._ctx.info()["components"]["transformer"]
        desc = c["single_file_format"]
        assert c["single_file_native_codes"] == 0
        widened = e.render(PROMPT, seed=SEED, **SHAPE)
        widened_alloc = memfd_bytes()
    assert ("fp8_scaled" if variant == "fp8_scaled" else "int8") in desc
    ref_dir = sf.official_with(TINY, tmp_path / "deq", deq)
    assert same(widened, render(ref_dir))
    if variant == "fp8_scaled":
        return
    monkeypatch.delenv("H3_QUANT_WIDEN")
    # native (the CPU default): the GEMM layers computed from the stored codes, the activations rotated at run time
    with Engine(TINY, threads=2, transformer=single) as e:
        c = e._ctx.info()["components"]["transformer"]
        owned = c["single_file_owned_bytes"]
        assert c["single_file_native_codes"] > 0
        got = e.render(PROMPT, seed=SEED, **SHAPE)
        native_alloc = memfd_bytes()
    # memory: the GEMM layers' BF16 forms are never written; what the owned file holds is the rest (the AdaLN
    # projections, widened because they are read on the host) and the QKV codes reordered (1 byte a value)
    gemm = [b for b in refs if not b.endswith("adaln_proj.linear")]
    gemm_bf16 = sum(t[b + ".weight"].numel() * 2 for b in gemm)
    qkv_codes = sum(t[b + ".weight"].numel() + t[b + ".weight"].shape[0] * 4 for b in gemm if "qkv" in b)
    print(f"owned file allocated: widened {widened_alloc} B, native {native_alloc} B (reported {owned} B); "
          f"GEMM layers as BF16 {gemm_bf16} B, QKV codes {qkv_codes} B")
    assert native_alloc <= owned + 64 * 1024 and widened_alloc - native_alloc >= gemm_bf16 - qkv_codes - 64 * 1024
    # numbers: against ComfyUI's dequantise-then-compute in F32 (the GEMM layers' dequantised values before any BF16
    # rounding; the AdaLN projections as both paths read them, widened), native is within 1e-5 relative L2 on the
    # denoised latents; the widened path is within its BF16 rounding
    exact_dir = sf.official_with(TINY, tmp_path / "exact", f32_dequantised(deq, tens, meta, gemm, heads))
    ref = denoised(exact_dir)
    nat = rel_l2(denoised(transformer=single), ref)
    monkeypatch.setenv("H3_QUANT_WIDEN", "1")
    wid = rel_l2(denoised(transformer=single), ref)
    monkeypatch.delenv("H3_QUANT_WIDEN")
    print(f"denoised rel-L2 against F32 dequantise-then-compute: native {nat:.3g}, widened {wid:.3g}")
    assert nat < 1e-5 and nat < wid
    diff = np.abs(got.frames.astype(int) - widened.frames.astype(int)).max()
    arel = float(np.linalg.norm(got.audio - widened.audio) / np.linalg.norm(widened.audio))
    print(f"native render against the widened one: frames max |diff| {diff}, audio rel-L2 {arel:.3g}")
    assert diff <= 2 and arel < 2e-2
    if not metadata_form:
        # the blocks streamed under a budget on the CPU are read (pread) from the owned file: widened there
        with Engine(TINY, threads=2, transformer=single, vram=0.008) as e:
            streamed = e.render(PROMPT, seed=SEED, **SHAPE)
            assert e.last_transformer_profile["stream"]["streamed_blocks"] == 6
        assert same(streamed, widened)


def test_pruned_single_file(tiny, official_render, tmp_path):
    t, heads = tiny
    cfg = sf.config(TINY)
    pruned = sf.prune(t, grid=1025, rank=cfg["time_embed_dim"], freq_dim=cfg["timestep_input_dim"])
    assert pruned["adaln_t_table"].shape == (1025, cfg["time_embed_dim"])
    # the table the file holds reproduces silu(time_embedder(t)) at off-grid t through its basis
    ts = np.array([0.0031, 0.5, 0.77777, 0.999])
    exact = sf.time_curve(t, ts, cfg["timestep_input_dim"])
    tab = pruned["adaln_t_table"].double().numpy()
    pos = ts * 1024
    lo = np.minimum(np.floor(pos).astype(int), 1023)
    lerp = tab[lo] + (pos - lo)[:, None] * (tab[lo + 1] - tab[lo])
    w = t["blocks.0.adaln_proj.linear.weight"].double().numpy()
    wr = pruned["blocks.0.adaln_proj.linear.weight"].double().numpy()
    rel = np.linalg.norm(lerp @ wr.T - exact @ w.T) / np.linalg.norm(exact @ w.T)
    print(f"pruned table (float64 lerp) against the exact projection: rel-L2 {rel:.3g}")
    assert rel < 1e-6, rel
    tens, meta, _ = sf.comfy_tensors(pruned, heads)
    single = sf.write_single(tmp_path / "minimax_h3_fl2va_pruned_bf16.safetensors", tens, meta)
    # the denoise (AdaLN tables precomputed for the schedule from the curve) against the official weights'
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((7, cfg["text_dim"])).astype(np.float32)
    lat = rng.standard_normal((24, 3, 2, 2)).astype(np.float32)
    aud = rng.standard_normal((2, 32, 5)).astype(np.float32)
    outs = []
    for kw in ({}, {"transformer": single}):
        with Engine(TINY, threads=2, **kw) as e:
            outs.append(tr.denoise(e._ctx, emb, lat.copy(), aud.copy(), 4)[:2])
    for a, b in zip(outs[0], outs[1]):
        rel = np.linalg.norm(a - b) / np.linalg.norm(a)
        print(f"pruned denoise rel-L2 {rel:.3g}")
        assert rel < 1e-6, rel
    got = render(transformer=single)
    diff = np.abs(got.frames.astype(int) - official_render.frames.astype(int)).max()
    arel = np.linalg.norm(got.audio - official_render.audio) / np.linalg.norm(official_render.audio)
    print(f"pruned render: frames max |diff| {diff}, audio rel-L2 {arel:.3g}")
    assert diff <= 2 and arel < 1e-3


def _te_tensors():
    return sf.load_transformer(TINY, "text_encoder")


@pytest.mark.parametrize("variant", ["bf16", "int8_convrot"])
def test_text_encoder_single_file(official_render, tmp_path, monkeypatch, variant):
    te = _te_tensors()
    tens, meta, refs = sf.comfy_tensors(te, None, variant=variant, select=sf.is_te_linear)
    single = sf.write_single(tmp_path / f"qwen3vl_32b_minimax_h3_{variant}.safetensors", tens, meta)
    if variant == "bf16":
        assert same(render(text_encoder=single), official_render)
        return
    assert refs
    # widening (H3_QUANT_WIDEN=1): the render of the official shards holding the dequantised BF16 weights
    monkeypatch.setenv("H3_QUANT_WIDEN", "1")
    ref_dir = sf.official_with(TINY, tmp_path / "deq", sf.dequantised_official(te, refs), part="text_encoder")
    widened = render(text_encoder=single)
    assert same(widened, render(ref_dir))
    monkeypatch.delenv("H3_QUANT_WIDEN")
    # native (the CPU default): the layers' GEMMs from the stored codes; against ComfyUI's dequantise-then-compute
    # in F32 the prompt embeddings are within 1e-5 relative L2, closer than the widened path
    from h3ctl import text as h3text

    exact_dir = sf.official_with(TINY, tmp_path / "exact", f32_dequantised(te, tens, meta, list(refs), None),
                                 part="text_encoder")
    ids = np.array([1, 5, 9, 33, 2, 17, 8], dtype=np.int32)

    def emb(model_dir=TINY, **files):
        with Engine(model_dir, threads=2, **files) as e:
            return h3text.encode(e._ctx, ids), memfd_bytes(), e._ctx.info()["components"]["text_encoder"]

    ref, _, _ = emb(exact_dir)
    nat, nat_alloc, c = emb(text_encoder=single)
    monkeypatch.setenv("H3_QUANT_WIDEN", "1")
    wid, wid_alloc, _ = emb(text_encoder=single)
    monkeypatch.delenv("H3_QUANT_WIDEN")
    rn = float(np.linalg.norm(nat - ref) / np.linalg.norm(ref))
    rw = float(np.linalg.norm(wid - ref) / np.linalg.norm(ref))
    print(f"text encoder int8_convrot: embeddings rel-L2 against F32 dequantise-then-compute: native {rn:.3g}, "
          f"widened {rw:.3g}; owned memfd {nat_alloc} B native, {wid_alloc} B widened")
    assert c["single_file_native_codes"] > 0 and rn < 1e-5 and rn < rw
    assert nat_alloc < wid_alloc and nat_alloc <= c["single_file_owned_bytes"] + 64 * 1024
    got = render(text_encoder=single)
    diff = np.abs(got.frames.astype(int) - widened.frames.astype(int)).max()
    arel = float(np.linalg.norm(got.audio - widened.audio) / np.linalg.norm(widened.audio))
    print(f"native text encoder render against the widened one: frames max |diff| {diff}, audio rel-L2 {arel:.3g}")
    assert diff <= 2 and arel < 2e-2


# ---- bad input --------------------------------------------------------------------------------------------------

def _bad(tmp_path, *args, needle):
    out = tmp_path / "out.mp4"
    proc = run("render", "-p", "x", "-d", TINY, "-o", out, "--width", 32, "--height", 32, "--frames", 22,
               "--steps", 2, *args)
    assert_clean_error(proc, needle)
    assert not out.exists()


def test_bad_single_files(tiny, tmp_path):
    t, heads = tiny
    tens, meta, _ = sf.comfy_tensors(t, heads)
    good = sf.write_single(tmp_path / "minimax_h3_fl2va_bf16.safetensors", tens, meta)
    # a file of another model (the text encoder's weights given as the transformer)
    other = sf.write_single(tmp_path / "other.safetensors", {k: v for k, v in list(_te_tensors().items())[:4]})
    _bad(tmp_path, "--transformer", other, needle="not a MiniMax-H3 transformer file")
    # truncated
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(good.read_bytes()[:100000])
    _bad(tmp_path, "--transformer", trunc, needle="truncated")
    # corrupt header
    corrupt = tmp_path / "corrupt.safetensors"
    data = bytearray(good.read_bytes())
    data[8:16] = b"\x00" * 8
    corrupt.write_bytes(bytes(data))
    _bad(tmp_path, "--transformer", corrupt, needle="corrupt.safetensors")
    # an unknown variant: an I8 weight without a format
    q = dict(tens)
    q["blocks.0.mlp.fc2.weight"] = torch.zeros(q["blocks.0.mlp.fc2.weight"].shape, dtype=torch.int8)
    q["blocks.0.mlp.fc2.weight_scale"] = torch.ones(q["blocks.0.mlp.fc2.weight"].shape[0], 1)
    unk = sf.write_single(tmp_path / "unknown.safetensors", q)
    _bad(tmp_path, "--transformer", unk, needle="format 'none given'")
    # nvfp4, refused by name
    nv = tmp_path / "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors"
    nv.write_bytes(good.read_bytes())
    _bad(tmp_path, "--text-encoder", nv, needle="nvfp4")
    # a LoRA given as a model
    lora = sf.write_single(tmp_path / "turbo.safetensors", {"blocks.0.attn.qkv_proj.lora_A.weight": torch.zeros(4, 8),
                                                             "blocks.0.attn.qkv_proj.lora_B.weight": torch.zeros(8, 4)})
    _bad(tmp_path, "--transformer", lora, needle="is a LoRA")
    # FL2VA and Ref2VA parts mixed
    ref = tmp_path / "minimax_h3_ref2va_bf16.safetensors"
    ref.write_bytes(good.read_bytes())
    _bad(tmp_path, "--transformer", ref, needle="FL2VA and Ref2VA parts cannot be mixed")
    # a text encoder of another size (its embedding narrower than the config says)
    te = _te_tensors()
    small = {k: (v[:, :96].contiguous() if k.endswith("embed_tokens.weight") else v) for k, v in te.items()}
    sized = sf.write_single(tmp_path / "te_small.safetensors", small)
    _bad(tmp_path, "--text-encoder", sized, needle="embed_tokens.weight' has shape [512, 96]")
    # a missing file, a folder
    _bad(tmp_path, "--transformer", tmp_path / "nope.safetensors", needle="no such file")
    _bad(tmp_path, "--video-vae", tmp_path, needle="is a directory")


def test_comfy_models_folder(tiny, tmp_path):
    t, heads = tiny
    tens, meta, _ = sf.comfy_tensors(t, heads)
    models = tmp_path / "ComfyUI" / "models"
    for sub in ("diffusion_models", "text_encoders", "vae"):
        (models / sub).mkdir(parents=True)
    for name in ("minimax_h3_fl2va_pruned_int8_convrot", "minimax_h3_fl2va_bf16", "minimax_h3_ref2va_bf16"):
        sf.write_single(models / "diffusion_models" / f"{name}.safetensors", tens, meta)
    (models / "text_encoders" / "qwen3vl_32b_minimax_h3_int8_convrot.safetensors").write_bytes(b"x")
    (models / "vae" / "minimax_h3_video_vae_fp16.safetensors").write_bytes(b"x")
    (models / "vae" / "minimax_h3_audio_vae_fp32.safetensors").write_bytes(b"x")
    found = components.comfy_files(models, ref2va=False)
    assert found["transformer"].name == "minimax_h3_fl2va_bf16.safetensors"  # bf16 first among the variants
    assert found["text_encoder"].name.endswith("int8_convrot.safetensors")
    assert found["video_vae"].name.startswith("minimax_h3_video_vae") and found["audio_vae"].name.startswith(
        "minimax_h3_audio_vae")
    assert components.comfy_files(models, ref2va=True)["transformer"].name == "minimax_h3_ref2va_bf16.safetensors"
    # the ComfyUI root works as well as its models/; the text encoder and VAEs need the release's configs
    with pytest.raises(H3Error, match="needs? the release's small config files"):
        components.resolve(tmp_path / "ComfyUI")
    # only the transformer from the folder: h3ctl's copy of the release's transformer config is used, and
    # h3-tiny's weights are not the release's shapes: refused before any work, naming the tensor
    for sub in ("text_encoders", "vae"):
        for f in (models / sub).iterdir():
            f.unlink()
    folder, files = components.resolve(models)
    assert folder == components.RELEASE_CONFIGS and set(files) == {"transformer"}
    with pytest.raises(H3Error, match="not 3 x 56 heads"):
        Engine(models, threads=1)
    proc = run("check", tmp_path / "ComfyUI")
    assert proc.returncode == 0 and "minimax_h3_fl2va_bf16.safetensors: ok (transformer)" in proc.stdout, proc.stderr
    assert "variant bf16" in proc.stdout
    # nvfp4 only: refused by name
    (models / "text_encoders" / "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors").write_bytes(b"x")
    with pytest.raises(H3Error, match="nvfp4"):
        components.resolve(models)


def test_info_describes_single_files(tiny, tmp_path):
    t, heads = tiny
    tens, meta, _ = sf.comfy_tensors(t, heads, variant="int8_convrot")
    single = sf.write_single(tmp_path / "minimax_h3_fl2va_int8_convrot.safetensors", tens, meta, prefix=True)
    with Engine(TINY, threads=1, transformer=single) as e:
        c = e._ctx.info()["components"]["transformer"]
    assert c["single_file"] == str(single)
    assert "model.diffusion_model. names" in c["single_file_format"] and "30 int8" in c["single_file_format"]
    assert c["single_file_owned_bytes"] > 0


def test_pruned_int8_cli(tiny, tmp_path):
    """The form most people hold (pruned int8_convrot, prefixed names) through the CLI: check describes it, info
    says what was inferred, render writes an MP4. Rank 8 as released: a lossy basis, so no exactness is claimed."""
    t, heads = tiny
    pruned = sf.prune(t, grid=1025, rank=8, freq_dim=sf.config(TINY)["timestep_input_dim"])
    tens, meta, refs = sf.comfy_tensors(pruned, heads, variant="int8_convrot")
    assert len(refs) == 6 * 4  # the narrow AdaLN projections stay unquantised, as in the released file
    single = sf.write_single(tmp_path / "minimax_h3_fl2va_pruned_int8_convrot.safetensors", tens, meta, prefix=True)
    proc = run("check", single)
    assert proc.returncode == 0 and "variant pruned int8_convrot, 24 quantised layers" in proc.stdout, proc.stderr
    proc = run("info", "-d", TINY, "--transformer", single, "--json", "--width", 32, "--height", 32, "--frames", 22)
    assert proc.returncode == 0, proc.stderr
    c = json.loads(proc.stdout)["components"]["transformer"]
    assert "int8_convrot, pruned" in c["single_file_format"] and c["dtypes"]["BF16"]["tensors"] > 0
    out = tmp_path / "o.mp4"
    proc = run("render", "-p", PROMPT, "-d", TINY, "--transformer", single, "-o", out, "--width", 32, "--height", 32,
               "--frames", 22, "--steps", 2, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 1000


def test_vae_single_files(official_render, tmp_path):
    """The VAEs as single files (ComfyUI's minimax_h3_video_vae / audio_vae: the official names in one file)."""
    video = TINY / "FL2VA" / "video_vae" / "source" / "model.safetensors"
    audio = TINY / "FL2VA" / "audio_vae" / "model.safetensors"
    assert same(render(video_vae=video, audio_vae=audio), official_render)
    # one VAE given as the other: refused by its names, before any work
    _bad(tmp_path, "--audio-vae", video, needle="not a MiniMax-H3 audio VAE file")
    _bad(tmp_path, "--video-vae", audio, needle="not a MiniMax-H3 video VAE file")


def test_comfy_folder_render(tiny, official_render, tmp_path):
    """A ComfyUI models/ folder holding all four parts, with the official folder's small files (--config-dir):
    byte-identical to the official layout's render."""
    t, heads = tiny
    models = tmp_path / "models"
    for sub in ("diffusion_models", "text_encoders", "vae"):
        (models / sub).mkdir(parents=True)
    tens, meta, _ = sf.comfy_tensors(t, heads)
    sf.write_single(models / "diffusion_models" / "minimax_h3_fl2va_bf16.safetensors", tens, meta)
    sf.write_single(models / "text_encoders" / "qwen3vl_32b_minimax_h3_bf16.safetensors", _te_tensors())
    (models / "vae" / "minimax_h3_video_vae_fp16.safetensors").symlink_to(
        TINY / "FL2VA" / "video_vae" / "source" / "model.safetensors")
    (models / "vae" / "minimax_h3_audio_vae_fp32.safetensors").symlink_to(
        TINY / "FL2VA" / "audio_vae" / "model.safetensors")
    with Engine(models, threads=2, config_dir=TINY) as e:
        assert set(e.files) == {"transformer", "text_encoder", "video_vae", "audio_vae"}
        got = e.render(PROMPT, seed=SEED, **SHAPE)
    assert same(got, official_render)
    out = tmp_path / "o.mp4"
    proc = run("render", "-p", PROMPT, "-d", models, "--config-dir", TINY, "-o", out, "--width", 32, "--height", 32,
               "--frames", 22, "--steps", 2, "--threads", 2)
    assert proc.returncode == 0 and out.stat().st_size > 1000, proc.stderr
    with pytest.raises(H3Error, match="not an official MiniMax-H3 folder"):
        components.resolve(models, config_dir=models)


def test_memory_estimate_of_release_shaped_single_files(tmp_path):
    """h3ctl check / info on single files of the release's 33B shapes (header-only files, their data a hole): the
    estimate's weights equal the sums computed here from the headers, the int8 layers counted at their codes on the
    CPU, and a --vram budget keeps the blocks dit_stream.c's rule says."""
    from h3ctl.components import RELEASE_CONFIGS
    from h3ctl.context import Context
    from tests import bench_memory_single_file as bm

    lay = {v: bm.release_layout(v) for v in ("bf16", "int8_convrot")}
    files = {v: bm.write_sparse(tmp_path / f"minimax_h3_fl2va_{v}.safetensors", lay[v]) for v in lay}
    size = {"bf16": 2, "f32": 4, "i8": 1, "f8": 1, "u8": 1}
    nbytes = {v: {n: size[d] * int(np.prod(s)) for n, d, s in lay[v]} for v in lay}
    strip = len(sf.PREFIX)
    gemm = {n[strip:] for n, d, s in lay["int8_convrot"] if d == "i8"}
    assert len(gemm) == 200  # 50 blocks x qkv / out / fc1 / fc2
    bf16_resident = sum(b for n, b in nbytes["bf16"].items() if "adaln_proj" not in n)
    codes = sum(nbytes["int8_convrot"][sf.PREFIX + g] + nbytes["int8_convrot"][sf.PREFIX + g[:-7] + ".weight_scale"]
                for g in gemm)
    widened = sum(nbytes["bf16"][sf.PREFIX + g] for g in gemm)
    est = {}
    for v, f in files.items():
        with Context(RELEASE_CONFIGS, device="cpu", files={"transformer": f}) as c:
            est[v] = c.memory_estimate(864, 480, 56, 64)["phases"]
    assert est["bf16"]["denoise_precomputed_adaln"]["weights"] == bf16_resident
    # int8 on the CPU: the blocks' GEMM layers held as their codes and scales, the rest as presented (BF16)
    assert est["int8_convrot"]["single_file_codes"] == {"presented": widened, "held": codes}
    assert est["int8_convrot"]["denoise_precomputed_adaln"]["weights"] == bf16_resident - widened + codes
    # a budget: the fixed GEMM weights (refiner, projections) + 2 ring slots keep no block; 3 more blocks keep 3
    with Context(RELEASE_CONFIGS, device="cpu", files={"transformer": files["bf16"]}, vram=1 << 19) as c:
        ub = c.memory_estimate(864, 480, 56, 64)["phases"]["under_vram_budget"]
    blk = sum(nbytes["bf16"][sf.PREFIX + f"blocks.0.{p}.weight"] for p in
              ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"))
    assert ub["block_bytes"] == blk and ub["blocks_resident"] == 50 and ub["blocks_streamed"] == 0
    for keep in (0, 3):
        gib = (ub["fixed_gemm_bytes"] + (keep + 2) * blk) / 2**30
        with Context(RELEASE_CONFIGS, device="cpu", files={"transformer": files["bf16"]}, vram=gib) as c:
            low = c.memory_estimate(864, 480, 56, 64)["phases"]["under_vram_budget"]
        assert low["blocks_resident"] == keep and low["blocks_streamed"] == 50 - keep and low["fits"]
        assert low["gemm_weights_held"] == ub["fixed_gemm_bytes"] + (keep + 2) * blk
    # check prints the estimate at both released shapes, info a table of them (with --vram too)
    proc = run("check", files["int8_convrot"])
    assert proc.returncode == 0, proc.stderr
    for shape in ("864x480x56", "1344x768x124"):
        assert f"estimate {shape}: transformer weights" in proc.stdout and "no block resident" in proc.stdout
    proc = run("info", "--transformer", files["int8_convrot"], "--device", "cpu", "--vram", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["single_file_estimates"]
    assert [(r["width"], r["height"], r["frames"]) for r in rows] == [(864, 480, 56), (1344, 768, 124)]
    assert rows[0]["no_vram"]["resident"] == bf16_resident - widened + codes
    assert all(r["vram"]["streamed_blocks"] > 0 for r in rows)


def test_lora_with_native_int8(tiny, tmp_path, monkeypatch):
    """A LoRA on an int8_convrot file run from its codes: the LoRA merges into widened weights, so the layers left
    unwritten are widened at the transformer's load (h3_sf_widen) and the render is byte-identical to the
    widening path's (H3_QUANT_WIDEN=1) with the same LoRA."""
    from safetensors.numpy import save_file as save_np

    t, heads = tiny
    tens, meta, _ = sf.comfy_tensors(t, heads, variant="int8_convrot")
    single = sf.write_single(tmp_path / "minimax_h3_fl2va_int8_convrot.safetensors", tens, meta, prefix=True)
    rng = np.random.default_rng(5)
    out_f, in_f = t["blocks.1.mlp.fc1.weight"].shape
    lora = tmp_path / "l.safetensors"
    save_np({"blocks.1.mlp.fc1.lora_A.weight": (rng.standard_normal((4, in_f)) * 0.1).astype(np.float32),
             "blocks.1.mlp.fc1.lora_B.weight": (rng.standard_normal((out_f, 4)) * 0.1).astype(np.float32)}, str(lora))
    with Engine(TINY, threads=2, transformer=single) as e:
        assert e._ctx.info()["components"]["transformer"]["single_file_native_codes"] > 0
        got = e.render(PROMPT, seed=SEED, lora=[str(lora)], **SHAPE)
        got_alloc = memfd_bytes()
    monkeypatch.setenv("H3_QUANT_WIDEN", "1")
    with Engine(TINY, threads=2, transformer=single) as e:
        want = e.render(PROMPT, seed=SEED, lora=[str(lora)], **SHAPE)
        want_alloc = memfd_bytes()
    assert same(got, want)
    assert got_alloc >= want_alloc  # every BF16 form was written after all (and the reordered QKV codes)
