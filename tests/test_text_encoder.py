"""libh3's text encoder against the oracle, transformers' Qwen3VLForConditionalGeneration.

MiniMax-H3 conditions on `hidden_states[K]` (K = `minimax_h3_conditioning_layer`) of the Qwen3-VL
language model for a text-only prompt, as diffusers' `get_qwen3vl_prompt_embeds` computes it. Each
config below is built by transformers itself with seeded random weights and written in the
official layout (`FL2VA/text_encoder/config.json` + `model-0000k-of-0000N.safetensors` + index, the
language model first and the vision tower last), then encoded by libh3 and by transformers.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import torch  # noqa: E402  (test extra)
import transformers  # noqa: E402

from h3ctl import text  # noqa: E402
from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402

COND_KEY = "minimax_h3_conditioning_layer"
VOCAB = 300
LENGTHS = (1, 2, 7, 64, 333, 512)

# GQA 3:1 (the fixtures' "tiny" text tower), plain MHA with an odd head count and head_dim 14
# (half = 7), and GQA 4:2 with a query width (96) wider than the hidden size (64) like the release.
CONFIGS = {
    "gqa": (dict(hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=3,
                 num_key_value_heads=1, head_dim=16), 3),
    "odd": (dict(hidden_size=40, intermediate_size=88, num_hidden_layers=4, num_attention_heads=5,
                 num_key_value_heads=5, head_dim=14), 2),
    "wide": (dict(hidden_size=64, intermediate_size=136, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24), 2),
}


# ---- checkpoint construction -------------------------------------------------------------------


def build_model(text_cfg: dict, seed: int = 0):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    t = dict(text_cfg, vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=4096,
             rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2],
                              "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=t["hidden_size"],
                  num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(text_config=t, vision_config=vision, tie_word_embeddings=False, image_token_id=VOCAB - 4,
                        video_token_id=VOCAB - 3, vision_start_token_id=VOCAB - 2, vision_end_token_id=VOCAB - 1)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm weights (and vision biases): around 1 so none is a no-op
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return model


def _natural(name: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def write_checkpoint(model, layer: int, root: Path, dtype: str = "f32", nshards: int = 3, drop=None,
                     rename=None) -> Path:
    """FL2VA/text_encoder in the official layout; returns the model root."""
    from safetensors.torch import save_file

    d = root / "FL2VA" / "text_encoder"
    d.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["architectures"] = ["Qwen3VLForConditionalGeneration"]
    cfg["dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    cfg[COND_KEY] = layer
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float32
    sd = {k: v.to(tdt).contiguous() for k, v in model.state_dict().items() if not (drop and drop(k))}
    if rename:
        sd = {rename.get(k, k): v for k, v in sd.items()}
    rank = lambda n: 0 if n.startswith("model.language_model.") else (1 if n.startswith("lm_head") else 2)  # noqa
    names = sorted(sd, key=lambda n: (rank(n), _natural(n)))
    per = -(-len(names) // nshards)
    weight_map = {}
    for i in range(nshards):
        part = names[i * per:(i + 1) * per]
        fn = f"model-{i + 1:05d}-of-{nshards:05d}.safetensors"
        save_file({k: sd[k] for k in part}, str(d / fn))
        weight_map.update({k: fn for k in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def oracle(model, ids, layer: int) -> np.ndarray:
    """hidden_states[layer] as diffusers' get_qwen3vl_prompt_embeds takes it (text only, f32)."""
    t = torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]
    with torch.no_grad():
        out = model.model(input_ids=t, attention_mask=torch.ones_like(t), mm_token_type_ids=torch.zeros_like(t),
                          use_cache=False, output_hidden_states=True)
    return out.hidden_states[layer][0].float().numpy()


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def st_header(path: Path) -> tuple[dict, int]:
    raw = path.read_bytes()[:8]
    n = struct.unpack("<Q", raw)[0]
    with open(path, "rb") as f:
        f.seek(8)
        return json.loads(f.read(n)), 8 + n


def tensors_where(root: Path, pred):
    """(file, absolute byte span, name, dtype, shape) of every tensor whose name matches."""
    d = root / "FL2VA" / "text_encoder"
    for f in sorted(d.glob("*.safetensors")):
        hdr, base = st_header(f)
        for name, e in hdr.items():
            if name != "__metadata__" and pred(name):
                b, en = e["data_offsets"]
                yield f, (base + b, base + en), name, e["dtype"], e["shape"]


