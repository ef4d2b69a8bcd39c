"""Writing what a render produces: MP4 (H.264 + AAC through the bundled ffmpeg), WAV, PNG/PPM frames;
reading keyframe images (PNG, JPEG, WebP, GIF, BMP) through the same ffmpeg.

Every writer goes to a temporary name next to the target and renames on success, so an
interrupted or failed write never leaves a partial file under the final name and never
replaces an existing file half-way.
"""

from __future__ import annotations

import os
import re
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
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise H3Error(f"H3_FFMPEG={env}: not an executable file")
        return env
    try:
        import imageio_ffmpeg
    except ImportError:  # a runtime dependency an offline --no-deps install can lack
        raise H3Error("imageio-ffmpeg is not installed (it provides the bundled ffmpeg for MP4s): pip install "
                      "imageio-ffmpeg, or write only --wav / --frames-dir") from None
    return imageio_ffmpeg.get_ffmpeg_exe()


def check_writable(path: str | os.PathLike, overwrite: bool) -> Path:
    """Fail early (before any compute) if `path` cannot be written or would be overwritten (the checks of
    h3ctl.outputs.check_target: a directory, an existing file, something not a regular file, a parent that is a
    file or missing)."""
    from .outputs import check_target

    return check_target(path, overwrite)


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


# ---- keyframe images -------------------------------------------------------------------------------

# Keyframes larger than this are refused before they are decoded (libh3's limit, core/keyframe.h).
MAX_IMAGE_PIXELS = 64_000_000
IMAGE_FORMATS = "PNG, JPEG, WebP, GIF or BMP"

# ffmpeg's colour conversion closest to PIL's for JPEG (4:2:0 chroma interpolated, exact rounding):
# within 3 levels of PIL's decode on our test images; PNG, WebP (lossless), GIF and BMP decode exactly.
_SWS = "bilinear+accurate_rnd+full_chroma_int+full_chroma_inp"


