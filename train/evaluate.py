"""Semantic checks of a generated 128x128x22 clip against the spec of its (single-object) prompt.

These approximate the semantic suite the lead will run later (through the C engine and diffusers); thresholds:

* ``colour``  - foreground = pixels farther than 64 (of 255, RGB distance) from the prompt's background colour;
  the median foreground RGB's nearest named colour (``world.COLOUR_RGB``) must be the prompt colour;
* ``motion``  - foreground centroid per frame; moves left/right/up/down: travel along the axis (mean of the last 3
  frames minus the first 3) >= 15 % of the canvas in the right direction and larger than the cross-axis travel;
  stays still: travel < 5 % and range < 8 % on both axes; bounces: vertical range >= 15 % and horizontal travel < 10 %;
* ``pitch``   - sounding prompts: dominant frequency of L+R within +-8 % of 220/440/880 Hz; ``no sound``: the RMS of
  the tonal bands (+-8 % around 220, 440, 660, 880 Hz) < 0.02;
* ``pan``     - horizontal motion with a sound: Pearson correlation between the per-frame equal-power pan estimate
  and the foreground x centroid >= 0.5 (over frames with audio energy);
* ``clicks``  - bounces: >= 1 click detected (high-passed envelope peak) and at least half of the video's floor
  contacts (local maxima of the centroid y) have a click within +-3 frames.

Anchored requests (FL2VA, :func:`check_anchored`): all of the above (so the motion between the anchors must follow the
prompt), plus for each anchor (``first`` -> frame 0, ``last`` -> the last frame) against the keyframe it was given:

* ``{a}_psnr``   - PSNR of the whole frame against the keyframe >= 25 dB (at the output size, 128x128);
* ``{a}_colour`` - the frame's foreground colour (as for ``colour``) is the keyframe's;
* ``{a}_place``  - the frame's foreground centroid lies within 10 % of the canvas side (Euclidean) of the keyframe's.

``measures`` also holds ``{a}_psnr_ceiling``: the PSNR of the video VAE's own reconstruction of that reference frame
(when given), the best any DiT can reach through the shipped decoder.
"""

from __future__ import annotations

import numpy as np

from train import world

SR = world.SAMPLE_RATE
FPS = world.FPS


def fg_mask(frames: np.ndarray, bg_rgb) -> np.ndarray:
    d = np.linalg.norm(frames.astype(np.float32) - np.asarray(bg_rgb, np.float32), axis=-1)
    return d > 64.0


def nearest_colour(rgb) -> str:
    rgb = np.asarray(rgb, np.float64)
    return min(world.COLOURS, key=lambda c: float(np.sum((np.asarray(world.COLOUR_RGB[c]) - rgb) ** 2)))


def centroids(mask: np.ndarray) -> np.ndarray:
    F, H, W = mask.shape
    xs, ys = np.arange(W) + 0.5, np.arange(H) + 0.5
    tot = mask.sum(axis=(1, 2)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        cx = (mask.sum(axis=1) * xs).sum(1) / tot
        cy = (mask.sum(axis=2) * ys).sum(1) / tot
    return np.stack([cx, cy], 1)


def dominant_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1.0 / SR)[int(np.argmax(spec))])


def tonal_rms(x: np.ndarray) -> float:
    spec = np.fft.rfft(x)
    hz = np.fft.rfftfreq(len(x), 1.0 / SR)
    keep = np.zeros_like(hz, dtype=bool)
    for f in (220.0, 440.0, 660.0, 880.0):
        keep |= np.abs(hz - f) <= 0.08 * f
    power = np.sum(np.abs(spec[keep]) ** 2) * 2 / len(x) ** 2
    return float(np.sqrt(power))


def frame_pan(audio: np.ndarray, F: int):
    bounds = [int(round(f / FPS * SR)) for f in range(F + 1)]
    pans, energy = [], []
    for f in range(F):
        seg = audio[:, bounds[f]:bounds[f + 1]].astype(np.float64)
        el, er = np.sqrt((seg ** 2).mean(axis=1))
        pans.append(np.arctan2(er, el) / (np.pi / 2))
        energy.append(el ** 2 + er ** 2)
    return np.array(pans), np.array(energy)


