"""Fuzzing of the reference media input paths: `--ref-audio` / audio references (media.read_audio) and
`--ref-image` / keyframes (media.read_image).

Seeded cases built from small valid files (a 16-bit WAV, a FLAC and an MP3 made by the bundled ffmpeg; a PNG, a
JPEG and a WebP made by PIL): truncated, bytes overwritten, whole-file random bytes, zero-length, WAV / FLAC / MP3
headers with out-of-range fields (sizes near 2^32, rates 0 and 4e9, 0 or 65535 channels, 0 bits), and files whose
extension lies about their content. Each case says whether it must be refused ("fail") or may decode ("any": a
payload with overwritten bytes can still be valid audio or pixels; PCM has no checksum). The contract:

* refused: H3Error, one line, naming the file; never another exception;
* decoded: audio float32 [1 or 2, samples >= 1], finite, with an integer rate; an image uint8 [H, W, 3].

tests/fuzz/test_media_fuzz.py runs a seeded handful in CI (a few seconds) and a few through the CLI (exit 2, one
line, nothing written). A longer run, for a fuzzing session:

    python tests/fuzz/media_fuzz.py --runs 3000 --seed 1 --keep media-fuzz-failures

prints a summary line and exits 1 when any case breaks the contract (its input is kept under --keep).
"""

from __future__ import annotations

import argparse
import io
import struct
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

AUDIO_EXT = {"wav": ".wav", "flac": ".flac", "mp3": ".mp3"}
IMAGE_EXT = {"png": ".png", "jpeg": ".jpg", "webp": ".webp"}


def wav16(pcm: np.ndarray, rate: int) -> bytes:
    ch = pcm.shape[0]
    data = np.clip(np.round(pcm.T * 32767.0), -32768, 32767).astype("<i2").tobytes()
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, ch, rate, rate * ch * 2, ch * 2, 16) + b"data" +
            struct.pack("<I", len(data)) + data)


