"""fp8 attention on CUDA (H3_OPT_FP8_ATTENTION, `--fp8-attention`): cuDNN's fp8 SDPA in the main transformer blocks.

Like fp8 weights, a speed trick, not an exact path: these tests measure how far it moves the result (printed, for the
docs) and hold it to h3-tiny's semantic suite >= 90 % (the issue's bar) plus sanity bounds that catch a broken
quantiser or scale (a wrong per-tensor scale gives rel-L2 ~1 and noise frames): the velocity within 0.1 rel-L2 of
the bf16 path and the decoded frames >= 25 dB PSNR on average. It must also stay deterministic: the same inputs give
the same bytes. At the released widths tests/bench_cuda_dit.py --fp8-attention measures speed and rel-L2.
"""

from __future__ import annotations

import numpy as np

from tests.gpu.cuda_support import heldout_quality, require_libh3_cuda, velocity_vs

require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

from h3ctl import Engine, _lib  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.engine import default_model_dir  # noqa: E402
from tests import semantic_run as S  # noqa: E402
from train import world  # noqa: E402

HELDOUT = world.heldout_specs()
FP8_ATT = _lib.H3_OPT_FP8_ATTENTION


def test_fp8_attention_velocity_close_to_bf16_and_deterministic():
    worst = 0.0
    with Context(default_model_dir(), device="cuda") as c16, \
            Context(default_model_dir(), device="cuda", flags=FP8_ATT) as ca, \
            Context(default_model_dir(), device="cuda", precision="fp8", flags=FP8_ATT) as cb:
        for T, h, w, n_text in ((2, 8, 8, 7), (7, 8, 8, 19), (5, 16, 12, 33)):
            for name, c in (("fp8 attention", ca), ("fp8 weights + attention", cb)):
                rv, ra, same = velocity_vs(c16, c, T, h, w, n_text, 11)
                assert same, f"{name}: two runs of the same inputs differ"
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
        s, ps = heldout_quality(name, renders[name], renders["bf16"])
        assert s["pass_rate"] >= 0.90, (name, s)
        assert np.mean(ps) >= 25.0, (name, np.mean(ps), min(ps))
