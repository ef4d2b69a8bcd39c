"""Weight streaming of the transformer blocks on CUDA (h3_options.vram_bytes, `--vram GiB`).

Streamed blocks live in pinned host memory in their device form (bf16, or fp8 values + scales) and move into a ring
of two device slots on a copy stream while the previous block computes. The GEMMs read the very bytes a resident
block holds, with the same plans, so the results must be byte-identical to the resident path: checked on h3-tiny
(bf16 and fp8: the transformer's output and a whole render) and at the released widths (a random checkpoint written
by tests/bench_cuda_dit.py's helpers, 3 blocks), where the device memory the transformer takes under a 4 GiB budget
is also measured (the driver's free memory, polled while it runs) and held to the budget.

bf16 blocks are held packed (core/wpack.h, ~3/4 of the bytes) where the budget holds the packed ring (one block of
words and two stagings of 85 % of a block, against the plain ring's two blocks): the image crosses into its slot's
staging and is decoded on the compute stream when the block runs. The bf16 cases check which ring the budget gives
(`ring_plan`), that every streamed block was then packed and that the copies moved fewer bytes; one case turns
packing off (H3_STREAM_PACK=0) and must give the same bytes through plain copies.
"""

from __future__ import annotations

import json
import math
import struct
import threading
import time

import numpy as np

from tests.gpu.cuda_support import denoise_both, require_libh3_cuda

require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import pytest  # noqa: E402

from h3ctl import Engine  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.engine import default_model_dir  # noqa: E402

GIB = 1 << 30
PARTS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")
OTHER = ["condition_proj.weight", "final_layer.video_out.weight", "final_layer.audio_out.weight",
         "video_patch_proj.weight", "audio_patch_proj.weight"]
PROMPT = "a red circle moves right on a black background, a high beep"


def _r256(n: int) -> int:
    return (n + 255) // 256 * 256


