"""The CI part of the reference media fuzzing (tests/fuzz/media_fuzz.py has the cases and the longer run).

* in process: every out-of-range header case and a seeded handful of truncated / overwritten / random /
  zero-length / mislabelled WAV, FLAC, MP3, PNG, JPEG and WebP files through media.read_audio / read_image: a
  one-line H3Error naming the file, or (for overwritten payloads and audio under another audio extension only) a
  valid decode;
* through the CLI (`h3ctl render --ref-audio` / `--ref-image`): a few of the must-fail cases end with one line,
  exit 2, no traceback and nothing written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from media_fuzz import base_files, cases, check, header_cases  # noqa: E402

from tests.h3cli import assert_clean_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "python" / "h3ctl" / "models" / "h3-tiny"
SEED = 20261201


@pytest.fixture(scope="module")
def files():
    return base_files()


def test_seeded_cases(files, tmp_path):
    todo = header_cases() + cases(files, SEED, 48)
    broken, refused = [], 0
    for name, data, expect in todo:
        p = tmp_path / name
        p.write_bytes(data)
        why = check(p, expect)
        if why:
            broken.append(f"{name}: {why}")
        refused += expect == "fail"
    assert not broken, "\n".join(broken)
    assert refused >= 30  # most cases are ones that must be refused: the check is not vacuous


@pytest.fixture(scope="module")
def ref2va_model():
    """h3-tiny, which has a Ref2VA/ partition (audio is decoded once the Engine is open)."""
    assert (TINY / "Ref2VA" / "transformer").is_dir()
    return TINY


def _cli_cases(files):
    return [
        ("--ref-audio", "cut.wav", files["wav"][:5000], "truncated"),
        ("--ref-audio", "cut.mp3", files["mp3"][:len(files["mp3"]) // 2], "truncated"),
        ("--ref-audio", "noise.flac", bytes(range(256)) * 4, "not an audio file"),
        ("--ref-audio", "picture.wav", files["png"], "not an audio file"),
        ("--ref-image", "sound.png", files["wav"], "not an image"),
    ]


@pytest.mark.parametrize("k", range(5))
def test_cli_refuses(files, ref2va_model, tmp_path, k):
    flag, name, data, needle = _cli_cases(files)[k]
    (tmp_path / name).write_bytes(data)
    (tmp_path / "good.png").write_bytes(files["png"])
    refs = ["--ref-image", str(tmp_path / "good.png")] if flag == "--ref-audio" else []
    out = tmp_path / "out.mp4"
    before = sorted(str(q) for q in tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "h3ctl", "render", "-d", str(ref2va_model), "-p", "x", "--size",
                           "64x64", "--steps", "2", "-q", "-o", str(out), "--wav", str(tmp_path / "out.wav"), *refs,
                           flag, str(tmp_path / name)], capture_output=True, text=True, timeout=120)
    what = "reference audio 2" if flag == "--ref-audio" else "reference image 1"
    assert_clean_error(proc, what, name, needle)
    assert sorted(str(q) for q in tmp_path.rglob("*")) == before  # nothing written