def clobber(root: Path, pred) -> int:
    """Overwrite the data of every matching tensor with 0xFF bytes (NaN in F32 and BF16)."""
    n = 0
    for f, (b, e), *_ in tensors_where(root, pred):
        with open(f, "r+b") as fh:
            fh.seek(b)
            fh.write(b"\xff" * (e - b))
        n += 1
    return n


def layer_of(name: str) -> int | None:
    m = re.match(r"model\.language_model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module")
def models():
    return {name: (build_model(cfg, seed=i), layer) for i, (name, (cfg, layer)) in enumerate(CONFIGS.items())}


@pytest.fixture(scope="module")
def ckpts(models, tmp_path_factory):
    out = {}
    for name, (m, layer) in models.items():
        out[name] = write_checkpoint(m, layer, tmp_path_factory.mktemp(f"te_{name}"))
    return out


def random_ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.int64)


# ---- parity ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_f32(name, models, ckpts):
    model, layer = models[name]
    with Context(ckpts[name], threads=2) as ctx:
        assert text.hidden_size(ctx) == model.config.text_config.hidden_size
        for i, n in enumerate(LENGTHS):
            ids = random_ids(n, 100 * i + n)
            got = text.encode(ctx, ids)
            ref = oracle(model, ids, layer)
            assert got.shape == ref.shape == (n, model.config.text_config.hidden_size)
            err = rel_l2(got, ref)
            print(f"parity: text {name} f32 {n} tokens: rel-L2 {err:.2e} (tol 1e-5)")
            assert err <= 1e-5, f"{name}, {n} tokens: rel-L2 {err:.3g}"


def test_parity_bf16_official_dtype(models, tmp_path):
    """A BF16 checkpoint against transformers running the same BF16 weights upcast to F32."""
    model, layer = models["gqa"]
    root = write_checkpoint(model, layer, tmp_path, dtype="bf16", nshards=2)
    upcast = build_model(CONFIGS["gqa"][0])
    upcast.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    with Context(root, threads=2) as ctx:
        for n in (1, 64, 512):
            ids = random_ids(n, n)
            err = rel_l2(text.encode(ctx, ids), oracle(upcast, ids, layer))
            print(f"parity: text bf16 {n} tokens: rel-L2 {err:.2e} (tol 1e-4)")
            assert err <= 1e-4, f"{n} tokens: rel-L2 {err:.3g}"


def test_official_fixture_checkpoints(tiny_models, tiny_ckpt, tiny_ckpt_f32):
    """The shared oracle fixtures (full official layout, every component): F32 and released-dtype (BF16)."""
    from tests.fixtures import conditioning_layer

    model = tiny_models["text_encoder"]
    layer = conditioning_layer(model)
    vocab = model.config.text_config.vocab_size
    upcast = type(model)(model.config).eval()
    upcast.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    rng = np.random.default_rng(11)
    for part, ref_model, tol in ((tiny_ckpt_f32, model, 1e-5), (tiny_ckpt, upcast, 1e-4)):
        with Context(part, threads=2) as ctx:
            for n in (1, 64, 512):
                ids = rng.integers(0, vocab, n)
                err = rel_l2(text.encode(ctx, ids), oracle(ref_model, ids, layer))
                assert err <= tol, f"{part}, {n} tokens: rel-L2 {err:.3g}"


def test_bit_identical_threads_and_prefetch(ckpts, monkeypatch):
    # H3_TEXT_READERS=3 splits each layer's reads over three threads (the GPU path's parallel
    # pread) and H3_TEXT_STREAM=1 runs the GPU's weight-stream protocol (pinned slots handed to the
    # reader, a load per layer); the bytes computed on, hence the output, must not change.
    ids = random_ids(333, 7)
    outs = []
    for threads in (1, 2):
        for prefetch in ("0", "1"):
            for readers, stream in (("1", "0"), ("3", "0"), ("1", "1"), ("3", "1")):
                monkeypatch.setenv("H3_TEXT_PREFETCH", prefetch)
                monkeypatch.setenv("H3_TEXT_READERS", readers)
                monkeypatch.setenv("H3_TEXT_STREAM", stream)  # 1: the GPU's slot protocol, a copy on the CPU
                with Context(ckpts["wide"], threads=threads) as ctx:
                    outs.append(text.encode(ctx, ids).tobytes())
    assert len(outs) == 16 and all(o == outs[0] for o in outs[1:])


