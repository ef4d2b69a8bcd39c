"""Every number and prompt a caller gives, checked before it reaches ctypes.

ctypes stores a Python int into an int32 field modulo 2^32 and truncates a float, so 2^32 + 128 would reach libh3
as 128 and 128.9 as 128. Each value is checked here against the range libh3 accepts and refused with one line that
names the value given and the allowed range; libh3 checks the same ranges again at its API for callers that do not
come through Python (libh3/api/render_api.c).
"""

from __future__ import annotations

import math
import numbers

from ._lib import H3Error

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38

# The ranges libh3 accepts (h3.h; the same numbers as libh3/api/render_api.c and the runtime's checks).
MAX_SIDE = 16384          # a canvas side in pixels
MAX_FRAMES = 100_000
MIN_STEPS, MAX_STEPS = 2, 1000
MAX_THREADS = 1024
MAX_VAE_TILE = 65536
MAX_REUSE = 1000
MAX_LAYERS = 65536
MAX_CACHE_THRESHOLD = 100.0
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4000, 384_000
MAX_LORA_SCALE = 1e6
FPS = 24


def _label(name: str) -> str:
    return name.replace("_", " ")


def whole(name: str, value, lo: int, hi: int, what: str = "", strict: bool = False) -> int:
    """`value` as an int in [lo, hi]: bools, non-integral floats, nan, inf and strings are refused (`strict`:
    every float)."""
    rng = f"between {lo} and {hi}{what}"
    if isinstance(value, bool) or value is None or (strict and not isinstance(value, numbers.Integral)):
        raise H3Error(f"{_label(name)} must be a whole number {rng}, got {value!r}")
    if isinstance(value, numbers.Integral):
        v = int(value)
    elif isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f) or not f.is_integer():
            raise H3Error(f"{_label(name)} must be a whole number {rng}, got {value!r}")
        v = int(f)
    else:
        raise H3Error(f"{_label(name)} must be a whole number {rng}, got {value!r}")
    if not lo <= v <= hi:
        raise H3Error(f"{_label(name)} must be {rng}, got {v}")
    return v


def real(name: str, value, lo: float, hi: float, what: str = "", lo_open: bool = False) -> float:
    """`value` as a finite float in [lo, hi] ((lo, hi] with lo_open)."""
    rng = (f"greater than {lo:g} and at most {hi:g}" if lo_open else f"between {lo:g} and {hi:g}") + what
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise H3Error(f"{_label(name)} must be a number {rng}, got {value!r}")
    f = float(value)
    if not math.isfinite(f) or f < lo or f > hi or (lo_open and f == lo):
        raise H3Error(f"{_label(name)} must be a number {rng}, got {value!r}")
    return f


def side(name: str, value) -> int:
    """A canvas side; 0 goes on to libh3, which explains the multiple its model needs (or, with a keyframe,
    takes the canvas from it)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == 0:
        return 0
    return whole(name, value, 1, MAX_SIDE, " pixels")


def frames(value) -> int:
    return whole("frames", value, 1, MAX_FRAMES)


def seconds(value) -> float:
    """A duration; its frames (rounded at 24 fps) must be in range too."""
    hi = MAX_FRAMES / FPS
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < float(value) <= hi):
        raise H3Error(f"seconds must be a positive number, at most {hi:g} ({MAX_FRAMES} frames at {FPS} fps), "
                      f"got {value!r}")
    return float(value)


def steps(value) -> int:
    return whole("steps", value, MIN_STEPS, MAX_STEPS)


def threads(value, name: str = "threads") -> int:
    return whole(name, value, 0, MAX_THREADS, " (0 = all cores)")


def seed(value) -> int:
    return whole("seed", value, 0, 2**64 - 1)


def vae_tile(value) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and not 0 <= value <= MAX_VAE_TILE:
        raise H3Error(f"VAE tile size must be 0 (the model's) or a positive number of pixels up to {MAX_VAE_TILE}, "
                      f"got {value}")
    return whole("VAE tile size", value, 0, MAX_VAE_TILE, " pixels (0 = the model's)")


def knob(name: str, value) -> int:
    hi = MAX_LAYERS if name == "layers" else MAX_REUSE
    return whole(name, value, 0, hi, " (0 = off)")


def cache_threshold(value) -> float:
    return real("cache threshold", value, 0.0, MAX_CACHE_THRESHOLD, " (0 = off)")


def lora_scale(path: str, value) -> float:
    return real(f"LoRA {path}: scale", value, -MAX_LORA_SCALE, MAX_LORA_SCALE)


def prompt(text, blank_ok: bool = False) -> str:
    """A prompt libh3 can take whole: a str, with no NUL (C would cut the text there) and some non-space
    character (an empty prompt and one of spaces only are refused alike), unless `blank_ok` (the request has
    keyframes, references or injected text states, which libh3 accepts without prompt text)."""
    if not isinstance(text, str):
        raise H3Error(f"the prompt must be a string, got {type(text).__name__}")
    if "\x00" in text:
        raise H3Error(f"the prompt holds a NUL character at position {text.index(chr(0))} (text after it would be "
                      "lost); remove it")
    for i, ch in enumerate(text):
        if "\udc80" <= ch <= "\udcff":  # a byte the command line could not decode (surrogateescape)
            raise H3Error(f"the prompt is not valid UTF-8: byte 0x{ord(ch) - 0xDC00:02X} at character {i}")
        if "\ud800" <= ch <= "\udfff":
            raise H3Error(f"the prompt is not valid UTF-8: a lone surrogate U+{ord(ch):04X} at character {i}")
    if not text.strip() and not blank_ok:  # (a keyframe or reference presentation may stand alone)
        raise H3Error("the prompt is empty" if not text else "the prompt is empty (only white space)")
    return text

