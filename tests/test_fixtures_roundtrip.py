"""The oracle fixtures write exactly the official layout and read back through diffusers bit-identically."""

import json
import os
import struct
import time
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", category=FutureWarning)  # torch weight_norm deprecation inside diffusers
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

from safetensors import safe_open  # noqa: E402

from tests.fixtures import (  # noqa: E402
    TINY_CONFIGS,
    build_models,
    component_total_bytes,
    load_component_tensors,
    make_checkpoint,
    read_official_to_diffusers,
    special_token_ids,
    write_official,
    write_sparse_fullsize,
)
from tests.fixtures import official as off  # noqa: E402

MODULES = ("transformer", "video_vae", "audio_vae", "text_encoder")
# diffusers names of the DiT parameters the release stores in F32 (independent of the writer's own table)
DIT_F32_DIFFUSERS = ("proj_in.", "audio_proj_in.", "time_embedder.", "proj_out.", "audio_proj_out.")


def _expected(component, name, tensor, dtype):
    """What a tensor must read back as: the original, rounded through BF16 where the official layout stores BF16."""
    if dtype == "official" and (
        component == "text_encoder" or (component == "transformer" and not name.startswith(DIT_F32_DIFFUSERS))
    ):
        return tensor.to(torch.bfloat16).to(torch.float32)
    return tensor


def _header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    return n, json.loads(raw)


_BUILT = {}


def _build(name, seed=0):
    """build_models, memoised for this module (the builds are treated as read-only)."""
    if (name, seed) not in _BUILT:
        _BUILT[name, seed] = build_models(name, seed=seed)
    return _BUILT[name, seed]


@pytest.fixture(scope="module", params=sorted(TINY_CONFIGS))
def built(request, tiny_models):
    if request.param == "tiny":
        return request.param, tiny_models  # the session fixture's models (seed 0) - no second build
    return request.param, _build(request.param)


@pytest.mark.parametrize("dtype", ["f32", "official"])
def test_roundtrip_is_identical(built, dtype, tmp_path):
    name, models = built
    pdir = write_official(models, tmp_path, dtype=dtype)
    back = read_official_to_diffusers(pdir)
    for component in MODULES:
        want = models[component].state_dict()
        got = back[component].state_dict()
        assert list(got) == list(want), f"{name}/{component}: key sets differ"
        for key, tensor in want.items():
            exp = _expected(component, key, tensor, dtype)
            assert got[key].dtype == torch.float32
            assert torch.equal(got[key], exp), f"{name}/{dtype}/{component}: {key} differs"
        # configs are derived from the official JSON files, not from the in-memory models
        strip = lambda c: {k: v for k, v in dict(c).items() if not k.startswith("_")}  # noqa: E731
        if component == "text_encoder":
            assert back[component].config.to_dict().keys() >= {"text_config", "vision_config"}
            assert back[component].config.text_config.to_dict() == models[component].config.text_config.to_dict()
            assert back[component].config.vision_config.to_dict() == models[component].config.vision_config.to_dict()
            assert off.conditioning_layer(back[component]) == TINY_CONFIGS[name]["text_encoder"]["conditioning_layer"]
        else:
            assert off._tuple(strip(back[component].config)) == off._tuple(strip(models[component].config))
    assert back["tokenizer_json"] == models["tokenizer_json"]
    # non-persistent buffers diffusers recomputes must agree with what was written
    assert torch.equal(back["transformer"].rope.inv_freq, models["transformer"].rope.inv_freq)


