"""libh3's audio resampler (h3_audio_resample, libh3/core/audio_resample.c) and Ref2VA references at any rate.

diffusers resamples a reference soundtrack once to the audio VAE's 32 kHz with torchaudio's Resample (defaults:
sinc_interp_hann, lowpass_filter_width 6, rolloff 0.99, rates reduced by their gcd). torchaudio cannot be installed
here, so the resampler is held to:

* content, measured: sines at 8 / 16 / 22.05 / 44.1 / 48 / 96 kHz resampled to 32 kHz match the analytic sine at
  32 kHz with SNR > 60 dB (200 samples from each end left out: the zero padding beyond the clip); tones above
  16 kHz at 48 kHz come out at least 40 dB (20 kHz) and 55 dB (23 kHz) down; DC gain 1 within 1e-3 (the
  Hann-windowed sinc's own ripple: 5e-4 .. 9e-4 measured);
* the length rule ceil(new * len / orig), identity at 32 kHz -> 32 kHz, determinism (and channels independent);
* a float64 direct convolution written here from torchaudio's documented kernel formula: <= 1e-5 rel-L2
  (measured ~4e-8: the kernel rounded to f32 and f32 inputs);
* bad rates / lengths / channels / capacity: one-line errors through h3_last_error;
* files: WAV, FLAC, MP3, Ogg, M4A, AIFF and Matroska decode at their own rate and channel count to the tone encoded;
* Ref2VA: diffusers' ref2va workflow with a 44.1 kHz stereo reference longer than the render and a 22.05 kHz mono
  one, its torchaudio call answered by the documented kernel in float64 (torchaudio is not installable here):
  final latents within 1e-3 rel-L2 (measured 1.2e-7 .. 1.4e-7); a 44.1 kHz PCM reference renders and gives
  bit-for-bit the latents of the same clip resampled here and passed at 32 kHz (one code path); truncation happens
  at the source rate before resampling, as diffusers does; a 44.1 kHz WAV file decodes at its own rate and takes
  the same path as its PCM; a bad rate from the CLI is one line and exit 2 with nothing written.
"""

from __future__ import annotations

import ctypes
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3ctl import _lib
from h3ctl._lib import H3Error
from tests.test_ref2va import FRAMES, H, PROMPT, SEED, W, _picture, ref2va_ckpt  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "python" / "h3ctl" / "models" / "h3-tiny"
RATES = [8000, 16000, 22050, 44100, 48000, 96000]


