"""libh3's FL2VA keyframe conditioning against the oracle: diffusers' MiniMaxH3FL2VATextEncoderStep over
transformers' Qwen3VLForConditionalGeneration (random weights in tiny configs, and h3-tiny's real text encoder).

The step builds the presentation ("<Picture k>: ", <|vision_start|>, image pads, <|vision_end|>, the prompt), runs
the processor's image processor on the keyframes and reads hidden_states[K]. Its image processor is transformers'
Qwen2VLImageProcessor with the torchvision backend, and torchvision cannot be installed beside the CPU torch of the
test extra. The stand-in below keeps every step of it but the one torchvision call, and makes that call the way
torchvision does: transformers' smart_resize; then tvF.resize(BICUBIC, antialias=True), which for a CPU uint8 tensor
is torch's own `F.interpolate(uint8, mode="bicubic", align_corners=False, antialias=True)`; then transformers'
rescale / normalise / patchify (its PIL-backend class with do_resize=False: the same arithmetic in f32, to ~1e-7).
libh3's resampler reproduces that uint8 interpolate bit for bit; Pillow's own BICUBIC (what the PIL backend would
use) differs from it by one level on some pixels, which the test measures and prints.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import torch  # noqa: E402  (test extra)
import torch.nn.functional as F  # noqa: E402

from h3ctl import _lib, text  # noqa: E402
from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402

TINY = Path(__file__).resolve().parents[1] / "python" / "h3ctl" / "models" / "h3-tiny" / "FL2VA"
COND_KEY = "minimax_h3_conditioning_layer"
TOL = 1e-5

# The processor settings libh3 uses when a model ships none (Qwen3-VL's published preprocessor_config.json).
DEFAULT_PROC = dict(patch_size=16, temporal_patch_size=2, merge_size=2, size={"shortest_edge": 65536,
                    "longest_edge": 16777216}, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
# A second geometry, written to processor/preprocessor_config.json: patch 8, CLIP statistics, pixel bounds that
# make smart_resize shrink one keyframe and grow another (with Python's half-to-even rounding on both).
CUSTOM_PROC = dict(patch_size=8, temporal_patch_size=2, merge_size=2, size={"shortest_edge": 4096,
                   "longest_edge": 40000}, image_mean=[0.48145466, 0.4578275, 0.40821073],
                   image_std=[0.26862954, 0.26130258, 0.27577711], resample=3,
                   image_processor_type="Qwen2VLImageProcessorFast")


# ---- the oracle ---------------------------------------------------------------------------------------------


def torch_resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """tvF.resize(uint8 CHW, (h, w), BICUBIC, antialias=True) on the CPU: torch's native uint8 interpolate."""
    t = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()[None]
    if (h, w) == tuple(t.shape[-2:]):
        return img
    out = F.interpolate(t, size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    return out[0].permute(1, 2, 0).contiguous().numpy()


class OracleImageProcessor:
    """Qwen2VLImageProcessor (torchvision backend) with the resize done as torchvision does it (module docstring)."""

    def __init__(self, cfg: dict):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.cfg = cfg
        kw = {k: v for k, v in cfg.items() if k not in ("resample", "image_processor_type")}
        self.merge_size = cfg["merge_size"]
        self.patch_size = cfg["patch_size"]
        self.pil = Qwen2VLImageProcessorPil(**kw)
        self.pil_noresize = Qwen2VLImageProcessorPil(**kw, do_resize=False)

    def resized(self, img: np.ndarray) -> np.ndarray:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        factor = self.patch_size * self.merge_size
        h, w = smart_resize(img.shape[0], img.shape[1], factor, self.cfg["size"]["shortest_edge"],
                            self.cfg["size"]["longest_edge"])
        return torch_resize(img, h, w)

    def __call__(self, images, return_tensors="pt"):
        return self.pil_noresize(images=[self.resized(np.asarray(im)) for im in images], return_tensors=return_tensors)


def oracle_processor(tok, cfg: dict):
    from transformers import Qwen3VLProcessor

    proc = object.__new__(Qwen3VLProcessor)  # only create_mm_token_type_ids and image_processor are used
    proc.image_token_ids = [tok.convert_tokens_to_ids("<|image_pad|>")]
    proc.video_token_ids = [tok.convert_tokens_to_ids("<|video_pad|>")]
    proc.audio_token_ids = []
    proc.image_processor = OracleImageProcessor(cfg)
    return proc


def diffusers_fl2va(model, layer: int, tok, proc, prompt: str, keyframes: list[np.ndarray], monkeypatch):
    """(prompt_embeds [n, hidden] f32, tags, token ids, vision inputs) as diffusers' FL2VA text step makes them."""
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3 import encoders
    from PIL import Image

    seen = {}
    real = encoders.get_qwen3vl_prompt_embeds

    def spy(text_encoder, processor, token_ids, vision_inputs=None, **kw):
        seen["ids"], seen["vision"] = list(token_ids), vision_inputs
        return real(text_encoder, processor, token_ids, vision_inputs, **kw)

    monkeypatch.setattr(encoders, "get_qwen3vl_prompt_embeds", spy)
    comps = SimpleNamespace(tokenizer=tok, processor=proc, text_encoder=model, text_encoder_layer=layer, text_tag=1,
                            video_tag=0, _execution_device=torch.device("cpu"))
    state = PipelineState()
    state.set("prompt", prompt)
    state.set("keyframes", [Image.fromarray(k) for k in keyframes])
    with torch.no_grad():
        encoders.MiniMaxH3FL2VATextEncoderStep()(comps, state)
    emb = state.get("prompt_embeds")[0].float().numpy()
    return emb, state.get("text_token_tags").numpy(), seen["ids"], seen["vision"]


# ---- libh3 ----------------------------------------------------------------------------------------------------


def _sizes(images):
    n = len(images)
    w = (ctypes.c_int * max(n, 1))(*[im.shape[1] for im in images])
    h = (ctypes.c_int * max(n, 1))(*[im.shape[0] for im in images])
    return w, h


def h3_rows(ctx, prompt: str, images) -> int:
    w, h = _sizes(images)
    return _lib.check(_lib.lib().h3_text_image_rows(ctx.ptr, prompt.encode(), len(images), w, h))


def h3_encode(ctx, prompt: str, images, cap: int | None = None):
    """(rows [n, hidden], ids, tags) from h3_text_encode_images."""
    images = [np.ascontiguousarray(im, dtype=np.uint8) for im in images]
    n = h3_rows(ctx, prompt, images) if cap is None else cap
    w, h = _sizes(images)
    ptrs = (_lib.c_uint8_p * max(len(images), 1))(*[im.ctypes.data_as(_lib.c_uint8_p) for im in images])
    out = np.zeros((max(n, 1), text.hidden_size(ctx)), np.float32)
    ids, tags = np.zeros(max(n, 1), np.int32), np.zeros(max(n, 1), np.uint8)
    got = _lib.check(_lib.lib().h3_text_encode_images(
        ctx.ptr, prompt.encode(), len(images), ptrs, w, h, out.ctypes.data_as(_lib.c_float_p), n,
        ids.ctypes.data_as(_lib.c_int32_p), tags.ctypes.data_as(_lib.c_uint8_p)))
    return out[:got], ids[:got], tags[:got]


def h3_pixels(ctx, img: np.ndarray):
    """(pixel_values [rows, patch_dim], grid_thw) from h3_image_preprocess."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    lib = _lib.lib()
    grid, dim = (ctypes.c_int32 * 3)(), ctypes.c_int32()
    total = _lib.check(lib.h3_image_preprocess(ctx.ptr, None, img.shape[1], img.shape[0], None, 0, grid,
                                               ctypes.byref(dim)))
    out = np.zeros(total, np.float32)
    _lib.check(lib.h3_image_preprocess(ctx.ptr, img.ctypes.data_as(_lib.c_uint8_p), img.shape[1], img.shape[0],
                                       out.ctypes.data_as(_lib.c_float_p), total, grid, ctypes.byref(dim)))
    return out.reshape(-1, dim.value), list(grid)


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---- checkpoints -----------------------------------------------------------------------------------------------


def _natural(name: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def build_model(text_over: dict, vision_over: dict, seed: int):
    """A Qwen3-VL over h3-tiny's vocabulary and vision token ids, seeded random weights."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    base = json.loads((TINY / "text_encoder" / "config.json").read_text())
    t = {k: v for k, v in base["text_config"].items() if k in ("vocab_size", "rms_norm_eps", "max_position_embeddings",
                                                                "rope_parameters")}
    t.update(hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1,
             head_dim=16)
    t.update(text_over)
    v = {k: base["vision_config"][k] for k in ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size",
                                               "spatial_merge_size", "temporal_patch_size", "num_position_embeddings",
                                               "deepstack_visual_indexes", "hidden_act")}
    v.update(vision_over, out_hidden_size=t["hidden_size"])
    cfg = Qwen3VLConfig(text_config=t, vision_config=v, tie_word_embeddings=False,
                        **{k: base[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                                "vision_end_token_id")})
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm weights and biases: around 1 so none is a no-op
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or "pos_embed" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
    return model