def wav_fields(ch=2, rate=44100, bits=16, fmt=1, frames=400, data_size=None, fmt_size=16) -> bytes:
    """A WAV with the header fields given as they are (no checks): for out-of-range headers."""
    data = bytes(max(0, frames * ch * bits // 8))
    body = (b"WAVEfmt " + struct.pack("<I", fmt_size) +
            struct.pack("<HHIIHH", fmt, ch, rate & 0xFFFFFFFF, (rate * ch * bits // 8) & 0xFFFFFFFF,
                        (ch * bits // 8) & 0xFFFF, bits) +
            b"data" + struct.pack("<I", len(data) if data_size is None else data_size) + data)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def base_files() -> dict[str, bytes]:
    """The valid seeds, small (a quarter second) so that every case decodes in milliseconds."""
    from h3ctl import media

    t = np.arange(11025) / 44100
    pcm = np.stack([0.4 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)]).astype(np.float32)
    files = {"wav": wav16(pcm, 44100)}
    src = wav16(pcm[:1, ::2], 22050)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in (("flac", ["-c:a", "flac"]), ("mp3", ["-c:a", "libmp3lame", "-b:a", "64k"])):
            # to a file, not a pipe: the muxers go back to fill in the FLAC sample count and the MP3 Info frame
            out = Path(tmp) / f"seed.{name}"
            subprocess.run([media.ffmpeg_exe(), "-v", "error", "-f", "wav", "-i", "pipe:0", *args, str(out)],
                           input=src, capture_output=True, check=True)
            files[name] = out.read_bytes()
    from PIL import Image

    img = Image.linear_gradient("L").resize((48, 40)).convert("RGB")
    for name, kw in (("png", {}), ("jpeg", {"quality": 90}), ("webp", {"lossless": True})):
        buf = io.BytesIO()
        img.save(buf, format=name.upper(), **kw)
        files[name] = buf.getvalue()
    return files


def header_cases() -> list[tuple[str, bytes, str]]:
    """(file name, bytes, expectation) for headers with out-of-range fields; each must be refused. A rate the
    resampler does not take (1 kHz) decodes but is refused by read_audio through libh3's rate check."""
    cases = [
        ("rate0.wav", wav_fields(rate=0)), ("rate4e9.wav", wav_fields(rate=4_000_000_000)),
        ("rate1k.wav", wav_fields(rate=1000)), ("chan0.wav", wav_fields(ch=0)),
        ("chan65535.wav", wav_fields(ch=65535, frames=1)), ("bits0.wav", wav_fields(bits=0)),
        ("fmt99.wav", wav_fields(fmt=99)), ("datasize.wav", wav_fields(data_size=0xFFFFFFF0)),
        ("fmtsize.wav", wav_fields(fmt_size=0x7FFFFFF0)), ("riff-only.wav", b"RIFF\xff\xff\xff\xffWAVE"),
        ("flac-hdr.flac", b"fLaC\x80\x00\x00\x22" + b"\xff" * 34),
        ("id3-huge.mp3", b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f" + bytes(64)),
    ]
    return [(n, b, "fail") for n, b in cases]


def cases(files: dict[str, bytes], seed: int, n: int) -> list[tuple[str, bytes, str]]:
    """n seeded cases (name with the extension the reader sees, bytes, "fail" or "any")."""
    from h3ctl import media

    rng = np.random.default_rng(seed)
    out = []
    kinds = list(AUDIO_EXT) + list(IMAGE_EXT)
    for k in range(n):
        kind = kinds[k % len(kinds)]
        ext = {**AUDIO_EXT, **IMAGE_EXT}[kind]
        src = files[kind]
        how = ["truncate", "overwrite", "random", "empty", "mislabel"][(k // len(kinds)) % 5]
        name = f"{seed}-{k}-{kind}-{how}"
        if how == "truncate":
            # a cut anywhere from inside the header to the last byte
            out.append((name + ext, src[:int(rng.integers(1, len(src)))], "fail"))
        elif how == "overwrite":
            b = bytearray(src)
            at = int(rng.integers(0, len(b)))
            span = int(rng.integers(1, 64))
            b[at:at + span] = rng.integers(0, 256, len(b[at:at + span]), dtype=np.uint8).tobytes()
            out.append((name + ext, bytes(b), "any"))
        elif how == "random":
            b = rng.integers(0, 256, int(rng.integers(1, 4096)), dtype=np.uint8).tobytes()
            sniff = media._sniff_audio if kind in AUDIO_EXT else media._sniff
            out.append((name + ext, b, "fail" if sniff(b[:16]) is None else "any"))
        elif how == "empty":
            out.append((name + ext, b"", "fail"))
        else:
            # another kind's valid bytes under this kind's extension: an image never decodes as audio nor audio as
            # an image; audio under another audio extension decodes by its content
            other = kinds[int(rng.integers(0, len(kinds)))]
            cross = (other in AUDIO_EXT) != (kind in AUDIO_EXT)
            if other == kind:
                other = kinds[(kinds.index(kind) + len(AUDIO_EXT)) % len(kinds)]
                cross = True
            out.append((f"{name}-{other}{ext}", files[other], "fail" if cross else "any"))
    return out


def check(path: Path, expect: str) -> str | None:
    """Run the reader the extension selects on one file; None when the contract holds, else what broke."""
    from h3ctl import media
    from h3ctl._lib import H3Error

    audio = path.suffix in AUDIO_EXT.values()
    try:
        if audio:
            pcm, rate = media.read_audio(path, "reference audio 1")
        else:
            rgb = media.read_image(path, "reference image 1")
    except H3Error as e:
        msg = str(e)
        if "\n" in msg or path.name not in msg:
            return f"message is not one line naming the file: {msg!r}"
        return None
    except Exception:  # noqa: BLE001 - the point of the check
        return "raised " + traceback.format_exc(limit=3).strip().splitlines()[-1]
    if expect == "fail":
        return "decoded, but must be refused"
    if audio:
        if not (pcm.dtype == np.float32 and pcm.ndim == 2 and pcm.shape[0] in (1, 2) and pcm.shape[1] >= 1
                and np.isfinite(pcm).all() and isinstance(rate, int)):
            return f"decoded to {pcm.dtype} {pcm.shape} at {rate!r}"
    elif not (rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3):
        return f"decoded to {rgb.dtype} {rgb.shape}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="folder for the inputs that break the contract")
    args = ap.parse_args(argv)
    files = base_files()
    todo = header_cases() + cases(files, args.seed, args.runs)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, data, expect in todo:
            p = Path(tmp) / name
            p.write_bytes(data)
            why = check(p, expect)
            if why:
                bad += 1
                print(f"{name}: {why}")
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / name).write_bytes(data)
            p.unlink()
    print(f"media fuzz: {len(todo)} cases, seed {args.seed}, {bad} broke the contract")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    sys.exit(main())
