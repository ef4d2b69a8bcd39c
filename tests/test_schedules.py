"""Few-step sigma grids (docs/few-step.md): each named grid against its reference formula, the model's or LoRA's
declared grid, the turbo presets, and bad input (one line, exit 2, nothing written)."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from h3ctl import Engine, presets, schedules
from h3ctl.engine import EMBEDDED_MODEL
from tests.h3cli import assert_clean_error, run as run_cli

PROMPT = "a red ball bounces, a drum hit"


@pytest.mark.parametrize("name,shift_v,shift_a", [("turbo-544p", 12.0, 3.0), ("turbo-768p", 6.0, 3.0),
                                                  ("pdd", 12.0, 3.0)])
@pytest.mark.parametrize("evals", [4, 5, 8])
def test_turbo_grids_match_diffusers_flowmatch(name, shift_v, shift_a, evals):
    """The Turbo / PDD grids are FlowMatch Euler with the distilled shifts over the linear base grid (ComfyUI's
    `simple` scheduler: steps + 1 points from 1 to 0): diffusers' FlowMatchEulerDiscreteScheduler with those sigmas."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    v, a = schedules.sigmas(name, evals + 1, 99.0, 99.0)  # the model's shifts do not apply to these grids
    for got, shift in ((v, shift_v), (a, shift_a)):
        s = FlowMatchEulerDiscreteScheduler(shift=shift)
        s.set_timesteps(sigmas=np.linspace(1.0, 0.0, evals + 1)[:-1].tolist())
        ref = s.sigmas.numpy()
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-7)


def test_turbo_544p_8_steps_is_comfyui_simple():
    # ComfyUI's `simple` 8-step grid at video shift 12 as its users quote it (LBH-123-AI/..._Upscaler#8), 4 decimals
    quoted = [1.0000, 0.9882, 0.9730, 0.9524, 0.9231, 0.8780, 0.8000, 0.6316, 0.0000]
    v, _ = schedules.sigmas("turbo-544p", 9)
    np.testing.assert_allclose(v, quoted, atol=5e-5)


@pytest.mark.parametrize("evals", [2, 4, 5, 7, 20])
def test_h3c_lowstep_grid_is_the_formula(evals):
    """h3.c's low-step grid, written from its formula in float32: base = 1 - i/E, sigma = s b / (1 + (s - 1) b)."""
    v, a = schedules.sigmas("h3c-lowstep", evals + 1)
    one = np.float32(1)
    for got, s in ((v, np.float32(12)), (a, np.float32(3))):
        i = np.arange(evals + 1, dtype=np.float32)
        b = one - i / np.float32(evals)
        ref = (s * b) / (one + (s - one) * b)
        ref[-1] = 0
        assert got.dtype == np.float32 and np.array_equal(got, ref.astype(np.float32))


def test_h3_grid_is_the_released_scheduler():
    import ctypes

    from h3ctl import _lib

    for steps, sv, sa in ((20, 12.0, 3.0), (5, 7.0, 2.0)):
        v, a = schedules.sigmas("h3", steps, sv, sa)
        ref = np.zeros(steps, np.float32)
        n = _lib.lib().h3_sigma_schedule(steps, sv, ref.ctypes.data_as(_lib.c_float_p), None)
        assert np.array_equal(v, ref[:n])
        n = _lib.lib().h3_sigma_schedule(steps, sa, ref.ctypes.data_as(_lib.c_float_p), None)
        assert np.array_equal(a, ref[:n])
    del ctypes


def render(model=None, **kw):
    with Engine(model, threads=2) as eng:
        r = eng.render(PROMPT, seed=3, **kw)
    return r.frames, r.audio


def test_schedule_changes_the_render_and_sigmas_equal_names():
    named = render(steps=5, schedule="turbo-768p")
    default = render(steps=5)
    assert not np.array_equal(named[1], default[1])
    # the same grid given as explicit sigmas is the same render, bit for bit
    given = render(sigmas=schedules.sigmas("turbo-768p", 5))
    assert np.array_equal(given[0], named[0]) and np.array_equal(given[1], named[1])
    # "h3" is the default path, bit for bit
    h3 = render(steps=5, schedule="h3")
    assert np.array_equal(h3[0], default[0]) and np.array_equal(h3[1], default[1])


def test_turbo_presets_pick_steps_and_grid():
    # on the 128x128 default canvas: the 544p grid; 4 / 8 evaluations
    t4 = render(preset="turbo4", steps=None)
    assert np.array_equal(t4[1], render(steps=5, schedule="turbo-544p")[1])
    assert presets.turbo_schedule(1344, 768) == "turbo-768p" and presets.turbo_schedule(960, 544) == "turbo-544p"
    with Engine(None, threads=2) as eng:
        req = eng.request(PROMPT, preset="turbo8", steps=None)
        assert req.steps == 9 and req.schedule == b"turbo-544p"
        req = eng.request(PROMPT, preset="turbo8", steps=7)  # an explicit count wins
        assert req.steps == 7
    # the fp8 path only where a GPU has it; an explicit precision always wins
    assert presets.gpu_precision(presets.get("turbo4").knobs, "default", "cpu") == "default"
    assert presets.gpu_precision(presets.get("turbo4").knobs, "int8", "auto") == "int8"
    assert presets.gpu_precision(presets.get("balanced").knobs, "default", "auto") == "default"