def write_checkpoint(model, layer: int, root: Path, processor: dict | None = None) -> Path:
    """FL2VA/{text_encoder (f32, 2 shards), tokenizer (h3-tiny's), processor (optional)}; returns the root."""
    from safetensors.torch import save_file

    d = root / "FL2VA" / "text_encoder"
    d.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["architectures"] = ["Qwen3VLForConditionalGeneration"]
    cfg[COND_KEY] = layer
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    sd = {k: v.float().contiguous() for k, v in model.state_dict().items()}
    names = sorted(sd, key=lambda n: (n.startswith("model.visual."), _natural(n)))  # vision tower last
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(d / fn))
        weight_map.update({k: fn for k in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copytree(TINY / "tokenizer", root / "FL2VA" / "tokenizer")
    if processor is not None:
        (root / "FL2VA" / "processor").mkdir()
        (root / "FL2VA" / "processor" / "preprocessor_config.json").write_text(json.dumps(processor))
    return root


# Two geometries: (text overrides, vision overrides, conditioning layer, processor file or None for the defaults).
CONFIGS = {
    # h3-tiny's vision tower (2 blocks x 32, deepstack after blocks 0 and 1), the default processor settings
    "tiny": ({}, {}, 3, None),
    # 3 blocks of 48 (4 heads of 12), patch 8, a 7x7 position table, deepstack listed out of block order, GQA 4:2,
    # head_dim 16 with mrope_section [3, 3, 2]
    "custom": (dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [3, 3, 2],
                                     "mrope_interleaved": True}),
               dict(depth=3, hidden_size=48, intermediate_size=80, num_heads=4, patch_size=8,
                    num_position_embeddings=49, deepstack_visual_indexes=[2, 0]), 3, CUSTOM_PROC),
}