def _sniff(head: bytes) -> str | None:
    """The ffmpeg demuxer for an image by its magic bytes; only these formats reach ffmpeg, so a text file
    or a video is never interpreted by one of ffmpeg's lenient demuxers."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png_pipe"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg_pipe"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp_pipe"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM":
        return "bmp_pipe"
    return None


def _truncated(data: bytes, demuxer: str) -> bool:
    """A file cut short: ffmpeg's JPEG decoder fills missing entropy-coded data in silently, so a JPEG must hold
    an end-of-image marker after its last scan; a PNG its IEND chunk; a WebP the bytes its RIFF header counts."""
    if demuxer == "jpeg_pipe":
        sos = data.rfind(b"\xff\xda")
        return sos < 0 or data.find(b"\xff\xd9", sos) < 0
    if demuxer == "png_pipe":
        return b"IEND" not in data[-4096:]
    if demuxer == "webp_pipe":
        return len(data) < 12 or len(data) < 8 + struct.unpack("<I", data[4:8])[0]
    return False


def _animated(data: bytes, demuxer: str) -> bool:
    """APNG (an acTL chunk before the image data) and animated WebP (VP8X animation flag or an ANIM chunk):
    ffmpeg's PNG decoder would quietly read only the first frame of an APNG. GIF frames are counted when
    decoding."""
    if demuxer == "png_pipe":
        pos = 8
        while pos + 8 <= len(data):
            n, kind = struct.unpack(">I4s", data[pos:pos + 8])
            if kind == b"acTL":
                return True
            if kind in (b"IDAT", b"IEND"):
                return False
            pos += 12 + n
        return False
    if demuxer == "webp_pipe":
        if data[12:16] == b"VP8X" and len(data) > 20 and data[20] & 0x02:
            return True
        return b"ANIM" in data[12:4096]
    if demuxer == "gif":
        return _gif_images(data) > 1
    return False


def _gif_images(data: bytes) -> int:
    """Image descriptors in a GIF's block stream (ffmpeg's GIF demuxer may return only the first of frames without
    a delay). A malformed stream counts what it holds so far; the decoder reports the damage."""
    def skip_sub_blocks(pos: int) -> int:
        while pos < len(data) and data[pos]:
            pos += 1 + data[pos]
        return pos + 1

    pos, images = 13, 0
    if len(data) > 10 and data[10] & 0x80:  # global colour table
        pos += 3 << ((data[10] & 7) + 1)
    while pos < len(data):
        kind = data[pos]
        if kind == 0x21:  # extension: label, then sub-blocks
            pos = skip_sub_blocks(pos + 2)
        elif kind == 0x2C:  # image: descriptor, local colour table, LZW code size, sub-blocks
            images += 1
            flags = data[pos + 9] if pos + 9 < len(data) else 0
            pos += 10 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0)
            pos = skip_sub_blocks(pos + 1)
        else:  # the trailer (0x3B) or damage
            break
    return images


# The most bytes an input may hold: an image of MAX_IMAGE_PIXELS stored raw (BMP, 4 bytes a pixel) with room
# for headers; an audio or video reference (decoded by ffmpeg from the file; a reference is cut to the
# render's length, and 4 GiB is hours of uncompressed stereo).
MAX_IMAGE_BYTES = 4 * 64_000_000 + (64 << 20)
MAX_MEDIA_BYTES = 4 << 30


def _existing_file(p: Path, label: str, cap: int = MAX_MEDIA_BYTES) -> None:
    """A media input path must name a regular file (not a directory, FIFO, device or symlink loop) of at most
    `cap` bytes: one H3Error line otherwise (h3ctl.outputs.check_input)."""
    from .outputs import check_input

    check_input(p, label)
    if p.stat().st_size > cap:
        raise H3Error(f"{label}: {p.stat().st_size} bytes, more than the {cap >> 20} MiB this input can need")


def read_image(path: str | os.PathLike, what: str = "image") -> np.ndarray:
    """Decode a still image into uint8 RGB [H, W, 3] with the bundled ffmpeg (alpha dropped, grey and palette
    expanded, as PIL's convert("RGB")). Unreadable, empty, truncated, non-image and animated files, images of
    more than 64 megapixels and aspects outside 1:4..4:1 raise H3Error with one line naming the file."""
    p = Path(path)
    label = f"{what} {p}"
    from .outputs import read_capped

    data = read_capped(p, label, MAX_IMAGE_BYTES)
    if not data:
        raise H3Error(f"{label}: the file is empty")
    demuxer = _sniff(data[:16])
    if demuxer is None:
        raise H3Error(f"{label}: not an image ({IMAGE_FORMATS})")
    if _truncated(data, demuxer):
        raise H3Error(f"{label}: the file is truncated (its end is missing)")
    if _animated(data, demuxer):
        raise H3Error(f"{label}: an animated image; a keyframe must be a single still image")
    base = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-f", demuxer]
    # 1. The size, from the stream header, before anything is decoded.
    probe = subprocess.run(base + ["-i", "pipe:0"], input=data, capture_output=True)
    err = probe.stderr.decode("utf-8", "replace")
    m = re.search(r"Stream #\d+:\d+.*?: Video: .*?, (\d+)x(\d+)[ ,\n]", err)
    if not m:
        kind = {"png_pipe": "PNG", "jpeg_pipe": "JPEG", "webp_pipe": "WebP", "gif": "GIF", "bmp_pipe": "BMP"}[demuxer]
        raise H3Error(f"{label}: not a readable {kind} image{_reason(err)}")
    w, h = int(m.group(1)), int(m.group(2))
    check_image_size(w, h, label)
    # 2. The pixels: at most two frames, every decoding error fatal (a truncated file fails here).
    proc = subprocess.run(base + ["-v", "error", "-xerror", "-err_detect", "explode", "-i", "pipe:0",
                                  "-map", "0:v:0", "-frames:v", "2", "-fps_mode", "passthrough", "-sws_flags", _SWS,
                                  "-f", "image2pipe", "-c:v", "ppm", "-pix_fmt", "rgb24", "pipe:1"],
                          input=data, capture_output=True)
    if proc.returncode != 0 or proc.stderr.strip():
        why = _reason(proc.stderr.decode("utf-8", "replace"))
        raise H3Error(f"{label}: cannot be decoded (truncated or corrupt){why}")
    frames = _ppm_frames(proc.stdout)
    if not frames:
        raise H3Error(f"{label}: cannot be decoded: no picture in the file")
    if len(frames) > 1:
        raise H3Error(f"{label}: an animated image; a keyframe must be a single still image")
    rgb = frames[0]
    if rgb.shape[:2] != (h, w):
        raise H3Error(f"{label}: decoded as {rgb.shape[1]}x{rgb.shape[0]}, its header says {w}x{h}")
    return rgb


def check_image_size(w: int, h: int, label: str) -> None:
    if w <= 0 or h <= 0:
        raise H3Error(f"{label}: the image is empty ({w}x{h})")
    if w * h > MAX_IMAGE_PIXELS:
        raise H3Error(f"{label}: {w}x{h} is more than {MAX_IMAGE_PIXELS // 1_000_000} megapixels")
    if w > 4 * h or h > 4 * w:
        raise H3Error(f"{label}: {w}x{h} is outside the aspect ratios 1:4 to 4:1")


def as_keyframe(image, what: str) -> np.ndarray:
    """A keyframe given as a path (decoded with read_image) or a uint8 [H, W, 3] array, checked."""
    if isinstance(image, (str, os.PathLike)):
        return read_image(image, what)
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise H3Error(f"{what}: must be a path or a uint8 [H, W, 3] RGB array, got {arr.dtype} {list(arr.shape)}")
    check_image_size(arr.shape[1], arr.shape[0], what)
    return np.ascontiguousarray(arr)


AUDIO_FORMATS = "WAV, FLAC, MP3, Ogg, AIFF, MP4/M4A/MOV or Matroska/WebM"


def _sniff_audio(head: bytes) -> str | None:
    """The ffmpeg demuxer for an audio file (or a video's soundtrack) by its magic bytes; only these containers reach
    ffmpeg, so a text file, an image or random bytes are never guessed at by one of its lenient probes (raw MP3
    frames are found in almost anything)."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:3] == b"ID3":
        return "mp3"
    # An MPEG audio frame header: 11 sync bits, a version, layer III, a bitrate and a sample rate that exist.
    if (len(head) >= 4 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x18 != 0x08
            and head[1] & 0x06 == 0x02 and head[2] >> 4 not in (0, 15) and (head[2] >> 2) & 3 != 3):
        return "mp3"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[4:8] == b"ftyp":
        return "mov"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    return None


def _wav_f32(buf: bytes) -> tuple[np.ndarray, int]:
    """ffmpeg's float WAV on a pipe (its sizes left unset) as (float32 [channels, samples], sample rate)."""
    if buf[:4] != b"RIFF" or buf[8:12] != b"WAVE":
        raise H3Error("ffmpeg returned an unexpected audio format")
    pos, rate, channels = 12, 0, 0
    while pos + 8 <= len(buf):
        tag, size = buf[pos:pos + 4], struct.unpack("<I", buf[pos + 4:pos + 8])[0]
        if tag == b"fmt " and size >= 16:
            fmt, channels, rate = struct.unpack("<HHI", buf[pos + 8:pos + 16])
            bits = struct.unpack("<H", buf[pos + 22:pos + 24])[0]
            if fmt not in (3, 0xFFFE) or bits != 32:  # IEEE float, plain or WAVE_FORMAT_EXTENSIBLE
                raise H3Error("ffmpeg returned an unexpected audio format")
        elif tag == b"data":
            if not channels:
                break
            data = buf[pos + 8:]
            data = data[:len(data) - len(data) % (4 * channels)]
            return np.frombuffer(data, "<f4").reshape(-1, channels).T.astype(np.float32), int(rate)
        pos += 8 + size + (size & 1)
    raise H3Error("ffmpeg returned an unexpected audio format")


_MP3_KBPS = {1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mp3_cut(data: bytes) -> bool:
    """An MP3 whose last frame runs past the end of the file, or that holds fewer frames than its Xing / Info
    header counts: ffmpeg decodes such a file without a word, short."""
    pos = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        pos = 10 + ((data[6] & 0x7F) << 21 | (data[7] & 0x7F) << 14 | (data[8] & 0x7F) << 7 | (data[9] & 0x7F))
    end = len(data) - (128 if data[-128:-125] == b"TAG" else 0)
    frames, counted = 0, None
    while pos + 4 <= end:
        h = data[pos:pos + 4]
        version, layer = (h[1] >> 3) & 3, (h[1] >> 1) & 3
        if h[0] != 0xFF or h[1] & 0xE0 != 0xE0 or version == 1 or layer != 1 or h[2] >> 4 in (0, 15) \
                or (h[2] >> 2) & 3 == 3:
            return False  # not a layer III frame: a trailing tag or other data; the decoder judges it
        rate = _MP3_RATES[version][(h[2] >> 2) & 3]
        kbps = _MP3_KBPS[1 if version == 3 else 2][h[2] >> 4]
        size = (144 if version == 3 else 72) * kbps * 1000 // rate + ((h[2] >> 1) & 1)
        if frames == 0:
            at = data.find(b"Xing", pos, pos + size)
            at = at if at >= 0 else data.find(b"Info", pos, pos + size)
            if at >= 0 and at + 12 <= len(data) and data[at + 7] & 1:  # the frame count is present
                counted = struct.unpack(">I", data[at + 8:at + 12])[0] + 1  # the header frame itself
        if pos + size > end:
            return True
        pos += size
        frames += 1
    return counted is not None and frames < counted


def _audio_cut(p: Path, demuxer: str, samples: int) -> bool:
    """A file shorter than its own header says: a WAV's data chunk or a FLAC's sample count (STREAMINFO), or an
    MP3 (_mp3_cut)."""
    with open(p, "rb") as f:
        data = f.read() if demuxer == "mp3" else f.read(1 << 16)
        size = os.fstat(f.fileno()).st_size
    if demuxer == "mp3":
        return _mp3_cut(data)
    if demuxer == "flac" and len(data) >= 26 and data[4] & 0x7F == 0:
        total = int.from_bytes(data[21:26], "big") & ((1 << 36) - 1)
        return total > 0 and samples < total
    if demuxer == "wav":
        pos = 12
        while pos + 8 <= len(data):
            tag, n = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
            if tag == b"data":
                return n not in (0, 0xFFFFFFFF) and pos + 8 + n > size
            pos += 8 + n + (n & 1)
    return False


def read_audio(path: str | os.PathLike, what: str = "audio") -> tuple[np.ndarray, int]:
    """An audio file (or a video's soundtrack) decoded with the bundled ffmpeg at its own sample rate, as
    (float32 [channels, samples], rate): mono stays mono (libh3 puts it on both sides, as diffusers does), more
    than two channels are downmixed to stereo by ffmpeg. libh3 resamples to the model's rate, so a file and a PCM
    array take the same path. Unreadable, empty, non-audio, truncated and corrupt files raise H3Error with one line
    naming the file."""
    p = Path(path)
    label = f"{what}: {p}"
    _existing_file(p, label)
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise H3Error(f"{label}: cannot read ({e.strerror or e})") from None
    if not head:
        raise H3Error(f"{label}: the file is empty")
    demuxer = _sniff_audio(head)
    if demuxer is None:
        raise H3Error(f"{label}: not an audio file ({AUDIO_FORMATS})")
    # Every decoding error is fatal (a damaged stream is refused, not patched with silence); `file:` keeps a name
    # with a colon from being read as a protocol. aformat leaves mono and stereo as they are.
    proc = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-v", "error", "-xerror",
                           "-err_detect", "crccheck+bitstream+buffer+explode", "-f", demuxer, "-i", f"file:{p}",
                           "-map", "0:a:0", "-vn",
                           "-af", "aformat=channel_layouts=mono|stereo", "-c:a", "pcm_f32le", "-f", "wav", "pipe:1"],
                          capture_output=True)
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0 or err.strip():
        if "matches no streams" in err:
            raise H3Error(f"{label}: has no audio stream")
        raise H3Error(f"{label}: cannot be decoded as audio (truncated or corrupt){_reason(err)}")
    try:
        pcm, rate = _wav_f32(proc.stdout)
    except H3Error as e:
        raise H3Error(f"{label}: {e}") from None
    if pcm.shape[1] == 0:
        raise H3Error(f"{label}: no audio samples")
    if _audio_cut(p, demuxer, pcm.shape[1]):
        raise H3Error(f"{label}: the file is truncated (its end is missing)")
    # The rate and length libh3's resampler takes (its own check, before the model does any work).
    import ctypes

    from . import _lib

    if _lib.lib().h3_audio_resample(None, pcm.shape[0], pcm.shape[1], rate, rate, None, 0, ctypes.byref(
            ctypes.c_int64())):
        raise H3Error(f"{label}: {_lib.last_error()}")
    if not np.isfinite(pcm).all():
        raise H3Error(f"{label}: decodes to samples that are not finite numbers")
    return np.ascontiguousarray(pcm), rate


def as_audio_reference(value, what: str) -> tuple[np.ndarray, int]:
    """An audio reference as (float32 [channels, samples] C-contiguous, its rate): a path (decoded at its own rate,
    read_audio) or a dict {"audio": array [channels, samples] or [samples], "sample_rate": Hz}. libh3 resamples
    any rate in 4 kHz .. 384 kHz to the model's once, after the truncation to the render's duration."""
    if isinstance(value, (str, os.PathLike)):
        return read_audio(value, what)
    if not isinstance(value, dict) or "audio" not in value or "sample_rate" not in value:
        raise H3Error(f"{what}: must be a path or a dict {{'audio': array, 'sample_rate': Hz}}")
    pcm = np.asarray(value["audio"])
    if pcm.ndim == 1:
        pcm = pcm[None]
    if pcm.ndim != 2 or pcm.shape[0] not in (1, 2) or not np.issubdtype(pcm.dtype, np.floating):
        raise H3Error(f"{what}: audio must be a float mono or stereo [channels, samples] array, got {pcm.dtype} "
                      f"{list(pcm.shape)}")
    if pcm.shape[1] == 0:
        raise H3Error(f"{what}: no audio samples")
    from . import limits

    try:
        # one that fits the int32 field goes on to libh3, which names the range it resamples from
        rate = limits.whole("sample rate", value["sample_rate"], 1, limits.INT32_MAX, strict=True)
    except H3Error:
        raise H3Error(f"{what}: sample_rate must be a whole number of Hz between {limits.MIN_SAMPLE_RATE} and "
                      f"{limits.MAX_SAMPLE_RATE}, got {value['sample_rate']!r}") from None
    return np.ascontiguousarray(pcm, dtype=np.float32), rate


# ---- video references ------------------------------------------------------------------------------

def _video_rate(text: str) -> float:
    """The frame rate ffmpeg's stream line reports ("29.97 fps"), as PyAV's average_rate would give it: ffmpeg
    prints the rate rounded to 2 decimals, so an NTSC rate k * 1000 / 1001 is recovered exactly."""
    m = re.search(r"Stream #[^\n]*Video:[^\n]*?([\d.]+) fps", text) or re.search(
        r"Stream #[^\n]*Video:[^\n]*?([\d.]+) tbr", text)
    if not m:
        return 0.0
    v = float(m.group(1))
    k = round(v * 1.001)
    if v != int(v) and abs(k * 1000 / 1001 - v) < 0.006:
        return k * 1000 / 1001
    return v


def read_video(path: str | os.PathLike, what: str = "video", sound: bool = True):
    """A video file decoded with the bundled ffmpeg (display rotation applied, as diffusers' from_file does):
    (uint8 frames [T, H, W, 3], the frame rate the container reports, its soundtrack as float32 [channels,
    samples] at its own rate (read_audio; libh3 resamples it as an audio reference) or None when it has none or
    `sound` is False, and that rate or 0)."""
    import imageio_ffmpeg

    _existing_file(Path(path), f"{what}: {path}")
    probe = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(path)], capture_output=True,
                           text=True, errors="replace").stderr
    if not re.search(r"Stream #\S+.*Video:", probe):
        raise H3Error(f"{what}: {path}: cannot be decoded as video{_reason(probe) or ': no video stream'}")
    fps = _video_rate(probe)
    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
        meta = next(reader)
        w, h = meta["size"]
        frames = [np.frombuffer(fr, dtype=np.uint8).reshape(h, w, 3) for fr in reader]
    except (RuntimeError, OSError, ValueError, StopIteration) as e:
        reason = str(e).strip().splitlines()
        raise H3Error(f"{what}: {path}: cannot be decoded as video: {reason[-1] if reason else 'ffmpeg failed'}")
    if not frames:
        raise H3Error(f"{what}: {path}: no video frames")
    if not fps > 0:
        raise H3Error(f"{what}: {path}: ffmpeg reports no frame rate")
    pcm, rate = None, 0
    if sound and re.search(r"Stream #\S+.*Audio:", probe):
        pcm, rate = read_audio(path, what)
    return np.stack(frames), fps, pcm, rate