def declaring_model(tmp_path, schedule):
    root = tmp_path / "m"
    root.mkdir()
    for e in EMBEDDED_MODEL.iterdir():
        if e.name != "FL2VA":
            os.symlink(e, root / e.name)
    (root / "FL2VA").mkdir()
    for e in (EMBEDDED_MODEL / "FL2VA").iterdir():
        if e.name == "model_index.json":
            idx = json.loads(e.read_text())
            idx["h3ctl"]["schedule"] = schedule
            (root / "FL2VA" / e.name).write_text(json.dumps(idx))
        else:
            os.symlink(e, root / "FL2VA" / e.name)
    return root


def test_declared_grid_is_used_and_preset_follows_it(tmp_path):
    model = declaring_model(tmp_path, "turbo-768p")
    declared = render(model, steps=5)
    assert np.array_equal(declared[1], render(steps=5, schedule="turbo-768p")[1])
    # a turbo preset defers to the model's own grid
    assert np.array_equal(render(model, preset="turbo4", steps=None)[1], declared[1])
    with Engine(model, threads=2) as eng:
        assert schedules.declared(eng, eng.request(PROMPT)) == "turbo-768p"


def test_lora_metadata_declares_a_grid(tmp_path):
    lora = tmp_path / "l.safetensors"
    save_file({"blocks.0.mlp.fc2.lora_A.weight": np.zeros((4, 704), np.float32),
               "blocks.0.mlp.fc2.lora_B.weight": np.zeros((256, 4), np.float32)}, str(lora),
              metadata={"h3ctl_schedule": "h3c-lowstep"})
    got = render(steps=5, lora=[str(lora)])
    assert np.array_equal(got[1], render(steps=5, schedule="h3c-lowstep")[1])


# ---- bad input ------------------------------------------------------------------------------------------------

def cli_bad(tmp_path, *args, needles=()):
    out = tmp_path / "o.mp4"
    proc = run_cli("render", "-p", "x", "-o", out, *map(str, args))
    line = assert_clean_error(proc, *needles)
    assert not out.exists()
    return line


def test_unknown_schedule_refused(tmp_path):
    cli_bad(tmp_path, "--schedule", "turbo-9000", needles=("turbo-9000", "does not exist", "turbo-768p"))


def test_schedule_against_the_models_declared_one_refused(tmp_path):
    model = declaring_model(tmp_path, "turbo-768p")
    cli_bad(tmp_path, "--model-dir", model, "--schedule", "turbo-544p", needles=("turbo-544p", "model declares",
                                                                               "turbo-768p"))


def test_schedule_against_a_loras_declared_one_refused(tmp_path):
    lora = tmp_path / "l.safetensors"
    save_file({"blocks.0.mlp.fc2.lora_A.weight": np.zeros((4, 704), np.float32),
               "blocks.0.mlp.fc2.lora_B.weight": np.zeros((256, 4), np.float32)}, str(lora),
              metadata={"h3ctl_schedule": "pdd"})
    cli_bad(tmp_path, "--lora", lora, "--schedule", "turbo-768p", needles=("LoRA declares", "pdd"))
    model = declaring_model(tmp_path, "turbo-768p")
    cli_bad(tmp_path, "--model-dir", model, "--lora", lora, needles=("model declares", "LoRA declares"))


def test_model_declaring_an_unknown_schedule_refused(tmp_path):
    model = declaring_model(tmp_path, "fastest")
    cli_bad(tmp_path, "--model-dir", model, needles=("h3ctl.schedule",))


def test_bad_explicit_sigmas_refused():
    from h3ctl._lib import H3Error

    with Engine(None, threads=2) as eng:
        for grid, needle in ((([1.0, 0.5, 0.6, 0.0], [1.0, 0.5, 0.2, 0.0]), "decrease"),
                             (([1.5, 0.0], [1.0, 0.0]), "[0, 1]"),
                             (([1.0, float("nan")], [1.0, 0.0]), "[0, 1]")):
            with pytest.raises(H3Error, match=needle.replace("[", r"\[").replace("]", r"\]")):
                eng.plan(eng.request(PROMPT, sigmas=grid))
        with pytest.raises(H3Error, match="give one of them"):
            eng.plan(eng.request(PROMPT, sigmas=schedules.sigmas("pdd", 5), schedule="pdd"))