def test_models_run_forward(built):
    """Every tiny config is usable as an oracle: all four modules run and give finite, non-trivial outputs."""
    name, m = built
    ids = special_token_ids(m["tokenizer_json"])
    with torch.no_grad(), off._single_thread():
        tr = m["transformer"]
        c = tr.config
        n_text, n_vid, n_aud = 3, 4, 6
        n = n_text + n_vid + n_aud
        out = tr(
            hidden_states=torch.randn(1, n_vid, c.in_channels * 4, generator=torch.Generator().manual_seed(1)),
            audio_hidden_states=torch.randn(1, n_aud, c.audio_in_channels, generator=torch.Generator().manual_seed(2)),
            encoder_hidden_states=torch.randn(1, n_text, c.text_dim, generator=torch.Generator().manual_seed(3)),
            timestep=torch.tensor([0.3, 0.7]),
            timestep_indices=torch.tensor([0] * (n_text + n_vid) + [1] * n_aud),
            token_tags=torch.tensor([1] * n_text + [0] * n_vid + [2] * n_aud),
            position_ids=torch.arange(3 * n, dtype=torch.float32).reshape(n, 3) / 3,
            video_indices=torch.arange(n_text, n_text + n_vid),
            audio_indices=torch.arange(n_text + n_vid, n),
            text_indices=torch.arange(n_text),
        )
        for y in (out.sample, out.audio_sample):
            assert torch.isfinite(y).all() and 0.1 < y.std() < 10
        video = m["video_vae"].decode(torch.randn(1, 24, 7, 2, 2)).sample  # one 7-latent window -> 22 frames
        assert video.shape == (1, 3, 22, 32, 32) and torch.isfinite(video).all() and video.std() > 0.1
        latent = m["video_vae"].encode(torch.randn(1, 3, 1, 32, 32)).latent_dist.mode()
        assert latent.shape == (1, 24, 1, 2, 2) and torch.isfinite(latent).all()
        wave = m["audio_vae"].decode(torch.randn(2, 32, 3)).sample
        assert wave.shape == (2, 1, 2400) and 0.005 < wave.std() < 0.5  # well inside the [-1, 1] clamp
        alat = m["audio_vae"].encode(0.1 * torch.randn(2, 1, 1600)).latent_dist.mode()
        assert alat.shape == (2, 32, 2) and torch.isfinite(alat).all()
        te = m["text_encoder"]
        vc = te.config.vision_config
        inp = torch.tensor([[5, ids["<|vision_start|>"], ids["<|image_pad|>"], ids["<|vision_end|>"], 7]])
        o = te(input_ids=inp, pixel_values=torch.randn(4, 3 * vc.temporal_patch_size * vc.patch_size ** 2),
               image_grid_thw=torch.tensor([[1, 2, 2]]), mm_token_type_ids=(inp == ids["<|image_pad|>"]).long(),
               output_hidden_states=True)
        h = o.hidden_states[off.conditioning_layer(te)]
        assert h.shape == (1, 5, c.text_dim) and torch.isfinite(h).all()


