"""Bad input and faults on a GPU machine: one line naming the problem, and everything still works afterwards.

* a GPU number past the last GPU: H3Error / exit 2 with one line naming it, nothing written, and the CPU and CUDA
  paths work in the same process afterwards with the same bytes as before;
* a bad request on a live CUDA context fails with one line and leaves the context usable (h3.h: any sequence of
  calls on a live context is safe);
* `auto` picks the GPU, and a CUDA context renders.
Uses the embedded h3-tiny, so it needs neither torch nor diffusers.
"""

from __future__ import annotations

import pytest

from tests.gpu.cuda_support import require_libh3_cuda

CUDA = require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import numpy as np  # noqa: E402

from h3ctl import _lib  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.engine import EMBEDDED_MODEL, Engine  # noqa: E402
from tests.h3cli import assert_clean_error, run  # noqa: E402

PROMPT = "a red circle moves right on a black background, a high beep"
BAD_INDEX = 99  # no lent machine has 100 GPUs


def _forward_inputs(ctx, seed=1):
    """A t2va forward of h3-tiny with libh3's own layout and noise: n_text 5, 3 x 4 x 6 latents, 7 audio latents."""
    cfg = ctx.info()["components"]["transformer"]["config"]
    lay = tr.packed_layout(ctx, 5, 3, 4, 6, 7)
    L = lay["position_ids"].shape[0]
    tsi = np.ones(L, np.int64)
    tsi[lay["audio_indices"]] = 0
    return dict(hidden_states=tr.noise(seed, 0, (lay["video_indices"].size, 96)),
                audio_hidden_states=tr.noise(seed, 1, (lay["audio_indices"].size, 32)),
                encoder_hidden_states=tr.noise(seed, 2, (5, cfg["text_dim"])),
                timestep=np.array([0.3, 0.7], np.float32), timestep_indices=tsi, **lay)


def _forward(device):
    with Context(EMBEDDED_MODEL, threads=4, device=device) as ctx:
        v, a = tr.forward(ctx, **_forward_inputs(ctx))
    return v.tobytes() + a.tobytes()


def test_auto_picks_the_gpu_and_says_which():
    with Context(EMBEDDED_MODEL) as ctx:
        assert ctx.device == "cuda"
        desc = ctx.device_description
    assert "\n" not in desc and CUDA["device"] in desc, desc


def test_device_index_out_of_range_then_everything_still_works(tmp_path):
    cpu_before, gpu_before = _forward("cpu"), _forward("cuda")
    with pytest.raises(H3Error) as e:
        Context(EMBEDDED_MODEL, device="cuda", device_index=BAD_INDEX)
    msg = str(e.value)
    print(f"fault: device_index {BAD_INDEX}: {msg}")
    assert "\n" not in msg and str(BAD_INDEX) in msg and "cuda" in msg.lower(), msg
    with pytest.raises(H3Error) as e2:
        Engine(device="cuda", device_index=BAD_INDEX)
    assert str(e2.value) == msg
    # the same process, after the failure: both paths work and give the bytes they gave before it
    assert _forward("cpu") == cpu_before
    assert _forward("cuda") == gpu_before
    # the CLI: exit 2, that one line, nothing written
    out = tmp_path / "x.mp4"
    line = assert_clean_error(run("render", "-p", PROMPT, "--device", "cuda", "--device-index", BAD_INDEX, "-o", out,
                                  "-q"), str(BAD_INDEX))
    assert line == f"h3ctl: error: {msg}"
    assert list(tmp_path.iterdir()) == []


def test_bad_request_on_a_cuda_context_leaves_it_usable():
    with Context(EMBEDDED_MODEL, threads=4, device="cuda") as ctx:
        good = _forward_inputs(ctx)
        v0, a0 = tr.forward(ctx, **good)
        bad = dict(good, audio_indices=good["audio_indices"].copy())
        bad["audio_indices"][0] = good["video_indices"][0]  # two rows claim one packed position
        with pytest.raises(H3Error) as e:
            tr.forward(ctx, **bad)
        assert "\n" not in str(e.value)
        with pytest.raises(H3Error):  # a step before any prepare
            _lib.check(_lib.lib().h3_step(ctx.ptr))
        v1, a1 = tr.forward(ctx, **good)
    assert v0.tobytes() == v1.tobytes() and a0.tobytes() == a1.tobytes()


def test_cuda_engine_renders():
    with Engine(threads=4, device="cuda") as eng:
        assert eng.device == "cuda"
        res = eng.render(PROMPT, 64, 64, 22, steps=3, seed=2)
        prof = eng.last_transformer_profile
    assert res.frames.shape == (22, 64, 64, 3) and np.isfinite(res.audio).all()
    assert prof["forwards"] == 2 and prof["forward_ms_min"] > 0
