"""The Python API: `Engine` keeps a model loaded and renders prompts to frames + stereo audio.

    from h3ctl import Engine
    eng = Engine()                      # the embedded h3-tiny, all cores
    res = eng.render("a red circle moves right on a black background, a high beep", seed=7)
    res.frames  # uint8 [F, H, W, 3]     res.audio  # float32 [2, S]     res.sample_rate  # 32000
    res.save("out.mp4")
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import _lib
from ._lib import H3Error
from .context import Context

EMBEDDED_MODEL = Path(__file__).resolve().parent / "models" / "h3-tiny"
FPS = 24

# Tensors a parity check may inject into a render (Engine.prepare's `injected`).
INJECTED = ("first_noise", "last_noise", "first_posterior_noise", "last_posterior_noise", "first_latent",
            "last_latent", "text_states", "text_tags")

# progress(phase, done, total) -> True to cancel
ProgressFn = Callable[[str, int, int], object]


def default_model_dir() -> Path:
    env = os.environ.get("H3CTL_MODEL")
    return Path(env) if env else EMBEDDED_MODEL


def frames_for_seconds(seconds: float) -> int:
    from . import limits

    return max(1, int(round(limits.seconds(seconds) * FPS)))


@dataclass
class Result:
    frames: np.ndarray          # uint8 [F, H, W, 3]
    audio: np.ndarray           # float32 [2, S], left then right
    sample_rate: int
    fps: int = FPS
    prompt: str = ""
    seed: int = 0
    steps: int = 0
    info: dict = field(default_factory=dict)
    transformer: dict = field(default_factory=dict)  # the transformer's work: evaluations, time_ms, ...
    profile: list | None = None  # render(profile=True): per-phase wall time and peak memory (h3ctl.profile)
    latents: tuple | None = None  # run(decode=None): (video [C, T, h, w], audio [2, C_a, T_a]); frames/audio None

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write an MP4 (H.264 + AAC), or a WAV when the name ends in .wav."""
        from . import media, outputs

        res = outputs.Reserved(path, overwrite)  # never over a file that appears meanwhile; nothing partial left
        try:
            try:
                if res.final.suffix.lower() == ".wav":
                    media.write_wav(res.tmp, self.audio, self.sample_rate)
                else:
                    media.write_mp4(res.tmp, self.frames, self.audio, self.sample_rate, fps=self.fps)
            except H3Error as e:
                raise H3Error(outputs.replace_path(str(e), res.tmp, res.final)) from None
            return res.publish()
        finally:
            if not res.done:
                res.discard()


class Request:
    """One render request: the h3_request libh3 reads (`c`), its parity injections (`c.parity`, an h3_parity) and
    the arrays their pointers borrow (keyframes, references and injected tensors, decoded or converted once, when
    Engine.request built it). Pass it to Engine.plan, prepare, run or render, as often as needed; the fields of
    the h3_request read through (req.width, req.references, ...)."""

    def __init__(self, c: _lib.H3Request, prompt: str = ""):
        self.c = c
        self.prompt = prompt
        self._keep: list = []  # the pointers in c borrow these arrays' memory

    def __getattr__(self, name):
        if name.startswith("_") or name in ("c", "prompt"):
            raise AttributeError(name)
        return getattr(self.c, name)


