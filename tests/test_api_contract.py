"""The public contract (issue #23): h3.h alone is enough to render; the model owns the request defaults (C and
Python report the same, from its model_index.json); a request decodes its media once; cancellation is public."""

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3ctl import Cancelled, Engine, _lib, media
from h3ctl._lib import H3Error
from h3ctl.context import Context
from h3ctl.engine import EMBEDDED_MODEL

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a red circle moves right on a black background, a high beep"
CC = os.environ.get("CC", "cc")


def _model_with_block(tmp_path: Path, block: dict) -> Path:
    """h3-tiny with FL2VA/model_index.json's h3ctl block replaced by `block` (everything else linked)."""
    d = tmp_path / "model"
    (d / "FL2VA").mkdir(parents=True)
    for p in EMBEDDED_MODEL.iterdir():
        if p.name != "FL2VA":
            (d / p.name).symlink_to(p)
    for p in (EMBEDDED_MODEL / "FL2VA").iterdir():
        if p.name != "model_index.json":
            (d / "FL2VA" / p.name).symlink_to(p)
    index = json.loads((EMBEDDED_MODEL / "FL2VA" / "model_index.json").read_text())
    index["h3ctl"] = block
    (d / "FL2VA" / "model_index.json").write_text(json.dumps(index))
    return d


def _c_defaults(ctx_ptr) -> tuple:
    r = _lib.H3Request()
    rc = _lib.lib().h3_request_default(ctx_ptr, ctypes.byref(r))
    return rc, (r.width, r.height, r.frames, r.steps, r.seed, bool(r.parity))


# ---- defaults: one owner (libh3, from the model) ---------------------------------------------------------------

def test_defaults_come_from_the_model(tmp_path):
    d = _model_with_block(tmp_path, {"default_width": 96, "default_height": 64, "default_frames": 39,
                                     "default_steps": 6, "max_pixels": 65536, "max_frames": 90})
    with Context(d, threads=1) as ctx:
        assert _c_defaults(ctx.ptr) == (0, (96, 64, 39, 6, 42, False))
    with Engine(d, threads=1) as eng:
        assert eng.defaults == {"width": 96, "height": 64, "frames": 39, "steps": 6, "seed": 42}
        plan = eng.plan(eng.request(PROMPT))
        assert (plan["width"], plan["height"], plan["frames"]) == (96, 64, 39)
        res = eng.render(PROMPT)
        assert res.frames.shape == (39, 64, 96, 3) and res.steps == 6 and res.info["steps"] == 5
    # the embedded model's own block (128 x 128, 22 frames; no default_steps: the release's 20)
    with Engine(threads=1) as eng:
        assert eng.defaults == {"width": 128, "height": 128, "frames": 22, "steps": 20, "seed": 42}
    # no context: the release's
    assert _c_defaults(None) == (0, (1344, 768, 124, 20, 42, False))
    # the CLI takes them too: no size, frames or steps given (the summary counts grid points, as --steps does)
    out = tmp_path / "o.wav"
    r = subprocess.run([sys.executable, "-m", "h3ctl", "render", "-d", str(d), "-p", PROMPT, "-o", "", "--wav",
                        str(out), "-q", "--threads", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "39 frames 96x64" in r.stdout and ", 6 steps," in r.stdout, r.stdout


def test_a_bad_default_is_refused_in_one_line(tmp_path):
    d = _model_with_block(tmp_path, {"default_width": 96, "default_height": 64, "default_steps": 1})
    # the block is checked once, when the model opens (check, info and render say the same line)
    with pytest.raises(H3Error, match=r"model_index.json: h3ctl.default_steps must be a whole number between 2 and 1000, got 1"):
        Context(d, threads=1)
    with pytest.raises(H3Error, match=r"model_index.json: h3ctl.default_steps must be a whole number between 2 and 1000"):
        Engine(d, threads=1)
    d2 = _model_with_block(tmp_path / "w", {"default_width": 1 << 31})
    with pytest.raises(H3Error, match="h3ctl.default_width must be a whole number between 1 and 16384"):
        Engine(d2, threads=1)


def test_python_has_no_copy_of_the_defaults_rule():
    for p in (ROOT / "python" / "h3ctl").rglob("*.py"):
        src = p.read_text()
        assert "default_width" not in src and "RELEASE_DEFAULTS" not in src, p


def test_info_without_model_dir_describes_the_embedded_model():
    r = subprocess.run([sys.executable, "-m", "h3ctl", "info", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    with Context(EMBEDDED_MODEL, threads=1) as ctx:
        want = ctx.info()
    assert info["partition"] == want["partition"] and info["components"].keys() == want["components"].keys()
    assert info["components"]["transformer"]["config"] == want["components"]["transformer"]["config"]


# ---- media decoded once ----------------------------------------------------------------------------------------

def test_render_decodes_each_medium_once(tmp_path, monkeypatch):
    """`h3ctl render` with a reference image, video and audio: each file is decoded exactly once, though the
    request is planned before it renders."""
    from h3ctl import render
    from h3ctl.cli import build_parser

    rng = np.random.default_rng(3)
    clip = np.repeat(rng.integers(0, 256, (1, 48, 64, 3), dtype=np.uint8), 20, axis=0)
    t = np.arange(32000, dtype=np.float32) / 32000
    sound = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)]).astype(np.float32) * 0.3
    media.write_mp4(tmp_path / "v.mp4", clip, sound, 32000)
    media.write_wav(tmp_path / "s.wav", sound, 32000)
    from PIL import Image

    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    calls = []
    for name in ("read_image", "read_video", "read_audio"):
        real = getattr(media, name)

        def counted(path, *a, _real=real, _name=name, **k):
            calls.append((_name, Path(path).name))
            return _real(path, *a, **k)

        monkeypatch.setattr(media, name, counted)
    args = build_parser().parse_args(["render", "-p", PROMPT, "--ref-image", str(tmp_path / "a.png"),
                                      "--ref-video", str(tmp_path / "v.mp4"), "--ref-audio", str(tmp_path / "s.wav"),
                                      "--size", "64x64", "--steps", "2", "--threads", "1", "-q", "-o", "",
                                      "--wav", str(tmp_path / "o.wav")])
    assert render.main(args) == 0
    assert (tmp_path / "o.wav").stat().st_size > 44
    # the video's soundtrack is read by read_video itself (one read_audio of v.mp4 inside it)
    assert sorted(calls) == sorted([("read_image", "a.png"), ("read_video", "v.mp4"), ("read_audio", "v.mp4"),
                                    ("read_audio", "s.wav")]), calls


# ---- cancellation is public ------------------------------------------------------------------------------------

def test_cancel_is_public_and_reset_by_the_next_request():
    with Engine(threads=1) as eng:
        assert not eng.cancelled

        def progress(phase, done, total):
            if phase == "denoise" and done == 2:
                eng.cancel()  # from the progress callback, as a Ctrl-C handler would
            return False

        with pytest.raises(Cancelled, match="the render was cancelled$"):
            eng.render(PROMPT, steps=6, progress=progress)
        assert eng.cancelled
        left = []
        with pytest.raises(Cancelled, match="by the step callback"):  # on_step's truthy return cancels the same way
            eng.run(eng.request(PROMPT, steps=6), on_step=lambda done, total: left.append(done) or done == 1)
        assert left == [0, 1] and eng.cancelled
        res = eng.render(PROMPT, steps=3)  # a new request starts uncancelled
        assert not eng.cancelled and res.frames.shape == (22, 128, 128, 3)
        ref = Engine(threads=1).render(PROMPT, steps=3)
        assert np.array_equal(res.frames, ref.frames) and np.array_equal(res.audio, ref.audio)


def test_nothing_outside_the_engine_reads_its_private_state():
    for p in (ROOT / "python" / "h3ctl").rglob("*.py"):
        if p.name == "engine.py":
            continue
        src = p.read_text()
        assert not re.search(r"\._(cancel|raised|progress)\b", src), p


def test_run_is_the_one_step_driver():
    """Engine.step() appears only in Engine.run among the callers in python/h3ctl."""
    for p in (ROOT / "python" / "h3ctl").rglob("*.py"):
        src = p.read_text()
        n = len(re.findall(r"\.step\(\)", src))
        assert n == (1 if p.name == "engine.py" else 0), (p, n)


# ---- h3.h alone is an embedder's header ------------------------------------------------------------------------

def _cc(tmp_path, source: str, *flags) -> subprocess.CompletedProcess:
    src = tmp_path / "x.c"
    src.write_text(source)
    return subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "libh3"), *flags, "-c",
                           str(src), "-o", str(tmp_path / "x.o")], capture_output=True, text=True)


