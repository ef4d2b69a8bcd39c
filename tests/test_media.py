"""MP4/WAV/PNG writers: valid files, content survives, nothing partial left behind, no overwrite."""

import numpy as np
import pytest

from h3ctl import media
from h3ctl._lib import H3Error

SR = 32000


def _clip(f=24, h=64, w=96):
    frames = np.zeros((f, h, w, 3), np.uint8)
    for i in range(f):
        x = 4 + i * 2
        frames[i, 20:40, x : x + 16] = (230, 40, 30)
    t = np.arange(SR) / SR
    audio = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.1 * np.sin(2 * np.pi * 440 * t)]).astype(np.float32)
    return frames, audio


def test_mp4_streams_and_content(tmp_path):
    frames, audio = _clip()
    out = tmp_path / "a.mp4"
    media.write_mp4(out, frames, audio, SR)
    info = media.probe_mp4(out)
    assert "h264" in info["video"] and "yuv420p" in info["video"] and "96x64" in info["video"]
    assert "aac" in info["audio"] and "32000 Hz" in info["audio"] and "stereo" in info["audio"]
    back = media.read_mp4_frames(out)
    assert back.shape == frames.shape
    assert np.abs(back.astype(int) - frames.astype(int)).mean() < 4.0
    pcm = media.read_mp4_audio(out, SR)
    assert pcm.shape[0] == 2 and abs(pcm.shape[1] - SR) < 2048
    spec = np.abs(np.fft.rfft(pcm[0, 2048:30000]))
    peak = np.argmax(spec) * SR / (30000 - 2048)
    assert abs(peak - 440) < 5
    # the left channel was louder: the pan survives encoding
    assert np.sqrt((pcm[0] ** 2).mean()) > 3 * np.sqrt((pcm[1] ** 2).mean())
    assert [p.name for p in tmp_path.iterdir()] == ["a.mp4"]


def test_wav_roundtrip(tmp_path):
    _, audio = _clip()
    media.write_wav(tmp_path / "a.wav", audio, SR)
    back, sr = media.read_wav(tmp_path / "a.wav")
    assert sr == SR and back.shape == audio.shape
    assert np.abs(back - audio).max() < 1e-4


def test_frames_png_and_ppm(tmp_path):
    frames, _ = _clip(f=3)
    names = media.write_frames_dir(tmp_path / "png", frames)
    assert [n.name for n in names] == ["frame-0001.png", "frame-0002.png", "frame-0003.png"]
    assert names[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    ppm = media.write_frames_dir(tmp_path / "ppm", frames, fmt="ppm")
    raw = ppm[1].read_bytes()
    assert raw.startswith(b"P6\n96 64\n255\n") and raw.endswith(frames[1].tobytes())
    with pytest.raises(H3Error, match="already exists"):
        media.write_frames_dir(tmp_path / "png", frames)


def test_failed_mux_leaves_nothing(tmp_path, monkeypatch):
    frames, audio = _clip(f=4)
    target = tmp_path / "b.mp4"
    monkeypatch.setenv("H3_FFMPEG", "/bin/false")
    with pytest.raises(H3Error, match="ffmpeg failed"):
        media.write_mp4(target, frames, audio, SR)
    assert list(tmp_path.iterdir()) == []


def test_check_writable(tmp_path):
    existing = tmp_path / "x.mp4"
    existing.write_bytes(b"keep")
    with pytest.raises(H3Error, match="already exists"):
        media.check_writable(existing, overwrite=False)
    media.check_writable(existing, overwrite=True)
    with pytest.raises(H3Error, match="does not exist"):
        media.check_writable(tmp_path / "nope" / "y.mp4", overwrite=False)
    with pytest.raises(H3Error, match="x.mp4 is a file, not a folder"):
        media.check_writable(existing / "y.mp4", overwrite=False)  # parent is a file
    with pytest.raises(H3Error, match="is a directory"):
        media.check_writable(tmp_path, overwrite=True)
    assert existing.read_bytes() == b"keep"
