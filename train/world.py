"""Deterministic synthetic audiovisual world: the training data for h3-tiny.

Pure numpy. Training-only: nothing under ``python/h3ctl`` may import this module.

Overview
--------
A *spec* (:class:`Spec`) holds the semantic attributes of a clip: a background and one or two
objects, each with a shape, colour, motion and sound. :func:`make_clip` turns a spec plus a
``seed`` (which fixes only nuisance variables: object size, start position, travel, bounce
period/phase, click noise) into a :class:`Clip`: RGB frames, stereo audio, the two caption forms
and exact ground truth. Same arguments -> byte-identical arrays.

Conventions
-----------
* Video: 24 fps, ``frames`` uint8 ``[F, H, W, 3]``. Image coordinates are continuous pixels, x to
  the right, y downwards; pixel ``(row i, col j)`` covers ``[j, j+1) x [i, i+1)`` and its centre
  is ``(j + 0.5, i + 0.5)``. So a centroid measured as the coverage-weighted mean of pixel
  centres matches ``truth`` centroids.
* Audio: 32 kHz stereo float32 ``[2, S]`` (row 0 = left, row 1 = right) with the
  *latent-aligned* length ``S = round(F / 24 * 40) * 800`` (:func:`audio_samples`), i.e. a whole
  number of 40 Hz audio latents (22 frames -> 37 latents -> 29600 samples; the video itself lasts
  22/24 s = 29333 samples, the audio runs on slightly). Audio sample ``n`` is at time
  ``n / 32000`` s, video frame ``f`` at ``f / 24`` s; positions between/after frames are
  linearly interpolated/held.
* Objects are drawn with a 1-pixel anti-aliased edge (coverage = clip(0.5 - signed distance));
  interior pixels are exactly the object's RGB. Two objects never overlap (per-frame boxes are
  kept >= 2 px apart), so every non-background pixel belongs to exactly one object.
* Moving objects travel 42-55 % of the canvas along their axis (linear, constant speed, first
  to last frame) and stay fully inside the canvas. ``stays still`` objects do not move at all.
  ``bounces``: the object stays at a fixed x and bounces vertically on an invisible floor at the
  bottom of the canvas; its height above the floor is a parabola of period ``P`` frames
  (8..12, at most F-1) with apex 42-55 % of the canvas height. Floor contacts ("bounces") happen
  exactly at integer frames ``f = k*P - phase`` (phase in 1..P-1, so never at frame 0); every
  clip with F >= 2 contains >= 1 bounce (22 frames: 1-3). They are recorded in
  ``truth.objects[i].bounce_frames``.
* Sounds: ``low hum`` = 220 Hz sine + 0.3 x 660 Hz (3rd harmonic; dominant stays 220 Hz),
  ``mid tone`` = 440 Hz pure sine, ``high beep`` = 880 Hz sine gated on/off at 4 Hz (120 ms on,
  5 ms raised-cosine ramps), ``no sound`` = nothing. Peak tone amplitude 0.3, 10 ms fade in/out at
  the clip ends. Both objects of a two-object clip may sound, but then with different sounds
  (different pitches). Each sounding object is panned with equal power from its *horizontal
  centroid*: ``p = x / W``, ``gain_L = cos(p*pi/2)``, ``gain_R = sin(p*pi/2)`` (:func:`pan_gains`),
  interpolated per audio sample. ``truth.objects[i].pan`` is ``p`` per video frame.
* Bounce clicks: at every bounce, a 4 ms exponentially decaying white-noise burst (peak ~0.45,
  broadband) starting at sample ``round(f / 24 * 32000)`` (``truth.click_samples``), panned like
  the bouncing object. Clicks occur whether or not the object has a tone.

Caption templates (exact)
-------------------------
All caption text is lower case except the Context-IR field names. ``{a}`` is ``an`` before
``orange``, else ``a``. ``{obj}`` is ``{colour} {shape}``.

One line, one object::

    {a} {obj} {motion} on a {background} background, {audio}

One line, two objects::

    {a} {obj1} {motion1} and {a} {obj2} {motion2} on a {background} background, {audio}

``{audio}`` (one line):
    * no object sounds: ``silent``
    * one object, sounding: ``a {sound}``                               e.g. ``a high beep``
    * two objects, only one sounding: ``a {sound} from the {obj}``      (names the sounding one)
    * two objects, both sounding: ``a {sound1} and a {sound2}``         (object order)

Context-IR (five lines joined with ``\\n``, no trailing newline)::

    Scene: {a} {obj} on a {background} background
    Scene: {a} {obj1} and {a} {obj2} on a {background} background        (two objects)
    Action: the {obj} {motion}
    Action: the {obj1} {motion1}; the {obj2} {motion2}                     (two objects)
    Camera: static
    Look: flat 2d shapes, solid colours, clean edges
    Audio: {ir_audio}

``{ir_audio}`` is ``; ``-joined parts: ``a {sound} from the {obj}`` for each sounding object (in
object order), then ``a click at each bounce`` if any object bounces; if no part applies it is
``silent``.

Examples::

    a red circle moves right on a black background, a high beep
    a red circle moves right and a blue square stays still on a black background, a high beep and a low hum
    an orange square bounces and a green circle moves up on a gray background, a mid tone from the green circle
    Scene: a red circle and a blue square on a black background
    Action: the red circle moves right; the blue square stays still
    Camera: static
    Look: flat 2d shapes, solid colours, clean edges
    Audio: a high beep from the red circle; a low hum from the blue square

Held-out split
--------------
A spec is *held out* iff any of its objects has a (colour, shape) pair in
:data:`HELDOUT_COLOUR_SHAPE` or a (motion, sound) pair in :data:`HELDOUT_MOTION_SOUND`. The
training split never produces such a spec; every individual attribute value still occurs in
training (each colour keeps >= 2 shapes, each shape >= 5 colours, each motion 3 sounds, each
sound >= 4 motions).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

__all__ = [
    "FPS", "SAMPLE_RATE", "AUDIO_LATENT_HZ", "BACKGROUNDS", "SHAPES", "COLOURS", "MOTIONS",
    "SOUNDS", "BACKGROUND_RGB", "COLOUR_RGB", "SOUND_HZ", "HELDOUT_COLOUR_SHAPE",
    "HELDOUT_MOTION_SOUND", "ObjectSpec", "Spec", "ObjectTruth", "Truth", "Clip",
    "audio_samples", "pan_gains", "make_clip", "caption_line", "caption_ir", "parse_caption",
    "sample_spec", "spec_item", "dataset_item", "iter_specs", "iter_dataset", "is_heldout",
    "heldout_pairs", "heldout_specs", "describe_attributes", "caption_words", "CAPTION_PUNCT",
    "ANCHOR_MODES", "anchor_names", "keyframes", "AnchorCase", "heldout_anchor_cases",
]

FPS = 24
SAMPLE_RATE = 32000
AUDIO_LATENT_HZ = 40
_SAMPLES_PER_LATENT = SAMPLE_RATE // AUDIO_LATENT_HZ  # 800

# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------

BACKGROUNDS = ("black", "white", "gray", "navy")
SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow", "white", "orange", "purple")
MOTIONS = ("moves left", "moves right", "moves up", "moves down", "stays still", "bounces")
SOUNDS = ("low hum", "mid tone", "high beep", "no sound")

BACKGROUND_RGB = {
    "black": (0, 0, 0),
    "white": (255, 255, 255),
    "gray": (128, 128, 128),
    "navy": (0, 0, 128),
}
COLOUR_RGB = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (40, 90, 240),
    "yellow": (250, 220, 30),
    "white": (255, 255, 255),
    "orange": (255, 140, 0),
    "purple": (150, 50, 210),
}
SOUND_HZ = {"low hum": 220.0, "mid tone": 440.0, "high beep": 880.0, "no sound": None}

# Held-out attribute combinations (never in the training split). See module docstring.
HELDOUT_COLOUR_SHAPE = (
    ("red", "triangle"),
    ("blue", "circle"),
    ("yellow", "square"),
    ("purple", "triangle"),
    ("orange", "circle"),
)
HELDOUT_MOTION_SOUND = (
    ("moves left", "high beep"),
    ("moves right", "low hum"),
    ("moves up", "mid tone"),
    ("moves down", "high beep"),
    ("bounces", "mid tone"),
    ("stays still", "low hum"),
)
_HO_CS = frozenset(HELDOUT_COLOUR_SHAPE)
_HO_MS = frozenset(HELDOUT_MOTION_SOUND)

_LOOK = "flat 2d shapes, solid colours, clean edges"
_CLICK_PHRASE = "a click at each bounce"
CAPTION_PUNCT = (",", ";", ":", "\n")

# Geometry / synthesis constants.
_SIZE_FRAC = (0.21, 0.27)      # object side / diameter, fraction of min(W, H)
_TRAVEL_FRAC = (0.42, 0.55)    # travel of moving objects and bounce apex, fraction of canvas
_BOUNCE_PERIOD = (8, 12)       # frames, inclusive
_EDGE = 1.0                    # px kept free at the canvas border
_GAP = 2.0                     # px kept free between two objects' boxes
_TONE_AMP = 0.3
_FADE_S = 0.010
_BEEP_RATE_HZ = 4.0
_BEEP_ON_S = 0.120
_BEEP_RAMP_S = 0.005
_CLICK_S = 0.004
_CLICK_TAU_S = 0.0008
_CLICK_AMP = 0.45


def _article(colour: str) -> str:
    return "an" if colour[0] in "aeiou" else "a"


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectSpec:
    shape: str
    colour: str
    motion: str
    sound: str = "no sound"

    def to_dict(self) -> dict:
        return {"colour": self.colour, "shape": self.shape, "motion": self.motion,
                "sound": self.sound}

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True)
class Spec:
    background: str
    objects: tuple  # tuple[ObjectSpec, ...], 1 or 2

    def to_dict(self) -> dict:
        """Same layout as :func:`parse_caption` returns."""
        return {"background": self.background, "objects": [o.to_dict() for o in self.objects]}

    @staticmethod
    def from_dict(d: dict) -> "Spec":
        return Spec(d["background"], tuple(
            ObjectSpec(o["shape"], o["colour"], o["motion"], o.get("sound", "no sound"))
            for o in d["objects"]))

    def validate(self) -> None:
        if self.background not in BACKGROUNDS:
            raise ValueError(f"unknown background {self.background!r}")
        if not 1 <= len(self.objects) <= 2:
            raise ValueError("a spec has one or two objects")
        for o in self.objects:
            if o.shape not in SHAPES or o.colour not in COLOURS or o.motion not in MOTIONS \
                    or o.sound not in SOUNDS:
                raise ValueError(f"bad object {o!r}")
            if o.colour == self.background:
                raise ValueError(f"object colour equals background {o.colour!r}")
        if len(self.objects) == 2:
            a, b = self.objects
            if a.colour == b.colour:
                raise ValueError("two objects must differ in colour")
            if a.sound == b.sound and a.sound != "no sound":
                raise ValueError("two sounding objects must have different sounds")

    @property
    def caption(self) -> str:
        return caption_line(self)

    @property
    def caption_ir(self) -> str:
        return caption_ir(self)


# ---------------------------------------------------------------------------------------------
# Captions
# ---------------------------------------------------------------------------------------------


def caption_line(spec: Spec) -> str:
    objs = spec.objects
    parts = [f"{_article(o.colour)} {o.name} {o.motion}" for o in objs]
    sounding = [o for o in objs if o.sound != "no sound"]
    if not sounding:
        audio = "silent"
    elif len(objs) == 1:
        audio = f"a {sounding[0].sound}"
    elif len(sounding) == 1:
        audio = f"a {sounding[0].sound} from the {sounding[0].name}"
    else:
        audio = " and ".join(f"a {o.sound}" for o in sounding)
    return f"{' and '.join(parts)} on a {spec.background} background, {audio}"


def caption_ir(spec: Spec) -> str:
    objs = spec.objects
    scene = " and ".join(f"{_article(o.colour)} {o.name}" for o in objs)
    action = "; ".join(f"the {o.name} {o.motion}" for o in objs)
    audio = [f"a {o.sound} from the {o.name}" for o in objs if o.sound != "no sound"]
    if any(o.motion == "bounces" for o in objs):
        audio.append(_CLICK_PHRASE)
    return "\n".join([
        f"Scene: {scene} on a {spec.background} background",
        f"Action: {action}",
        "Camera: static",
        f"Look: {_LOOK}",
        f"Audio: {'; '.join(audio) if audio else 'silent'}",
    ])


def _alt(words) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_RE_OBJ = re.compile(
    rf"\b(?:an?|the)\s+({_alt(COLOURS)})\s+({_alt(SHAPES)})s?\b(?:\s+({_alt(MOTIONS)})\b)?")
_RE_BG = re.compile(rf"\bon\s+(?:an?\s+|the\s+)?({_alt(BACKGROUNDS)}|grey)\s+background\b")
_RE_SOUND = re.compile(
    rf"\b({_alt(s for s in SOUNDS if s != 'no sound')})\b"
    rf"(?:\s+from\s+the\s+({_alt(COLOURS)})\s+({_alt(SHAPES)})\b)?")


def parse_caption(caption: str) -> dict:
    """Parse either caption form (or a similar free-form prompt) back into a partial spec.

    Returns ``{"background": str, "objects": [{"colour", "shape", "motion", "sound"}, ...]}``;
    keys that the text does not determine are left out (``background`` if no "on a X
    background"; an object's ``motion`` if none follows its first mention; ``sound`` if the
    audio part is missing or ambiguous, e.g. two objects but one unattributed sound). Objects
    are identified by (colour, shape) in order of first mention. For a complete caption produced
    by this module, ``parse_caption(c) == spec.to_dict()``.
    """
    text = caption.lower()
    ir_audio = None
    body = text
    m = re.search(r"^\s*audio:(.*)$", text, flags=re.M)
    if m:
        ir_audio = m.group(1)
        body = text[:m.start()] + text[m.end():]
    out: dict = {}
    mb = _RE_BG.search(body)
    if mb:
        out["background"] = "gray" if mb.group(1) == "grey" else mb.group(1)
    objs: list = []
    index = {}
    for mo in _RE_OBJ.finditer(body):
        key = (mo.group(1), mo.group(2))
        if key not in index:
            index[key] = len(objs)
            objs.append({"colour": key[0], "shape": key[1]})
        if mo.group(3) and "motion" not in objs[index[key]]:
            objs[index[key]]["motion"] = mo.group(3)

    # Audio: the IR Audio line, else the text after the background phrase (one-line form),
    # else the text after the last comma.
    if ir_audio is not None:
        audio_text = ir_audio
    elif mb:
        audio_text = body[mb.end():]
    else:
        audio_text = body.rsplit(",", 1)[1] if "," in body else ""
    sounds = [(ms.group(1), (ms.group(2), ms.group(3)) if ms.group(2) else None)
              for ms in _RE_SOUND.finditer(audio_text)]
    if objs:
        if not sounds:
            if ir_audio is not None or re.search(r"\b(silent|silence|no sound)\b", audio_text):
                for o in objs:
                    o["sound"] = "no sound"
        elif all(who is not None for _, who in sounds):
            if all(who in index for _, who in sounds):
                for o in objs:
                    o["sound"] = "no sound"
                for snd, who in sounds:
                    objs[index[who]]["sound"] = snd
        elif len(sounds) == len(objs) and all(who is None for _, who in sounds):
            for o, (snd, _) in zip(objs, sounds):
                o["sound"] = snd
    out["objects"] = objs
    return out


def describe_attributes() -> dict:
    """Vocabulary lists (and the associated RGB / Hz tables)."""
    return {
        "backgrounds": list(BACKGROUNDS),
        "shapes": list(SHAPES),
        "colours": list(COLOURS),
        "motions": list(MOTIONS),
        "sounds": list(SOUNDS),
        "background_rgb": dict(BACKGROUND_RGB),
        "colour_rgb": dict(COLOUR_RGB),
        "sound_hz": dict(SOUND_HZ),
    }


def caption_words() -> list:
    """Every word that can appear in a caption of either form, sorted (punctuation excluded:
    see :data:`CAPTION_PUNCT`). Tokenise captions with ``re.findall(r"[A-Za-z0-9]+", c)``."""
    words = set()
    for phrase in (*BACKGROUNDS, *SHAPES, *COLOURS, *MOTIONS, *SOUNDS, _LOOK, _CLICK_PHRASE):
        words.update(re.findall(r"[A-Za-z0-9]+", phrase))
    words.update(["a", "an", "the", "and", "on", "background", "silent", "from", "static",
                  "Scene", "Action", "Camera", "Look", "Audio"])
    words.discard("no")  # "no sound" is a vocabulary value but never written in captions
    words.discard("sound")
    return sorted(words)


# ---------------------------------------------------------------------------------------------
# Held-out split and sampling
# ---------------------------------------------------------------------------------------------


def heldout_pairs(spec: Spec) -> list:
    """The held-out pairs present in ``spec`` (empty for a training spec)."""
    out = []
    for o in spec.objects:
        if (o.colour, o.shape) in _HO_CS:
            out.append(("colour-shape", o.colour, o.shape))
        if (o.motion, o.sound) in _HO_MS:
            out.append(("motion-sound", o.motion, o.sound))
    return out


def is_heldout(spec: Spec) -> bool:
    return any((o.colour, o.shape) in _HO_CS or (o.motion, o.sound) in _HO_MS
               for o in spec.objects)


def _choice(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _sample_object(rng, background, taken_colour, taken_sound, train_only):
    while True:
        colour = _choice(rng, COLOURS)
        if colour == background or colour == taken_colour:
            continue
        shape = _choice(rng, SHAPES)
        motion = _choice(rng, MOTIONS)
        sound = _choice(rng, SOUNDS)
        if sound != "no sound" and sound == taken_sound:
            continue
        if train_only and ((colour, shape) in _HO_CS or (motion, sound) in _HO_MS):
            continue
        return ObjectSpec(shape, colour, motion, sound)


def sample_spec(rng: np.random.Generator, split: str = "train",
                p_two: float = 0.4) -> Spec:
    """Sample a spec. ``split``: ``"train"`` (never held out, the default), ``"heldout"`` (at
    least one held-out pair) or ``"any"`` (the unconstrained distribution). One object with
    probability ``1 - p_two``, else two; all attributes uniform subject to the constraints."""
    if split not in ("train", "heldout", "any"):
        raise ValueError(f"bad split {split!r}")
    while True:
        background = _choice(rng, BACKGROUNDS)
        n = 2 if rng.random() < p_two else 1
        objs = []
        for _ in range(n):
            prev = objs[0] if objs else None
            objs.append(_sample_object(rng, background, prev and prev.colour,
                                       prev and prev.sound, split == "train"))
        spec = Spec(background, tuple(objs))
        if split != "heldout" or is_heldout(spec):
            return spec


_SPLIT_CODE = {"train": 0, "heldout": 1, "any": 2}


def _item_rng(i: int, seed: int, split: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([0x4833, seed, _SPLIT_CODE[split], i]))


def spec_item(i: int, seed: int = 0, split: str = "train") -> tuple:
    """(spec, clip_seed) of item ``i`` of a dataset: random access, no rendering."""
    rng = _item_rng(i, seed, split)
    spec = sample_spec(rng, split)
    return spec, int(rng.integers(2**31))


def dataset_item(i: int, seed: int = 0, split: str = "train", width: int = 128,
                 height: int = 128, frames: int = 22) -> tuple:
    """Item ``i`` of ``iter_dataset(.., seed, split, ..)`` as (spec, clip), random access."""
    spec, clip_seed = spec_item(i, seed, split)
    return spec, make_clip(spec, width, height, frames, clip_seed)


def iter_specs(n: int, seed: int = 0, split: str = "train") -> Iterator[Spec]:
    """The specs of ``iter_dataset(n, seed, split)`` without rendering."""
    for i in range(n):
        yield spec_item(i, seed, split)[0]


def iter_dataset(n: int, seed: int = 0, split: str = "train", width: int = 128,
                 height: int = 128, frames: int = 22) -> Iterator[tuple]:
    """Yield ``n`` (spec, clip) pairs. ``split="train"``: never held out; ``"heldout"``: every
    spec contains at least one held-out pair (random specs, 1 or 2 objects)."""
    for i in range(n):
        yield dataset_item(i, seed, split, width, height, frames)


def heldout_specs() -> list:
    """27 fixed single-object held-out specs (test prompts): each held-out (motion, sound) pair
    with two training (colour, shape) pairs, and each held-out (colour, shape) pair with three
    training (motion, sound) pairs. Covers every motion, every sound, every colour."""
    out = []
    train_cs = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in _HO_CS]
    train_ms = [(m, s) for m in MOTIONS for s in SOUNDS if (m, s) not in _HO_MS]
    k = 0
    for motion, sound in HELDOUT_MOTION_SOUND:
        for _ in range(2):
            colour, shape = train_cs[(k * 5) % len(train_cs)]
            bg = [b for b in BACKGROUNDS if b != colour][k % 3]
            out.append(Spec(bg, (ObjectSpec(shape, colour, motion, sound),)))
            k += 1
    for colour, shape in HELDOUT_COLOUR_SHAPE:
        for _ in range(3):
            motion, sound = train_ms[(k * 7) % len(train_ms)]
            bg = [b for b in BACKGROUNDS if b != colour][k % 3]
            out.append(Spec(bg, (ObjectSpec(shape, colour, motion, sound),)))
            k += 1
    return out


# ---------------------------------------------------------------------------------------------
# Clips
# ---------------------------------------------------------------------------------------------


@dataclass
class ObjectTruth:
    shape: str
    colour: str
    rgb: tuple
    motion: str
    sound: str
    freq: Optional[float]       # Hz, None for "no sound"
    size: float                 # side / diameter in px
    boxes: np.ndarray           # [F, 4] float32 (x0, y0, x1, y1), continuous pixel coords
    centroids: np.ndarray       # [F, 2] float32 (x, y): area centroid of the shape
    pan: np.ndarray             # [F] float32, x / W in [0, 1] (see pan_gains)
    bounce_frames: tuple        # ints, frames at which the object touches the floor


@dataclass
class Truth:
    background: str
    background_rgb: tuple
    objects: tuple              # tuple[ObjectTruth, ...], same order as spec.objects
    bounce_frames: tuple        # frame of each click, sorted (one entry per click)
    click_samples: tuple        # audio sample index where each click starts, same order
    overlap: bool = False       # True only if 1000 layout draws all overlapped (not seen at
                                # >= 40x40 px; happens for ~3 % of two-object clips at 32x32)


@dataclass
class Clip:
    spec: Spec
    seed: int
    frames: np.ndarray          # [F, H, W, 3] uint8
    audio: np.ndarray           # [2, S] float32, S = audio_samples(F)
    caption: str
    caption_ir: str
    truth: Truth
    fps: int = FPS
    sample_rate: int = SAMPLE_RATE


def audio_samples(frames: int) -> int:
    """Latent-aligned audio length for ``frames`` video frames: round(F/24*40) * 800."""
    return int(round(frames / FPS * AUDIO_LATENT_HZ)) * _SAMPLES_PER_LATENT


def pan_gains(p):
    """Equal-power pan: p in [0, 1] (0 = left) -> (gain_L, gain_R)."""
    th = np.clip(p, 0.0, 1.0) * (np.pi / 2)
    return np.cos(th), np.sin(th)


@dataclass
class _Track:
    size: float
    cx: np.ndarray   # [F] box centre
    cy: np.ndarray
    bounces: tuple = field(default_factory=tuple)


def _track(o: ObjectSpec, W: int, H: int, F: int, rng: np.random.Generator) -> _Track:
    size = float(rng.uniform(*_SIZE_FRAC)) * min(W, H)
    r = size / 2
    lo_x, hi_x = r + _EDGE, W - r - _EDGE
    lo_y, hi_y = r + _EDGE, H - r - _EDGE
    t = np.arange(F, dtype=np.float64) / max(F - 1, 1)
    cx = np.full(F, rng.uniform(lo_x, hi_x))
    cy = np.full(F, rng.uniform(lo_y, hi_y))
    bounces: tuple = ()
    m = o.motion
    if m in ("moves left", "moves right", "moves up", "moves down"):
        horiz = m in ("moves left", "moves right")
        lo, hi = (lo_x, hi_x) if horiz else (lo_y, hi_y)
        extent = W if horiz else H
        travel = min(float(rng.uniform(*_TRAVEL_FRAC)) * extent, hi - lo)
        start = rng.uniform(lo, hi - travel)
        pos = start + travel * t
        if m in ("moves left", "moves up"):
            pos = pos[::-1].copy()
        if horiz:
            cx = pos
        else:
            cy = pos
    elif m == "bounces":
        apex = min(float(rng.uniform(*_TRAVEL_FRAC)) * H, hi_y - lo_y)
        period = int(rng.integers(_BOUNCE_PERIOD[0], _BOUNCE_PERIOD[1] + 1))
        period = max(2, min(period, F - 1)) if F >= 3 else 2
        phase = int(rng.integers(1, period))
        f = np.arange(F)
        ph = ((f + phase) % period) / period
        cy = hi_y - apex * 4.0 * ph * (1.0 - ph)
        bounces = tuple(int(b) for b in f[(f + phase) % period == 0])
    return _Track(size, cx.astype(np.float64), cy.astype(np.float64), bounces)


def _boxes(tr: _Track) -> np.ndarray:
    r = tr.size / 2
    return np.stack([tr.cx - r, tr.cy - r, tr.cx + r, tr.cy + r], axis=1)


def _disjoint(a: _Track, b: _Track) -> bool:
    ba, bb = _boxes(a), _boxes(b)
    sep_x = (ba[:, 2] + _GAP <= bb[:, 0]) | (bb[:, 2] + _GAP <= ba[:, 0])
    sep_y = (ba[:, 3] + _GAP <= bb[:, 1]) | (bb[:, 3] + _GAP <= ba[:, 1])
    return bool(np.all(sep_x | sep_y))


def _sdf(shape: str, X: np.ndarray, Y: np.ndarray, cx: float, cy: float, r: float):
    dx, dy = X - cx, Y - cy
    if shape == "circle":
        return np.sqrt(dx * dx + dy * dy) - r
    if shape == "square":
        return np.maximum(np.abs(dx), np.abs(dy)) - r
    # Apex-up isosceles triangle inscribed in the box: (cx, cy-r), (cx+r, cy+r), (cx-r, cy+r).
    k = 1.0 / math.sqrt(5.0)
    e = dy + r
    return np.maximum(np.maximum((-2.0 * dx - e) * k, (2.0 * dx - e) * k), dy - r)


def _draw(frame: np.ndarray, shape: str, rgb: np.ndarray, cx: float, cy: float, r: float):
    H, W = frame.shape[:2]
    x0, x1 = max(int(math.floor(cx - r - 1)), 0), min(int(math.ceil(cx + r + 1)), W)
    y0, y1 = max(int(math.floor(cy - r - 1)), 0), min(int(math.ceil(cy + r + 1)), H)
    if x0 >= x1 or y0 >= y1:
        return
    X = np.arange(x0, x1, dtype=np.float32)[None, :] + 0.5
    Y = np.arange(y0, y1, dtype=np.float32)[:, None] + 0.5
    a = np.clip(0.5 - _sdf(shape, X, Y, cx, cy, r), 0.0, 1.0)[..., None]
    region = frame[y0:y1, x0:x1].astype(np.float32)
    frame[y0:y1, x0:x1] = np.rint(region + (rgb - region) * a).astype(np.uint8)


def _tone(sound: str, t: np.ndarray) -> np.ndarray:
    w = 2 * np.pi * t
    if sound == "low hum":
        return (np.sin(w * 220.0) + 0.3 * np.sin(w * 660.0)) / 1.3
    if sound == "mid tone":
        return np.sin(w * 440.0)
    if sound == "high beep":
        period = 1.0 / _BEEP_RATE_HZ
        u = np.mod(t, period)
        env = np.clip(np.minimum(u, _BEEP_ON_S - u) / _BEEP_RAMP_S, 0.0, 1.0)
        env = np.where(u < _BEEP_ON_S, 0.5 - 0.5 * np.cos(np.pi * env), 0.0)
        return np.sin(w * 880.0) * env
    raise ValueError(sound)


def make_clip(spec: Spec, width: int = 128, height: int = 128, frames: int = 22,
              seed: int = 0) -> Clip:
    """Render ``spec`` deterministically. ``seed`` (int >= 0) fixes layout/nuisance only."""
    spec.validate()
    W, H, F = int(width), int(height), int(frames)
    if W < 8 or H < 8 or F < 1:
        raise ValueError("canvas must be >= 8x8 and frames >= 1")
    rng = np.random.default_rng(np.random.SeedSequence([0x4834, int(seed), W, H, F]))

    # Layout: rejection-sample nuisance parameters until the two objects never overlap.
    overlap = False
    for attempt in range(1000):
        tracks = [_track(o, W, H, F, rng) for o in spec.objects]
        if len(tracks) == 1 or _disjoint(tracks[0], tracks[1]):
            break
    else:
        overlap = True

    # Video.
    bg = BACKGROUND_RGB[spec.background]
    video = np.empty((F, H, W, 3), dtype=np.uint8)
    video[...] = np.asarray(bg, dtype=np.uint8)
    for o, tr in zip(spec.objects, tracks):
        rgb = np.asarray(COLOUR_RGB[o.colour], dtype=np.float32)
        for f in range(F):
            _draw(video[f], o.shape, rgb, float(tr.cx[f]), float(tr.cy[f]), tr.size / 2)

    # Truth.
    obj_truth = []
    for o, tr in zip(spec.objects, tracks):
        r = tr.size / 2
        cy_c = tr.cy + (r / 3.0 if o.shape == "triangle" else 0.0)
        obj_truth.append(ObjectTruth(
            shape=o.shape, colour=o.colour, rgb=COLOUR_RGB[o.colour], motion=o.motion,
            sound=o.sound, freq=SOUND_HZ[o.sound], size=tr.size,
            boxes=_boxes(tr).astype(np.float32),
            centroids=np.stack([tr.cx, cy_c], axis=1).astype(np.float32),
            pan=(tr.cx / W).astype(np.float32), bounce_frames=tr.bounces))

    # Audio.
    S = audio_samples(F)
    t = np.arange(S, dtype=np.float64) / SAMPLE_RATE
    fpos = t * FPS
    frame_idx = np.arange(F, dtype=np.float64)
    audio = np.zeros((2, S), dtype=np.float64)
    for o, tr in zip(spec.objects, tracks):
        if o.sound == "no sound":
            continue
        gl, gr = pan_gains(np.interp(fpos, frame_idx, tr.cx) / W)
        sig = _TONE_AMP * _tone(o.sound, t)
        audio[0] += sig * gl
        audio[1] += sig * gr
    nf = min(int(_FADE_S * SAMPLE_RATE), S // 2)
    if nf > 0:
        ramp = 0.5 - 0.5 * np.cos(np.pi * (np.arange(nf) + 0.5) / nf)
        audio[:, :nf] *= ramp
        audio[:, S - nf:] *= ramp[::-1]
    n_click = int(_CLICK_S * SAMPLE_RATE)
    click_env = _CLICK_AMP * np.exp(-np.arange(n_click) / (_CLICK_TAU_S * SAMPLE_RATE))
    clicks = []
    for tr in tracks:
        for b in tr.bounces:
            s0 = int(round(b / FPS * SAMPLE_RATE))
            n = min(n_click, S - s0)
            if n <= 0:
                continue
            burst = rng.uniform(-1.0, 1.0, n_click)[:n] * click_env[:n]
            gl, gr = pan_gains(tr.cx[b] / W)
            audio[0, s0:s0 + n] += burst * gl
            audio[1, s0:s0 + n] += burst * gr
            clicks.append((b, s0))
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    clicks.sort()

    truth = Truth(background=spec.background, background_rgb=bg, objects=tuple(obj_truth),
                  bounce_frames=tuple(b for b, _ in clicks),
                  click_samples=tuple(s for _, s in clicks), overlap=overlap)
    return Clip(spec=spec, seed=int(seed), frames=video, audio=audio,
                caption=caption_line(spec), caption_ir=caption_ir(spec), truth=truth)


# ---------------------------------------------------------------------------------------------
# First/last-frame anchors (FL2VA)
# ---------------------------------------------------------------------------------------------
#
# An anchored request gives the first and/or the last frame of the clip besides the prompt. For a
# rendered clip the keyframes are simply its own first and last frames, at the clip's size (no
# resize), so an anchored training example is (caption, keyframes of the same clip, the clip).
# Nothing above changes: the text-only data and the held-out split are the same specs and clips.

#: Anchor modes in a fixed order; ``anchor_names(mode)`` is diffusers' ``keyframe_anchors`` tuple
#: (the packed order of the keyframe blocks: first, then last).
ANCHOR_MODES = ("first", "last", "both")


def anchor_names(mode: Optional[str]) -> tuple:
    """``None``/``"none"`` -> ``()``; ``"first"`` -> ``("first",)``; ``"last"`` -> ``("last",)``;
    ``"both"`` -> ``("first", "last")``."""
    if mode in (None, "none", "text"):
        return ()
    if mode == "both":
        return ("first", "last")
    if mode in ("first", "last"):
        return (mode,)
    raise ValueError(f"bad anchor mode {mode!r}")


def keyframes(clip: Clip) -> tuple:
    """(first frame, last frame) of a rendered clip, uint8 ``[H, W, 3]`` each (copies)."""
    return clip.frames[0].copy(), clip.frames[-1].copy()


@dataclass(frozen=True)
class AnchorCase:
    """One held-out anchored test request: the prompt of ``spec`` (one-line or Context-IR form),
    the anchors of mode ``mode`` taken from ``make_clip(spec, W, H, F, clip_seed)``."""
    spec: Spec
    mode: str
    clip_seed: int
    form: str  # "line" | "ir"

    @property
    def prompt(self) -> str:
        return caption_line(self.spec) if self.form == "line" else caption_ir(self.spec)

    @property
    def anchors(self) -> tuple:
        return anchor_names(self.mode)

    def clip(self, width: int = 128, height: int = 128, frames: int = 22) -> Clip:
        """The reference clip the anchors come from (one of the videos the request describes)."""
        return make_clip(self.spec, width, height, frames, self.clip_seed)


def heldout_anchor_cases(n: int = 27) -> list:
    """``n`` (<= 27) fixed anchored test requests on the held-out specs (:func:`heldout_specs`):
    case ``k`` uses spec ``k``, anchor mode ``ANCHOR_MODES[k % 3]`` (9 first-only, 9 last-only,
    9 both for n = 27; every motion meets at least two modes, five of the six all three) and
    the one-line caption for even ``k``, Context-IR for odd ``k`` (as the text-only eval does).
    The keyframes come from clip seed ``7000 + k``, a seed no training clip is drawn from (training
    clip seeds come from ``spec_item``'s generator, not from this series)."""
    specs = heldout_specs()
    if not 0 < n <= len(specs):
        raise ValueError(f"n must be in 1..{len(specs)}")
    return [AnchorCase(specs[k], ANCHOR_MODES[k % 3], 7000 + k, "line" if k % 2 == 0 else "ir")
            for k in range(n)]