def click_frames(audio: np.ndarray) -> list:
    """Frames (float) of detected clicks: peaks of the second-difference energy envelope in 2 ms hops."""
    mono = audio.astype(np.float64).sum(0)
    hp = np.diff(mono, 2) ** 2
    hop = 64
    n = len(hp) // hop
    env = hp[: n * hop].reshape(n, hop).sum(1)
    if env.max() <= 0:
        return []
    floor = max(0.2 * env.max(), 20 * np.median(env) + 1e-9)
    peaks = [i for i in range(1, n - 1) if env[i] >= floor and env[i] >= env[i - 1] and env[i] >= env[i + 1]]
    out = []
    for p in peaks:  # merge peaks closer than 30 ms
        if out and p - out[-1] < 15:
            continue
        out.append(p)
    return [p * hop / SR * FPS for p in out]


def shape_of(mask: np.ndarray) -> str | None:
    """The shape of a single-object foreground mask [F, H, W], by vote over frames: per frame, the shape whose
    template of the same area, centred on the mask's centroid (a triangle's centroid lies r/3 below its box centre),
    overlaps the mask best (IoU). None without a usable object. Robust to the rounded corners the video VAE
    leaves (a bounding-box fill ratio calls those circles): 27/27 on clips, 18/27 on VAE round trips."""
    votes = []
    for m in mask:
        ys, xs = np.nonzero(m)
        if len(ys) < 20:
            continue
        cy, cx = ys.mean() + 0.5, xs.mean() + 0.5
        H, W = m.shape
        X = np.arange(W, dtype=np.float32)[None, :] + 0.5
        Y = np.arange(H, dtype=np.float32)[:, None] + 0.5
        best = None
        for sh in world.SHAPES:
            area = float(len(ys))
            r = {"circle": np.sqrt(area / np.pi), "square": np.sqrt(area) / 2, "triangle": np.sqrt(area / 2)}[sh]
            t = world._sdf(sh, X, Y, cx, cy - (r / 3 if sh == "triangle" else 0.0), r) < 0
            iou = (t & m).sum() / max((t | m).sum(), 1)
            if best is None or iou > best[0]:
                best = (iou, sh)
        votes.append(best[1])
    if not votes:
        return None
    names, counts = np.unique(votes, return_counts=True)
    return str(names[np.argmax(counts)])


def check(spec: world.Spec, frames: np.ndarray, audio: np.ndarray) -> dict:
    """Checks for a single-object spec. Returns {name: bool} (only the checks that apply) plus measurements."""
    o = spec.objects[0]
    F, H, W, _ = frames.shape
    res: dict = {}
    meas: dict = {}
    mask = fg_mask(frames, world.BACKGROUND_RGB[spec.background])
    area = mask.reshape(F, -1).mean(1)
    meas["fg_area"] = float(area.mean())
    if mask.sum() > 0:
        med = np.median(frames[mask].reshape(-1, 3), axis=0)
        meas["fg_rgb"] = [float(v) for v in med]
        meas["colour"] = nearest_colour(med)
    else:
        meas["colour"] = None
    # an object covers ~4-7 % of the canvas: a "foreground" over 40 % of it is a failed render, not an object
    sane = 0.0 < meas["fg_area"] < 0.4
    res["colour"] = bool(sane and meas["colour"] == o.colour)

    cen = centroids(mask)
    valid = (area > 0.002) & (area < 0.4)
    if valid.sum() >= F // 2:
        c = cen.copy()
        idx = np.where(valid)[0]
        for ax in range(2):  # fill frames without foreground by interpolation
            c[:, ax] = np.interp(np.arange(F), idx, cen[idx, ax])
        disp = (c[-3:].mean(0) - c[:3].mean(0)) / np.array([W, H])
        ext = (c.max(0) - c.min(0)) / np.array([W, H])
        meas["travel"] = [float(v) for v in disp]
        meas["range"] = [float(v) for v in ext]
        m = o.motion
        if m in ("moves left", "moves right", "moves up", "moves down"):
            ax = 0 if m in ("moves left", "moves right") else 1
            sign = 1 if m in ("moves right", "moves down") else -1
            res["motion"] = bool(disp[ax] * sign >= 0.15 and abs(disp[ax]) > abs(disp[1 - ax]))
        elif m == "stays still":
            res["motion"] = bool(np.all(np.abs(disp) < 0.05) and np.all(ext < 0.08))
        else:
            res["motion"] = bool(ext[1] >= 0.15 and abs(disp[0]) < 0.10)
    else:
        c = None
        res["motion"] = False

    mono = audio.astype(np.float64).sum(0)
    if o.sound != "no sound":
        hz = dominant_hz(mono)
        meas["dominant_hz"] = hz
        target = world.SOUND_HZ[o.sound]
        res["pitch"] = bool(abs(hz / target - 1) <= 0.08)
    else:
        meas["tonal_rms"] = tonal_rms(mono)
        res["pitch"] = bool(meas["tonal_rms"] < 0.02)

    if o.motion in ("moves left", "moves right") and o.sound != "no sound":
        pan, energy = frame_pan(audio, F)
        ok = energy > 0.1 * energy.max() if energy.max() > 0 else np.zeros(F, bool)
        if c is not None and ok.sum() >= 6 and np.std(pan[ok]) > 1e-6 and np.std(c[ok, 0]) > 1e-6:
            r = float(np.corrcoef(pan[ok], c[ok, 0])[0, 1])
        else:
            r = float("nan")
        meas["pan_corr"] = r
        res["pan"] = bool(r >= 0.5)

    if o.motion == "bounces":
        clicks = click_frames(audio)
        meas["click_frames"] = [round(x, 1) for x in clicks]
        if c is not None:
            y = c[:, 1]
            contacts = [f for f in range(1, F - 1) if y[f] >= y[f - 1] and y[f] >= y[f + 1]
                        and y[f] > y.min() + 0.5 * (y.max() - y.min())]
        else:
            contacts = []
        meas["contact_frames"] = contacts
        near = [min((abs(f - k) for k in clicks), default=99) <= 3 for f in contacts]
        res["clicks"] = bool(len(clicks) >= 1 and (len(contacts) == 0 or np.mean(near) >= 0.5))
    return {"checks": res, "measures": meas}