def test_written_dtypes_and_shards(tiny_ckpt, tiny_ckpt_f32):
    for pdir, official in ((tiny_ckpt, True), (tiny_ckpt_f32, False)):
        with safe_open(str(pdir / "transformer" / "model.safetensors"), "pt") as f:
            for key in f.keys():
                want = "F32" if (not official or key.startswith(off.DIT_F32_PREFIXES)) else "BF16"
                got = f.get_slice(key).get_dtype()
                assert got == want, (key, got, want)
            assert f.get_slice("rope.inv_freq").get_dtype() == "F32"
        assert not (pdir / "transformer" / "model.safetensors.index.json").exists()
        te = pdir / "text_encoder"
        shards = sorted(p.name for p in te.glob("*.safetensors"))
        assert len(shards) >= 2 and all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
        index = json.loads((te / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == set(shards)
        sizes = 0
        for shard in shards:
            with safe_open(str(te / shard), "pt") as f:
                for key in f.keys():
                    assert index["weight_map"][key] == shard
                    assert f.get_slice(key).get_dtype() == ("BF16" if official else "F32")
                    sizes += f.get_tensor(key).numel() * (2 if official else 4)
        assert index["metadata"]["total_size"] == sizes
        last = sorted(shards)[-1]
        assert any(k.startswith("model.visual.") and v == last for k, v in index["weight_map"].items())
        for rel in ("video_vae/source/model.safetensors", "audio_vae/model.safetensors"):
            with safe_open(str(pdir / rel), "pt") as f:
                assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


def test_qkv_rows_are_per_head_interleaved(tiny_models, tiny_ckpt, tiny_ckpt_f32):
    tr = tiny_models["transformer"]
    heads, d = tr.config.num_attention_heads, tr.config.attention_head_dim
    sd = load_component_tensors(tiny_ckpt_f32 / "transformer")
    for off_prefix, dif_prefix in (("blocks.1.", "transformer_blocks.1."),
                                   ("token_refiner.blocks.0.", "token_refiner.refiner_blocks.0.")):
        qkv = sd[off_prefix + "attn.qkv_proj.weight"]
        assert qkv.shape == (3 * heads * d, tr.config.hidden_size)
        for h in range(heads):
            for j, part in enumerate("qkv"):
                rows = qkv[3 * d * h + j * d: 3 * d * h + (j + 1) * d]
                ref = tr.state_dict()[f"{dif_prefix}attn.to_{part}.weight"][d * h: d * (h + 1)]
                assert torch.equal(rows, ref), (off_prefix, h, part)
    # the BF16 file holds the same rows, rounded
    sd16 = load_component_tensors(tiny_ckpt / "transformer")
    assert sd16["blocks.0.attn.qkv_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(sd16["blocks.0.attn.qkv_proj.weight"], sd["blocks.0.attn.qkv_proj.weight"].to(torch.bfloat16))

    vae = tiny_models["video_vae"]
    vh, vd = vae.config.decoder_num_attention_heads, vae.config.decoder_attention_head_dim
    with safe_open(str(tiny_ckpt_f32 / "video_vae/source/model.safetensors"), "pt") as f:
        for suffix in ("weight", "bias"):
            fused = f.get_tensor(f"decoder.transformer_blocks.1.attn.to_qkv.{suffix}")
            ref = vae.state_dict()
            h = 1
            for j, part in enumerate("qkv"):
                rows = fused[3 * vd * h + j * vd: 3 * vd * h + (j + 1) * vd]
                assert torch.equal(rows, ref[f"decoder.transformer_blocks.1.attn.to_{part}.{suffix}"][vd * h: vd * (h + 1)])


def test_fc1_is_gate_then_up(tiny_models, tiny_ckpt_f32):
    tr = tiny_models["transformer"]
    ffn = tr.config.ffn_dim
    sd = load_component_tensors(tiny_ckpt_f32 / "transformer")
    for off_name, dif_name in (("blocks.0.mlp.fc1.weight", "transformer_blocks.0.ff.net.0.proj.weight"),
                               ("token_refiner.blocks.1.mlp.fc1.weight",
                                "token_refiner.refiner_blocks.1.ff.net.0.proj.weight")):
        fc1, proj = sd[off_name], tr.state_dict()[dif_name]  # diffusers SwiGLU: [up; gate]
        assert fc1.shape == (2 * ffn, tr.config.hidden_size)
        assert torch.equal(fc1[:ffn], proj[ffn:]) and torch.equal(fc1[ffn:], proj[:ffn])
    vae = tiny_models["video_vae"]
    inner = vae.config.decoder_num_attention_heads * vae.config.decoder_attention_head_dim * vae.config.decoder_ffn_mult
    with safe_open(str(tiny_ckpt_f32 / "video_vae/source/model.safetensors"), "pt") as f:
        for suffix in ("weight", "bias"):
            w1 = f.get_tensor(f"decoder.transformer_blocks.0.ff.w1.{suffix}")
            proj = vae.state_dict()[f"decoder.transformer_blocks.0.ff.net.0.proj.{suffix}"]
            assert torch.equal(w1[:inner], proj[inner:]) and torch.equal(w1[inner:], proj[:inner])
        mask = f.get_tensor("decoder.mask_token")
        assert mask.shape == (1, 1, vae.config.decoder_num_attention_heads * vae.config.decoder_attention_head_dim)
        assert not mask.any()
        assert "decoder.x_embedder.weight" in f.keys() and "encoder.down.1.block.0.nin_shortcut.weight" in f.keys()
        assert "encoder.down.0.downsample.conv.weight" in f.keys()


def test_parameters_are_random_and_seeded(tiny_models):
    for component in MODULES:
        model = tiny_models[component]
        for name, p in model.named_parameters():
            assert p.dtype == torch.float32 and torch.isfinite(p).all(), name
            assert p.count_nonzero() == p.numel(), f"{component}.{name} has zeros"
    vae = tiny_models["video_vae"]
    assert all(s > 0 for s in vae.config.latents_std) and any(m != 0 for m in vae.config.latents_mean)
    assert all(s > 0 for s in tiny_models["audio_vae"].config.latents_std)
    # constant buffers stay exactly as the model computes them
    from diffusers.models.autoencoders.autoencoder_kl_minimax_h3_audio import kaiser_sinc_filter1d

    for name, b in tiny_models["audio_vae"].named_buffers():
        if name.endswith("zero_k_bias"):
            assert not b.any()
        elif name.endswith("upsample.filter") or name.endswith("lowpass.filter"):
            assert torch.equal(b, kaiser_sinc_filter1d(0.25, 0.3, 12)), name
    # seeded: same seed -> identical, other seed -> different (smallest config)
    a, b, c = _build("odd", 0), build_models("odd", seed=0), _build("odd", 1)
    for component in MODULES:
        sa, sb, sc = a[component].state_dict(), b[component].state_dict(), c[component].state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), component
        assert any(not torch.equal(sa[k], sc[k]) for k in sa), component
    assert a["video_vae"].config.latents_mean == b["video_vae"].config.latents_mean != c["video_vae"].config.latents_mean


def test_layout_files(tiny_models, tiny_ckpt):
    pdir, root = tiny_ckpt, tiny_ckpt.parent
    index = json.loads((pdir / "model_index.json").read_text())
    assert index == {
        "_class_name": "MiniMaxH3Pipeline", "_diffusers_version": "0.32.2",
        "transformer": ["diffusers", "MiniMaxH3DiTModel"],
        "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"], "processor": ["transformers", "Qwen3VLProcessor"],
        "video_vae": ["diffusers", "MiniMaxH3VideoVAE"], "audio_vae": ["diffusers", "MiniMaxH3AudioVAE"],
        "scheduler": None,
        "_minimax_h3": {"schema_version": 1, "partition": "fl2va", "tasks": ["t2va", "fl2va"], "task_aliases": {},
                        "sigma_shift_scales": {"video": 12.0, "audio": 3.0}},
    }
    cfg = json.loads((pdir / "transformer/config.json").read_text())
    t = TINY_CONFIGS["tiny"]["transformer"]
    assert cfg["_class_name"] == "MiniMaxH3DiTModel"
    assert cfg["adaln_out_features"] == 18 * t["hidden_size"] and cfg["final_adaln_out_features"] == 2 * t["hidden_size"]
    assert (cfg["latents_dim"], cfg["audio_latents_dim"], cfg["rope_inv_freq_len"]) == (24, 32, t["rope_freq_dim"])
    te_cfg = json.loads((pdir / "text_encoder/config.json").read_text())
    assert te_cfg["minimax_h3_conditioning_layer"] == 3 < te_cfg["text_config"]["num_hidden_layers"]
    vsrc = json.loads((pdir / "video_vae/source/config.json").read_text())
    assert vsrc["vae_ratio"] == 16 and vsrc["vae_ratio_t"] == 4 and vsrc["z_channels"] == vsrc["embed_dim"] == 24
    vtop = json.loads((pdir / "video_vae/config.json").read_text())
    assert len(vtop["latents_mean"]) == len(vtop["latents_std"]) == 24
    meta = json.loads((pdir / "audio_vae/metadata.json").read_text())["metadata"]["kwargs"]
    assert meta["num_attention_heads"] == 2 and "resblock_kernel_sizes" not in meta
    assert "decoder_kernel_sizes" not in meta and meta["vae_latent_channels"] == 32
    assert (root / "tokenizer/tokenizer.json").read_text() == (pdir / "tokenizer/tokenizer.json").read_text()

    from transformers import Qwen2TokenizerFast

    tok = Qwen2TokenizerFast.from_pretrained(str(pdir / "tokenizer"))
    ids = special_token_ids(tiny_models["tokenizer_json"])
    assert tok.convert_tokens_to_ids("<|image_pad|>") == ids["<|image_pad|>"]
    assert tok("A red fox walking through snow", add_special_tokens=False)["input_ids"][0] == 32  # same as Qwen
    assert max(ids.values()) < tiny_models["text_encoder"].config.text_config.vocab_size
    assert tiny_models["text_encoder"].config.image_token_id == ids["<|image_pad|>"]


def test_make_checkpoint_is_build_plus_write(tmp_path):
    pdir = make_checkpoint(tmp_path, "odd", seed=1, dtype="f32")
    assert pdir == tmp_path / "FL2VA"
    ref = _build("odd", 1)["transformer"].state_dict()
    got = read_official_to_diffusers(pdir)["transformer"].state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # rewriting into the same folder leaves no stale shards behind
    write_official(_build("odd", 1), tmp_path, dtype="f32", max_shard_bytes=50_000)
    write_official(_build("odd", 1), tmp_path, dtype="f32")
    assert sorted(p.name for p in (pdir / "transformer").iterdir()) == ["config.json", "model.safetensors"]


def test_sharded_and_ref2va_layouts(tmp_path):
    pdir = write_official(_build("odd", 1), tmp_path, dtype="official", max_shard_bytes=40_000, partition="Ref2VA",
                          write_root_tokenizer=False)
    assert pdir.name == "Ref2VA" and not (tmp_path / "tokenizer").exists()
    index = json.loads((pdir / "transformer/model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == sorted(p.name for p in (pdir / "transformer").glob("*.safetensors"))
    for fname in files:  # greedy packing never exceeds the limit unless one tensor alone does
        n, header = _header(pdir / "transformer" / fname)
        header.pop("__metadata__", None)
        ends = [v["data_offsets"][1] for v in header.values()]
        assert max(ends) <= 40_000 or len(header) == 1
    mi = json.loads((pdir / "model_index.json").read_text())["_minimax_h3"]
    assert mi["partition"] == "ref2va" and mi["tasks"] == ["ref2va"]
    back = read_official_to_diffusers(pdir)
    assert back["transformer"].config.num_layers == 3
    meta = json.loads((pdir / "audio_vae/metadata.json").read_text())["metadata"]["kwargs"]
    assert meta["num_attention_heads"] == 1 and meta["decoder_rates"] == [8, 10, 10] and "decoder_kernel_sizes" not in meta


def test_sparse_fullsize_layout(tmp_path):
    import diffusers  # noqa: F401  (imports are not part of the timed write)
    import transformers  # noqa: F401
    from diffusers import AutoencoderKLMiniMaxH3Audio  # noqa: F401
    from transformers import Qwen3VLForConditionalGeneration  # noqa: F401

    t0, c0 = time.perf_counter(), time.process_time()
    pdir = write_sparse_fullsize(tmp_path)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # CPU time is the robust measure on a shared machine; the wall bound only catches pathological slowness
    assert cpu < 5.0, f"write_sparse_fullsize used {cpu:.2f}s of CPU ({wall:.2f}s wall)"
    assert wall < 20.0, f"write_sparse_fullsize took {wall:.2f}s wall"

    gib = 2 ** 30
    dit = component_total_bytes(pdir / "transformer")
    assert abs(dit - 62 * gib) < 0.1 * 62 * gib
    assert dit == 66_280_430_144  # 522 BF16 + 13 F32 tensors of the released geometry
    shards = sorted((pdir / "transformer").glob("*.safetensors"))
    assert len(shards) == 13 and shards[-1].name == "model-00013-of-00013.safetensors"
    index = json.loads((pdir / "transformer/model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == dit and len(index["weight_map"]) == 535
    dtypes = {}
    for shard in shards:
        n, header = _header(shard)
        assert n % 8 == 0 and header.pop("__metadata__") == {"format": "pt"}
        data = max(v["data_offsets"][1] for v in header.values())
        assert os.path.getsize(shard) == 8 + n + data
        for key, v in header.items():
            dtypes[key] = v["dtype"]
    assert sum(d == "F32" for d in dtypes.values()) == 13 and sum(d == "BF16" for d in dtypes.values()) == 522
    assert dtypes["blocks.49.attn.qkv_proj.weight"] == "BF16"
    te = sorted((pdir / "text_encoder").glob("*.safetensors"))
    assert len(te) == 14
    _, last = _header(te[-1])
    assert last["model.visual.patch_embed.proj.weight"]["shape"] == [1152, 3, 2, 16, 16]
    assert last["model.visual.merger.linear_fc2.weight"]["shape"] == [5120, 4608]
    te_index = json.loads((pdir / "text_encoder/model.safetensors.index.json").read_text())
    assert "model.language_model.layers.63.mlp.down_proj.weight" in te_index["weight_map"]
    assert abs(component_total_bytes(pdir / "video_vae/source") / gib - 9.7) < 0.05
    _, vh = _header(pdir / "video_vae/source/model.safetensors")
    assert vh["decoder.transformer_blocks.35.attn.to_qkv.weight"]["shape"] == [6144, 2048]
    assert vh["decoder.mask_token"]["shape"] == [1, 1, 2048]
    _, ah = _header(pdir / "audio_vae/model.safetensors")
    ah.pop("__metadata__")
    assert ah["decoder.ups.6.0.weight_v"]["shape"] == [16, 8, 4]
    assert ah["decoder.activation_post.act.alpha"]["shape"] == [8]
    # sparse: the data areas take (almost) no disk
    blocks = sum(os.stat(p).st_blocks for p in pdir.rglob("*") if p.is_file()) * 512
    assert blocks < 64 * 2 ** 20

    # the shape-only meta build of the audio VAE has exactly the names/shapes/order of a real build
    from diffusers import AutoencoderKLMiniMaxH3Audio

    from tests.fixtures import sparse

    cfg = TINY_CONFIGS["tiny"]["audio_vae"]
    torch.manual_seed(0)
    real = AutoencoderKLMiniMaxH3Audio(**cfg).state_dict()
    with torch.device("meta"), sparse._fast_meta_audio_build():
        fast = AutoencoderKLMiniMaxH3Audio(**cfg).state_dict()
    assert [(k, v.shape, v.dtype) for k, v in real.items()] == [(k, v.shape, v.dtype) for k, v in fast.items()]
    assert set(ah) == set(real)  # "tiny" has the released audio topology (5 encoder / 7 decoder stages)