def images_for(seed: int, shapes):
    rng = np.random.default_rng(seed)
    out = []
    for h, w in shapes:
        y, x = np.mgrid[0:h, 0:w]
        smooth = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(h + w - 2, 1)], -1)
        out.append(np.clip(smooth + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8))
    return out


# keyframe sizes per config: one image, then two of different sizes and aspects (first frame, last frame)
SHAPES = {
    "tiny": ([(128, 128)], [(96, 160), (256, 320)]),     # grown to 256x256; grown to 224x352; kept as is
    "custom": ([(300, 200)], [(300, 200), (40, 72)]),    # shrunk to 240x160; grown to 48x96
}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import Qwen2TokenizerFast

    return Qwen2TokenizerFast.from_pretrained(str(TINY / "tokenizer"))


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    out = {}
    for i, (name, (tover, vover, layer, proc)) in enumerate(CONFIGS.items()):
        model = build_model(tover, vover, seed=10 + i)
        root = write_checkpoint(model, layer, tmp_path_factory.mktemp(f"vt_{name}"), proc)
        out[name] = (model, layer, root, proc or DEFAULT_PROC)
    return out


# ---- processor ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_pixel_values(name, setups, tokenizer):
    model, layer, root, pcfg = setups[name]
    oracle = OracleImageProcessor(pcfg)
    shapes = [s for group in SHAPES[name] for s in group] + [(7, 300), (301, 3), (33, 33)]
    with Context(root, threads=2) as ctx:
        for img in images_for(1, shapes):
            got, grid = h3_pixels(ctx, img)
            ref = oracle([img])
            ref_px, ref_grid = ref["pixel_values"].numpy(), ref["image_grid_thw"][0].tolist()
            assert grid == ref_grid, (img.shape, grid, ref_grid)
            assert got.shape == ref_px.shape
            err, mx = rel_l2(got, ref_px), float(np.abs(got - ref_px).max())
            # Pillow's BICUBIC (the PIL backend's resize) for comparison: one uint8 level apart on some pixels.
            pil = oracle.pil(images=[img], return_tensors="pt")["pixel_values"].numpy()
            pil_lv = float(np.abs(pil - ref_px).max()) * (pcfg["image_std"][0] * 255)
            print(f"pixel_values {name} {img.shape[1]}x{img.shape[0]} -> grid {grid}: rel-L2 {err:.1e}, max abs "
                  f"{mx:.1e} (tol {TOL}); Pillow's resize would differ by up to {pil_lv:.2f} levels")
            assert err <= TOL and mx <= 1e-5, (name, img.shape, err, mx)


