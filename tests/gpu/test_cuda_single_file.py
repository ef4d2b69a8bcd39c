"""A fp8_scaled single-file transformer on CUDA (compute capability 8.9+): its GEMM layers handed to the backend as
the stored e4m3 codes with the file's scale broadcast per row (weight_load_fp8, docs/single-files.md), against the
widening path (H3_QUANT_WIDEN=1: every layer dequantised to BF16 at load).

Not an exact path: fp8 GEMMs quantise the activations too. Held to the bounds test_cuda_fp8.py uses for
`--precision fp8` (denoised latents within 0.1 relative L2 of the widened path's, frames >= 30 dB PSNR), and info
must report the codes in use (single_file_native_codes > 0) only where they are.
"""

from __future__ import annotations

import os

import numpy as np

from tests.gpu.cuda_support import require_libh3_cuda

require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import pytest  # noqa: E402

from h3ctl import Engine  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl.engine import default_model_dir  # noqa: E402
from tests.fixtures import single_file as sf  # noqa: E402

TINY = default_model_dir()
SHAPE = dict(width=64, height=64, frames=22, steps=4)


def _denoise(single):
    cfg = sf.config(TINY)
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((7, cfg["text_dim"])).astype(np.float32)
    lat = rng.standard_normal((24, 3, 2, 2)).astype(np.float32)
    aud = rng.standard_normal((2, 32, 5)).astype(np.float32)
    with Engine(TINY, device="cuda", transformer=single) as e:
        codes = e._ctx.info()["components"]["transformer"]["single_file_native_codes"]
        return tr.denoise(e._ctx, emb, lat, aud, 4)[:2], codes, e.render("a red circle, a beep", seed=3, **SHAPE)


def test_fp8_scaled_native_on_cuda(tmp_path, monkeypatch):
    t = sf.load_transformer(TINY)
    heads = sf.config(TINY)["num_attention_heads"]
    tens, meta, _ = sf.comfy_tensors(t, heads, variant="fp8_scaled")
    single = sf.write_single(tmp_path / "minimax_h3_fl2va_fp8_scaled.safetensors", tens, meta, prefix=True)
    monkeypatch.setenv("H3_QUANT_WIDEN", "1")
    (wv, wa), wcodes, wr = _denoise(single)
    monkeypatch.delenv("H3_QUANT_WIDEN")
    (nv, na), ncodes, nr = _denoise(single)
    rv = float(np.linalg.norm(nv - wv) / np.linalg.norm(wv))
    ra = float(np.linalg.norm(na - wa) / np.linalg.norm(wa))
    mse = float(np.mean((nr.frames.astype(np.float64) - wr.frames.astype(np.float64)) ** 2))
    psnr = 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
    print(f"fp8 single file on CUDA: native codes {ncodes} B; denoised vs widened: video {rv:.2e} audio {ra:.2e}; "
          f"frames {psnr:.1f} dB")
    assert wcodes == 0 and ncodes > 0
    assert rv <= 0.1 and ra <= 0.1 and psnr >= 30.0
