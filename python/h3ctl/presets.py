"""Speed presets: named settings of libh3's speed knobs, each with its measured cost and quality.

The knobs (h3.h `h3_request`, `h3ctl render --help`) trade quality for transformer time:

    reuse R            run the transformer at every R-th step only; extrapolate the velocity between
    core_reuse K       run the block stack at every K-th call only; reuse its residual between
    layers M           run M of the model's blocks (layer_policy "gate" or "uniform" picks them)
    token_reduction    average horizontally adjacent video tokens over the middle blocks
    render_size WxH    run the transformer and decoders on a smaller canvas; Lanczos-3 up to the output
    cache_threshold X  skip steps while the first block's modulated input changes less than X
    lora FILE[:SCALE]  LoRA files merged into the weights at load (not a speed knob, but set the same way)
    steps N            sigma grid points (a preset's count applies when the caller gives none)
    schedule NAME      the sigma grid (h3ctl.schedules; docs/few-step.md); sigmas: explicit (video, audio) grids

The few-step presets (turbo4, turbo8) are for step-distilled models (a Turbo checkpoint, a Turbo / PDD / FastH3
LoRA): the evaluation count those were distilled for, the grid the model or its LoRA declares (else the lightx2v
Turbo grid of the canvas: shifts 6 / 3 from a 768-pixel short edge, 12 / 3 below), and the fp8 weights on a GPU
that runs them. On the release without such a LoRA they are just few steps. No distilled model could be measured
here, so their quality columns say "not measured". `tiny-fast` is h3-tiny's own few-step student: 4 evaluations on
the h3 grid with the LoRA train/distill_fewstep.py distilled (shipped beside the model; it fits h3-tiny only).

A preset is a set of these (`render_scale` stands for a render size of that fraction of the output, rounded
down to a valid canvas of the same aspect). The `measured` numbers of each preset come from
tests/bench_presets.py on h3-tiny (docs/presets.md has the table): speed-up of transformer time against `reference`
at the same seed, SSIM and PSNR of the frames and log-spectral distance of the audio against the reference
render from the same noise, and the semantic pass rate on the held-out prompts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ._lib import H3_LAYERS_GATE, H3_LAYERS_UNIFORM, H3Error

LAYER_POLICIES = {"gate": H3_LAYERS_GATE, "uniform": H3_LAYERS_UNIFORM}
KNOBS = ("reuse", "core_reuse", "layers", "layer_policy", "token_reduction", "render_size", "render_scale",
         "cache_threshold", "lora", "steps", "schedule", "sigmas", "auto_schedule", "gpu_precision")


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    knobs: dict = field(default_factory=dict)
    # From tests/bench_presets.py on h3-tiny (the anchored model; 128x128x22, 20 steps, 2 threads, the held-out prompts).
    measured: dict = field(default_factory=dict)


STUDENT_LORA = "h3-tiny-fast.safetensors"


def student_lora() -> str:
    """The path of h3-tiny's few-step LoRA (train/distill_fewstep.py; docs/few-step.md), shipped beside the model."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "h3-tiny", "lora", STUDENT_LORA)


PRESETS: dict[str, Preset] = {
    "reference": Preset("reference", "every knob off: the exact render", {}, {
        "speedup": 1.0, "wall_speedup": 1.0, "ssim": 1.0, "psnr": math.inf, "lsd_db": 0.0, "semantic": 0.935}),
    "balanced": Preset("balanced", "indistinguishable from the reference by every measure, half the transformer evaluations",
                       {"reuse": 2}, {"speedup": 1.96, "wall_speedup": 1.61, "ssim": 0.996, "psnr": 51.6,
                                      "lsd_db": 0.09, "semantic": 0.935}),
    "fast": Preset("fast", "3x less transformer time at SSIM 0.983", {"reuse": 4},
                   {"speedup": 3.13, "wall_speedup": 2.12, "ssim": 0.983, "psnr": 38.8, "lsd_db": 0.44,
                    "semantic": 0.935}),
    "draft": Preset("draft", "4.6x less transformer time, for previews and iterating on a prompt", {"reuse": 6},
                    {"speedup": 4.64, "wall_speedup": 2.63, "ssim": 0.956, "psnr": 29.3, "lsd_db": 0.94,
                     "semantic": 0.935}),
    "turbo4": Preset("turbo4", "4 evaluations on the distilled grid, for step-distilled models (not measured)",
                     {"steps": 5, "auto_schedule": True, "gpu_precision": "fp8"}, {}),
    "turbo8": Preset("turbo8", "8 evaluations on the distilled grid, for step-distilled models (not measured)",
                     {"steps": 9, "auto_schedule": True, "gpu_precision": "fp8"}, {}),
    "tiny-fast": Preset("tiny-fast", "h3-tiny's few-step student: 4 evaluations with its distilled LoRA (h3-tiny only)",
                        {"steps": 5, "lora": [student_lora()]}, {
                            "speedup": 4.83, "wall_speedup": 2.34, "ssim": 0.978, "psnr": 35.7, "lsd_db": 0.85,
                            "semantic": 0.946}),
}

