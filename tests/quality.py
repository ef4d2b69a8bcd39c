"""Quality measures of a render against a reference render: PSNR and SSIM of frames, log-spectral distance of audio.

Plain numpy (no image or audio library), so the benchmark and the tests need nothing beyond the test environment.
"""

from __future__ import annotations

import numpy as np


def psnr(a: np.ndarray, b: np.ndarray, data_range: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB over all values (inf when identical)."""
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(data_range**2 / mse))


def _gaussian(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2
    g = np.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def _blur(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of [..., H, W, C] along H and W."""
    n = len(g)
    H, W = x.shape[-3], x.shape[-2]
    y = sum(g[k] * x[..., k:H - n + 1 + k, :, :] for k in range(n))
    return sum(g[k] * y[..., :, k:W - n + 1 + k, :] for k in range(n))


def ssim(a: np.ndarray, b: np.ndarray, data_range: float = 255.0) -> float:
    """Mean structural similarity (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03) of
    frames [F, H, W, C] or one image [H, W, C], computed per channel and averaged over channels, windows and
    frames."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.ndim == 3:
        a, b = a[None], b[None]
    g = _gaussian()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_a, mu_b = _blur(a, g), _blur(b, g)
    var_a = _blur(a * a, g) - mu_a**2
    var_b = _blur(b * b, g) - mu_b**2
    cov = _blur(a * b, g) - mu_a * mu_b
    m = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(m.mean())


def _power_spectrogram(x: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if len(x) < n_fft:
        x = np.pad(x, (0, n_fft - len(x)))
    frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    spec = np.fft.rfft(x[idx] * np.hanning(n_fft)[None, :], axis=1)
    return np.abs(spec) ** 2


def log_spectral_distance(a: np.ndarray, b: np.ndarray, n_fft: int = 1024, hop: int = 256, eps: float = 1e-10) -> float:
    """Log-spectral distance in dB between audio a and b ([channels, samples] or [samples]): per STFT frame
    sqrt(mean over frequency of (10 log10 Pa - 10 log10 Pb)^2), averaged over frames and channels."""
    a = np.atleast_2d(np.asarray(a, np.float64))
    b = np.atleast_2d(np.asarray(b, np.float64))
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    out = []
    for ca, cb in zip(a, b):
        pa, pb = _power_spectrogram(ca, n_fft, hop), _power_spectrogram(cb, n_fft, hop)
        d = 10 * np.log10(pa + eps) - 10 * np.log10(pb + eps)
        out.append(np.sqrt(np.mean(d**2, axis=1)).mean())
    return float(np.mean(out))