class Engine:
    """A loaded model.

    Threads: an Engine may be shared between threads. Every method that calls into the model takes the
    engine's lock (a re-entrant lock, one per engine), so calls from different threads run one after another,
    never at once; render() holds it for the whole render (prepare, every step, both decodes), so another
    thread's calls wait until the render is complete and cannot interleave with it. A render therefore gives
    the same bytes whether or not other threads use the engine; to render in parallel, use one Engine per
    thread (each has its own model context). The step-by-step methods (prepare, step, decode_*) share the
    engine's one prepared request: a thread driving them should hold `engine.lock` across the sequence.
    cancel() takes no lock: any thread, or a signal handler, may call it to stop the running call.

    A progress callback runs on the rendering thread, inside the call into the model. It must not call the
    engine (except cancel()): such a call raises H3Error("engine is busy: ...") rather than re-entering the
    model in the middle of a call; the render then fails with that error.
    """

    def __init__(self, model_dir: str | os.PathLike | None = None, threads: int | None = None, device: str = "auto",
                 device_index: int = 0, precision: str = "default", ref2va: bool = False, vram=None,
                 fp8_attention: bool = False, fp8_decoder: bool = False, quantized: str | os.PathLike | None = None,
                 transformer=None, text_encoder=None, video_vae=None, audio_vae=None, tokenizer=None,
                 config_dir=None):
        """`ref2va`: open the model's Ref2VA/ partition (its transformer), which renders with `references`; a
        component folder Ref2VA/ lacks is FL2VA's (h3-tiny's shared-weight Ref2VA keeps only its transformer).
        `device`: "auto" (the GPU when libh3's CUDA backend, or on a Mac its Metal backend, is built and one answers,
        else the CPU), "cpu", "cuda" or "metal"; `device_index`: the GPU ordinal. `precision`: the transformer blocks' weights, "default" (= "bf16",
        exact), "fp8" (CUDA) or "int8" (CPU); refused with the reason where the device cannot run it. `vram`: GiB
        the transformer's GEMM weights may hold (None or 0: auto, resident when they fit); the blocks that do not fit
        stream from host memory through two slots, with byte-identical results. `fp8_attention`: the main blocks'
        self-attention as cuDNN's fp8 SDPA (CUDA on Hopper or newer; faster, not exact; any `precision`).
        `fp8_decoder`: the video decoder's layer GEMMs with fp8 weights (CUDA sm_89+; not exact, measured slower).
        `quantized`: with precision "fp8", the file `h3ctl quantize` wrote from this model (h3ctl.quantize), read
        instead of quantising at load (the same bytes); refused with the reason when it was made from another
        checkpoint or is incomplete. `transformer` / `text_encoder` / `video_vae` / `audio_vae`: single files
        (ComfyUI's repackages: bf16, pruned, fp8_scaled, int8_convrot) read instead of the folder's weights, the folder
        giving the configs (docs/single-files.md); `model_dir` may be a ComfyUI models/ folder; `tokenizer`: the
        official tokenizer/ folder; `config_dir`: the official folder whose small files go with a ComfyUI folder."""
        # Threading state first: close() and the guards must work even if opening fails below.
        self._lock = threading.RLock()
        self._owner: int | None = None  # thread holding the lock in a public method
        self._depth = 0                 # nesting of public methods on that thread (render -> prepare)
        self._native = 0                # > 0 while a call that may run the progress hook is in the model
        self._ctx = None
        # Single files (h3ctl.components); `model_dir` may also be a ComfyUI models/ folder.
        from .components import resolve

        folder, self.files = resolve(model_dir, ref2va=ref2va, transformer=transformer, text_encoder=text_encoder,
                                     video_vae=video_vae, audio_vae=audio_vae, tokenizer=tokenizer,
                                     config_dir=config_dir)
        self.model_dir = folder if folder is not None else default_model_dir()
        if folder is None and not self.model_dir.exists():
            raise H3Error(f"{self.model_dir}: the embedded model is missing from this installation")
        self._ctx = Context(self.model_dir, threads=threads or 0, device=device, device_index=device_index,
                            precision=precision, ref2va=ref2va, vram=vram, quantized=quantized,
                            flags=(_lib.H3_OPT_FP8_ATTENTION if fp8_attention else 0)
                            | (_lib.H3_OPT_FP8_DECODER if fp8_decoder else 0), files=self.files)
        self._progress: ProgressFn | None = None
        try:
            self.defaults = self._model_defaults()
        except H3Error:
            self._ctx.close()
            self._ctx = None
            raise
        self.last_transformer_profile: dict = {}
        self._cancel = False
        self._raised: list[BaseException] = []
        self._hook = _lib.H3ProgressFn(self._on_progress)  # kept alive as long as the engine
        _lib.lib().h3_set_progress(self._ctx.ptr, self._hook, None)

    # -- progress and cancellation -----------------------------------------------------------
    def device_memory_peak(self, reset: bool = False) -> int | None:
        """Peak device memory in use (bytes) on the GPU since the last reset, or None on a CPU-only engine (see
        h3_device_memory_peak). Like cancel(), it may be called from the progress callback."""
        ctx = self._ctx
        if ctx is None:
            return None
        peak = _lib.c_uint64(0)
        rc = _lib.lib().h3_device_memory_peak(ctx.ptr, 1 if reset else 0, _lib.ctypes.byref(peak))
        if rc < 0:
            raise H3Error(_lib.last_error())
        return int(peak.value) if rc == 1 else None

    def _model_defaults(self) -> dict:
        """width / height / frames / steps / seed of a request that gives none: libh3's h3_request_default, which
        reads the model's model_index.json (the one place those defaults are decided)."""
        c = _lib.H3Request()
        _lib.check(_lib.lib().h3_request_default(self._ctx.ptr, ctypes.byref(c)))
        return {"width": c.width, "height": c.height, "frames": c.frames, "steps": c.steps, "seed": c.seed}

    def cancel(self) -> None:
        """Ask the running call to stop at its next unit of work (safe from a signal handler). The request stays
        cancelled (`cancelled`) until the next prepare."""
        self._cancel = True

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called since the last prepare (a render that finished just before the cancel
        arrived returns normally: its caller checks this before writing anything)."""
        return self._cancel

    @contextlib.contextmanager
    def hooked(self, progress: ProgressFn | None = None):
        """For a direct call into the model through the engine's context (a stage such as h3ctl.text.encode):
        clears the cancel flag, routes the context's progress hook to `progress` for the block, and re-raises an
        exception the callback raised (the C call then failed with H3_E_CANCELLED) instead of that failure."""
        with self._guard("hooked"):
            self._cancel = False
            previous, self._progress = self._progress, progress
            try:
                yield self._ctx
            except H3Error:
                if self._raised:
                    err = self._raised.pop(0)
                    self._raised.clear()
                    raise err from None
                raise
            finally:
                self._progress = previous

    def _on_progress(self, _user, phase, done, total):
        if self._cancel:
            return 1
        if self._progress is not None:
            try:
                if self._progress(phase.decode() if phase else "", int(done), int(total)):
                    return 1
            except BaseException as e:  # noqa: BLE001 - re-raised after the C call returns
                self._raised.append(e)
                return 1
        return 1 if self._cancel else 0

    # -- threading -----------------------------------------------------------------------------
    @property
    def lock(self) -> threading.RLock:
        """The engine's lock: hold it to run several calls (prepare, step, ...) with no other thread between."""
        return self._lock

    @contextlib.contextmanager
    def _guard(self, what: str):
        """Serialises a public method with every other thread's calls (see the class docstring)."""
        me = threading.get_ident()
        if self._native and self._owner == me:
            # Only the thread inside the model can get here with _native set: it is its own progress callback.
            raise H3Error(f"engine is busy: {what}() was called from the engine's progress callback while a call "
                          "into the model is running; only cancel() may be called from there")
        with self._lock:
            self._owner = me
            self._depth += 1
            try:
                if self._ctx is None and what != "close":
                    raise H3Error("the engine is closed")
                yield
            finally:
                self._depth -= 1
                if not self._depth:
                    self._owner = None

    def _hooked(self, fn, *args) -> int:
        """One C call that may run the progress hook; marks the window in which re-entry is refused."""
        self._native += 1
        try:
            return fn(*args)
        finally:
            self._native -= 1

    def _call(self, rc: int) -> int:
        if self._raised:
            err = self._raised.pop(0)
            self._raised.clear()
            raise err
        if rc == -6:  # H3_E_CANCELLED: by our own flag (cancel(), Ctrl-C) or a progress callback
            from .errors import Cancelled

            raise Cancelled("the render was cancelled" + ("" if self._cancel else " by the progress callback"), 6)
        return _lib.check(rc)

    # -- rendering ---------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        with self._guard("threads"):
            return self._ctx.threads

    @property
    def device(self) -> str:
        """Where the transformer runs: "cpu", "cuda" or "metal"."""
        with self._guard("device"):
            return self._ctx.device

    @property
    def device_description(self) -> str:
        """One line naming the device (GPU model and memory, or CPU kernels and threads)."""
        with self._guard("device_description"):
            return self._ctx.device_description

    def prepare(self, prompt, width: int | None = None, height: int | None = None, frames: int | None = None,
                seconds: float | None = None, steps: int | None = None, seed: int = 42,
                video_noise: np.ndarray | None = None, audio_noise: np.ndarray | None = None,
                vae_tile: int | None = None, preset: str | None = None, first_frame=None, last_frame=None,
                injected: dict | None = None, references=None, **knobs) -> dict:
        """Everything before the first step, for a Request (Engine.request) or for the arguments `request` takes
        (the prompt first), built into one here. Returns the prepared render's shapes (render_info)."""
        with self._guard("prepare"):
            if isinstance(prompt, Request):
                req = prompt
            else:
                req = self.request(prompt, width, height, frames, seconds, steps, seed, vae_tile, preset=preset,
                                   first_frame=first_frame, last_frame=last_frame, references=references,
                                   video_noise=video_noise, audio_noise=audio_noise, injected=injected, **knobs)
            self._cancel = False
            self._call(self._hooked(_lib.lib().h3_prepare, self._ctx.ptr, ctypes.byref(req.c)))
            return self.render_info()

    @property
    def sample_rate(self) -> int:
        """The audio VAE's sample rate (Hz): the rate of the rendered audio (audio references at other rates are
        resampled to it by libh3)."""
        return int(self._ctx.info()["components"]["audio_vae"]["config"]["sample_rate"])

    def reference_size(self, width: int, height: int) -> tuple[int, int]:
        """The size an image reference of width x height is encoded at (h3_reference_size)."""
        w, h = ctypes.c_int(), ctypes.c_int()
        _lib.check(_lib.lib().h3_reference_size(self._ctx.ptr, int(width), int(height), ctypes.byref(w),
                                                ctypes.byref(h)))
        return w.value, h.value

    def reference_video_size(self, width: int, height: int, frames: int, fps: float,
                             render_frames: int) -> tuple[int, int, int, int]:
        """A video reference of `frames` frames of width x height at `fps` in a render of `render_frames` frames:
        (canvas width, height, its frames at 24 fps after the truncation, latent frames) (h3_reference_video_size)."""
        out = [ctypes.c_int() for _ in range(4)]
        _lib.check(_lib.lib().h3_reference_video_size(self._ctx.ptr, int(width), int(height), int(frames), float(fps),
                                                      int(render_frames), *[ctypes.byref(o) for o in out]))
        return tuple(o.value for o in out)

    def _inject(self, req: "Request", injected: dict, video_noise, audio_noise) -> None:
        """The request's h3_parity from the injected tensors, each checked for its shape against the request's
        plan (libh3 cannot: it only receives pointers)."""
        injected = dict(injected or {})
        # Ref2VA parity: "reference_noise_<k>" / "reference_posterior_noise_<k>" ([C, t, h, w] at the k-th
        # reference's encoding size, k from 0 in request order).
        ref_inj = {n: injected.pop(n) for n in list(injected) if re.fullmatch(r"reference_(posterior_)?noise_\d+", n)}
        unknown = sorted(set(injected) - set(INJECTED))
        if unknown:
            raise H3Error(f"unknown injected tensor(s): {', '.join(unknown)} (known: {', '.join(INJECTED)})")
        injected = {k: v for k, v in injected.items() if v is not None}
        if video_noise is None and audio_noise is None and not injected and not ref_inj:
            return
        par = _lib.H3Parity()
        par.struct_size = ctypes.sizeof(par)
        keep = req._keep
        anchors = {"first": bool(req.c.first_frame) or "first_latent" in injected,
                   "last": bool(req.c.last_frame) or "last_latent" in injected}
        inj = {}
        for name, arr in injected.items():
            if name.startswith(("first_", "last_")) and not anchors[name.split("_")[0]]:
                raise H3Error(f"{name} given without the {name.split('_')[0]} frame")
            inj[name] = np.ascontiguousarray(arr, dtype=np.uint8 if name == "text_tags" else np.float32)
        if "text_tags" in inj and "text_states" not in inj:
            raise H3Error("text_tags given without text_states")
        if "text_states" in inj:
            par.text_rows = int(inj["text_states"].shape[0]) if inj["text_states"].ndim == 2 else -1
        noise = {n: np.ascontiguousarray(a, dtype=np.float32)
                 for n, a in (("video_noise", video_noise), ("audio_noise", audio_noise)) if a is not None}
        for name, arr in {**noise, **inj}.items():
            keep.append(arr)
            setattr(par, name, arr.ctypes.data_as(_lib.c_uint8_p if arr.dtype == np.uint8 else _lib.c_float_p))
        req.c.parity = ctypes.pointer(par)  # the plan reads no tensor, only which are given and text_rows
        keep.append(par)
        info = self.plan(req)
        want = {"video_noise": [info["latent_channels"], info["latent_frames"], info["latent_height"],
                                info["latent_width"]],
                "audio_noise": [2, info["audio_latent_channels"], info["audio_latents"]]}
        want_c = [info["latent_channels"], 1, info["latent_height"], info["latent_width"]]
        hidden = _lib.check(_lib.lib().h3_text_hidden_size(self._ctx.ptr)) if "text_states" in inj else 0
        for name, arr in {**noise, **inj}.items():
            if name == "text_states":
                shape = [arr.shape[0] if arr.ndim == 2 else -1, hidden]
            elif name == "text_tags":
                shape = [par.text_rows]
            else:
                shape = want.get(name, want_c)
            if list(arr.shape) != shape:
                raise H3Error(f"{name} must have shape {shape}, got {list(arr.shape)}")
        if ref_inj:
            self._inject_references(req, par, ref_inj, info)

    def _inject_references(self, req: "Request", par, ref_inj: dict, info: dict) -> None:
        """h3_parity.reference_noise / reference_posterior_noise from "reference_[posterior_]noise_<k>"."""
        n = int(req.c.n_references)
        arr = ctypes.cast(req.c.references, ctypes.POINTER(_lib.H3Reference)) if n else None
        tables = {"noise": (_lib.c_float_p * max(n, 1))(), "posterior_noise": (_lib.c_float_p * max(n, 1))()}
        for name, value in ref_inj.items():
            k = int(name.rsplit("_", 1)[1])
            if not 0 <= k < n:
                raise H3Error(f"{name}: the request has {n} references")
            ref = arr[k]
            if ref.kind == _lib.H3_REFERENCE_AUDIO:
                raise H3Error(f"{name}: reference {k + 1} is audio, which is never noised (nothing to inject)")
            t = 1
            if ref.kind == _lib.H3_REFERENCE_VIDEO:
                w, h, _, t = self.reference_video_size(ref.width, ref.height, ref.frames, ref.fps, info["frames"])
            else:
                w, h = self.reference_size(ref.width, ref.height)
            # the video VAE's pixels per latent: the canvas over its latent grid (the output, not a render_size)
            ratio = info["height"] // info["latent_height"] if not req.c.render_width else 16
            want = [info["latent_channels"], t, h // ratio, w // ratio]
            value = np.ascontiguousarray(value, dtype=np.float32)
            if list(value.shape) != want:
                raise H3Error(f"{name} must have shape {want}, got {list(value.shape)}")
            req._keep.append(value)
            tables["posterior_noise" if "posterior" in name else "noise"][k] = value.ctypes.data_as(_lib.c_float_p)
        req._keep.extend(tables.values())
        par.reference_noise = ctypes.cast(tables["noise"], ctypes.POINTER(_lib.c_float_p))
        par.reference_posterior_noise = ctypes.cast(tables["posterior_noise"], ctypes.POINTER(_lib.c_float_p))

    def request(self, prompt: str = "", width: int | None = None, height: int | None = None,
                frames: int | None = None, seconds: float | None = None, steps: int | None = None,
                seed: int = 42, vae_tile: int | None = None, preset: str | None = None,
                first_frame=None, last_frame=None, anchors: dict | None = None, references=None,
                video_noise: np.ndarray | None = None, audio_noise: np.ndarray | None = None,
                injected: dict | None = None, blank_ok: bool = False, **knobs) -> "Request":
        """One render request (a Request: pass it to plan, prepare, run or render). Every medium given as a path
        (keyframes, reference images, videos, audio) is decoded here, once; the request keeps the arrays alive.
        width, height, frames and steps left out are the model's (h3_request_default: its model_index.json).

        `preset`: a name of h3ctl.presets.PRESETS (None: every knob off, the exact render); knobs given explicitly
        (reuse=, core_reuse=, layers=, layer_policy="gate"|"uniform", token_reduction=, render_size="WxH",
        cache_threshold=, lora=["FILE[:SCALE]", ...]) override the preset's. libh3 checks them with the rest of
        the request (h3_plan).

        `first_frame` / `last_frame`: keyframes (a path, decoded with the bundled ffmpeg, or a uint8 [H, W, 3]
        RGB array). With a keyframe and no width/height, the canvas follows the first keyframe's aspect by the
        model's canvas rule (libh3 resolves it; `plan` reports it).

        `references` (Ref2VA): a list in the order the model reads them; an item is an image (a path or a uint8
        [H, W, 3] array) or ("image", image), or audio: a dict {"audio": float [channels, samples] (or [samples])
        array, "sample_rate": Hz} at any rate from 4 to 384 kHz (libh3 resamples it to the model's once, as
        diffusers does) or ("audio", path) decoded with the bundled ffmpeg at the file's own rate, or a video:
        ("video", path) (decoded with the bundled ffmpeg, its soundtrack kept), ("silent_video", path) (the sound
        dropped) or a dict {"frames": uint8 [T, H, W, 3], "fps": rate (default 24), "audio": float [channels,
        samples] (optional), "sample_rate": Hz}. Needs an Engine opened with ref2va=True on a model with Ref2VA/.

        Parity checks (h3_parity): `video_noise` [C, T, h, w] / `audio_noise` [2, C_a, T_a] replace the initial
        noise; `injected` holds tensors used instead of libh3's own computation: "first_noise", "last_noise" (the
        conditioning noise eps, [C, 1, h, w]), "first_posterior_noise", "last_posterior_noise" (the encoder's
        posterior noise, same shape), "first_latent", "last_latent" (the normalised condition latents, same
        shape, instead of encoding the keyframe; a keyframe may then be None), "text_states" ([rows, text
        hidden], instead of encoding the prompt), "text_tags" ([rows] uint8: 1 text, 0 vision rows) and
        "reference_noise_<k>" / "reference_posterior_noise_<k>" (reference k's draws, [C, t, h, w] at its
        encoding size). Each is checked for its shape here."""
        from . import limits, media, presets, schedules

        with self._guard("request"):
            if not isinstance(prompt, str):
                raise H3Error("the prompt must be a string")
            resolved = presets.resolve(preset, **knobs)
            if frames is not None and seconds is not None:
                raise H3Error("give frames or seconds, not both")
            inj = injected or {}
            keyed_in = (first_frame is not None or last_frame is not None or bool(references)
                        or any((anchors or {}).values())
                        or any(inj.get(f"{k}_latent") is not None for k in ("first", "last")))
            prompt = limits.prompt(prompt, blank_ok=blank_ok or keyed_in or inj.get("text_states") is not None)
            if seconds is not None:
                frames = frames_for_seconds(seconds)
            # every number checked before ctypes stores it (an int32 field takes 2^32 + k as k)
            width = None if width is None else limits.side("width", width)
            height = None if height is None else limits.side("height", height)
            frames = None if frames is None else limits.frames(frames)
            steps = None if steps is None else limits.steps(steps)
            seed = limits.seed(seed)
            vae_tile = limits.vae_tile(vae_tile or 0)
            c = _lib.H3Request()
            _lib.check(_lib.lib().h3_request_default(self._ctx.ptr, ctypes.byref(c)))
            c.prompt = prompt.encode("utf-8", "surrogatepass")
            req = Request(c, prompt)
            keep = req._keep
            for which, image in (("first", first_frame), ("last", last_frame)):
                if image is not None:
                    rgb = media.as_keyframe(image, f"{which} frame")
                    keep.append(rgb)
                    setattr(c, f"{which}_frame", rgb.ctypes.data_as(_lib.c_uint8_p))
                    setattr(c, f"{which}_width", rgb.shape[1])
                    setattr(c, f"{which}_height", rgb.shape[0])
            if references:
                refs = media.as_references(references, self.sample_rate)
                arr = (_lib.H3Reference * len(refs))()
                for i, (kind, value) in enumerate(refs):
                    if kind == "audio":
                        pcm, rate = value  # planar [channels, samples], as h3_reference.pcm
                        keep.append(pcm)
                        arr[i].kind = _lib.H3_REFERENCE_AUDIO
                        arr[i].pcm = pcm.ctypes.data_as(_lib.c_float_p)
                        arr[i].channels, arr[i].samples, arr[i].sample_rate = pcm.shape[0], pcm.shape[1], rate
                        continue
                    if kind == "video":
                        clip, fps, pcm, rate = value
                        keep.append(clip)
                        arr[i].kind = _lib.H3_REFERENCE_VIDEO
                        arr[i].rgb = clip.ctypes.data_as(_lib.c_uint8_p)
                        arr[i].frames, arr[i].height, arr[i].width = clip.shape[:3]
                        arr[i].fps = fps
                        if pcm is not None:  # its soundtrack, planar [channels, samples]
                            keep.append(pcm)
                            arr[i].pcm = pcm.ctypes.data_as(_lib.c_float_p)
                            arr[i].channels, arr[i].samples, arr[i].sample_rate = pcm.shape[0], pcm.shape[1], rate
                        continue
                    rgb = value
                    keep.append(rgb)
                    arr[i].kind = _lib.H3_REFERENCE_IMAGE
                    arr[i].rgb = rgb.ctypes.data_as(_lib.c_uint8_p)
                    arr[i].width, arr[i].height, arr[i].frames = rgb.shape[1], rgb.shape[0], 1
                keep.append(arr)
                c.references = ctypes.cast(arr, ctypes.c_void_p)
                c.n_references = len(refs)
            # With keyframes an unset canvas is 0 x 0: libh3 takes it from the first keyframe's aspect.
            inj = injected or {}
            keyed = bool(keep) or any((anchors or {}).values()) or any(
                inj.get(f"{k}_latent") is not None for k in ("first", "last"))
            if keyed and (width is None) != (height is None):
                raise H3Error("give width and height together, or neither (the canvas then follows the keyframe)")
            if width is not None or keyed:
                c.width = int(0 if width is None else width)
            if height is not None or keyed:
                c.height = int(0 if height is None else height)
            if frames is not None:
                c.frames = int(frames)
            if steps is not None:
                c.steps = int(steps)
                resolved.pop("steps", None)  # the caller's count wins over a preset's
            c.seed = int(seed)
            c.vae_tile_px = int(vae_tile or 0)
            presets.apply(c, resolved, declared=lambda r: schedules.declared(self, r))
            self._inject(req, injected, video_noise, audio_noise)
            return req

    def plan(self, req: "Request") -> dict:
        """Validate a request (Engine.request) and return its shapes, computing nothing."""
        with self._guard("plan"):
            info = _lib.H3RenderInfo()
            info.struct_size = ctypes.sizeof(info)
            _lib.check(_lib.lib().h3_plan(self._ctx.ptr, ctypes.byref(req.c), ctypes.byref(info)))
            return {name: getattr(info, name) for name, _ in info._fields_ if name != "struct_size"}

    def render_info(self) -> dict:
        with self._guard("render_info"):
            info = _lib.H3RenderInfo()
            info.struct_size = ctypes.sizeof(info)
            _lib.check(_lib.lib().h3_render_info_get(self._ctx.ptr, ctypes.byref(info)))
            return {name: getattr(info, name) for name, _ in info._fields_ if name != "struct_size"}

    def step(self) -> int:
        """One Euler transition; returns the steps left."""
        with self._guard("step"):
            return self._call(self._hooked(_lib.lib().h3_step, self._ctx.ptr))

    def latents(self) -> tuple[np.ndarray, np.ndarray]:
        with self._guard("latents"):
            i = self.render_info()
            v = np.empty((i["latent_channels"], i["latent_frames"], i["latent_height"], i["latent_width"]),
                         np.float32)
            a = np.empty((2, i["audio_latent_channels"], i["audio_latents"]), np.float32)
            _lib.check(_lib.lib().h3_get_latents(self._ctx.ptr, v.ctypes.data_as(_lib.c_float_p),
                                                 a.ctypes.data_as(_lib.c_float_p)))
            return v, a

    def prompt_tokens(self) -> np.ndarray:
        with self._guard("prompt_tokens"):
            n = _lib.check(_lib.lib().h3_prompt_tokens(self._ctx.ptr, None, 0))
            ids = np.empty(n, np.int32)
            _lib.check(_lib.lib().h3_prompt_tokens(self._ctx.ptr, ids.ctypes.data_as(_lib.c_int32_p), n))
            return ids

    def decode_audio(self) -> np.ndarray:
        with self._guard("decode_audio"):
            i = self.render_info()
            pcm = np.empty((2, i["audio_samples"]), np.float32)
            self._call(self._hooked(_lib.lib().h3_decode, self._ctx.ptr, None, pcm.ctypes.data_as(_lib.c_float_p)))
            return pcm

    def decode_video(self) -> np.ndarray:
        with self._guard("decode_video"):
            i = self.render_info()
            rgb = np.empty((i["frames"], i["height"], i["width"], 3), np.uint8)
            self._call(self._hooked(_lib.lib().h3_decode, self._ctx.ptr, rgb.ctypes.data_as(_lib.c_uint8_p), None))
            return rgb

    def transformer_profile(self) -> dict:
        """The transformer's memory and timing facts for the current request (before decoding releases it):
        adaln_weight_bytes (released by the precompute), adaln_table_bytes, forward timings in ms."""
        with self._guard("transformer_profile"):
            raw = _lib.lib().h3_dit_profile_json(self._ctx.ptr)
            if raw is None:
                raise H3Error(_lib.last_error())
            return json.loads(raw.decode("utf-8"))

    def decode_video_f32(self) -> np.ndarray:
        with self._guard("decode_video_f32"):
            i = self.render_info()
            px = np.empty((i["frames"], i["height"], i["width"], 3), np.float32)
            self._call(self._hooked(_lib.lib().h3_decode_video_f32, self._ctx.ptr, px.ctypes.data_as(_lib.c_float_p)))
            return px

    def run(self, req: "Request", *, progress: ProgressFn | None = None,
            on_step: Callable[[int, int], object] | None = None, decode: str | None = "uint8",
            profile=None) -> Result:
        """The one step driver: prepare `req`, run every step, then decode. Every render goes through it
        (render(), `h3ctl render`, the session, previews, the ComfyUI nodes, the parity modules).

        `progress(phase, done, total)`: libh3's progress (a truthy return cancels). `on_step(done, total)`: called
        after the prepare (done = 0) and after every step (done = steps run, total = steps of the request);
        a truthy return cancels, as cancel() does. `decode`: "uint8" (Result.frames uint8 [F, H, W, 3] and
        Result.audio float32 [2, S]), "f32" (frames as floats in [0, 1] before the uint8 rounding) or None (no
        decode: Result.latents holds (video [C, T, h, w], audio [2, C_a, T_a]) and frames / audio are None).
        `profile` as in render(). A cancel (cancel(), a callback) raises h3ctl.Cancelled."""
        if decode not in ("uint8", "f32", None):
            raise H3Error(f"decode must be 'uint8', 'f32' or None, got {decode!r}")
        with self._guard("run"):
            prof = None
            if profile is not None and profile is not False:
                from .profile import PhaseProfile

                prof = profile if isinstance(profile, PhaseProfile) else PhaseProfile(self.device_memory_peak)

                def progress(phase, done, total, _user=progress):
                    prof.progress(phase)
                    return _user(phase, done, total) if _user is not None else False

            previous, self._progress = self._progress, progress
            try:
                info = self.prepare(req)
                total, done = int(info["steps"]), int(info["steps_done"])
                while True:
                    if on_step is not None and on_step(done, total):
                        from .errors import Cancelled

                        self.cancel()
                        raise Cancelled("the render was cancelled by the " + getattr(on_step, "who", "step callback"), 6)
                    if self._cancel:
                        from .errors import Cancelled

                        raise Cancelled("the render was cancelled", 6)
                    if done >= total:
                        break
                    left = self.step()
                    done = total - left
                self.last_transformer_profile = self.transformer_profile()
                latents = None
                frames = audio = None
                if decode is None:
                    latents = self.latents()
                else:
                    # The decoders' first callbacks come after their weights load: start their phases here.
                    if prof is not None:
                        prof.progress("audio_decode")
                    audio = self.decode_audio()
                    if prof is not None:
                        prof.progress("video_decode")
                    frames = self.decode_video() if decode == "uint8" else self.decode_video_f32()
                if prof is not None and not isinstance(profile, PhaseProfile):
                    prof.finish()
            finally:
                self._progress = previous
            tp = self.last_transformer_profile
            work = {"evaluations": tp.get("evaluations", 0), "block_runs": tp.get("block_runs", 0),
                    "skipped_steps": tp.get("skipped_steps", 0), "layers_run": tp.get("layers_run", 0),
                    "time_ms": tp.get("transformer_ms", 0.0)}
            return Result(frames=frames, audio=audio, sample_rate=info["sample_rate"], fps=info["fps"],
                          prompt=req.prompt, seed=int(req.c.seed), steps=int(info["steps"]) + 1, info=info,
                          transformer=work, profile=prof.as_dict() if prof is not None else None, latents=latents)

    def render(self, prompt, width: int | None = None, height: int | None = None, frames: int | None = None,
               seconds: float | None = None, steps: int | None = None, seed: int = 42,
               progress: ProgressFn | None = None, video_noise: np.ndarray | None = None,
               audio_noise: np.ndarray | None = None, vae_tile: int | None = None, preview: Callable | None = None,
               preview_every: int = 1, preset: str | None = None, first_frame=None, last_frame=None,
               references=None, profile=None, **knobs) -> Result:
        """Prompt (or a Request from Engine.request) -> Result(frames uint8 [F,H,W,3], audio float32 [2,S],
        sample_rate). The other arguments build the request as `request` does (ignored with a Request).

        `first_frame` / `last_frame` (a path or a uint8 [H, W, 3] RGB array): the video starts / ends on these
        keyframes (FL2VA); without width/height the canvas follows the first keyframe's aspect.

        `preset` / knobs: the speed presets and knobs of `request` (default: none, the exact render).
        `Result.transformer` (and `last_transformer_profile`) report the transformer's work for the render:
        evaluations, block_runs, skipped_steps, layers_run and time_ms.

        `preview(rgb, step)` (optional) receives the current x0 estimate every `preview_every` steps and at the
        last one, as uint8 [T, h, w, 3] through the model's latent-to-RGB map (h3ctl.preview; the first use on a
        model fits that map, about a second on h3-tiny, then it is cached).

        `profile`: True, or an h3ctl.profile.PhaseProfile to add to, records each phase's wall time, peak RSS and
        peak device memory; `Result.profile` then lists them (dicts: phase, wall_s, peak_rss_bytes,
        peak_device_bytes, the last None on the CPU). A PhaseProfile passed in is left open (its caller may
        time more phases, as `h3ctl render` does its writing)."""
        with self._guard("render"):
            on_step = None
            if preview is not None:
                from .preview import Previewer

                previewer = Previewer(self, preview, preview_every)  # before the request: a first fit renders
            if isinstance(prompt, Request):
                req = prompt
            else:
                req = self.request(prompt, width, height, frames, seconds, steps, seed, vae_tile, preset=preset,
                                   first_frame=first_frame, last_frame=last_frame, references=references,
                                   video_noise=video_noise, audio_noise=audio_noise, **knobs)
            if preview is not None:
                on_step = previewer.stepper(req.c.steps)
            return self.run(req, progress=progress, on_step=on_step, profile=profile)

    def close(self) -> None:
        with self._guard("close"):
            if getattr(self, "_ctx", None) is not None:
                self._ctx.close()
                self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
