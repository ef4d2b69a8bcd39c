"""Per-step previews: the sampler's current x0 estimate through a cheap latent-to-RGB linear map.

The sampler is Euler on flow matching: x_{i+1} = x_i + (s_{i+1} - s_i) v_i, so two consecutive latents and
their sigmas give the velocity v = (x_{i+1} - x_i) / (s_{i+1} - s_i) and the clean-video estimate
x0 = x_{i+1} - s_{i+1} v, which is what the denoiser currently believes the video is (exact at the last step,
where s = 0). No C changes are needed: `Engine.latents()` after each step (Engine.run's on_step) is enough.

The map sends each latent voxel's C channels (plus a constant) to an RGB colour: a (C+1) x 3 matrix fitted by
least squares against the real video decoder. The decoder is far from linear, so where the map is fitted
matters: random latents alone give a map that misses real content (it scores below a flat mean colour on clips
with black or white backgrounds), so the fit also decodes the x0 estimates of a few short calibration renders
(fixed, generic prompts at 64 x 64) and random latents are kept at a lower weight. Each decoded frame is
box-averaged over the pixels a latent voxel decodes to (the spatial ratio, and the VAE's frames per temporal
token), which is exactly the least-squares fit against nearest-upsampled latents. Fitting takes about a second
on h3-tiny; it happens once per model: the map is stored in the user's cache folder
($XDG_CACHE_HOME/h3ctl/preview or ~/.cache/h3ctl/preview), keyed by a hash of the model's configs and the
sizes and leading bytes of every weight file. A model may also ship its own map as `h3ctl_preview.json` next
to its `model_index.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import _lib
from ._lib import H3Error

FIT_VERSION = 2  # 2: calibration at 128 x 128, 6 steps; random latents only without calibration
MAP_FILENAME = "h3ctl_preview.json"

# Generic prompts whose renders calibrate the map: saturated colours on dark, light, grey and blue grounds.
CALIBRATION_PROMPTS = (
    "a red circle moves right on a black background",
    "a blue square moves left on a white background",
    "a yellow triangle bounces on a gray background",
    "a green circle moves up on a navy background",
    "an orange square stays still on a black background",
    "a purple triangle moves down on a white background",
    "a white circle bounces on a navy background",
)
# width, height, frames, steps. h3-tiny's decoder of stage 8 maps the latents of tiny, 4-step renders and random
# latents far off what real renders decode to (a fit on them reached 20.0 dB on held-out renders, where a fit on
# those renders themselves reaches 25.8-29.4 dB): the calibration renders run at the model's trained canvas with
# 6 steps, and random latents are left out of a calibrated fit (even at weight 0.03 they cost 1-2 dB on held-out
# renders); they remain the fit of last resort (calibrate=False).
CALIBRATION_SHAPE = (128, 128, 22, 6)
RANDOM_LATENTS = 2                   # random latents [C, 7, 8, 8] decoded ...
RANDOM_WEIGHT = 0.0                  # ... each weighing this much against one calibration decode (0: not decoded)
RIDGE = 1e-2

PreviewFn = Callable[..., object]  # preview(rgb uint8 [T, h, w, 3], step) -> truthy to cancel


# -- schedule and x0 ---------------------------------------------------------------------------------

def sigma_schedule(steps: int, shift: float) -> np.ndarray:
    """The sampler's sigmas for `steps` grid points (libh3's h3_sigma_schedule, bit for bit)."""
    sig = np.zeros(max(int(steps), 2), np.float32)
    n = _lib.check(_lib.lib().h3_sigma_schedule(int(steps), float(shift), sig.ctypes.data_as(_lib.c_float_p), None))
    return sig[:n].copy()


def x0_estimate(prev: np.ndarray, cur: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    """Clean-latent estimate from x_i (prev, at sigma) and x_{i+1} (cur, at sigma_next) of one Euler step."""
    if sigma_next == 0.0:
        return cur
    v = (cur - prev) / np.float32(sigma_next - sigma)
    return cur - np.float32(sigma_next) * v


def video_shift(engine) -> float:
    """The video schedule's shift, as libh3 reads it for the transformer (model_index.json's sigma_shift_scales,
    else the release's 12): one rule, in libh3's config reader."""
    try:
        return float(engine._ctx.info()["components"]["transformer"]["config"]["shift_video"])
    except (KeyError, TypeError) as e:
        raise H3Error(f"{engine.model_dir}: no transformer config to take the sampler's shift from") from e


# -- latent geometry -------------------------------------------------------------------------------

def frame_tokens(T: int, F: int, vae_cfg: dict | None = None) -> np.ndarray:
    """For each of F decoded frames, the latent frame (0..T-1) it comes from.

    The H3 video VAE decodes clips of `clip_length` frames from clip_length + token_drop = k x temporal_ratio
    tokens; the first token of each clip yields ratio - drop frames, the others `ratio` (1, 4, 4, 4, 4 for the
    release). Models whose config does not add up get an even split.
    """
    cfg = vae_cfg or {}
    ratio, clip = int(cfg.get("temporal_ratio", 4)), int(cfg.get("clip_length", 17))
    drop = int(cfg.get("token_drop", 3))
    if ratio > 0 and clip > 0 and 0 <= drop < ratio and (clip + drop) % ratio == 0:
        per_clip = (clip + drop) // ratio
        counts = [ratio - drop if k % per_clip == 0 else ratio for k in range(T)]
        if sum(counts) == F:
            return np.repeat(np.arange(T), counts)
    return np.minimum((np.arange(F) * T) // max(F, 1), T - 1)


def pool_frames(pixels: np.ndarray, T: int, h: int, w: int, vae_cfg: dict | None = None) -> np.ndarray:
    """Decoded frames [F, H, W, 3] -> their mean over each latent voxel's pixels: [T, h, w, 3]."""
    F, H, W, _ = pixels.shape
    sy, sx = H // h, W // w
    px = pixels[:, : h * sy, : w * sx].reshape(F, h, sy, w, sx, 3).mean(axis=(2, 4))
    owner = frame_tokens(T, F, vae_cfg)
    out = np.zeros((T, h, w, 3), np.float64)
    for t in range(T):
        sel = owner == t
        out[t] = px[sel].mean(axis=0) if sel.any() else px[min(int(t * F / T), F - 1)]
    return out