def test_kept_layers_compute_the_streamed_bits_and_read_only_embeddings(models, ckpts, monkeypatch):
    # A GPU with room keeps the layers the first streamed encode computed on (h3_text_keep) and later
    # encodes read only their prompt's embedding rows. H3_TEXT_STREAM=1 runs the GPU's protocol on the
    # CPU and H3_TEXT_KEEP=1 keeps there too (a host copy): the bits and the reads are checked here.
    name = "wide"
    model, layer = models[name]
    hidden = model.config.text_config.hidden_size
    root = ckpts[name]
    a, b = random_ids(77, 11), random_ids(333, 12)
    monkeypatch.setenv("H3_TEXT_STREAM", "1")
    monkeypatch.setenv("H3_TEXT_KEEP", "0")
    with Context(root, threads=2) as ctx:
        want_a = text.encode(ctx, a).tobytes()
        want_b = text.encode(ctx, b).tobytes()
        assert text.cache_stats(ctx)["last_bytes_read"] == expected_bytes(root, layer, len(b), hidden)
    monkeypatch.setenv("H3_TEXT_KEEP", "1")
    with Context(root, threads=2) as ctx:
        got_a = text.encode(ctx, a).tobytes()  # streamed, and kept
        assert text.cache_stats(ctx)["last_bytes_read"] == expected_bytes(root, layer, len(a), hidden)
        got_b = text.encode(ctx, b).tobytes()  # from the kept layers
        assert text.cache_stats(ctx)["last_bytes_read"] == expected_bytes(root, 0, len(b), hidden)
        monkeypatch.setenv("H3_TEXT_KEEP", "0")  # kept layers are used whatever the switch says once made
        got_b2 = text.encode(ctx, random_ids(5, 13)).tobytes()
        assert text.cache_stats(ctx)["last_bytes_read"] == expected_bytes(root, 0, 5, hidden)
    assert got_a == want_a and got_b == want_b and len(got_b2) == 5 * hidden * 4


# ---- streaming: what is read -------------------------------------------------------------------


def expected_bytes(root: Path, layer: int, n: int, hidden: int) -> int:
    total = sum(e - b for _, (b, e), name, *_ in tensors_where(root, lambda s: (layer_of(s) or 0) < layer
                                                                 and layer_of(s) is not None))
    emb = next(tensors_where(root, lambda s: s.endswith("embed_tokens.weight")))
    item = {"F32": 4, "BF16": 2, "F16": 2}[emb[3]]
    return total + n * hidden * item


def test_layers_past_the_conditioning_layer_are_never_read(models, tmp_path):
    model, layer = models["gqa"]
    hidden = model.config.text_config.hidden_size
    ids = random_ids(64, 3)
    ids[:3] = [5, 5, 6]
    base = write_checkpoint(model, layer, tmp_path / "base")
    with Context(base, threads=2) as ctx:
        want = text.encode(ctx, ids)
        assert text.cache_stats(ctx)["last_bytes_read"] == expected_bytes(base, layer, len(ids), hidden)

    # Everything the encoder must not touch turned to NaN: later layers, the final norm, lm_head,
    # the vision tower and every embedding row the prompt does not use.
    clob = write_checkpoint(model, layer, tmp_path / "clobbered")
    n = clobber(clob, lambda s: (layer_of(s) is not None and layer_of(s) >= layer) or s.startswith("lm_head")
                or s.startswith("model.visual.") or s == "model.language_model.norm.weight")
    assert n > 10
    emb = next(tensors_where(clob, lambda s: s.endswith("embed_tokens.weight")))
    f, (b, e), _, _, shape = emb
    row = (e - b) // shape[0]
    used = set(int(i) for i in ids)
    with open(f, "r+b") as fh:
        for r in range(shape[0]):
            if r not in used:
                fh.seek(b + r * row)
                fh.write(b"\xff" * row)
    with Context(clob, threads=2) as ctx:
        got = text.encode(ctx, ids)
    assert np.isfinite(got).all() and got.tobytes() == want.tobytes()

    # ... and removed altogether (the index no longer lists them).
    gone = write_checkpoint(model, layer, tmp_path / "removed",
                            drop=lambda s: (layer_of(s) is not None and layer_of(s) >= layer)
                            or s.startswith(("lm_head", "model.visual.")) or s == "model.language_model.norm.weight")
    with Context(gone, threads=1) as ctx:
        assert text.encode(ctx, ids).tobytes() == want.tobytes()


# ---- prompt cache, progress, memory ------------------------------------------------------------


