"""`h3ctl info` on fixture checkpoints and on a synthetic full-size layout (headers only)."""

import json
import time

import pytest

from tests.fixtures import TINY_CONFIGS, make_checkpoint, write_sparse_fullsize
from tests.h3cli import run


@pytest.fixture(scope="module", params=sorted(TINY_CONFIGS))
def ckpt(request, tmp_path_factory):
    name = request.param
    return name, make_checkpoint(tmp_path_factory.mktemp(f"info_{name}"), name, seed=1, dtype="official")


def test_info_json_matches_configs(ckpt):
    name, part = ckpt
    proc = run("info", "-d", part.parent, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["partition"] == "FL2VA"
    comps = info["components"]
    assert all(comps[c]["present"] for c in ("transformer", "text_encoder", "tokenizer", "video_vae", "audio_vae"))
    cfg = json.loads((part / "transformer" / "config.json").read_text())
    dit = comps["transformer"]["config"]
    for key in ("hidden_size", "num_layers", "num_attention_heads", "attention_head_dim", "ffn_hidden_size", "text_dim"):
        assert dit[key] == cfg[key], key
    # bytes and dtypes come straight from the headers
    assert set(comps["transformer"]["dtypes"]) == {"BF16", "F32"}
    assert set(comps["video_vae"]["dtypes"]) == {"F32"}
    total = sum(p.stat().st_size for p in (part / "transformer").glob("*.safetensors"))
    assert 0 < comps["transformer"]["bytes"] < total
    te = json.loads((part / "text_encoder" / "config.json").read_text())
    assert comps["text_encoder"]["config"]["conditioning_layer"] == te["minimax_h3_conditioning_layer"]
    assert comps["text_encoder"]["files"] >= 2
    mem = info["memory_estimate"]["phases"]
    assert set(mem) >= {"text_encoding", "denoise_precomputed_adaln", "denoise_without_precompute", "video_decode",
                        "audio_decode"}
    assert mem["denoise_without_precompute"]["weights"] > mem["denoise_precomputed_adaln"]["weights"]
    assert mem["adaln_weights_released"] > 0


def test_info_text_output(ckpt):
    _, part = ckpt
    proc = run("info", "-d", part)  # a partition folder directly works too
    assert proc.returncode == 0, proc.stderr
    for word in ("transformer", "text_encoder", "video_vae", "audio_vae", "Peak memory estimate", "AdaLN"):
        assert word in proc.stdout


def test_memory_estimate_scales_with_canvas(ckpt):
    _, part = ckpt
    small = json.loads(run("info", "-d", part, "--json", "--width", "256", "--height", "256").stdout)
    big = json.loads(run("info", "-d", part, "--json", "--width", "512", "--height", "512").stdout)
    s, b = small["memory_estimate"], big["memory_estimate"]
    assert b["video_tokens"] == 4 * s["video_tokens"]
    assert b["phases"]["denoise_precomputed_adaln"]["activations"] > s["phases"]["denoise_precomputed_adaln"]["activations"]


def test_info_full_size_sparse_layout_under_two_seconds(tmp_path):
    part = write_sparse_fullsize(tmp_path)
    t0 = time.perf_counter()
    proc = run("info", "-d", part.parent, "--json")
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert wall < 2.0, f"h3ctl info took {wall:.2f} s"
    assert info["elapsed_s"] < 0.5
    dit = info["components"]["transformer"]
    assert dit["files"] == 13 and dit["tensors"] == 535
    assert 60 * 2**30 < dit["bytes"] < 64 * 2**30  # the release's ~62 GiB DiT
    assert dit["config"]["num_layers"] == 50 and dit["config"]["hidden_size"] == 5376
    te = info["components"]["text_encoder"]
    assert te["files"] == 14 and te["config"]["conditioning_layer"] == 50
    mem = info["memory_estimate"]["phases"]
    # 50 blocks x (96768 x 2688 weights + bias) in BF16 are released by the AdaLN precompute.
    assert mem["adaln_weights_released"] == 50 * (96768 * 2688 + 96768) * 2 + (10752 * 2688 + 10752) * 2
    # streaming the text encoder holds ~2 layers, not 50 GB
    assert mem["text_encoding"]["total"] < 3 * 2**30


KNOBS = ("H3_NO_SIMD", "H3_CUDA_LIB", "H3_DIT_PRECOMPUTE", "H3_DIT_KEEP_ADALN", "H3_TEXT_PREFETCH", "H3_DROP_PAGE_CACHE",
         "H3_STAGES_CPU", "H3_FP8_ATTENTION", "H3_FP8_DECODER", "H3_TEXT_STREAM", "H3_TEXT_READERS", "H3_TEXT_KEEP", "H3_STREAM_PACK",
         "H3_CUDA_ATTENTION", "H3_CUDA_ROWS", "H3_CUDNN_LIB", "H3_QUANT_WIDEN", "H3_LOOPBACK_RANKS", "RANK", "WORLD_SIZE", "LOCAL_RANK",
         "H3_RENDEZVOUS", "H3_NCCL_LIB")


def test_info_prints_the_tuning_in_effect(ckpt):
    # Every variable libh3 reads (docs/environment.md) is in the info JSON, null where unset; set ones
    # show the value the library acts on (H3_TEXT_READERS clamped to 1-16 as the reader does).
    import os

    _, part = ckpt
    clean = {k: v for k, v in os.environ.items() if k not in KNOBS}
    info = json.loads(run("info", "-d", part, "--json", "--device", "cpu", env=clean).stdout)
    assert set(info["tuning"]) == set(KNOBS) and all(v is None for v in info["tuning"].values()), info["tuning"]
    proc = run("info", "-d", part, "--device", "cpu", env=clean)
    assert "none set: every default holds" in proc.stdout
    env = dict(clean, H3_TEXT_READERS="99", H3_DIT_PRECOMPUTE="0", H3_DIT_KEEP_ADALN="1", H3_STREAM_PACK="0",
               H3_TEXT_KEEP="1", H3_TEXT_STREAM="0", H3_CUDA_ROWS="scalar", H3_NO_SIMD="1", H3_QUANT_WIDEN="1")
    got = json.loads(run("info", "-d", part, "--json", "--device", "cpu", env=env).stdout)["tuning"]
    assert got == {k: None for k in KNOBS} | {"H3_TEXT_READERS": 16, "H3_DIT_PRECOMPUTE": False,
                                               "H3_DIT_KEEP_ADALN": True, "H3_STREAM_PACK": False,
                                               "H3_TEXT_KEEP": True, "H3_TEXT_STREAM": False, "H3_CUDA_ROWS": "scalar",
                                               "H3_NO_SIMD": True, "H3_QUANT_WIDEN": True}
    proc = run("info", "-d", part, "--device", "cpu", env=env)
    assert proc.returncode == 0, proc.stderr
    for line in ("H3_TEXT_READERS=16", "H3_DIT_PRECOMPUTE=0", "H3_STREAM_PACK=0", "H3_CUDA_ROWS=scalar", "H3_NO_SIMD=1"):
        assert line in proc.stdout, line