def test_resize_matches_torch_bit_for_bit(setups):
    """The resampler alone, through a do_resize-free lens: the processed patches of many up/down scales equal
    torch's uint8 interpolate exactly (a level of difference would be 1/127.5 ~ 8e-3 here)."""
    _, _, root, pcfg = setups["tiny"]
    oracle = OracleImageProcessor(pcfg)
    rng = np.random.default_rng(5)
    with Context(root, threads=2) as ctx:
        worst = 0.0
        for h, w in [(1, 1), (5, 17), (255, 257), (700, 90), (64, 1000), (511, 384), (3000, 20)]:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            got, _ = h3_pixels(ctx, img)
            ref = oracle([img])["pixel_values"].numpy()
            worst = max(worst, float(np.abs(got - ref).max()))
        print(f"resize: 7 random images, max abs difference {worst:.1e} over the processed patches")
        assert worst <= 1e-6


# ---- the whole conditioner ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("count", [1, 2])
def test_parity_fl2va(name, count, setups, tokenizer, monkeypatch):
    model, layer, root, pcfg = setups[name]
    proc = oracle_processor(tokenizer, pcfg)
    keyframes = images_for(2 + count, SHAPES[name][count - 1])
    prompt = "a red circle moves right on a black background, a high beep"
    ref, ref_tags, ref_ids, vision = diffusers_fl2va(model, layer, tokenizer, proc, prompt, keyframes, monkeypatch)
    with Context(root, threads=2) as ctx:
        assert h3_rows(ctx, prompt, keyframes) == len(ref_ids)
        got, ids, tags = h3_encode(ctx, prompt, keyframes)
        for i, k in enumerate(keyframes):  # the pixels the tower saw
            px, grid = h3_pixels(ctx, k)
            assert grid == vision["image_grid_thw"][i].tolist()
    assert ids.tolist() == ref_ids
    assert tags.tolist() == ref_tags.tolist()
    assert got.shape == ref.shape
    err = rel_l2(got, ref)
    pads = int((ids == model.config.image_token_id).sum())
    print(f"parity: fl2va {name}, {count} keyframe(s) {[k.shape[:2] for k in keyframes]}: {len(ids)} rows "
          f"({pads} image rows), rel-L2 {err:.2e} (tol {TOL})")
    assert err <= TOL, (name, count, err)
    # every vision row is conditioned on the image (not the pad token's embedding): a different keyframe moves them
    with Context(root, threads=2) as ctx:
        other, _, _ = h3_encode(ctx, prompt, [255 - k for k in keyframes])
    assert rel_l2(other[ids == model.config.image_token_id], got[ids == model.config.image_token_id]) > 1e-3