def test_prompt_cache(ckpts):
    a, b = random_ids(64, 1), random_ids(7, 2)
    with Context(ckpts["odd"], threads=2) as ctx:
        s0 = text.cache_stats(ctx)
        assert s0["budget"] == 256 << 20 and s0["entries"] == 0
        first = text.encode(ctx, a)
        assert text.cache_stats(ctx)["last_bytes_read"] > 0
        again = text.encode(ctx, a)
        s = text.cache_stats(ctx)
        assert again.tobytes() == first.tobytes()
        assert (s["hits"], s["misses"], s["entries"], s["last_bytes_read"]) == (1, 1, 1, 0)
        text.encode(ctx, b)
        text.encode(ctx, a[:-1])  # a prefix is another prompt
        s = text.cache_stats(ctx)
        assert (s["hits"], s["misses"], s["entries"]) == (1, 3, 3)
        # LRU by bytes: shrink to the two most recent entries -> `a` (least recent) goes.
        keep = s["bytes"] - (s["bytes"] - 1) // 3  # > the two smaller entries, < all three
        text.set_cache_budget(ctx, keep)
        assert text.cache_stats(ctx)["entries"] <= 2
        text.encode(ctx, a)
        assert text.cache_stats(ctx)["misses"] == 4
        text.clear_cache(ctx)
        s = text.cache_stats(ctx)
        assert s["entries"] == 0 and s["bytes"] == 0
        text.set_cache_budget(ctx, 0)
        text.encode(ctx, a)
        text.encode(ctx, a)
        assert text.cache_stats(ctx)["hits"] == 1  # caching off


def test_progress_and_cancel(ckpts):
    seen = []
    with Context(ckpts["gqa"], threads=2) as ctx:
        text.encode(ctx, random_ids(9, 0), progress=lambda phase, done, total: seen.append((phase, done, total)))
        assert seen == [("text_encoder", i, 3) for i in range(4)]
        text.clear_cache(ctx)
        with pytest.raises(H3Error) as e:
            text.encode(ctx, random_ids(9, 0), progress=lambda phase, done, total: done == 1)
        assert e.value.code == 6 and "cancelled" in str(e.value)

        def boom(*_):
            raise KeyError("from the callback")

        with pytest.raises(KeyError):
            text.encode(ctx, random_ids(5, 0), progress=boom)
        assert text.encode(ctx, random_ids(5, 0)).shape == (5, 48)  # hook removed again