def test_h3h_alone_compiles_the_example_and_not_the_stages(tmp_path):
    ex = (ROOT / "examples" / "render.c").read_text()
    assert '#include "h3.h"' in ex and "h3_stages.h" not in ex
    r = _cc(tmp_path, ex)
    assert r.returncode == 0, r.stderr
    stage_call = "int main(void) { return (int)h3_tokenize(0, 0, 0, 0, 0); }\n"
    r = _cc(tmp_path, '#include "h3.h"\n' + stage_call)
    assert r.returncode != 0 and "h3_tokenize" in r.stderr  # not declared by h3.h
    r = _cc(tmp_path, '#include "h3.h"\nint main(void) { h3_parity p; (void)p; return 0; }\n')
    assert r.returncode != 0 and "h3_parity" in r.stderr  # the injections are not part of it either
    r = _cc(tmp_path, '#include "h3_stages.h"\n' + stage_call)
    assert r.returncode == 0, r.stderr


def test_c_example_renders_the_models_defaults_like_python(tmp_path):
    """build/render with no size: the embedded model's defaults through h3_request_default, the same bytes as
    Engine().render (the default render)."""
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "examples"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    r = subprocess.run([str(ROOT / "build" / "render"), str(EMBEDDED_MODEL), str(out), PROMPT], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("22 frames 128x128"), r.stdout
    frames = sorted(out.glob("frame-*.ppm"))
    assert len(frames) == 22
    with Engine(device="cpu") as eng:
        want = eng.render(PROMPT).frames
    head = b"P6\n128 128\n255\n"
    for i, f in enumerate(frames):
        data = f.read_bytes()
        assert data.startswith(head) and data[len(head):] == want[i].tobytes(), f.name