def test_parity_deepstack_beyond_the_conditioning_layer(setups, tokenizer, monkeypatch, tmp_path):
    """K = 1 with two deepstack sets: hidden_states[1] is layer 0's output before its deepstack addition."""
    model, _, _, pcfg = setups["tiny"]
    root = write_checkpoint(model, 1, tmp_path)
    keyframes = images_for(9, [(64, 96)])
    ref, _, ref_ids, _ = diffusers_fl2va(model, 1, tokenizer, oracle_processor(tokenizer, pcfg), "x", keyframes,
                                         monkeypatch)
    with Context(root, threads=2) as ctx:
        got, ids, _ = h3_encode(ctx, "x", keyframes)
    err = rel_l2(got, ref)
    print(f"parity: fl2va conditioning layer 1 (deepstack after layers 0, 1): rel-L2 {err:.2e}")
    assert ids.tolist() == ref_ids and err <= TOL


def test_parity_h3_tiny(tokenizer, monkeypatch):
    """h3-tiny's own text encoder (BF16 weights, vision tower in model-00003) against transformers on the same
    weights widened to F32."""
    from safetensors.torch import load_file
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg_json = json.loads((TINY / "text_encoder" / "config.json").read_text())
    layer = cfg_json[COND_KEY]
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_dict(cfg_json)).eval().requires_grad_(False)
    sd = {}
    for f in sorted((TINY / "text_encoder").glob("*.safetensors")):
        sd.update({k: v.float() for k, v in load_file(str(f)).items()})
    assert any(k.startswith("model.visual.") for k in sd)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith("lm_head") for k in missing), (missing, unexpected)
    model = model.float()
    proc = oracle_processor(tokenizer, DEFAULT_PROC)
    keyframes = images_for(11, [(128, 128), (128, 128)])
    prompt = "a blue square moves left on a white background, a low hum"
    ref, ref_tags, ref_ids, _ = diffusers_fl2va(model, layer, tokenizer, proc, prompt, keyframes, monkeypatch)
    with Context(TINY.parent, threads=2) as ctx:
        got, ids, tags = h3_encode(ctx, prompt, keyframes)
    err = rel_l2(got, ref)
    print(f"parity: fl2va h3-tiny (BF16 weights), 2 keyframes 128x128: {len(ids)} rows, rel-L2 {err:.2e} (tol {TOL})")
    assert ids.tolist() == ref_ids and tags.tolist() == ref_tags.tolist() and err <= TOL


# ---- the engine's own contract: cache, determinism, text-only ------------------------------------------------------


def test_cache_and_determinism(setups):
    _, _, root, _ = setups["tiny"]
    keyframes = images_for(21, [(96, 128), (128, 96)])
    with Context(root, threads=2) as ctx:
        a, _, _ = h3_encode(ctx, "p", keyframes)
        s0 = text.cache_stats(ctx)
        b, _, _ = h3_encode(ctx, "p", keyframes)
        s1 = text.cache_stats(ctx)
        assert s1["hits"] == s0["hits"] + 1 and np.array_equal(a, b)
        changed = [k.copy() for k in keyframes]
        changed[1][50, 60, 1] ^= 1  # one level of one pixel of the last frame
        c, _, _ = h3_encode(ctx, "p", changed)
        s2 = text.cache_stats(ctx)
        assert s2["misses"] == s1["misses"] + 1 and not np.array_equal(a, c)
    with Context(root, threads=1) as ctx:
        d, _, _ = h3_encode(ctx, "p", keyframes)
    assert np.array_equal(a, d), "results depend on the thread count"


def test_no_keyframes_is_the_text_path(setups, tokenizer):
    _, _, root, _ = setups["tiny"]
    prompt = "a green triangle bounces"
    ids_ref = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with Context(root, threads=2) as ctx:
        got, ids, tags = h3_encode(ctx, prompt, [])
        plain = text.encode(ctx, np.asarray(ids_ref))
    assert ids.tolist() == ids_ref and set(tags.tolist()) == {1}
    assert np.array_equal(got, plain)