def _features(lat: np.ndarray) -> np.ndarray:
    C = lat.shape[0]
    x = np.moveaxis(np.asarray(lat, np.float64), 0, -1).reshape(-1, C)
    return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)


# -- the map ----------------------------------------------------------------------------------------

@dataclass
class PreviewMap:
    """latent [C, T, h, w] -> RGB [T, h, w, 3]: rgb = [latent, 1] @ matrix, clipped to [0, 1]."""

    matrix: np.ndarray                       # float32 [C + 1, 3]
    key: str = ""
    source: str = "fit"                      # "fit", "cache" or "model"
    info: dict = field(default_factory=dict)

    @property
    def channels(self) -> int:
        return self.matrix.shape[0] - 1

    def float_rgb(self, latents: np.ndarray) -> np.ndarray:
        lat = np.asarray(latents, np.float32)
        if lat.ndim != 4 or lat.shape[0] != self.channels:
            raise H3Error(f"preview: latents must be [{self.channels}, T, h, w], got {list(lat.shape)}")
        C, T, h, w = lat.shape
        flat = np.moveaxis(lat, 0, -1).reshape(-1, C) @ self.matrix[:C] + self.matrix[C]
        return np.clip(flat.reshape(T, h, w, 3), 0.0, 1.0)

    def rgb(self, latents: np.ndarray) -> np.ndarray:
        """uint8 [T, h, w, 3]: one small image per latent frame."""
        return np.round(self.float_rgb(latents) * 255.0).astype(np.uint8)

    def to_json(self) -> dict:
        return {"format": "h3ctl-preview-map", "version": FIT_VERSION, "key": self.key,
                "channels": self.channels, "matrix": self.matrix.astype(float).round(7).tolist(), "info": self.info}

    @staticmethod
    def from_json(d: dict, channels: int | None = None, source: str = "cache") -> "PreviewMap":
        m = np.asarray(d["matrix"], dtype=np.float32)
        if m.ndim != 2 or m.shape[1] != 3 or m.shape[0] < 2 or not np.isfinite(m).all():
            raise ValueError("matrix must be [C + 1, 3] finite numbers")
        if channels is not None and m.shape[0] != channels + 1:
            raise ValueError(f"matrix is for {m.shape[0] - 1} latent channels, the model has {channels}")
        return PreviewMap(m, key=str(d.get("key", "")), source=source, info=dict(d.get("info", {})))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "h3ctl" / "preview"