ANCHOR_PSNR_DB = 25.0
ANCHOR_PLACE = 0.10


def psnr_u8(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float(10 * np.log10(255.0 ** 2 / max(mse, 1e-12)))


def frame_object(frame: np.ndarray, bg_rgb) -> tuple:
    """(nearest colour name or None, centroid (x, y) or None) of one frame's foreground."""
    mask = fg_mask(frame[None], bg_rgb)[0]
    area = float(mask.mean())
    if not 0.0 < area < 0.4:
        return None, None
    colour = nearest_colour(np.median(frame[mask].reshape(-1, 3), axis=0))
    return colour, centroids(mask[None])[0]


def is_anchor_check(name: str) -> bool:
    return name.startswith(("first_", "last_"))


def check_anchored(spec: world.Spec, frames: np.ndarray, audio: np.ndarray, ref_frames: np.ndarray, anchors,
                   ceiling_frames: np.ndarray | None = None) -> dict:
    """:func:`check` plus the anchor checks (module docstring). ``ref_frames``: the reference clip the keyframes are
    its first / last frames of; ``anchors``: ("first",), ("last",) or ("first", "last")."""
    r = check(spec, frames, audio)
    res, meas = r["checks"], r["measures"]
    bg = world.BACKGROUND_RGB[spec.background]
    H, W = frames.shape[1:3]
    for a in anchors:
        f = 0 if a == "first" else -1
        key, gen_f = ref_frames[f], frames[f]
        p = psnr_u8(gen_f, key)
        kc, kxy = frame_object(key, bg)
        gc, gxy = frame_object(gen_f, bg)
        dist = float(np.hypot(*(gxy - kxy)) / max(W, H)) if gxy is not None and kxy is not None else float("inf")
        meas[f"{a}_psnr"] = p
        meas[f"{a}_colour"] = gc
        meas[f"{a}_offset"] = dist
        if ceiling_frames is not None:
            meas[f"{a}_psnr_ceiling"] = psnr_u8(ceiling_frames[f], key)
        res[f"{a}_psnr"] = bool(p >= ANCHOR_PSNR_DB)
        res[f"{a}_colour"] = bool(gc is not None and gc == kc)
        res[f"{a}_place"] = bool(dist <= ANCHOR_PLACE)
    return r


def summarize(results: list, keep=None) -> dict:
    """results: [{"checks": {...}}] -> pass counts per check and overall (only the checks ``keep(name)`` accepts)."""
    per: dict = {}
    for r in results:
        for k, v in r["checks"].items():
            if keep is not None and not keep(k):
                continue
            a = per.setdefault(k, [0, 0])
            a[0] += int(v)
            a[1] += 1
    total_pass = sum(v[0] for v in per.values())
    total = sum(v[1] for v in per.values())
    return {"per_check": {k: f"{v[0]}/{v[1]}" for k, v in per.items()},
            "pass_rate": total_pass / max(1, total), "passed": total_pass, "total": total}
