"""Writing what a render produces: MP4 (H.264 + AAC through the bundled ffmpeg), WAV, PNG/PPM frames.

Every writer goes to a temporary name next to the target and renames on success, so an
interrupted or failed write never leaves a partial file under the final name and never
replaces an existing file half-way.
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import wave
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ._lib import H3Error

FPS = 24


def ffmpeg_exe() -> str:
    env = os.environ.get("H3_FFMPEG")
    if env:
        return env
    try:
        import imageio_ffmpeg
    except ImportError:  # pragma: no cover - a runtime dependency
        raise H3Error("imageio-ffmpeg is not installed (it provides the bundled ffmpeg)") from None
    return imageio_ffmpeg.get_ffmpeg_exe()


def check_writable(path: str | os.PathLike, overwrite: bool) -> Path:
    """Fail early (before any compute) if `path` cannot be written or would be overwritten."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise H3Error(f"{p}: already exists (pass --overwrite to replace it)")
    if p.exists() and p.is_dir():
        raise H3Error(f"{p}: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise H3Error(f"{parent}: output folder does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise H3Error(f"{parent}: output folder is not writable")
    return p


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path in the same folder; rename it onto `path` only if the block succeeds."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.partial-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, p)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def _as_frames(frames: np.ndarray) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise H3Error(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    return np.ascontiguousarray(frames)


def _as_audio(audio: np.ndarray) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 2 or audio.shape[0] != 2:
        raise H3Error(f"audio must be float32 [2, samples], got {list(audio.shape)}")
    return audio


def write_wav(path: str | os.PathLike, audio: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM stereo WAV (clipped to [-1, 1])."""
    audio = _as_audio(audio)
    pcm = np.clip(np.round(audio.T * 32767.0), -32768, 32767).astype("<i2")
    with atomic_path(path) as tmp:
        with wave.open(str(tmp), "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(int(sample_rate))
            w.writeframes(pcm.tobytes())


def read_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        n, ch, sr, width = w.getnframes(), w.getnchannels(), w.getframerate(), w.getsampwidth()
        data = w.readframes(n)
    if width != 2:
        raise H3Error(f"{path}: only 16-bit WAV is supported")
    pcm = np.frombuffer(data, dtype="<i2").reshape(-1, ch).T.astype(np.float32) / 32767.0
    return pcm, sr


def encode_png(rgb: np.ndarray) -> bytes:
    """A minimal PNG encoder (8-bit RGB, no filtering)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def write_frames_dir(folder: str | os.PathLike, frames: np.ndarray, fmt: str = "png", overwrite: bool = False) -> list[Path]:
    """frame-0001.png ... into `folder` (created if needed). Existing frames are kept unless overwrite."""
    frames = _as_frames(frames)
    if fmt not in ("png", "ppm"):
        raise H3Error(f"frame format must be png or ppm, got '{fmt}'")
    d = Path(folder)
    if d.exists() and not d.is_dir():
        raise H3Error(f"{d}: exists and is not a folder")
    d.mkdir(parents=True, exist_ok=True)
    names = [d / f"frame-{i + 1:04d}.{fmt}" for i in range(len(frames))]
    clash = [n for n in names if n.exists()]
    if clash and not overwrite:
        raise H3Error(f"{clash[0]}: already exists (pass --overwrite to replace frames)")
    for name, rgb in zip(names, frames):
        with atomic_path(name) as tmp:
            if fmt == "png":
                tmp.write_bytes(encode_png(rgb))
            else:
                h, w, _ = rgb.shape
                tmp.write_bytes(f"P6\n{w} {h}\n255\n".encode() + rgb.tobytes())
    return names


def write_mp4(path: str | os.PathLike, frames: np.ndarray, audio: np.ndarray | None, sample_rate: int,
              fps: int = FPS, crf: int = 18) -> None:
    """H.264 yuv420p + AAC stereo through the bundled ffmpeg; video and audio on two pipes."""
    frames = _as_frames(frames)
    f, h, w, _ = frames.shape
    if w % 2 or h % 2:
        raise H3Error(f"H.264 yuv420p needs even dimensions, got {w}x{h}")
    args = [ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", str(fps), "-i", "pipe:0"]
    rfd = wfd = None
    if audio is not None:
        audio = _as_audio(audio)
        rfd, wfd = os.pipe()
        args += ["-f", "f32le", "-ar", str(int(sample_rate)), "-ac", "2", "-i", f"pipe:{rfd}",
                 "-map", "0:v", "-map", "1:a"]
    args += ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-preset", "veryfast", "-crf", str(crf)]
    if audio is not None:
        args += ["-c:a", "aac", "-b:a", "192k", "-ar", str(int(sample_rate)), "-ac", "2"]
    args += ["-movflags", "+faststart", "-f", "mp4"]
    with atomic_path(path) as tmp:
        errors: list[BaseException] = []
        proc = subprocess.Popen(args + [str(tmp)], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(rfd,) if rfd is not None else (),
                                start_new_session=True)  # Ctrl-C reaches us, and we stop ffmpeg cleanly
        if rfd is not None:
            os.close(rfd)

        def feed_video():
            try:
                for fr in frames:
                    proc.stdin.write(fr.tobytes())
                proc.stdin.close()
            except (BrokenPipeError, OSError) as e:
                errors.append(e)

        def feed_audio():
            try:
                interleaved = np.ascontiguousarray(audio.T, dtype="<f4").tobytes()
                with os.fdopen(wfd, "wb", closefd=True) as fa:
                    fa.write(interleaved)
            except (BrokenPipeError, OSError) as e:
                errors.append(e)

        # Both pipes concurrently: ffmpeg reads its inputs interleaved, and a full pipe on one
        # side would otherwise block the other forever.
        threads = [threading.Thread(target=feed_video, daemon=True)]
        if audio is not None:
            threads.append(threading.Thread(target=feed_audio, daemon=True))
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            err = proc.stderr.read().decode("utf-8", "replace")
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if rc != 0:
            last = err.strip().splitlines()[-1] if err.strip() else f"exit status {rc}"
            raise H3Error(f"{path}: ffmpeg failed: {last}")
        if errors:
            raise H3Error(f"{path}: writing to ffmpeg failed: {errors[0]}")


def probe_mp4(path: str | os.PathLike) -> dict:
    """Stream facts of an MP4 as ffmpeg reports them (there is no ffprobe in the bundled build)."""
    proc = subprocess.run([ffmpeg_exe(), "-hide_banner", "-i", str(path)], capture_output=True, text=True)
    info = {"video": None, "audio": None}
    for line in proc.stderr.splitlines():
        line = line.strip()
        if line.startswith("Stream") and "Video:" in line:
            info["video"] = line
        elif line.startswith("Stream") and "Audio:" in line:
            info["audio"] = line
    return info


def read_mp4_frames(path: str | os.PathLike) -> np.ndarray:
    """Decode an MP4 back to uint8 frames (tests and semantic checks)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    w, h = meta["size"]
    return np.stack([np.frombuffer(fr, dtype=np.uint8).reshape(h, w, 3) for fr in reader])


def read_mp4_audio(path: str | os.PathLike, sample_rate: int = 32000) -> np.ndarray:
    proc = subprocess.run([ffmpeg_exe(), "-v", "error", "-i", str(path), "-vn", "-f", "f32le", "-ac", "2",
                           "-ar", str(sample_rate), "-"], capture_output=True)
    if proc.returncode != 0:
        raise H3Error(f"{path}: cannot decode audio: {proc.stderr.decode(errors='replace').strip()}")
    return np.frombuffer(proc.stdout, dtype="<f4").reshape(-1, 2).T.copy()