# The preset `h3ctl render` uses when none is given: `balanced` costs nothing the measures can see (SSIM 0.996,
# PSNR 52 dB, the reference's semantic pass rate) and halves the transformer's evaluations (1.96x less time). The Python API's default
# stays the exact render (preset=None), which the parity suites and byte-identical reruns rely on.
DEFAULT_PRESET = "balanced"


def get(name: str) -> Preset:
    p = PRESETS.get(name) if isinstance(name, str) else None
    if p is None:
        raise H3Error(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return p


def parse_size(text) -> tuple[int, int]:
    """'96x96' or (96, 96) -> (96, 96)."""
    from . import limits

    if isinstance(text, (tuple, list)) and len(text) == 2:
        return limits.side("render width", text[0]), limits.side("render height", text[1])
    try:
        w, h = str(text).lower().split("x")
        return int(w), int(h)
    except ValueError:
        raise H3Error(f"render size must look like 96x96, got {text!r}") from None


def parse_lora(spec) -> tuple[str, float]:
    """'FILE[:SCALE]' or (FILE, SCALE) -> (path, scale). A path may itself hold ':' (the scale is the part
    after the last one when it parses as a number)."""
    from . import limits

    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        path, scale = str(spec[0]), spec[1]
    else:
        path, scale = str(spec), 1.0
        head, sep, tail = path.rpartition(":")
        # A colon is the scale's unless the whole text names a file or the text after it is a path ("c:/x").
        if sep and head and not os.path.lexists(path) and "/" not in tail and "\\" not in tail:
            try:
                scale = float(tail)
            except ValueError:
                raise H3Error(f"LoRA {spec!r}: the scale after the last ':' must be a number, got {tail!r} "
                              "(FILE or FILE:SCALE)") from None
            path = head
    if not path:
        raise H3Error(f"LoRA must look like FILE or FILE:SCALE, got {spec!r}")
    return os.fspath(path), limits.lora_scale(path, scale)


def scaled_canvas(width: int, height: int, scale: float, multiple: int = 32) -> tuple[int, int] | None:
    """The largest canvas of exactly the output's aspect whose sides are multiples of `multiple` and at most
    `scale` times the output's; None when only the output itself fits."""
    if not (0 < scale < 1):
        return None
    for rw in range(int(width * scale) // multiple * multiple, multiple - 1, -multiple):
        if (rw * height) % width == 0:
            rh = rw * height // width
            if rh >= multiple and rh % multiple == 0:
                return rw, rh
    return None


def resolve(preset: str | None = None, **given) -> dict:
    """The knobs of a preset (None: none) with the caller's explicit values (those not None) on top."""
    unknown = sorted(set(given) - set(KNOBS))
    if unknown:
        raise TypeError(f"unknown knob(s): {', '.join(unknown)}")
    knobs = dict(get(preset).knobs) if preset is not None else {}
    if preset == "tiny-fast" and given.get("lora") is None and not os.path.isfile(student_lora()):
        raise H3Error(f"preset tiny-fast: its LoRA {STUDENT_LORA} is not installed (expected at {student_lora()})")
    for k, v in given.items():
        if v is not None:
            knobs[k] = v
    if "render_size" in knobs:
        knobs.pop("render_scale", None)  # an explicit canvas wins over a preset's fraction
    return knobs


def turbo_schedule(width: int, height: int) -> str:
    """The lightx2v Turbo grid of a canvas: the 768p models (shifts 6 / 3) from a 768-pixel short edge on."""
    return "turbo-768p" if min(width, height) >= 768 else "turbo-544p"


def gpu_precision(knobs: dict, precision: str, device: str) -> str:
    """The precision a preset asks for where the GPU has it (fp8: CUDA compute capability 8.9+), else `precision`.
    An explicit --precision (not "default") always wins."""
    want = knobs.get("gpu_precision")
    if not want or precision != "default" or device == "cpu":
        return precision
    from . import _lib

    try:
        cuda = _lib.backends().get("cuda", {})
        cc = tuple(int(x) for x in str(cuda.get("compute_capability", "0.0")).split("."))
    except (H3Error, ValueError):
        return precision
    return want if cuda.get("available") and cc >= (8, 9) else precision


def apply(req, knobs: dict, declared=None) -> None:
    """Write resolved knobs into an H3Request (libh3 checks ranges and conflicts in h3_plan). `declared(req)`
    gives the schedule the model or its LoRA files declare (for a preset's automatic grid)."""
    import ctypes

    import numpy as np

    from . import _lib

    if knobs.get("steps") is not None:
        req.steps = int(knobs["steps"])
    sched = knobs.get("schedule")
    if sched is not None and not isinstance(sched, str):
        raise H3Error(f"schedule must be a name, got {sched!r}")
    if not sched and knobs.get("auto_schedule") and knobs.get("sigmas") is None:
        # the model's own grid when it declares one (libh3 applies it), else the Turbo grid of this canvas
        if declared is None or declared(req) is None:
            w, h = req.width, req.height
            if w and h:
                sched = turbo_schedule(w, h)
    req.schedule = sched.encode() if sched else None
    if knobs.get("sigmas") is not None:
        sv, sa = (np.ascontiguousarray(x, np.float32) for x in knobs["sigmas"])
        if sv.ndim != 1 or sv.shape != sa.shape:
            raise H3Error("sigmas must be two 1-D grids (video, audio) of the same length")
        both = np.concatenate([sv, sa])
        req.sigmas = both.ctypes.data_as(_lib.c_float_p)
        req.n_sigmas = len(sv)
        req._keep_sigmas = both

    from . import limits

    def whole(name):
        return limits.knob(name, knobs.get(name, 0))

    req.reuse = whole("reuse")
    req.core_reuse = whole("core_reuse")
    req.layers = whole("layers")
    policy = knobs.get("layer_policy", "gate")
    if policy not in LAYER_POLICIES:
        raise H3Error(f"layer policy must be one of {', '.join(LAYER_POLICIES)}, got {policy!r}")
    req.layer_policy = LAYER_POLICIES[policy]
    req.token_reduction = 1 if knobs.get("token_reduction") else 0
    size = None
    if knobs.get("render_size") is not None:
        size = parse_size(knobs["render_size"])
    elif knobs.get("render_scale") is not None:
        size = scaled_canvas(req.width, req.height, float(knobs["render_scale"]))
    if size:
        size = (limits.side("render width", size[0]), limits.side("render height", size[1]))
    req.render_width, req.render_height = size if size else (0, 0)
    req.cache_threshold = limits.cache_threshold(knobs.get("cache_threshold") or 0.0)
    loras = knobs.get("lora") or []
    if isinstance(loras, (str, os.PathLike)):
        loras = [loras]
    specs = [parse_lora(os.fspath(x) if isinstance(x, os.PathLike) else x) for x in loras]
    from .outputs import check_input

    for path, _ in specs:  # a directory, FIFO or device is refused by name (libh3 reads only regular files)
        check_input(path, f"LoRA {path}")
    if specs:
        paths = (ctypes.c_char_p * len(specs))(*[os.fsencode(p) for p, _ in specs])
        scales = (ctypes.c_float * len(specs))(*[s for _, s in specs])
        req.lora_paths = ctypes.cast(paths, ctypes.POINTER(ctypes.c_char_p))
        req.lora_scales = ctypes.cast(scales, _lib.c_float_p)
        req.n_lora = len(specs)
        req._keep_lora = (paths, scales)  # alive as long as the request


def describe(knobs: dict) -> str:
    """One line naming a preset's settings."""
    parts = []
    if knobs.get("reuse", 0) > 1:
        parts.append(f"reuse {knobs['reuse']}")
    if knobs.get("core_reuse", 0) > 1:
        parts.append(f"core reuse {knobs['core_reuse']}")
    if knobs.get("layers"):
        parts.append(f"layers {knobs['layers']} ({knobs.get('layer_policy', 'gate')})")
    if knobs.get("token_reduction"):
        parts.append("token reduction")
    if knobs.get("render_size"):
        parts.append(f"render size {knobs['render_size']}")
    if knobs.get("render_scale"):
        parts.append(f"render at {knobs['render_scale']:g} of the output size")
    if knobs.get("cache_threshold"):
        parts.append(f"cache threshold {knobs['cache_threshold']:g}")
    if knobs.get("steps"):
        parts.append(f"{knobs['steps'] - 1} evaluations")
    if knobs.get("schedule"):
        parts.append(f"schedule {knobs['schedule']}")
    if knobs.get("auto_schedule"):
        parts.append("declared grid or turbo-544p/768p")
    if knobs.get("gpu_precision"):
        parts.append(f"{knobs['gpu_precision']} on a GPU with it")
    return ", ".join(parts) or "every knob off"


def table() -> str:
    """`h3ctl presets`: each preset's settings with its measured speed-up and quality."""
    rows = [("preset", "settings", "transformer speed-up", "wall speed-up", "SSIM", "PSNR dB", "audio LSD dB",
             "semantic")]
    for name, p in PRESETS.items():
        m = p.measured
        fmt = lambda key, f: f.format(m[key]) if key in m else "not measured"  # noqa: E731
        psnr = "exact" if m.get("psnr") == math.inf else fmt("psnr", "{:.1f}")
        rows.append((name + (" (default)" if name == DEFAULT_PRESET else ""), describe(p.knobs),
                     fmt("speedup", "{:.2f}x"), fmt("wall_speedup", "{:.2f}x"), fmt("ssim", "{:.3f}"), psnr,
                     fmt("lsd_db", "{:.2f}"),
                     fmt("semantic", "{:.1%}")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("measured on h3-tiny (128x128, 22 frames, 20 steps, 2 threads) against the reference render of the "
                 "same noise; tests/bench_presets.py")
    lines.append("turbo4 / turbo8: no step-distilled model could be measured here (docs/few-step.md)")
    lines.append("")
    lines += [f"{name}: {p.summary}" for name, p in PRESETS.items()]
    return "\n".join(lines)
