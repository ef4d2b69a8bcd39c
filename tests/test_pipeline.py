"""End to end: libh3's text -> video + stereo audio against diffusers' modular pipeline, determinism,
the Python API and the C API from C alone."""

import os
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from h3ctl import Engine
from tests.h3cli import run as cli
from tests.pipeline_oracle import diffusers_pipeline, rel_l2, run as run_diffusers

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a red circle moves right on a black background, a high beep"


def _noise(engine, width, height, frames, seed=11):
    plan = engine.plan(engine.request(PROMPT, width, height, frames))
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((plan["latent_channels"], plan["latent_frames"], plan["latent_height"],
                             plan["latent_width"])).astype(np.float32)
    a = rng.standard_normal((2, plan["audio_latent_channels"], plan["audio_latents"])).astype(np.float32)
    return v, a


@pytest.mark.parametrize("config,width,height,frames,steps", [("tiny", 64, 96, 22, 4), ("odd", 96, 64, 39, 6)])
def test_pipeline_matches_diffusers(config, width, height, frames, steps, tmp_path):
    from tests.fixtures import build_models, write_official

    models = build_models(config, seed=5)
    part = write_official(models, tmp_path / "m", dtype="f32")
    with Engine(part.parent, threads=2) as eng:
        v, a = _noise(eng, width, height, frames)
    inputs = tmp_path / "in.safetensors"
    save_file({"prompt": np.frombuffer(PROMPT.encode(), np.uint8).copy(), "latents": v[None], "audio_latents": a,
               "width": np.array([width]), "height": np.array([height]), "num_frames": np.array([frames]),
               "num_inference_steps": np.array([steps])}, inputs)
    proc = cli("parity", "pipeline", "--model", part.parent, "--inputs", inputs, "--out", tmp_path / "out.safetensors")
    assert proc.returncode == 0, proc.stderr
    ours = load_file(tmp_path / "out.safetensors")
    ref_video, ref_audio = run_diffusers(diffusers_pipeline(models, part / "tokenizer"), PROMPT, width, height, frames,
                                         steps, v, a)
    assert ours["videos"].shape == ref_video.shape == (1, frames, height, width, 3)
    assert ours["audio"].shape == ref_audio.shape
    ev, ea = rel_l2(ours["videos"], ref_video), rel_l2(ours["audio"], ref_audio)
    print(f"parity: pipeline {config} {width}x{height}x{frames} {steps} steps: decoded video rel-L2 {ev:.2e}, audio rel-L2 {ea:.2e}")
    assert ev <= 1e-3 and ea <= 1e-3
    # the test would notice a different prompt: the conditioning matters
    other_video, _ = run_diffusers(diffusers_pipeline(models, part / "tokenizer"), "a blue square", width, height,
                                   frames, steps, v, a)
    assert rel_l2(ours["videos"], other_video) > 10 * max(ev, 1e-6)


def test_same_seed_byte_identical_across_runs_and_threads(tiny_ckpt):
    results = []
    for threads in (1, 2, 2):
        with Engine(tiny_ckpt.parent, threads=threads) as eng:
            results.append(eng.render(PROMPT, 64, 64, 22, steps=5, seed=1234))
    for r in results[1:]:
        assert np.array_equal(r.frames, results[0].frames)
        assert r.audio.tobytes() == results[0].audio.tobytes()
    with Engine(tiny_ckpt.parent, threads=2) as eng:
        other = eng.render(PROMPT, 64, 64, 22, steps=5, seed=1235)
    assert not np.array_equal(other.frames, results[0].frames)


def test_engine_stays_loaded_and_reuses_the_prompt(tiny_ckpt, tmp_path):
    from h3ctl import text

    with Engine(tiny_ckpt.parent, threads=2) as eng:
        first = eng.render(PROMPT, 64, 64, 22, steps=3, seed=7)
        before = text.cache_stats(eng._ctx)
        second = eng.render(PROMPT, 64, 64, 22, steps=3, seed=7)
        after = text.cache_stats(eng._ctx)
        assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"]
        assert np.array_equal(first.frames, second.frames)
        assert first.frames.dtype == np.uint8 and first.frames.shape == (22, 64, 64, 3)
        assert first.audio.dtype == np.float32 and first.audio.shape == (2, 37 * 800)
        assert first.sample_rate == 32000
        out = first.save(tmp_path / "a.mp4")
        assert out.stat().st_size > 1000
        first.save(tmp_path / "a.wav")
        with wave.open(str(tmp_path / "a.wav")) as w:
            assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 32000, 37 * 800)


def test_injected_noise_is_used(tiny_ckpt):
    with Engine(tiny_ckpt.parent, threads=2) as eng:
        v, a = _noise(eng, 64, 64, 22)
        eng.prepare(PROMPT, 64, 64, 22, steps=3, video_noise=v, audio_noise=a)
        lv, la = eng.latents()
        assert np.array_equal(lv, v) and np.array_equal(la, a)
        with pytest.raises(Exception, match="video_noise must have shape"):
            eng.prepare(PROMPT, 64, 64, 22, steps=3, video_noise=v[:, :3])


def test_c_example_renders_frames_and_wav(tiny_ckpt, tmp_path):
    subprocess.run(["make", "-s", "-C", str(ROOT), "examples"], check=True)
    out = tmp_path / "c_out"
    proc = subprocess.run([str(ROOT / "build" / "render"), str(tiny_ckpt.parent), str(out), PROMPT, "64", "64",
                           "22", "5", "99"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    ppm = sorted(out.glob("frame-*.ppm"))
    assert len(ppm) == 22
    with Engine(tiny_ckpt.parent, threads=2) as eng:
        ref = eng.render(PROMPT, 64, 64, 22, steps=5, seed=99)
    header = b"P6\n64 64\n255\n"
    for i, p in enumerate(ppm):
        raw = p.read_bytes()
        assert raw[: len(header)] == header and raw[len(header):] == ref.frames[i].tobytes()
    with wave.open(str(out / "audio.wav")) as w:
        assert (w.getnchannels(), w.getframerate()) == (2, 32000)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2).T / 32767.0
    assert np.abs(pcm - ref.audio).max() < 2e-4