def model_key(engine) -> str:
    """Identity of a model for the cache: configs, file names and sizes, and each file's first 64 KiB."""
    info = engine._ctx.info()
    h = hashlib.sha256(f"h3ctl-preview-{FIT_VERSION}".encode())
    h.update(json.dumps(CALIBRATION_PROMPTS).encode() + repr((CALIBRATION_SHAPE, RANDOM_LATENTS,
                                                               RANDOM_WEIGHT)).encode())
    for name in sorted(info.get("components", {})):
        comp = info["components"][name]
        h.update(name.encode() + json.dumps(comp.get("config", {}), sort_keys=True).encode())
        d = comp.get("dir")
        if not d or not os.path.isdir(d):
            continue
        for root, dirs, files in os.walk(d):
            dirs.sort()
            for fn in sorted(files):
                p = os.path.join(root, fn)
                try:
                    size = os.path.getsize(p)
                    with open(p, "rb") as f:
                        head = f.read(65536)
                except OSError:
                    continue
                h.update(os.path.relpath(p, d).encode() + str(size).encode() + hashlib.sha256(head).digest())
    return h.hexdigest()


def _vae_cfg(engine) -> dict:
    try:
        return dict(engine._ctx.info()["components"]["video_vae"]["config"])
    except (H3Error, KeyError, TypeError):
        return {}


def _decode(engine, lat: np.ndarray) -> np.ndarray:
    from .parity.vae_video import decode

    _, px = decode(engine._ctx, lat, want_rgb=False)
    return px


def fit_map(engine, *, calibrate: bool = True, seed: int = 0) -> PreviewMap:
    """Fit the map for `engine`'s model against its video decoder.

    Runs the calibration renders on `engine` (so call it between renders, never inside one): each render's last
    two x0 estimates are decoded (plus RANDOM_LATENTS random latents at RANDOM_WEIGHT each when that is not 0);
    without calibration, the random latents alone.
    """
    vae_cfg = _vae_cfg(engine)
    C = None
    normal = rhs = None
    used = {"renders": 0, "random": 0}

    def add(lat, weight):
        nonlocal normal, rhs, C
        px = _decode(engine, lat)
        A = _features(lat)
        Y = pool_frames(px, *lat.shape[1:], vae_cfg).reshape(-1, 3)
        if normal is None:
            C = lat.shape[0]
            normal, rhs = np.zeros((C + 1, C + 1)), np.zeros((C + 1, 3))
        normal += (weight / len(A)) * (A.T @ A)
        rhs += (weight / len(A)) * (A.T @ Y)

    if calibrate:
        W, H, F, steps = CALIBRATION_SHAPE
        shift = video_shift(engine)
        sig = sigma_schedule(steps, shift)
        for k, prompt in enumerate(CALIBRATION_PROMPTS):
            x0s = []
            seen = {}

            def on_step(done, total):
                cur, _ = engine.latents()
                if done > 0:
                    i = done - 1
                    x0s.append(x0_estimate(seen["prev"], cur, float(sig[i]), float(sig[i + 1]))
                               if i + 1 < len(sig) else cur)
                seen["prev"] = cur

            engine.run(engine.request(prompt, W, H, F, steps=steps, seed=1000 + k), on_step=on_step, decode=None)
            for x0 in x0s[-2:]:
                add(x0, 1.0)
                used["renders"] += 1
    rng = np.random.default_rng(seed)
    info = engine._ctx.info()["components"]["video_vae"]["config"]
    C0 = int(info.get("latent_channels", C or 0))
    for _ in range(RANDOM_LATENTS if not calibrate or RANDOM_WEIGHT > 0 else 0):
        add(rng.standard_normal((C0, 7, 8, 8)).astype(np.float32), RANDOM_WEIGHT if calibrate else 1.0)
        used["random"] += 1
    n = normal.shape[0]
    matrix = np.linalg.solve(normal + RIDGE * np.eye(n), rhs).astype(np.float32)
    return PreviewMap(matrix, source="fit", info={"decodes": used, "ridge": RIDGE})


def _read_map(path: Path, channels: int, key: str | None, source: str) -> PreviewMap | None:
    try:
        d = json.loads(path.read_text())
        if d.get("format") != "h3ctl-preview-map":
            return None
        if key is not None and d.get("key") != key:
            return None
        return PreviewMap.from_json(d, channels, source=source)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable or stale: refit


