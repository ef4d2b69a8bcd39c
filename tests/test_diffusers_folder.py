"""diffusers-format MiniMax-H3 files (issue #25; docs/single-files.md, "diffusers' names").

The fixtures' random tiny models (`build_models("tiny", seed=0)`) are saved with diffusers' own `save_pretrained`
next to the official layout written from the same models (`write_official`, all-F32 so both hold the same values):

* the transformer's `diffusion_pytorch_model.safetensors` (diffusers' names: separate to_q/to_k/to_v,
  `ff.net.0.proj` [value; gate], no `rope.inv_freq`): every tensor of the official shard equals what libh3 presents
  from it, byte for byte (build/tests/test_single_file compares the stores), `rope.inv_freq` included (computed as
  diffusers computes its buffer);
* a render with `--transformer` that file and the official folder's configs is byte-identical (tolerance 0) to the
  official layout's render;
* `h3ctl check` and `h3ctl info` name the file's form (diffusers' names);
* the video VAE's file (diffusers' names: `encoder.down_blocks`, `decoder.proj_in`, separate to_q/to_k/to_v,
  `ff.net.*`) equals the official `video_vae/source/model.safetensors` as presented, byte for byte;
* the whole folder given with `-d` (configs translated by h3ctl/diffusers_folder.py; the text encoder and audio
  VAE files under their own names) renders byte-identically to the official layout, through Engine and the CLI;
* bad input: a folder whose model_index.json lacks a component, one whose component's weights are missing, a wrong
  class name, a diffusers transformer without its to_k tensors: one line and exit 2, nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "python"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from h3ctl import Engine, components  # noqa: E402
from tests.h3cli import assert_clean_error, run  # noqa: E402

SHAPE = dict(width=32, height=32, frames=22, steps=2)
PROMPT = "a red circle moves right on a black background, a high beep"
SEED = 3
COMPARE = ROOT / "build" / "tests" / "test_single_file"
MODEL_INDEX = {  # what diffusers' modular MiniMax-H3 pipeline names (its ComponentSpecs)
    "_class_name": "MiniMaxH3ModularPipeline",
    "transformer": ["diffusers", "MiniMaxH3Transformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLMiniMaxH3"],
    "audio_vae": ["diffusers", "AutoencoderKLMiniMaxH3Audio"],
    "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
    "tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "scheduler": ["diffusers", "MiniMaxH3Scheduler"],
    "audio_scheduler": ["diffusers", "MiniMaxH3Scheduler"],
}


@pytest.fixture(scope="module")
def folders(tiny_models, tmp_path_factory):
    from tests.fixtures import write_official
    from tests.fixtures.official import write_tokenizer

    root = tmp_path_factory.mktemp("h3_diffusers")
    official = write_official(tiny_models, root / "official", dtype="f32")
    diff = root / "diffusers"
    for sub, key in (("transformer", "transformer"), ("vae", "video_vae"), ("audio_vae", "audio_vae"),
                     ("text_encoder", "text_encoder")):
        tiny_models[key].save_pretrained(str(diff / sub))
    write_tokenizer(tiny_models["tokenizer_json"], diff, None)
    for sub, shift in (("scheduler", 12.0), ("audio_scheduler", 3.0)):
        (diff / sub).mkdir()
        (diff / sub / "scheduler_config.json").write_text(json.dumps({"_class_name": "MiniMaxH3Scheduler",
                                                                       "shift": shift}))
    (diff / "model_index.json").write_text(json.dumps(MODEL_INDEX))
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "build/tests/test_single_file"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return official, diff, tiny_models["transformer"].config


def _render(model_dir, **files):
    with Engine(model_dir, threads=2, **files) as e:
        return e.render(PROMPT, seed=SEED, **SHAPE)


def test_transformer_tensors_equal_official(folders):
    official, diff, cfg = folders
    single = diff / "transformer" / "diffusion_pytorch_model.safetensors"
    ref = official / "transformer" / "model.safetensors"
    from safetensors import safe_open

    with safe_open(str(ref), "np") as f:
        n_ref = len(list(f.keys()))
    proc = subprocess.run([str(COMPARE), str(single), str(ref), str(cfg.num_attention_heads),
                           str(cfg.rope_freq_dim), str(cfg.rope_theta)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"compare: {n_ref} tensors equal, 0 differ" in proc.stdout
    assert "diffusers' names" in proc.stdout


def test_video_vae_tensors_equal_official(folders, tiny_models):
    official, diff, _ = folders
    single = diff / "vae" / "diffusion_pytorch_model.safetensors"
    ref = official / "video_vae" / "source" / "model.safetensors"
    from safetensors import safe_open

    with safe_open(str(ref), "np") as f:
        n_ref = len(list(f.keys()))
    heads = tiny_models["video_vae"].config.decoder_num_attention_heads
    proc = subprocess.run([str(COMPARE), str(single), str(ref), str(heads), "video_vae"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"compare: {n_ref} tensors equal, 0 differ" in proc.stdout


def test_render_equals_official(folders, tmp_path):
    official, diff, _ = folders
    single = diff / "transformer" / "diffusion_pytorch_model.safetensors"
    a = _render(official.parent)
    b = _render(official.parent, transformer=single)
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.audio, b.audio)
    with Engine(diff, threads=2) as e:
        assert set(e.files) == {"transformer", "text_encoder", "video_vae", "audio_vae"}
        c = e.render(PROMPT, seed=SEED, **SHAPE)
    assert np.array_equal(a.frames, c.frames) and np.array_equal(a.audio, c.audio)
    out = tmp_path / "o.mp4"
    proc = run("render", "-p", PROMPT, "-d", diff, "-o", out, "--width", 32, "--height", 32, "--frames", 22,
               "--steps", 2, "--threads", 2)
    assert proc.returncode == 0 and out.stat().st_size > 1000, proc.stderr


def _variant(diff: Path, dst: Path, index: dict, drop: str | None = None) -> Path:
    dst.mkdir()
    for p in diff.iterdir():
        if p.is_dir() and p.name != drop:
            (dst / p.name).symlink_to(p)
    (dst / "model_index.json").write_text(json.dumps(index))
    return dst


def test_bad_diffusers_input(folders, tmp_path):
    official, diff, _ = folders
    out = tmp_path / "out.mp4"
    common = ("-o", out, "--width", 32, "--height", 32, "--frames", 22, "--steps", 2)
    no_audio = {k: v for k, v in MODEL_INDEX.items() if k != "audio_vae"}
    for d, needle in ((_variant(diff, tmp_path / "a", no_audio, "audio_vae"), "no 'audio_vae' component"),
                      (_variant(diff, tmp_path / "b", MODEL_INDEX, "audio_vae"), "audio_vae/diffusion_pytorch_model"),
                      (_variant(diff, tmp_path / "c", {**MODEL_INDEX, "vae": ["diffusers", "AutoencoderKLWan"]}),
                       "'vae' is 'AutoencoderKLWan', expected AutoencoderKLMiniMaxH3")):
        proc = run("render", "-p", "x", "-d", d, *common)
        assert_clean_error(proc, needle)
        assert not out.exists()

    from safetensors.numpy import load_file, save_file

    t = load_file(str(diff / "transformer" / "diffusion_pytorch_model.safetensors"))
    del t["transformer_blocks.0.attn.to_k.weight"]
    broken = tmp_path / "broken.safetensors"
    save_file(t, str(broken))
    proc = run("render", "-p", "x", "-d", official.parent, "--transformer", broken, *common)
    assert_clean_error(proc, "transformer_blocks.0.attn.to_k.weight")
    assert not out.exists()
    assert components.is_diffusers_folder(diff)


def test_check_and_info_name_diffusers_file(folders):
    official, diff, _ = folders
    single = diff / "transformer" / "diffusion_pytorch_model.safetensors"
    proc = run("check", single)
    assert proc.returncode == 0 and "transformer under diffusers' names" in proc.stdout, proc.stdout + proc.stderr
    proc = run("check", diff)
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split(" ok (")[1].split(")")[0] for line in proc.stdout.splitlines()) == \
        ["audio_vae", "text_encoder", "transformer", "video_vae"], proc.stdout
    proc = run("info", "-d", diff)
    assert proc.returncode == 0 and proc.stdout.count("(diffusers' names)") == 2, proc.stdout + proc.stderr
    proc = run("info", "-d", official.parent, "--transformer", single)
    assert proc.returncode == 0, proc.stderr
    assert "diffusers' names" in proc.stdout and "QKV" in proc.stdout, proc.stdout
