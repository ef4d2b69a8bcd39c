"""Weight streaming of the transformer blocks on the CPU (`--vram GiB`, Engine(vram=), h3_options.vram_bytes).

A budget below the transformer's weights keeps only the blocks that fit after two slots and reads the others from
their shards with pread, a reader thread filling one slot while the other computes. The GEMMs consume the stored
bytes either way, so a streamed render must be byte-identical to the resident one (frames and audio), at any thread
count. The budget is derived from the checkpoint's own header (tensor sizes), not from our engine.
"""

import ctypes
import json
import math
import struct

import numpy as np
import pytest

from h3ctl import Engine, H3Error, _lib
from h3ctl.engine import default_model_dir
from tests.h3cli import assert_clean_error, run

PROMPT = "a red circle moves right on a black background, a high beep"
GIB = 1 << 30
PARTS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")
# What every request below renders: small, so the four renders of the module stay fast.
REQ = dict(width=64, height=64, frames=22, steps=4, seed=7)


def _header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def _sizes():
    """From the transformer's safetensors header: bytes of one block's four GEMM weights as a slot holds them
    (each rounded up to 64 bytes), bytes of every other GEMM weight the transformer keeps (refiner blocks,
    condition_proj, patch projections, heads), and the block count."""
    tdir = default_model_dir() / "FL2VA" / "transformer"
    hdr = {}
    for shard in sorted(tdir.glob("*.safetensors")):
        hdr.update({k: v for k, v in _header(shard).items() if k != "__metadata__"})
    nbytes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items()}
    layers = json.loads((tdir / "config.json").read_text())["num_layers"]
    block = sum(math.ceil(nbytes[f"blocks.0.{p}.weight"] / 64) * 64 for p in PARTS)
    other = [f"token_refiner.blocks.{i}.{p}.weight" for i in range(2) for p in PARTS]
    other += ["condition_proj.weight", "final_layer.video_out.weight", "final_layer.audio_out.weight",
              "video_patch_proj.weight", "audio_patch_proj.weight"]
    return block, sum(nbytes[k] for k in other), layers


def _render(threads, vram=None, **knobs):
    e = Engine(threads=threads, vram=vram)
    try:
        r = e.render(PROMPT, **REQ, **knobs)
        return r.frames.copy(), r.audio.copy(), e.last_transformer_profile["stream"]
    finally:
        e.close()


@pytest.fixture(scope="module")
def resident():
    return _render(2)


def test_streamed_render_is_byte_identical_to_resident(resident):
    block, other, layers = _sizes()
    frames, audio, info = resident
    assert info["streamed_blocks"] == 0 and info["bytes_streamed"] == 0
    assert info["weight_bytes_held"] >= other + layers * block - 64 * 4 * layers
    # Room for the other weights, the two slots and one block: that block stays, every other one streams.
    budget = other + 3 * block + block // 2
    for threads in (1, 3):
        f, a, s = _render(threads, vram=budget / GIB)
        assert s["blocks"] == layers and s["streamed_blocks"] == layers - 1, s
        assert s["weight_bytes_held"] <= budget
        assert s["bytes_streamed"] > 0 and s["bytes_streamed"] % block == 0
        assert f.shape == frames.shape and a.shape == audio.shape
        assert np.array_equal(f, frames), f"frames differ at {threads} threads"
        assert np.array_equal(a, audio), f"audio differs at {threads} threads"
        # content, not an empty render that happens to match
        assert float(np.std(f.astype(np.float32))) > 1.0 and float(np.abs(a).max()) > 1e-4


def test_every_block_streamed_is_byte_identical(resident):
    block, other, layers = _sizes()
    frames, audio, _ = resident
    budget = other + 2 * block + block // 2  # the slots only
    f, a, s = _render(2, vram=budget / GIB)
    assert s["streamed_blocks"] == layers and s["weight_bytes_held"] <= budget
    assert np.array_equal(f, frames) and np.array_equal(a, audio)


def test_streaming_with_layer_dropping_and_token_reduction():
    """Layer dropping opens the blocks lazily and runs a subset (streamed ones skipped in the pass); token
    reduction runs some blocks on fewer rows: both must give the resident bits."""
    block, other, layers = _sizes()
    knobs = dict(layers=4, token_reduction=1)
    f0, a0, _ = _render(2, **knobs)
    f, a, s = _render(2, vram=(other + 3 * block) / GIB, **knobs)
    assert s["streamed_blocks"] == layers - 1 and s["bytes_streamed"] > 0
    assert np.array_equal(f, f0) and np.array_equal(a, a0)


def test_budget_that_holds_everything_streams_nothing(resident):
    f, a, s = _render(2, vram=1.0)
    assert s["streamed_blocks"] == 0 and s["bytes_streamed"] == 0
    assert np.array_equal(f, resident[0]) and np.array_equal(a, resident[1])


@pytest.mark.parametrize("value", ["-1", "nan", "abc", "1e12", "inf"])
def test_bad_vram_values_on_the_cli(tmp_path, value):
    proc = run("render", "-p", PROMPT, "-o", tmp_path / "x.mp4", "--wav", tmp_path / "x.wav", "-q", "--vram", value)
    assert_clean_error(proc, "--vram must be a number of GiB between 0 (auto) and 1048576", repr(value))
    assert list(tmp_path.iterdir()) == []


def test_budget_below_the_slots_fails_with_the_sizes(tmp_path):
    block, other, _ = _sizes()
    gib = (other + block) / GIB  # one slot short
    proc = run("render", "-p", PROMPT, "--size", "64x64", "-o", tmp_path / "x.mp4", "-q", "--vram", f"{gib:.6f}")
    line = assert_clean_error(proc, "vram budget", "is below what the transformer needs with its blocks streamed",
                              "2 slots of")
    assert "GiB of other weights" in line
    assert list(tmp_path.iterdir()) == []


def test_bad_values_in_the_bindings_and_the_c_api():
    for bad in (-0.5, float("nan"), "x", True, 2.0**21):
        with pytest.raises(H3Error, match="vram must be a number of GiB"):
            Engine(threads=1, vram=bad)
    opts = _lib.H3Options()
    _lib.lib().h3_options_default(ctypes.byref(opts))
    opts.device = _lib.H3_DEVICE_CPU
    for bad in (-1, (1 << 50) + 1):
        opts.vram_bytes = bad
        assert not _lib.lib().h3_init(str(default_model_dir()).encode(), ctypes.byref(opts))
        assert f"vram budget must be between 0 (auto) and 1 PiB, got {bad} bytes" in _lib.last_error()


def test_cpu_budget_refuses_int8():
    block, other, _ = _sizes()
    e = Engine(threads=1, precision="int8", vram=(other + 3 * block) / GIB)
    try:
        with pytest.raises(H3Error, match="cannot be combined with LoRA files or int8 precision"):
            e.render(PROMPT, **REQ)
    finally:
        e.close()