def resample(x: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """h3_audio_resample on [channels, samples] (or [samples]) float32."""
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    lib = _lib.lib()
    n = ctypes.c_int64(-1)
    _lib.check(lib.h3_audio_resample(None, x.shape[0], x.shape[1], in_rate, out_rate, None, 0, ctypes.byref(n)))
    y = np.full((x.shape[0], n.value), np.nan, np.float32)
    m = ctypes.c_int64(-1)
    _lib.check(lib.h3_audio_resample(x.ctypes.data_as(_lib.c_float_p), x.shape[0], x.shape[1], in_rate, out_rate,
                                     y.ctypes.data_as(_lib.c_float_p), y.size, ctypes.byref(m)))
    assert m.value == n.value
    return y


def snr_db(got: np.ndarray, want: np.ndarray) -> float:
    return 10 * math.log10(np.sum(want**2) / np.sum((got - want) ** 2))


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("freq", [440.0, 1000.0])
def test_sine_matches_the_analytic_sine(rate, freq):
    x = 0.5 * np.sin(2 * np.pi * freq * np.arange(rate // 2) / rate)
    y = resample(x, rate, 32000)[0]
    want = 0.5 * np.sin(2 * np.pi * freq * np.arange(y.size) / 32000)
    inner = slice(200, y.size - 200)
    snr = snr_db(y[inner].astype(np.float64), want[inner])
    assert snr > 60, f"{rate} Hz, {freq} Hz tone: SNR {snr:.1f} dB"


@pytest.mark.parametrize("freq,floor_db", [(20000.0, 40.0), (23000.0, 55.0)])
def test_tone_above_the_new_nyquist_is_removed(freq, floor_db):
    x = np.sin(2 * np.pi * freq * np.arange(24000) / 48000)  # RMS 1 / sqrt(2)
    y = resample(x, 48000, 32000)[0][200:-200].astype(np.float64)
    level = 20 * math.log10(np.sqrt(np.mean(y**2)) * math.sqrt(2))
    assert level < -floor_db, f"{freq} Hz at 48 kHz -> 32 kHz: {level:.1f} dB"


@pytest.mark.parametrize("rate", RATES + [11025, 384000, 4000])
def test_dc_gain_is_one(rate):
    y = resample(np.ones(rate // 4), rate, 32000)[0]
    inner = y[200:-200]
    assert inner.size > 1000 and np.abs(inner - 1).max() < 1e-3


@pytest.mark.parametrize("in_rate,out_rate", [(44100, 32000), (32000, 44100), (8000, 32000), (96000, 32000),
                                              (22050, 32000), (383999, 4001), (4001, 383999), (48000, 44100)])
@pytest.mark.parametrize("n", [1, 2, 3, 441, 1000, 44101])
def test_length_rule(in_rate, out_rate, n):
    g = math.gcd(in_rate, out_rate)
    orig, new = in_rate // g, out_rate // g
    want = -(-new * n // orig)  # ceil(new * len / orig) on the reduced rates, exactly
    out = ctypes.c_int64(-1)
    assert _lib.lib().h3_audio_resample(None, 1, n, in_rate, out_rate, None, 0, ctypes.byref(out)) == 0
    assert out.value == want
    if n <= 1000:
        assert resample(np.ones(n), in_rate, out_rate).shape == (1, want)


def test_identity_and_determinism():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9001)).astype(np.float32)
    assert np.array_equal(resample(x, 32000, 32000), x)
    a, b = resample(x, 44100, 32000), resample(x, 44100, 32000)
    assert a.tobytes() == b.tobytes()
    # each channel on its own: a stereo call is two mono calls
    assert np.array_equal(a[0], resample(x[0], 44100, 32000)[0]) and np.array_equal(a[1], resample(x[1], 44100,
                                                                                                     32000)[0])


def torchaudio_direct(x: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """torchaudio's resample written as a plain float64 sum over every input sample, from its documented kernel:
    rates reduced by their gcd (orig, new), base = min(orig, new) * 0.99, and for output n = j * new + p and input i,
    t = clamp(((i - j * orig) / orig - p / new) * base, -6, 6), weight sinc(t) * cos(pi t / 12)^2 * base / orig,
    zeros outside the clip, ceil(new * len / orig) outputs. torchaudio takes -p / new as an arange of the default
    dtype divided by an int, i.e. in float32; every other step is float64 (its kernel is built in float64 and
    cast to float32 once, which is why the comparison is to 1e-5, not bits)."""
    g = math.gcd(in_rate, out_rate)
    orig, new = in_rate // g, out_rate // g
    base = min(orig, new) * 0.99
    n_out = -(-new * x.size // orig)
    n = np.arange(n_out)[:, None]
    j, p = n // new, n % new
    phase = (-p.astype(np.float32)) / np.float32(new)
    i = np.arange(x.size)[None, :]
    t = np.clip(((i - j * orig) / orig + phase.astype(np.float64)) * base, -6, 6)
    weight = np.sinc(t) * np.cos(np.pi * t / 12) ** 2 * base / orig
    return weight @ x.astype(np.float64)


def torchaudio_banded(x: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """torchaudio_direct's sum restricted to the inputs its clamp leaves a weight on (|i / orig - n / new| * base
    < 6, so |i - n * orig / new| <= ceil(6 * orig / base)), for clips too long for the full matrix."""
    g = math.gcd(in_rate, out_rate)
    orig, new = in_rate // g, out_rate // g
    base = min(orig, new) * 0.99
    reach = math.ceil(6 * orig / base) + 2
    n = np.arange(-(-new * x.size // orig))[:, None]
    j, p = n // new, n % new
    phase = ((-p.astype(np.float32)) / np.float32(new)).astype(np.float64)
    i = (n * orig) // new + np.arange(-reach, reach + 1)[None, :]
    t = np.clip(((i - j * orig) / orig + phase) * base, -6, 6)
    weight = np.sinc(t) * np.cos(np.pi * t / 12) ** 2 * base / orig
    inside = (i >= 0) & (i < x.size)
    return (weight * np.where(inside, x.astype(np.float64)[np.clip(i, 0, x.size - 1)], 0.0)).sum(axis=1)


@pytest.mark.parametrize("in_rate,out_rate,n", [(44100, 32000, 900), (48000, 32000, 900), (22050, 32000, 700),
                                                (8000, 32000, 300), (16000, 32000, 500), (96000, 32000, 1500),
                                                (11025, 32000, 500), (32000, 44100, 600), (384000, 4000, 4000),
                                                (4000, 384000, 40), (383999, 32000, 3000)])
def test_matches_torchaudio_kernel_formula(in_rate, out_rate, n):
    x = np.random.default_rng(in_rate + n).standard_normal(n).astype(np.float32)
    got = resample(x, in_rate, out_rate)[0].astype(np.float64)
    want = torchaudio_direct(x, in_rate, out_rate)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert got.shape == want.shape and err <= 1e-5, f"{in_rate} -> {out_rate}: rel-L2 {err:.2e}"
    assert np.allclose(torchaudio_banded(x, in_rate, out_rate), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("args,msg", [
    ((1, 100, 3999, 32000), "input rate 3999 Hz is outside 4000 .. 384000 Hz"),
    ((1, 100, 0, 32000), "input rate 0 Hz"),
    ((1, 100, -44100, 32000), "input rate -44100 Hz"),
    ((1, 100, 44100, 384001), "output rate 384001 Hz is outside"),
    ((1, 0, 44100, 32000), "0 samples per channel"),
    ((1, -5, 44100, 32000), "-5 samples per channel"),
    ((1, (1 << 40) + 1, 44100, 32000), "samples per channel (1 .. 2^40)"),
    ((0, 100, 44100, 32000), "0 channels (1 .. 64)"),
    ((65, 100, 44100, 32000), "65 channels"),
])
def test_bad_arguments(args, msg):
    lib = _lib.lib()
    out = ctypes.c_int64(-7)
    rc = lib.h3_audio_resample(None, *args, None, 0, ctypes.byref(out))
    assert rc == -1 and msg in _lib.last_error() and "\n" not in _lib.last_error()
    assert out.value == -7  # nothing written on failure
    with pytest.raises(H3Error, match=re.escape(msg)):
        _lib.check(rc)


def test_bad_buffers():
    lib = _lib.lib()
    x = np.zeros(441, np.float32)
    y = np.zeros(319, np.float32)  # 320 needed
    rc = lib.h3_audio_resample(x.ctypes.data_as(_lib.c_float_p), 1, 441, 44100, 32000,
                               y.ctypes.data_as(_lib.c_float_p), y.size, None)
    assert rc == -1 and "output holds 319 floats, 1 x 320 needed" in _lib.last_error()
    assert not y.any()
    rc = lib.h3_audio_resample(None, 1, 441, 44100, 32000, y.ctypes.data_as(_lib.c_float_p), y.size, None)
    assert rc == -1 and "NULL input" in _lib.last_error()


# ---- Ref2VA references at another rate ------------------------------------------------------------------------

def _sound(seed, channels, seconds, rate):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return np.asarray([0.4 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) + 0.05 * rng.standard_normal(t.size)
                       for _ in range(channels)], np.float32)


def _latents(d, refs, steps=2):
    from h3ctl import Engine

    with Engine(d, threads=2, ref2va=True) as eng:
        eng.prepare(PROMPT, W, H, FRAMES, steps=steps, seed=SEED, references=refs)
        while eng.step() > 0:
            pass
        return eng.latents()


def test_ref2va_resamples_a_44k_reference(ref2va_ckpt):  # noqa: F811
    """A 44.1 kHz PCM reference is accepted and is exactly the same clip resampled by h3_audio_resample and given
    at 32 kHz; a longer one is truncated to FRAMES / 24 s at 44.1 kHz first, then resampled (diffusers' order)."""
    d, _ = ref2va_ckpt
    pic = _picture(61, 64, 96)
    short = _sound(62, 2, 0.6, 44100)  # shorter than the render's FRAMES / 24 s: kept whole
    v44, a44 = _latents(d, [pic, {"audio": short, "sample_rate": 44100}])
    v32, a32 = _latents(d, [pic, {"audio": resample(short, 44100, 32000), "sample_rate": 32000}])
    assert np.array_equal(v44, v32) and np.array_equal(a44, a32)
    v0, a0 = _latents(d, [pic, {"audio": short[:, ::2].copy(), "sample_rate": 22050}])
    assert np.abs(a0 - a44).max() > 1e-3  # another clip moves the render: the reference is read
    # truncation at the source rate: a long clip is its int(FRAMES / 24 * 44100)-sample head, resampled
    long = _sound(63, 1, 1.5, 44100)
    keep = int(FRAMES / 24 * 44100)
    vl, al = _latents(d, [pic, {"audio": long, "sample_rate": 44100}])
    vk, ak = _latents(d, [pic, {"audio": long[:, :keep].copy(), "sample_rate": 44100}])
    assert np.array_equal(vl, vk) and np.array_equal(al, ak)


class _StandInResample:
    """torchaudio.transforms.Resample(orig, new) as diffusers calls it, for the oracle: torchaudio cannot be
    installed here, so its documented sum (torchaudio_banded, float64) is rounded to float32."""

    def __init__(self, orig_freq, new_freq):
        self.rates = (int(orig_freq), int(new_freq))

    def __call__(self, waveform):
        import torch

        w = waveform.detach().cpu().numpy()
        return torch.from_numpy(np.stack([torchaudio_banded(c, *self.rates) for c in w]).astype(np.float32))


@pytest.mark.parametrize("channels,seconds,rate", [(2, 1.3, 44100), (1, 0.55, 22050)])
def test_pipeline_with_resampled_audio_matches_diffusers(ref2va_ckpt, tiny_models, tiny_ckpt_f32,  # noqa: F811
                                                         monkeypatch, channels, seconds, rate):
    """diffusers' ref2va workflow with an audio reference at 44.1 kHz (stereo, longer than the render: truncated at
    44.1 kHz, then resampled) or 22.05 kHz (mono: duplicated, then resampled), its torchaudio call answered by the
    documented kernel in float64, vs libh3 given the same PCM at its own rate, diffusers' visual draws injected:
    final latents within 1e-3 rel-L2. This holds the order (truncate, expand, resample once) to diffusers' code."""
    import types

    from h3ctl import Engine
    from tests.fl2va_oracle import rel_l2
    from tests.ref2va_oracle import ref2va_pipeline, run_ref2va
    from tests.test_ref2va import REF_EDGE, STEPS, TOL

    monkeypatch.setitem(sys.modules, "torchaudio", types.SimpleNamespace(
        transforms=types.SimpleNamespace(Resample=_StandInResample)))
    d, ref_transformer = ref2va_ckpt
    pic = _picture(67, 80, 120)
    w = _sound(68, channels, seconds, rate)
    rng = np.random.default_rng(7)
    v = rng.standard_normal((24, 7, H // 16, W // 16)).astype(np.float32)
    a = rng.standard_normal((2, 32, 37)).astype(np.float32)
    pipe = ref2va_pipeline(tiny_models, ref_transformer, tiny_ckpt_f32 / "tokenizer", REF_EDGE)
    ref = run_ref2va(pipe, PROMPT, [pic, ("audio", w, rate)], FRAMES, STEPS, v, a, width=W, height=H, seed=SEED)
    inj = {"reference_noise_0": ref["cond_noise"][0], "reference_posterior_noise_0": ref["posterior_noise"][0]}
    with Engine(d, threads=2, ref2va=True) as eng:
        eng.prepare(PROMPT, W, H, FRAMES, steps=STEPS, seed=SEED, video_noise=v, audio_noise=a,
                    references=[pic, {"audio": w, "sample_rate": rate}], injected=inj)
        while eng.step() > 0:
            pass
        gv, ga = eng.latents()
    ev, ea = rel_l2(gv, ref["latents"]), rel_l2(ga, ref["audio_latents"])
    print(f"parity: ref2va image + audio at {rate} Hz ({channels} ch, {seconds} s): latents rel-L2 video {ev:.2e}, "
          f"audio {ea:.2e}")
    assert ev <= TOL and ea <= TOL


def _wav16(path, pcm, rate):
    """A 16-bit PCM WAV written by hand (media.write_wav is stereo-only)."""
    ch, n = pcm.shape
    data = np.clip(np.round(pcm.T * 32767.0), -32768, 32767).astype("<i2").tobytes()
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " +
                     struct.pack("<IHHIIHH", 16, 1, ch, rate, rate * ch * 2, ch * 2, 16) + b"data" +
                     struct.pack("<I", len(data)) + data)
    return np.frombuffer(data, "<i2").reshape(n, ch).T / np.float32(32768.0)


def test_audio_file_decodes_at_its_own_rate(ref2va_ckpt, tmp_path):  # noqa: F811
    """A 44.1 kHz mono WAV comes back from media.read_audio at 44.1 kHz and mono (its exact 16-bit values), and a
    render with the file is bit-for-bit the render with the same PCM given as an array."""
    from h3ctl import media

    d, _ = ref2va_ckpt
    want = _wav16(tmp_path / "s.wav", _sound(64, 1, 0.5, 44100), 44100).astype(np.float32)
    pcm, rate = media.read_audio(tmp_path / "s.wav")
    assert rate == 44100 and pcm.dtype == np.float32 and np.array_equal(pcm, want)
    pic = _picture(65, 64, 96)
    vf, af = _latents(d, [pic, ("audio", str(tmp_path / "s.wav"))])
    va, aa = _latents(d, [pic, {"audio": want, "sample_rate": 44100}])
    assert np.array_equal(vf, va) and np.array_equal(af, aa)


@pytest.mark.parametrize("rate,needle", [(2000, "input rate 2000 Hz is outside 4000 .. 384000 Hz"),
                                         (500000, "input rate 500000 Hz is outside")])
def test_cli_bad_rate(ref2va_ckpt, tmp_path, rate, needle):  # noqa: F811
    from tests.h3cli import assert_clean_error

    d, _ = ref2va_ckpt
    from PIL import Image

    Image.fromarray(_picture(66, 64, 96)).save(tmp_path / "a.png")
    _wav16(tmp_path / "s.wav", np.zeros((1, 800), np.float32), rate)
    before = sorted(str(q) for q in tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "h3ctl", "render", "-d", str(d), "-p", PROMPT, "--size", f"{W}x{H}",
                           "--frames", str(FRAMES), "--steps", "2", "-q", "-o", str(tmp_path / "o.mp4"),
                           "--ref-image", str(tmp_path / "a.png"), "--ref-audio", str(tmp_path / "s.wav")],
                          capture_output=True, text=True, cwd=ROOT / "python")
    assert_clean_error(proc, "reference audio 2", "s.wav", needle)
    assert sorted(str(q) for q in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("ext,codec,rate,channels", [
    ("wav", ["-c:a", "pcm_s16le"], 44100, 2), ("flac", ["-c:a", "flac"], 22050, 1),
    ("mp3", ["-c:a", "libmp3lame", "-b:a", "128k"], 48000, 2), ("ogg", ["-c:a", "libvorbis"], 44100, 1),
    ("m4a", ["-c:a", "aac", "-b:a", "128k"], 48000, 2), ("aiff", ["-c:a", "pcm_s16be"], 16000, 1),
    ("mkv", ["-c:a", "libopus", "-b:a", "96k"], 48000, 2)])
def test_audio_containers_decode_at_their_rate(tmp_path, ext, codec, rate, channels):
    """Each container read_audio accepts (sniffed by content) decodes at the file's own rate and channel count to
    the tone that was encoded: a 440 Hz sine of amplitude 0.3 (its spectrum's peak within 1 Hz, its RMS within
    0.5 dB; lossless formats within 1 / 32768 of it)."""
    from h3ctl import media

    path = tmp_path / f"tone.{ext}"
    layout = "stereo" if channels == 2 else "mono"
    subprocess.run([media.ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i",
                    f"aevalsrc=0.3*sin(2*PI*440*t):s={rate}:d=1:c={layout}", *codec, str(path)], check=True)
    pcm, got_rate = media.read_audio(path)
    assert got_rate == rate and pcm.shape[0] == channels and pcm.dtype == np.float32
    x = pcm[0].astype(np.float64)
    assert abs(pcm.shape[1] - rate) <= rate // 20  # a second, give or take codec framing
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size), n=8 * x.size))
    assert abs(np.argmax(spec) * rate / (8 * x.size) - 440) < 1
    mid = x[x.size // 4: 3 * x.size // 4]
    assert abs(20 * math.log10(np.sqrt(np.mean(mid**2)) / (0.3 / math.sqrt(2)))) < 0.5
    if ext in ("wav", "flac", "aiff"):
        want = 0.3 * np.sin(2 * np.pi * 440 * np.arange(x.size) / rate)
        assert np.abs(x - want).max() <= 1.01 / 32768
