"""Issue #27, values: every number is range-checked before ctypes stores it into a 32-bit field (where 2^32 + k
would arrive as k), with one line naming the value and the range; prompts with NUL, only spaces or bytes that are
not UTF-8 are refused. No render runs: every case fails in the checks, before any work."""

import math

import numpy as np
import pytest

from h3ctl import Cancelled, Engine, H3Error
from tests.h3cli import assert_clean_error, run

BASE = ["render", "-q", "-p", "a red circle moves right on a black background, a high beep"]

# the ints that wrap or slip through a 32-bit field, and floats where an integer is meant
EDGE_INTS = [0, -1, 2**31 - 1, 2**31, 2**32 + 22, 2**63]
EDGE_FLOATS = [math.nan, math.inf, 128.9]


@pytest.fixture(scope="module")
def eng():
    e = Engine(threads=1)
    yield e
    e.close()


@pytest.mark.parametrize("argv, needle", [
    (["--width", "4294967424"], "width must be between 1 and 16384 pixels, got 4294967424"),
    (["--size", "128x4294967424"], "height must be between 1 and 16384 pixels, got 4294967424"),
    (["--size", "-32x64"], "width must be between 1 and 16384 pixels, got -32"),
    (["--frames", "4294967318"], "frames must be between 1 and 100000, got 4294967318"),
    (["--frames", "1000000000"], "frames must be between 1 and 100000, got 1000000000"),
    (["--seconds", "178956971.58"], "seconds must be a positive number, at most 4166.67 (100000 frames at 24 fps), got 178956971.58"),
    (["--seconds", "1e10"], "got 10000000000.0"),
    (["--seconds", "1e308"], "seconds must be a positive number"),
    (["--seconds", "nan"], "seconds must be a positive number"),
    (["--seconds", "-1e5"], "seconds must be a positive number"),
    (["--steps", "4294967316"], "steps must be between 2 and 1000, got 4294967316"),
    (["--threads", "4294967297"], "--threads must be between 0 and 1024 (0 = all cores), got 4294967297"),
    (["--threads", "4294967295"], "got 4294967295"),
    (["--threads", "-1"], "got -1"),
    (["--reuse", "4294967298"], "reuse must be between 0 and 1000 (0 = off), got 4294967298"),
    (["--layers", "-1"], "layers must be between 0 and 65536 (0 = off), got -1"),
    (["--cache-threshold", "inf"], "cache threshold must be a number between 0 and 100"),
    (["--vae-tile", "4294967552"], "VAE tile size must be 0 (the model's) or a positive number of pixels up to 65536"),
    (["--seed", "-1"], "seed must be between 0 and 18446744073709551615, got -1"),
    (["--lora", "file.safetensors:abc"], "the scale after the last ':' must be a number, got 'abc'"),
    (["--lora", "file.safetensors:nan"], "scale must be a number between"),
])
def test_cli_numbers_refused(tmp_path, argv, needle):
    out = tmp_path / "o.mp4"
    proc = run(*BASE, "-o", out, *argv)
    assert_clean_error(proc, needle)
    assert not out.exists() and not list(tmp_path.iterdir())


RANGES = {"width": (1, 16384), "height": (1, 16384), "frames": (1, 100000), "steps": (2, 1000),
          "vae_tile": (0, 65536), "reuse": (0, 1000), "core_reuse": (0, 1000), "layers": (0, 65536)}


@pytest.mark.parametrize("name, value", [(n, v) for n, (lo, hi) in RANGES.items() for v in EDGE_INTS + EDGE_FLOATS
                                         if not (isinstance(v, int) and lo <= v <= hi)])
def test_api_ints_refused(eng, name, value):
    lo, hi = RANGES[name]
    kw = {name: value}
    if name in ("width", "height"):
        kw.setdefault("width", 128)
        kw.setdefault("height", 128)
        kw[name] = value
    with pytest.raises(H3Error) as e:
        eng.plan(eng.request("x", **kw))
    msg = str(e.value)
    if name in ("width", "height") and value == 0:  # libh3 names the multiple its model needs
        assert "multiples of 32 and at least 32" in msg, msg
        return
    rng = f"up to {hi}" if name == "vae_tile" and isinstance(value, int) else f"between {lo} and {hi}"
    assert rng in msg and (repr(value) in msg or str(value) in msg), msg


def test_api_wrapping_values(eng):
    for kw, needle in ((dict(width=2**32 + 128, height=128), "got 4294967424"),
                       (dict(frames=2**32 + 22), "got 4294967318"), (dict(steps=2**32 + 20), "got 4294967316"),
                       (dict(width=128.9, height=128), "whole number between 1 and 16384 pixels, got 128.9"),
                       (dict(seconds=1e308), "seconds must be a positive number"), (dict(seed=2**64), "seed")):
        with pytest.raises(H3Error, match=needle.replace("(", r"\(").replace(")", r"\)")):
            eng.render("x", **kw)
    with pytest.raises(H3Error, match="threads must be between 0 and 1024"):
        Engine(threads=2**32 + 1)