def _write_cache(path: Path, pmap: PreviewMap) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".preview-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(pmap.to_json(), f)
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def load_map(engine, *, refit: bool = False, on_fit: Callable[[], object] | None = None) -> PreviewMap:
    """The model's map: shipped with the model, else cached, else fitted now (and cached when possible).

    `on_fit()` is called just before a fit starts (to tell the user why the first preview takes a moment).
    An unwritable cache folder only means the map is fitted again next time.
    """
    memo = getattr(engine, "_h3ctl_preview_map", None)
    if memo is not None and not refit:
        return memo  # the engine keeps its map: one fit per loaded model even when nothing can be cached
    lock = getattr(engine, "lock", None)  # a fit runs several engine calls: no other thread in between
    with lock if lock is not None else contextlib.nullcontext():
        m = _find_map(engine, refit, on_fit)
    try:
        engine._h3ctl_preview_map = m
    except AttributeError:  # pragma: no cover - an engine with __slots__
        pass
    return m


def _find_map(engine, refit: bool, on_fit) -> PreviewMap:
    info = engine._ctx.info()
    channels = int(info["components"]["video_vae"]["config"]["latent_channels"])
    pdir = Path(info.get("partition_dir") or engine.model_dir)
    if not refit:
        for shipped in (pdir / MAP_FILENAME, Path(engine.model_dir) / MAP_FILENAME):
            if shipped.is_file():
                m = _read_map(shipped, channels, None, "model")
                if m is not None:
                    return m
    key = model_key(engine)
    path = cache_dir() / f"{key[:32]}.json"
    if not refit:
        m = _read_map(path, channels, key, "cache")
        if m is not None:
            return m
    if on_fit is not None:
        on_fit()
    m = fit_map(engine)
    m.key = key
    m.info["cached"] = _write_cache(path, m)
    m.info["path"] = str(path)
    return m


# -- driving a render -------------------------------------------------------------------------------

def _arity(fn) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


class Previewer:
    """Steps a prepared render, calling `callback(rgb, step)` every `every` steps and at the last one.

    rgb is uint8 [T, h, w, 3] (one image per latent frame, at latent resolution); step counts the transformer
    evaluations done. A truthy return value cancels the render as Ctrl-C does.
    """

    def __init__(self, engine, callback: PreviewFn, every: int = 1, pmap: PreviewMap | None = None):
        if not callable(callback):
            raise H3Error("preview must be a callable taking (rgb, step)")
        if int(every) < 1:
            raise H3Error(f"preview_every must be 1 or more, got {every}")
        self.engine = engine
        self.callback = callback
        self.every = int(every)
        self.map = pmap if pmap is not None else load_map(engine)
        self._two = _arity(callback) >= 2
        self.shown = 0

    def _deliver(self, x0, step):
        rgb = self.map.rgb(x0)
        self.shown += 1
        stop = self.callback(rgb, step) if self._two else self.callback(rgb)
        return bool(stop)

    def stepper(self, steps: int) -> Callable[[int, int], bool]:
        """The on_step callback of Engine.run for a request of `steps` sigma grid points: before a step whose
        preview is due it keeps the latents, after it delivers the x0 estimate. Returns True (cancel) when the
        preview callback asked to stop."""
        eng = self.engine
        sig = sigma_schedule(steps, video_shift(eng))
        state = {"prev": None}

        def on_step(done: int, total: int) -> bool:
            exact = len(sig) == total + 1
            if state["prev"] is not None:
                i = done - 1
                cur = eng.latents()[0]
                x0 = x0_estimate(state["prev"], cur, float(sig[i]), float(sig[i + 1])) if exact else cur
                state["prev"] = None
                if self._deliver(x0, done):
                    return True
            if done < total and ((done + 1) % self.every == 0 or done + 1 == total):
                state["prev"] = eng.latents()[0]
            return False

        on_step.who = "preview callback"  # named by the Cancelled it causes
        return on_step


def upscale(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of uint8 [h, w, 3] (or [..., h, w, 3]) to [height, width, 3], pixel centres aligned."""
    a = np.asarray(rgb, np.float32)
    h, w = a.shape[-3], a.shape[-2]

    def axis(n_out, n_in):
        x = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
        x = np.clip(x, 0, n_in - 1)
        lo = np.floor(x).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (x - lo).astype(np.float32)

    ylo, yhi, fy = axis(height, h)
    xlo, xhi, fx = axis(width, w)
    rows = a[..., ylo, :, :] * (1 - fy)[:, None, None] + a[..., yhi, :, :] * fy[:, None, None]
    out = rows[..., xlo, :] * (1 - fx)[:, None] + rows[..., xhi, :] * fx[:, None]
    return np.clip(np.round(out), 0, 255).astype(np.uint8)
