"""`h3ctl render`: outputs, shape rules, refusing to overwrite, unwritable outputs, Ctrl-C."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from h3ctl import media
from tests.h3cli import assert_clean_error, run

PROMPT = "a red circle moves right on a black background, a high beep"


def test_render_writes_mp4_wav_and_frames(tiny_ckpt, tmp_path):
    out, wav, frames = tmp_path / "a.mp4", tmp_path / "a.wav", tmp_path / "frames"
    proc = run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "--size", "64x96", "--frames", "22", "--steps", "3",
               "-o", out, "--wav", wav, "--frames-dir", frames, "--profile", "-q")
    assert proc.returncode == 0, proc.stderr
    info = media.probe_mp4(out)
    assert "h264" in info["video"] and "64x96" in info["video"] and "yuv420p" in info["video"]
    assert "aac" in info["audio"] and "32000 Hz" in info["audio"] and "stereo" in info["audio"]
    assert len(media.read_mp4_frames(out)) == 22
    pcm, sr = media.read_wav(wav)
    assert sr == 32000 and pcm.shape == (2, 37 * 800)
    assert len(list(frames.glob("frame-*.png"))) == 22
    # the profile is a table on stderr, one row per phase with a wall time; stdout keeps the summary line
    for phase in ("encode prompt", "load transformer", "denoise", "decode audio", "decode video", "write outputs"):
        row = next((ln for ln in proc.stderr.splitlines() if ln.startswith(phase)), None)
        assert row is not None, (phase, proc.stderr)
        assert float(row[len(phase):].split()[0].rstrip("s")) >= 0
    assert "peak memory" in proc.stderr and "AdaLN precompute released" in proc.stderr
    assert "peak memory" not in proc.stdout and "a.mp4" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4", "a.wav", "frames"]


def test_skip_mp4_with_empty_output(tiny_ckpt, tmp_path):
    proc = run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "--size", "64x64", "--steps", "3", "-o", "",
               "--wav", tmp_path / "only.wav", "-q")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["only.wav"]


@pytest.mark.parametrize("args,needles", [
    (["--width", "100", "--height", "64"], ["multiples of 32"]),
    (["--size", "0x64"], ["multiples of 32"]),
    (["--size", "64"], ["--size must look like"]),
    (["--frames", "363"], ["exceed this model's limit of 362"]),
    (["--seconds", "16"], ["exceed this model's limit"]),
    (["--frames", "22", "--seconds", "1"], ["not allowed with argument"]),
    (["--steps", "1"], ["steps must be between 2 and 1000"]),
    (["--threads", "-1"], ["--threads"]),
    (["--seconds", "-2"], ["seconds must be a positive number"]),
    (["--size", "1536x1536"], ["more than this model's limit"]),
])
def test_bad_render_requests(tiny_ckpt, tmp_path, args, needles):
    out = tmp_path / "x.mp4"
    proc = run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", out, "-q", *args)
    assert_clean_error(proc, *needles)
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_not_overwritten(tiny_ckpt, tmp_path):
    out = tmp_path / "keep.mp4"
    out.write_bytes(b"precious")
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", out, "-q"), "already exists",
                       "--overwrite")
    assert out.read_bytes() == b"precious"
    proc = run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "--size", "64x64", "--steps", "3", "-o", out, "-q",
               "--overwrite")
    assert proc.returncode == 0 and out.read_bytes()[4:8] == b"ftyp"


def test_unwritable_and_bad_paths(tiny_ckpt, tmp_path):
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", tmp_path / "no" / "x.mp4", "-q"),
                       "output folder does not exist")
    assert_clean_error(run("render", "-d", tmp_path / "missing", "-p", PROMPT, "-o", tmp_path / "x.mp4", "-q"),
                       "no such directory")
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", "", "-o", tmp_path / "x.mp4", "-q"),
                       "the prompt is empty")
    (tmp_path / "f").write_text("x")
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", "", "--frames-dir", tmp_path / "f",
                           "-q"), "not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_missing_ffmpeg_is_said_before_the_render(tiny_ckpt, tmp_path):
    """An install without imageio-ffmpeg (an offline --no-deps install), or an H3_FFMPEG that is not a program:
    one line before any work (no render, so no progress and no time spent), nothing written; --wav still works."""
    import os

    block = tmp_path / "block" / "imageio_ffmpeg"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(block.parent), os.environ.get("PYTHONPATH", "")]))
    env.pop("H3_FFMPEG", None)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    line = assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", out / "x.mp4", env=env),
                              "imageio-ffmpeg is not installed", "pip install imageio-ffmpeg")
    assert "Traceback" not in line and time.monotonic() - t0 < 30
    env2 = dict(os.environ, H3_FFMPEG=str(tmp_path / "no-ffmpeg"))
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", out / "x.mp4", env=env2),
                       "H3_FFMPEG=", "not an executable file")
    assert list(out.iterdir()) == []
    proc = run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", "", "--wav", out / "a.wav", "--steps", "2", "-q",
               env=env)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in out.iterdir()] == ["a.wav"]


def test_ctrl_c_stops_cleanly(tmp_path):
    """SIGINT during denoising: exit 130, one line, no output and no temporary file left."""
    from tests.fixtures import make_checkpoint

    part = make_checkpoint(tmp_path / "m", "wide", seed=2)
    out = tmp_path / "o"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "h3ctl", "render", "-d", str(part.parent), "-p", PROMPT,
                             "--size", "256x256", "--frames", "56", "--steps", "400", "-o", str(out / "x.mp4"),
                             "--wav", str(out / "x.wav"), "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(4.0)
    assert proc.poll() is None, "the render finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip() == "h3ctl: interrupted"
    assert list(out.iterdir()) == []


def test_vae_tile_option(tiny_ckpt, tmp_path):
    """Smaller decoder tiles blend differently (as diffusers' tiling does) but decode the same video."""
    from h3ctl import Engine

    with Engine(tiny_ckpt.parent, threads=2) as eng:
        whole = eng.render(PROMPT, 96, 160, 22, steps=3, seed=5)
        tiled = eng.render(PROMPT, 96, 160, 22, steps=3, seed=5, vae_tile=96)
    assert not np.array_equal(whole.frames, tiled.frames)
    assert np.abs(whole.frames.astype(int) - tiled.frames).mean() < 40
    assert np.array_equal(whole.audio, tiled.audio)
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", tmp_path / "x.mp4", "-q",
                           "--vae-tile", "40"), "VAE tile size 40 must be a multiple of 16")
    assert_clean_error(run("render", "-d", tiny_ckpt.parent, "-p", PROMPT, "-o", tmp_path / "x.mp4", "-q",
                           "--vae-tile", "-16"), "VAE tile size must be 0")
    assert list(tmp_path.iterdir()) == []