def _shapes(tdir):
    hdr = {}
    for shard in sorted(tdir.glob("*.safetensors")):
        with open(shard, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr.update({k: v["shape"] for k, v in json.loads(f.read(n)).items() if k != "__metadata__"})
    return hdr


def device_sizes(root, fp8: bool):
    """From the checkpoint's header, the device form the CUDA backend documents (backend.h weight_bytes): bf16 values,
    or for an fp8 block weight (K a multiple of 16) e4m3 values + one f32 scale per row, each part rounded up to 256
    bytes. Returns (bytes of one main block, bytes of every other GEMM weight, blocks)."""
    tdir = root / "FL2VA" / "transformer"
    shp = _shapes(tdir)
    layers = json.loads((tdir / "config.json").read_text())["num_layers"]

    def form(rows, cols, quant):
        if quant and cols % 16 == 0:
            return _r256(rows * cols) + _r256(4 * rows)
        return _r256(2 * rows * cols)

    block = sum(form(*shp[f"blocks.0.{p}.weight"], fp8) for p in PARTS)
    other = sum(form(*shp[f"token_refiner.blocks.{i}.{p}.weight"], False) for i in range(2) for p in PARTS)
    other += sum(form(*shp[k], False) for k in OTHER)
    return block, other, layers


def ring_plan(budget, other, block, precision, packing=True):
    """dit_stream_plan's rule: (packed ring?, blocks that stay) for a budget below the whole transformer."""
    stage = block * 17 // 20 // 256 * 256  # h3_wpack_stream_max
    packed = precision == "default" and packing and budget - other >= block + 2 * stage
    ring = block + 2 * stage if packed else 2 * block
    return packed, max(0, (budget - other - ring) // block)


def check_packing(s, precision, packing=True):
    """bf16 blocks stream packed (every one, fewer bytes copied than streamed) unless packing is off; fp8 never."""
    if precision == "default" and packing:
        assert s["packed_blocks"] == s["streamed_blocks"] > 0, s
        assert s["bytes_copied"] < 0.85 * s["bytes_streamed"], s
    else:
        assert s["packed_blocks"] == 0 and s["bytes_copied"] == s["bytes_streamed"], s


@pytest.mark.parametrize("precision", ["default", "fp8"])
def test_h3tiny_streamed_transformer_is_byte_identical(precision):
    root = default_model_dir()
    block, other, layers = device_sizes(root, precision == "fp8")
    budget = other + 3 * block + block // 2  # plain: one block stays; packed (2.7 blocks of ring): none
    packed, keep = ring_plan(budget, other, block, precision)
    assert packed == (precision == "default")
    with Context(root, device="cuda", precision=precision) as cr, \
            Context(root, device="cuda", precision=precision, vram=budget / GIB) as cs:
        for T, h, w, n_text in ((2, 8, 8, 7), (7, 16, 12, 33)):
            lat, (v0, a0), (v1, a1) = denoise_both(cr, cs, T, h, w, n_text, 3, 4)
            s = tr.profile(cs)["stream"]
            print(f"stream: h3-tiny {precision} T={T} {h}x{w}: {s}")
            assert s["streamed_blocks"] == layers - keep and s["weight_bytes_held"] <= budget, s
            assert s["bytes_streamed"] > 0
            check_packing(s, precision, packed)
            assert np.array_equal(v0, v1) and np.array_equal(a0, a1), precision
            assert float(np.abs(v0 - lat).max()) > 1e-3  # the transformer moved the latents


def test_h3tiny_plain_copies_are_byte_identical(monkeypatch):
    """H3_STREAM_PACK=0: the same blocks stream through plain copies, and the output is the resident one and the
    packed one, byte for byte."""
    root = default_model_dir()
    block, other, layers = device_sizes(root, False)
    budget = other + 2 * block + block * 17 // 20  # every block streams, through either ring
    assert ring_plan(budget, other, block, "default") == (True, 0)
    assert ring_plan(budget, other, block, "default", packing=False) == (False, 0)
    with Context(root, device="cuda") as cr, Context(root, device="cuda", vram=budget / GIB) as cp:
        monkeypatch.setenv("H3_STREAM_PACK", "0")  # read at h3_init: cs streams plain, cp (opened before) packed
        with Context(root, device="cuda", vram=budget / GIB) as cs:
            lat, (v0, a0), (v1, a1) = denoise_both(cr, cs, 7, 16, 12, 33, 3, 4)
            s = tr.profile(cs)["stream"]
        monkeypatch.delenv("H3_STREAM_PACK")
        _, _, (v2, a2) = denoise_both(cr, cp, 7, 16, 12, 33, 3, 4)
        sp = tr.profile(cp)["stream"]
    print(f"stream: h3-tiny plain copies: {s}; packed: {sp}")
    assert s["streamed_blocks"] == layers and sp["streamed_blocks"] == layers, (s, sp)
    check_packing(s, "default", packing=False)
    check_packing(sp, "default")
    assert np.array_equal(v0, v1) and np.array_equal(a0, a1)
    assert np.array_equal(v0, v2) and np.array_equal(a0, a2)


def test_h3tiny_streamed_render_is_byte_identical():
    block, other, _ = device_sizes(default_model_dir(), False)
    out = []
    for vram in (None, (other + 2 * block + block * 17 // 20) / GIB):  # resident, then every block streamed
        with Engine(threads=8, device="cuda", vram=vram) as e:
            r = e.render(PROMPT, width=64, height=64, frames=22, steps=6, seed=11)
            out.append((r.frames.copy(), r.audio.copy(), e.last_transformer_profile["stream"]))
    assert out[1][2]["streamed_blocks"] == out[1][2]["blocks"], out[1][2]
    check_packing(out[1][2], "default")
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


# ---- released widths -----------------------------------------------------------------------------------------------

RELEASE_BLOCKS = 3
SHAPE = "512x512x22:8"  # 1,874 tokens: activations of a few hundred MiB next to the 4 GiB of weights


@pytest.fixture(scope="module")
def release_ckpt(tmp_path_factory):
    """A random checkpoint at the released widths with RELEASE_BLOCKS blocks (bench_cuda_dit.py's writer)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device: the released-width checkpoint is drawn on the GPU")
    pytest.importorskip("diffusers", reason="the checkpoint is drawn with diffusers' model class")
    from tests import bench_cuda_dit as bench

    root = tmp_path_factory.mktemp("release-stream")
    model = bench.build_model(torch, RELEASE_BLOCKS, 0, {})
    bench.write_checkpoint(torch, model, root)
    del model
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return root, bench.geometry(SHAPE)


class FreePoll:
    """The driver's free device memory, polled from a thread while the transformer runs (ctypes releases the GIL)."""

    def __init__(self, torch):
        self.torch, self.low, self._stop = torch, None, threading.Event()

    def _run(self):
        while not self._stop.is_set():
            f = self.torch.cuda.mem_get_info()[0]
            self.low = f if self.low is None else min(self.low, f)
            time.sleep(0.001)

    def __enter__(self):
        self.base = self.torch.cuda.mem_get_info()[0]
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def used(self) -> int:
        now = self.torch.cuda.mem_get_info()[0]
        return self.base - min(now if self.low is None else self.low, now)


# Budgets below the whole transformer (its other weights, 1.49 GiB, plus 3 blocks: 3.64 GiB in bf16, 2.57 GiB in
# fp8), so that streaming must happen: with three blocks, two slots plus one resident block hold as much as all
# three, so every block streams (a budget the whole model fits in streams nothing, as it should).
@pytest.mark.parametrize("precision,gib", [("default", 3.2), ("default", 3.5), ("fp8", 2.5)])
def test_release_widths_budget_held_and_byte_identical(release_ckpt, precision, gib):
    import torch

    root, g = release_ckpt
    block, other, layers = device_sizes(root, precision == "fp8")
    budget = int(gib * GIB)
    packed, keep = ring_plan(budget, other, block, precision)  # bf16: 3.2 GiB holds the plain ring, 3.5 the packed
    rng = np.random.default_rng(5)
    pe = rng.standard_normal((g["n_text"], 5120)).astype(np.float32)
    lat = rng.standard_normal((24, g["lat_t"], g["lat_h"], g["lat_w"])).astype(np.float32)
    aud = rng.standard_normal((2, 32, g["audio"])).astype(np.float32)
    with Context(root, device="cuda", precision=precision, vram=gib) as cs:
        with FreePoll(torch) as poll:  # the transformer opens inside this first call
            v1, a1, _ = tr.denoise(cs, pe, lat, aud, 3)
        s = tr.profile(cs)["stream"]
        used = poll.used
    # 1 GiB for what is not weights at 1,874 tokens: activations (~0.1 GiB), AdaLN tables, scratch, the f32 islands'
    # conversion staging (2 x 64 MiB) and cuDNN's attention workspace
    act = 1 << 30
    print(f"stream: released widths {precision}, {layers} blocks of {block / GIB:.3f} GiB, other weights "
          f"{other / GIB:.3f} GiB, budget {gib} GiB: {s['streamed_blocks']} streamed, weights held "
          f"{s['weight_bytes_held'] / GIB:.3f} GiB, device memory taken by the transformer (peak) {used / GIB:.3f} GiB")
    assert 0 < s["streamed_blocks"] == layers - max(0, min(layers, keep)), s
    assert s["weight_bytes_held"] <= budget
    check_packing(s, precision, packed)
    assert used <= budget + act, used / GIB
    with Context(root, device="cuda", precision=precision) as cr:
        v0, a0, _ = tr.denoise(cr, pe, lat, aud, 3)
    assert np.array_equal(v0, v1) and np.array_equal(a0, a1)
    assert math.isfinite(float(np.abs(v0).sum()))