def test_memory_estimate_matches_the_streaming_buffers(ckpts):
    root = ckpts["wide"]
    layer_bytes = []
    for l in range(2):
        spans = [e - b for _f, (b, e), *_ in tensors_where(root, lambda s, l=l: layer_of(s) == l)]
        layer_bytes.append(sum((x + 63) // 64 * 64 for x in spans))
    with Context(root) as ctx:
        est = ctx.memory_estimate(64, 64, 17, 512)["phases"]["text_encoding"]
    assert est["layer_bytes"] == max(layer_bytes) and est["layer_buffers"] == 2
    assert est["weights"] == 2 * max(layer_bytes)
    assert est["total"] == est["weights"] + est["activations"]


# ---- bad input through `h3ctl parity text` -----------------------------------------------------


def _parity(tmp_path, model_dir, ids, name="in"):
    from safetensors.numpy import save_file

    from h3ctl.cli import main

    inp, out = tmp_path / f"{name}.safetensors", tmp_path / f"{name}.out.safetensors"
    save_file({"input_ids": ids}, str(inp))
    rc = main(["parity", "text", "--model", str(model_dir), "--inputs", str(inp), "--out", str(out)])
    return rc, out


def test_parity_cli_roundtrip(models, ckpts, tmp_path):
    from safetensors.numpy import load_file, save_file

    from tests.h3cli import assert_clean_error, run

    model, layer = models["gqa"]
    ids = random_ids(33, 5)[None]
    inp, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"input_ids": ids.astype(np.int32)}, str(inp))
    proc = run("parity", "text", "--model", ckpts["gqa"], "--inputs", inp, "--out", out, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    got = load_file(str(out))["prompt_embeds"]
    assert got.shape == (1, 33, 48) and got.dtype == np.float32
    assert rel_l2(got[0], oracle(model, ids[0], layer)) <= 1e-5
    # the same through a real process on bad input: one line, exit 2, no output file
    out.unlink()
    save_file({"input_ids": np.array([[3, VOCAB + 7]], np.int64)}, str(inp))
    proc = run("parity", "text", "--model", ckpts["gqa"], "--inputs", inp, "--out", out)
    assert_clean_error(proc, f"token id {VOCAB + 7} at position 1 is outside the vocabulary")
    assert not out.exists()


@pytest.fixture(scope="module")
def broken_ckpts(models, tmp_path_factory):
    model, layer = models["gqa"]
    t = tmp_path_factory.mktemp("te_broken")
    missing = write_checkpoint(model, layer, t / "missing",
                               drop=lambda s: s == "model.language_model.layers.1.mlp.up_proj.weight")
    # wrong shape: layer 0's k_proj stored under layer 0's v_proj name is the same shape, so swap
    # in q_proj's [48, 48] for k_proj's [16, 48].
    sd_model = build_model(CONFIGS["gqa"][0])
    sd_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        sd_model.model.language_model.layers[0].self_attn.k_proj.weight = torch.nn.Parameter(
            torch.zeros(48, 48), requires_grad=False)
    wrong = write_checkpoint(sd_model, layer, t / "wrong_shape")
    return {"missing": missing, "wrong_shape": wrong}


@pytest.mark.parametrize("case,needle", [
    ("out_of_vocab", "token id 300 at position 2 is outside the vocabulary [0, 300)"),
    ("negative", "token id -1 at position 0 is outside the vocabulary"),
    ("empty", "empty prompt"),
    ("float_ids", "input_ids must be int64 or int32"),
    ("rank", "input_ids must have shape [1, n]"),
    ("missing", "model.language_model.layers.1.mlp.up_proj.weight' is missing"),
    ("wrong_shape", "model.language_model.layers.0.self_attn.k_proj.weight' has shape [48, 48], the config "
                    "implies [16, 48]"),
])
def test_parity_cli_bad_input(case, needle, ckpts, broken_ckpts, tmp_path, capsys):
    model_dir = broken_ckpts.get(case, ckpts["gqa"])
    ids = {
        "out_of_vocab": np.array([[1, 2, VOCAB, 3]], np.int64),
        "negative": np.array([[-1, 2]], np.int64),
        "empty": np.zeros((1, 0), np.int64),
        "float_ids": np.array([[1.0, 2.0]], np.float32),
        "rank": np.array([1, 2, 3], np.int64),
    }.get(case, np.array([[1, 2, 3]], np.int64))
    rc, out = _parity(tmp_path, model_dir, ids)
    err = capsys.readouterr().err
    assert rc == 2
    assert not out.exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("h3ctl: error: "), err
    assert needle in lines[0], lines[0]


# ---- config handling -----------------------------------------------------------------------------


def _with_config(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    p = dst / "FL2VA" / "text_encoder" / "config.json"
    cfg = json.loads(p.read_text())
    edit(cfg)
    p.write_text(json.dumps(cfg))
    return dst


def test_rope_theta_defaults_like_transformers(models, ckpts, tmp_path):
    """No rope_theta anywhere: transformers falls back to Qwen3VLTextConfig.default_theta (500000)."""
    from transformers import Qwen3VLConfig

    model, layer = models["gqa"]
    root = _with_config(ckpts["gqa"], tmp_path / "no_theta",
                        lambda c: c["text_config"]["rope_parameters"].pop("rope_theta"))
    cfg = json.loads((root / "FL2VA" / "text_encoder" / "config.json").read_text())
    cfg.pop(COND_KEY)
    ref = type(model)(Qwen3VLConfig.from_dict(cfg)).eval()
    assert ref.config.text_config.rope_parameters["rope_theta"] == 500000.0
    ref.load_state_dict(model.state_dict())
    ids = random_ids(200, 4)
    with Context(root, threads=2) as ctx:
        assert rel_l2(text.encode(ctx, ids), oracle(ref, ids, layer)) <= 1e-5


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["text_config"]["rope_parameters"].update(rope_type="yarn", factor=2.0), "rope_type 'yarn'"),
    (lambda c: c["text_config"].update(hidden_act="gelu"), "hidden_act 'gelu'"),
    (lambda c: c["text_config"].update(attention_bias=True), "attention_bias must be false"),
    (lambda c: c.update({COND_KEY: 4}), "needs more than 4 layers (it has 4)"),
])
def test_unsupported_configs_are_refused(edit, needle, ckpts, tmp_path):
    root = _with_config(ckpts["gqa"], tmp_path / "cfg", edit)
    with Context(root) as ctx:
        with pytest.raises(H3Error) as e:
            text.encode(ctx, [1, 2, 3])
    assert needle in str(e.value) and "config.json" in str(e.value)
