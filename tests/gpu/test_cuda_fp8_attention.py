"""fp8 attention on CUDA (H3_OPT_FP8_ATTENTION, `--fp8-attention`): cuDNN's fp8 SDPA in the main transformer blocks.

Like fp8 weights, a speed trick, not an exact path: these tests measure how far it moves the result (printed, for the
README) and hold it to h3-tiny's semantic suite >= 90 % (the issue's bar) plus sanity bounds that catch a broken
quantiser or scale (a wrong per-tensor scale gives rel-L2 ~1 and noise frames): the velocity within 0.1 rel-L2 of
the bf16 path and the decoded frames >= 25 dB PSNR on average. It must also stay deterministic: the same inputs give
the same bytes. At the released widths tests/bench_cuda_dit.py --fp8-attention measures speed and rel-L2.
"""

from __future__ import annotations

import numpy as np

from tests.gpu.cuda_support import psnr, rel_l2, require_libh3_cuda

require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

from h3ctl import Engine, _lib  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.engine import default_model_dir  # noqa: E402
from tests import semantic_run as S  # noqa: E402
from train import evaluate, world  # noqa: E402

HELDOUT = world.heldout_specs()
FP8_ATT = _lib.H3_OPT_FP8_ATTENTION


def test_fp8_attention_velocity_close_to_bf16_and_deterministic():
    rng = np.random.default_rng(11)
    worst = 0.0
    with Context(default_model_dir(), device="cuda") as c16, \
            Context(default_model_dir(), device="cuda", flags=FP8_ATT) as ca, \
            Context(default_model_dir(), device="cuda", precision="fp8", flags=FP8_ATT) as cb:
        cfg = tr._config(c16)
        for T, h, w, n_text in ((2, 8, 8, 7), (7, 8, 8, 19), (5, 16, 12, 33)):
            pe = rng.standard_normal((n_text, cfg["text_dim"])).astype(np.float32)
            lat = rng.standard_normal((cfg["latents_dim"], T, h, w)).astype(np.float32)
            aud = rng.standard_normal((2, cfg["audio_latents_dim"], 4 * T)).astype(np.float32)
            v16, a16, _ = tr.denoise(c16, pe, lat, aud, 2)
            for name, c in (("fp8 attention", ca), ("fp8 weights + attention", cb)):
                v8, a8, _ = tr.denoise(c, pe, lat, aud, 2)
                again = tr.denoise(c, pe, lat, aud, 2)
                assert np.array_equal(v8, again[0]) and np.array_equal(a8, again[1]), f"{name}: not deterministic"
                rv, ra = rel_l2(v8 - lat, v16 - lat), rel_l2(a8 - aud, a16 - aud)
                print(f"{name}: h3-tiny velocity vs bf16 T={T} {h}x{w} text {n_text}: video {rv:.2e} audio {ra:.2e}")
                worst = max(worst, rv, ra)
    assert worst <= 0.1, worst


def test_fp8_attention_h3tiny_semantic_suite_and_frames_against_bf16():
    renders = {}
    for name, prec, fa in (("bf16", "default", False), ("fp8 attention", "default", True),
                           ("fp8 weights + attention", "fp8", True)):
        with Engine(threads=8, device="cuda", precision=prec, fp8_attention=fa) as eng:
            renders[name] = [S.libh3_render(eng, spec.caption, 20, 42 + k) for k, spec in enumerate(HELDOUT)]
    for name in ("fp8 attention", "fp8 weights + attention"):
        res = [evaluate.check(spec, f, a) for spec, (f, a) in zip(HELDOUT, renders[name])]
        s = evaluate.summarize(res)
        ps = [psnr(f8[0], f16[0]) for f8, f16 in zip(renders[name], renders["bf16"])]
        au = [rel_l2(f8[1], f16[1]) for f8, f16 in zip(renders[name], renders["bf16"])]
        print(f"semantic: cuda {name} {s['passed']}/{s['total']} = {100 * s['pass_rate']:.1f} % {s['per_check']}")
        print(f"{name}: h3-tiny frames vs bf16 over {len(HELDOUT)} prompts: PSNR min {min(ps):.1f} dB, mean "
              f"{np.mean(ps):.1f} dB; audio rel-L2 max {max(au):.2e}")
        assert s["pass_rate"] >= 0.90, (name, s)
        assert np.mean(ps) >= 25.0, (name, np.mean(ps), min(ps))