def as_video_reference(value, what: str, sample_rate: int, sound: bool = True):
    """A video reference as (uint8 frames [T, H, W, 3] C-contiguous, fps, float32 soundtrack [ch, samples] or
    None, its rate): a path (decoded with its soundtrack at the file's own rate, unless `sound` is False; libh3
    resamples it; `sample_rate` is the rate reported when there is no soundtrack) or a dict
    {"frames": uint8 [T, H, W, 3], "fps": rate (default 24), "audio": [channels, samples] (optional),
    "sample_rate": Hz (with audio)}."""
    if isinstance(value, (str, os.PathLike)):
        frames, fps, pcm, rate = read_video(value, what, sound)
        return frames, fps, pcm, int(rate) if pcm is not None else int(sample_rate)
    if not isinstance(value, dict) or "frames" not in value:
        raise H3Error(f"{what}: must be a path or a dict {{'frames': uint8 [T, H, W, 3], 'fps': rate, "
                      "'audio': array, 'sample_rate': Hz}")
    frames = np.asarray(value["frames"])
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] < 1:
        raise H3Error(f"{what}: frames must be uint8 [frames, height, width, 3], got {frames.dtype} "
                      f"{list(frames.shape)}")
    from . import limits

    fps = value.get("fps", 24.0)
    try:
        fps = limits.real("fps", fps, 0.0, 1000.0, lo_open=True)
    except H3Error:
        raise H3Error(f"{what}: frame rate {fps!r} must be a number greater than 0 and at most 1000 fps") from None
    pcm, rate = None, int(sample_rate)
    if sound and value.get("audio") is not None:
        if "sample_rate" not in value:
            raise H3Error(f"{what}: a soundtrack needs its 'sample_rate'")
        pcm, rate = as_audio_reference({"audio": value["audio"], "sample_rate": value["sample_rate"]}, what)
    return np.ascontiguousarray(frames), fps, pcm, rate