# ---- bad input ---------------------------------------------------------------------------------------------------


def test_bad_input(setups, tmp_path):
    model, layer, root, _ = setups["tiny"]
    ok = images_for(0, [(64, 64)])[0]
    lib = _lib.lib()
    with Context(root, threads=2) as ctx:
        def err_of(fn):
            with pytest.raises(H3Error) as e:
                fn()
            return str(e.value)

        assert "empty image" in err_of(lambda: h3_rows(ctx, "p", [np.zeros((0, 5, 3), np.uint8)]))
        assert "empty image" in err_of(lambda: h3_encode(ctx, "p", [np.zeros((4, 0, 3), np.uint8)], cap=100))
        w, h = (ctypes.c_int * 1)(20000), (ctypes.c_int * 1)(20000)
        msg = err_of(lambda: _lib.check(lib.h3_text_image_rows(ctx.ptr, b"p", 1, w, h)))
        assert "too many pixels" in msg and "20000x20000" in msg
        assert "aspect ratio" in err_of(lambda: h3_rows(ctx, "p", [np.zeros((1, 300, 3), np.uint8)]))
        n = h3_rows(ctx, "p", [ok])
        assert f"has {n} rows, the output holds {n - 1}" in err_of(lambda: h3_encode(ctx, "p", [ok], cap=n - 1))
        ptrs = (_lib.c_uint8_p * 1)()  # a NULL image
        w, h = (ctypes.c_int * 1)(64), (ctypes.c_int * 1)(64)
        out = np.zeros((n, 48), np.float32)
        msg = err_of(lambda: _lib.check(lib.h3_text_encode_images(ctx.ptr, b"p", 1, ptrs, w, h,
                                                                  out.ctypes.data_as(_lib.c_float_p), n, None, None)))
        assert "keyframe 1: NULL pixels" in msg
        assert "nothing to encode" in err_of(lambda: h3_encode(ctx, "", [], cap=4))
        assert "keyframes (0 to" in err_of(lambda: h3_rows(ctx, "p", [ok] * 65))
    # a processor whose patch does not fit the tower
    bad = write_checkpoint(model, layer, tmp_path / "bad", dict(DEFAULT_PROC, patch_size=14))
    with Context(bad, threads=2) as ctx:
        msg = err_of(lambda: h3_rows(ctx, "p", [ok]))
        assert "preprocessor_config.json" in msg and "do not match the vision tower" in msg


def test_progress_and_cancel(setups):
    _, _, root, _ = setups["tiny"]
    keyframes = images_for(31, [(64, 64), (96, 64)])
    lib = _lib.lib()
    seen, stop_at = [], {"phase": None}

    def hook(_user, phase, done, total):
        seen.append((phase.decode(), done, total))
        return 1 if (phase.decode(), done) == stop_at["phase"] else 0

    cb = _lib.H3ProgressFn(hook)
    with Context(root, threads=2) as ctx:
        text.set_cache_budget(ctx, 0)
        lib.h3_set_progress(ctx.ptr, cb, None)
        h3_encode(ctx, "p", keyframes)
        vision = [s for s in seen if s[0] == "vision_encoder"]
        assert vision[0] == ("vision_encoder", 0, 4) and vision[-1] == ("vision_encoder", 4, 4)  # 2 images x 2 blocks
        assert seen[-1] == ("text_encoder", 3, 3)
        stop_at["phase"] = ("vision_encoder", 3)  # inside the second keyframe
        with pytest.raises(H3Error) as e:
            h3_encode(ctx, "p", keyframes)
        assert e.value.code == 6 and "keyframe 2" in str(e.value)
        stop_at["phase"] = None
        h3_encode(ctx, "p", keyframes)  # the context is still usable
        lib.h3_set_progress(ctx.ptr, _lib.H3ProgressFn(), None)