def test_sample_rate_and_fps_refused():
    from h3ctl import media

    for rate in (10**12, 2**32 + 32000, 2**31, -1, 0, 32000.5, math.nan):
        with pytest.raises(H3Error, match="sample_rate must be a whole number of Hz between 4000 and 384000"):
            media.as_audio_reference({"audio": np.zeros((1, 100), np.float32), "sample_rate": rate}, "ref")
    for fps in (math.nan, math.inf, 0, -24, 1e9):
        with pytest.raises(H3Error, match="frame rate .* must be a number greater than 0 and at most 1000 fps"):
            media.as_video_reference({"frames": np.zeros((2, 32, 32, 3), np.uint8), "fps": fps}, "ref", 32000)


@pytest.mark.parametrize("prompt, needle", [
    ("a red circle\x00 moves left", "NUL character at position 12"),
    ("   ", "the prompt is empty"),
    ("", "the prompt is empty"),
    ("a red \udcff\udcfe circle", "not valid UTF-8: byte 0xFF at character 6"),
])
def test_api_prompts_refused(eng, prompt, needle):
    with pytest.raises(H3Error, match=needle):
        eng.render(prompt, width=128, height=128, frames=5, steps=2)


def test_cli_prompts_refused(tmp_path):
    out = tmp_path / "o.mp4"
    assert_clean_error(run(*BASE[:2], "-p", "   ", "-o", out), "the prompt is empty")
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "h3ctl", "render", "-q", "-p", b"a red \xff\xfe circle", "-o",
                           str(out)], capture_output=True, text=True)
    assert_clean_error(proc, "byte 0xFF")
    assert not out.exists()


def test_prompt_token_limit(tmp_path):
    """The limit is the text encoder's context (h3-tiny: max_position_embeddings 4096); refused in one line
    before the transformer runs."""
    out = tmp_path / "o.mp4"
    proc = run(*BASE[:2], "-p", "red circle " * 3000, "-o", out, "--size", "128x128", timeout=60)
    assert_clean_error(proc, "tokens, more than this model's limit of 4096 (its text encoder's context)")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_preview_cancel_is_package_exception(eng):
    with pytest.raises(Cancelled, match="cancelled"):
        eng.render("x", width=128, height=128, frames=5, steps=3, preview=lambda rgb, s: True)
    try:
        eng.render("x", width=128, height=128, frames=5, steps=3, progress=lambda p, d, t: p == "denoise")
    except Exception as e:  # noqa: BLE001 - the point: a cancel is an Exception
        assert isinstance(e, Cancelled) and str(e)
    else:
        raise AssertionError("not cancelled")


def test_render_summary_steps(tmp_path):
    out = tmp_path / "o.mp4"
    proc = run(*BASE, "-o", out, "--size", "128x128", "--steps", "3", "--frames", "5")
    assert proc.returncode == 0, proc.stderr
    assert ", 3 steps," in proc.stdout, proc.stdout


def test_help_says_zero_is_off():
    proc = run("render", "--help")
    text = " ".join(proc.stdout.split())
    assert "extrapolate the velocity between (0: off)" in text and "0: all of them, off" in text


# The sweep: every numeric option of `render` at the values that wrap or slip through, in-process (no render runs:
# each value is refused before any work). Values a field accepts are left out (they would render).
SWEEP_VALUES = ["0", "-1", "2147483647", "2147483648", "4294967318", "9223372036854775808", "nan", "inf", "12.5"]
SWEEP_OK = {  # the values of SWEEP_VALUES each option accepts
    "--width": set(), "--height": set(), "--frames": set(), "--seconds": {"12.5"}, "--steps": set(),
    "--seed": {"0", "2147483647", "2147483648", "4294967318", "9223372036854775808"}, "--vae-tile": {"0"},
    "--threads": {"0"}, "--device-index": {"0", "2147483647"}, "--reuse": {"0"}, "--core-reuse": {"0"},
    "--layers": {"0"}, "--cache-threshold": {"0", "12.5"}, "--vram": {"0", "12.5"},
}


@pytest.mark.parametrize("option, value", [(o, v) for o, ok in SWEEP_OK.items() for v in SWEEP_VALUES if v not in ok])
def test_cli_numeric_sweep(tmp_path, capsys, option, value):
    from h3ctl.cli import main

    out = tmp_path / "o.mp4"
    code = main(BASE + ["-o", str(out), "--size", "128x128", option, value] if option not in ("--width", "--height")
                else BASE + ["-o", str(out), "--height" if option == "--width" else "--width", "128", option, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("h3ctl: error: "), err
    shown = {"nan": "nan", "inf": "inf"}.get(value, value)
    # (a float option names the value as parsed: 9223372036854775808 -> 9.223372036854776e+18)
    assert shown in err[0] or repr(float(value)) in err[0] or (value == "0" and "0x128" in err[0]), err[0]
    assert not list(tmp_path.iterdir())