def as_references(references, sample_rate: int = 32000) -> list[tuple[str, object]]:
    """Ref2VA references in request order as ("image", uint8 [H, W, 3]), ("audio", (float32 [ch, samples],
    rate)) or ("video", (uint8 [T, H, W, 3], fps, soundtrack or None, its rate)): an item is an image (a path
    or an array), ("image", image), ("audio", path or dict), a dict {"audio": array, "sample_rate": Hz},
    ("video", path or dict) (a file keeps its sound), ("silent_video", path or dict) (the sound dropped) or a
    dict {"frames": array, ...} (a video, as_video_reference)."""
    if isinstance(references, (str, os.PathLike, np.ndarray, dict)):
        references = [references]
    out = []
    for i, item in enumerate(references, 1):
        if isinstance(item, dict):
            kind, value = ("video" if "frames" in item else "audio"), item
        else:
            kind, value = item if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) else (
                "image", item)
        if kind == "image":
            out.append(("image", as_keyframe(value, f"reference image {i}")))
        elif kind == "audio":
            out.append(("audio", as_audio_reference(value, f"reference audio {i}")))
        elif kind in ("video", "silent_video"):
            out.append(("video", as_video_reference(value, f"reference video {i}", sample_rate,
                                                    sound=kind == "video")))
        else:
            raise H3Error(f"reference {i}: {kind!r} is not a reference kind (image, video, silent_video, audio)")
    return out


def _reason(text: str) -> str:
    """ffmpeg's first line that reports a problem with the data (its tag `[png @ 0x...]` dropped), as
    ": reason", or ""."""
    for line in text.splitlines():
        line = re.sub(r"^(\[[^]]*\]\s*)+", "", line.strip())
        if re.search(r"error|invalid|too big|overread|truncat|corrupt|missing|unsupported", line, re.I):
            return f": {line}"
    return ""


def _ppm_frames(buf: bytes) -> list[np.ndarray]:
    """Binary PPM (P6, maxval 255) frames one after another, as ffmpeg's image2pipe writes them."""
    out, pos = [], 0
    while pos < len(buf):
        m = re.match(rb"P6\s+(\d+)\s+(\d+)\s+255\s", buf[pos:pos + 64])
        if not m:
            raise H3Error("ffmpeg returned an unexpected picture format")
        w, h = int(m.group(1)), int(m.group(2))
        start = pos + m.end()
        end = start + w * h * 3
        if end > len(buf):
            raise H3Error("ffmpeg returned a short picture")
        out.append(np.frombuffer(buf, np.uint8, w * h * 3, start).reshape(h, w, 3).copy())
        pos = end
    return out
