"""tests/bench_render_released.py's plumbing, through its --dry-run (toy widths on the CPU): the checkpoint it writes
renders, every phase is measured on both sides, and the extrapolation is the arithmetic its docstring states. Not a
timed test: no number is compared with a bound, only with the measurements it was derived from."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    pytest.importorskip("diffusers")
    out = tmp_path_factory.mktemp("bench") / "render.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_render_released.py"), "--dry-run", "--repeats",
                           "1", "--threads", "2", "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_every_phase_measured_on_both_sides(dry_run):
    proc, res = dry_run
    runs = res["libh3"]["64x64x22"]
    assert len(runs) == 2  # cold, then warm
    for run in runs:
        assert set(run["phases"]) == {"encode prompt", "load transformer", "denoise", "decode audio", "decode video"}
        assert all(p["wall_s"] > 0 for p in run["phases"].values())
        assert run["frames"] == [22, 64, 64, 3] and run["audio_samples"] == 37 * 800  # 37 audio latents x hop 800
        assert run["transformer"]["forwards"] == 2 and run["prompt_tokens"] > 0
    d = res["diffusers"]["64x64x22"]
    assert d["prompt_tokens"] == runs[-1]["prompt_tokens"]
    for k in ("text_ms", "video_decode_ms", "audio_decode_ms"):
        assert d[k] > 0
    assert d["transformer"]["forward_ms"] > 0 and d["transformer"]["eager_block_ms"] > 0
    for phase in ("text encoder", "denoise", "video decode", "audio decode", "total", "load transformer", "write MP4"):
        assert f"| {phase} |" in proc.stdout or f"| **{phase}** |" in proc.stdout, phase


def test_extrapolation_is_the_stated_arithmetic(dry_run):
    _, res = dry_run
    cfg = res["config"]
    run = res["libh3"]["64x64x22"][-1]
    ex = res["extrapolated"]["64x64x22"]["libh3"]
    tp, ph = run["transformer"], run["phases"]
    # the fastest forward (a render's first also builds its plans); the text encoder from this render's encode
    # unless that was a prompt-cache hit (then another warm render's)
    block = tp["stack_ms_min"] / 1e3 / cfg["blocks"]
    fixed = (tp["forward_ms_min"] - tp["stack_ms_min"]) / 1e3
    outside = max(0.0, ph["denoise"]["wall_s"] - tp["transformer_ms"] / 1e3)
    assert ex["denoise_s"] == pytest.approx(outside + 19 * (fixed + 50 * block), rel=1e-9)
    enc = ph["encode prompt"]["wall_s"]
    assert ex["text_encode_s"] == enc or enc < 0.005
    assert ex["text_s"] == pytest.approx(ex["text_encode_s"] / cfg["text_layers"] * 50, rel=1e-9)
    assert ex["total_s"] == pytest.approx(ex["text_s"] + ex["denoise_s"] + ph["decode audio"]["wall_s"]
                                          + ph["decode video"]["wall_s"], rel=1e-9)
    d, dx = res["diffusers"]["64x64x22"], res["extrapolated"]["64x64x22"]["diffusers"]
    t = d["transformer"]
    assert dx["denoise_s"] == pytest.approx(19 * (t["forward_ms"] - 4 * t["eager_block_ms"]
                                                  + 50 * t["eager_block_ms"]) / 1e3, rel=1e-9)
    assert dx["text_s"] == pytest.approx(d["text_ms"] / (cfg["text_layers"] + 1) * 50 / 1e3, rel=1e-9)


def test_few_step_run_extrapolates_to_its_own_step_count(tmp_path):
    """--steps 5 --full-steps 5 --schedule turbo-544p (issue #26's 4-evaluation render): 4 forwards measured, the
    tables extrapolate to 4 forwards, not 19, and the schedule is the one asked for."""
    pytest.importorskip("diffusers")
    out = tmp_path / "render4.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_render_released.py"), "--dry-run", "--repeats",
                           "1", "--threads", "2", "--steps", "5", "--full-steps", "5", "--schedule", "turbo-544p",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["config"]["full_steps"] == 5 and res["config"]["schedule"] == "turbo-544p"
    run = res["libh3"]["64x64x22"][-1]
    tp, ph = run["transformer"], run["phases"]
    assert tp["forwards"] == 4
    block = tp["stack_ms_min"] / 1e3 / res["config"]["blocks"]
    fixed = (tp["forward_ms_min"] - tp["stack_ms_min"]) / 1e3
    outside = max(0.0, ph["denoise"]["wall_s"] - tp["transformer_ms"] / 1e3)
    assert res["extrapolated"]["64x64x22"]["libh3"]["denoise_s"] == pytest.approx(outside + 4 * (fixed + 50 * block),
                                                                                 rel=1e-9)
    assert "5 steps (4 forwards, schedule turbo-544p)" in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "tests" / "bench_render_released.py"), "--dry-run",
                          "--full-steps", "1"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert bad.returncode == 2 and "--full-steps" in bad.stderr
