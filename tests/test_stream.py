"""Weight streaming of the transformer blocks on the CPU (`--vram GiB`, Engine(vram=), h3_options.vram_bytes).

A budget below the transformer's weights keeps only the blocks that fit after two slots and reads the others from
their shards with pread, a reader thread filling one slot while the other computes. The GEMMs consume the stored
bytes either way, so a streamed render must be byte-identical to the resident one (frames and audio), at any thread
count. The budget is derived from the checkpoint's own header (tensor sizes), not from our engine. What the CPU then
holds is measured too: the peak RSS of a process streaming every block against a resident one.
"""

import ctypes
import json
import math
import struct
import sys

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
    # the CPU reads stored bytes (no packed copies there): what moved is what streamed
    assert s["packed_blocks"] == 0 and s["bytes_copied"] == s["bytes_streamed"] > 0, s
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


# ---- what the CPU holds --------------------------------------------------------------------------------------------

PEAK_SCRIPT = r"""
import json, sys
import numpy as np
from h3ctl import transformer as tr
from h3ctl.context import Context
vram = float(sys.argv[2]) or None
with Context(sys.argv[1], threads=2, device="cpu", vram=vram) as ctx:
    cfg = tr._config(ctx)
    rng = np.random.default_rng(0)
    pe = rng.standard_normal((5, cfg["text_dim"])).astype(np.float32)
    lat = rng.standard_normal((cfg["latents_dim"], 2, 4, 4)).astype(np.float32)
    aud = rng.standard_normal((2, cfg["audio_latents_dim"], 8)).astype(np.float32)
    v, a, _ = tr.denoise(ctx, pe, lat, aud, 3)
    np.save(sys.argv[3], np.concatenate([v.ravel(), a.ravel()]))
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"peak_kib": hwm,
                      "stream": tr.profile(ctx)["stream"]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak RSS from /proc/self/status")
def test_cpu_streaming_keeps_only_the_budget_in_memory(tmp_path):
    """With a budget of the two slots alone, the process's peak RSS is lower than the resident one's by about the
    blocks beyond the slots (the streamed blocks' pages are never mapped in; pread fills the two slots), and the
    velocity is the same bytes. Each run is a fresh process, so each peak is its own."""
    import subprocess

    block, other, layers = _sizes()
    res = []
    for i, vram in enumerate((0.0, (other + 2 * block + block // 2) / GIB)):
        out = tmp_path / f"v{i}.npy"
        proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(default_model_dir()), repr(vram), str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        res.append(json.loads(proc.stdout.strip().splitlines()[-1]) | {"v": np.load(out)})
    print(f"stream: CPU h3-tiny transformer, {layers} blocks of {block / 2**20:.2f} MiB: peak RSS resident "
          f"{res[0]['peak_kib'] / 1024:.1f} MiB, every block streamed {res[1]['peak_kib'] / 1024:.1f} MiB")
    assert res[0]["stream"]["streamed_blocks"] == 0 and res[1]["stream"]["streamed_blocks"] == layers
    assert np.array_equal(res[0]["v"], res[1]["v"])
    saved = (res[0]["peak_kib"] - res[1]["peak_kib"]) * 1024
    # the blocks beyond the two slots (measured: 88 % of them), with room for allocator and page-table noise
    assert saved >= 0.6 * (layers - 2) * block, (saved, block)
