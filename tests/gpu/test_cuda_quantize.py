"""fp8 weights from a file on CUDA (`h3ctl quantize`, h3_options.quantized_path): the same bytes as quantising at load.

`h3ctl quantize` computes on the CPU what the CUDA backend's quantiser computes (tests/test_quantize.py checks the
formula and the conversion); a context given the file uploads those bytes and scales instead of quantising. So the
transformer's output and a whole render must be byte-identical to precision fp8 quantised at load, with every block
resident and with the blocks streamed under a vram budget (the streamed path saves the loaded device form). A file
made from another checkpoint (here h3-tiny's Ref2VA transformer, or a changed identity) is refused on CUDA too.
"""

from __future__ import annotations

import numpy as np

from tests.gpu.cuda_support import denoise_both, require_libh3_cuda

CUDA = require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import pytest  # noqa: E402

if tuple(int(x) for x in CUDA.get("compute_capability", "0.0").split(".")) < (8, 9):
    reason = f"fp8 needs compute capability 8.9+, this GPU is {CUDA.get('compute_capability')}"
    print(f"skip: {reason}")
    pytest.skip(reason, allow_module_level=True)

from h3ctl import Engine, H3Error  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.engine import default_model_dir  # noqa: E402
from h3ctl.quantize import quantize  # noqa: E402
from tests.gpu.test_cuda_stream import GIB, PROMPT, device_sizes  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8file")
    root = default_model_dir()
    return {"fl2va": quantize(root, d / "fl2va.safetensors"), "ref2va": quantize(root, d / "ref2va.safetensors",
                                                                                  ref2va=True)}


def stream_budget():
    """Every block but one streamed (h3-tiny's fp8 device form)."""
    block, other, layers = device_sizes(default_model_dir(), True)
    return (other + 3 * block + block // 2) / GIB, layers


@pytest.mark.parametrize("streamed", [False, True])
def test_transformer_from_the_file_is_byte_identical(files, streamed):
    root = default_model_dir()
    vram, layers = stream_budget() if streamed else (None, 0)
    with Context(root, device="cuda", precision="fp8", vram=vram) as at_load, \
            Context(root, device="cuda", precision="fp8", vram=vram, quantized=files["fl2va"]) as from_file:
        for T, h, w, n_text in ((2, 8, 8, 7), (7, 16, 12, 33)):
            lat, (v0, a0), (v1, a1) = denoise_both(at_load, from_file, T, h, w, n_text, 5, 4)
            s = tr.profile(from_file)["stream"]
            print(f"quantized file: h3-tiny T={T} {h}x{w} streamed={streamed}: {s}")
            if streamed:
                assert s["streamed_blocks"] == layers - 1 and s["bytes_streamed"] > 0, s
            assert np.array_equal(v0, v1) and np.array_equal(a0, a1)
            assert float(np.abs(v0 - lat).max()) > 1e-3  # the transformer moved the latents


def test_render_from_the_file_is_byte_identical_resident_and_streamed(files):
    vram, _ = stream_budget()
    out = []
    for quantized, budget in ((None, None), (files["fl2va"], None), (files["fl2va"], vram), (None, vram)):
        with Engine(threads=8, device="cuda", precision="fp8", quantized=quantized, vram=budget) as e:
            r = e.render(PROMPT, width=64, height=64, frames=22, steps=6, seed=11)
            out.append((r.frames.copy(), r.audio.copy()))
    for f, a in out[1:]:
        assert np.array_equal(out[0][0], f) and np.array_equal(out[0][1], a)
    with Engine(threads=8, device="cuda") as e:  # and fp8 is not the bf16 path
        r = e.render(PROMPT, width=64, height=64, frames=22, steps=6, seed=11)
    assert not np.array_equal(r.audio, out[0][1])


def test_a_file_of_another_checkpoint_is_refused_on_cuda(files, tmp_path):
    root = default_model_dir()
    with pytest.raises(H3Error, match="quantised from another checkpoint"):
        Context(root, device="cuda", precision="fp8", quantized=files["ref2va"])
    with pytest.raises(H3Error, match="quantised from another checkpoint"):
        Context(root, ref2va=True, device="cuda", precision="fp8", quantized=files["fl2va"])
    with pytest.raises(H3Error, match="needs precision fp8"):
        Context(root, device="cuda", quantized=files["fl2va"])
    # Ref2VA's own file is taken, and its transformer matches quantising at load
    with Context(root, ref2va=True, device="cuda", precision="fp8") as a, \
            Context(root, ref2va=True, device="cuda", precision="fp8", quantized=files["ref2va"]) as b:
        _, (v0, a0), (v1, a1) = denoise_both(a, b, 2, 8, 8, 7, 9, 3)
        assert np.array_equal(v0, v1) and np.array_equal(a0, a1)
