"""The node classes, in ComfyUI's V1 node contract: INPUT_TYPES, RETURN_TYPES, RETURN_NAMES, FUNCTION, CATEGORY.

Graph:  H3ctl Load Model -> H3ctl Encode Prompt -> H3ctl Sample -> H3ctl Decode -> IMAGE, AUDIO, fps
(e.g. into ComfyUI's CreateVideo / SaveVideo). The sampler's output is an h3ctl latent (video [C, T, h, w] and
audio [2, C_a, T_a] float32 arrays plus the render facts), self-contained: it can be decoded any time later.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path

import numpy as np

CATEGORY = "h3ctl"
MODEL = "H3CTL_MODEL"
CONDITIONING = "H3CTL_CONDITIONING"
LATENT = "H3CTL_LATENT"
SEED_MAX = 0xFFFFFFFFFFFFFFFF

_ENGINES: dict = {}
_LOCK = threading.RLock()


def _optional(name: str):
    """A module when it can be imported (ComfyUI's, torch, PIL), else None; imported when first needed."""
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - absent or broken: the nodes work without it
        return None


def _check_interrupted():
    mm = _optional("comfy.model_management")
    if mm is not None and hasattr(mm, "throw_exception_if_processing_interrupted"):
        mm.throw_exception_if_processing_interrupted()


def _progress_bar(total: int):
    utils = _optional("comfy.utils")
    if utils is not None and hasattr(utils, "ProgressBar"):
        return utils.ProgressBar(total)
    return None


def _tensor(a: np.ndarray):
    torch = _optional("torch")
    if torch is None:
        return a
    return torch.from_numpy(np.ascontiguousarray(a))


def _engine_lock(eng):
    """The engine's own lock where it has one (h3ctl's Engine serialises threads with it), else ours."""
    return getattr(eng, "lock", None) or _LOCK


class H3Model:
    """What flows along a H3CTL_MODEL link: a loaded Engine (shared by every run with the same folder)."""

    def __init__(self, engine, key):
        self.engine = engine
        self.key = key

    def __repr__(self):
        return f"H3Model({self.engine.model_dir})"


def load_engine(model_dir: str = "", threads: int = 0) -> H3Model:
    from ..engine import Engine, default_model_dir

    path = Path(model_dir).expanduser() if model_dir.strip() else default_model_dir()
    key = (str(path.resolve()), int(threads))
    with _LOCK:
        eng = _ENGINES.get(key)
        if eng is None or getattr(eng, "_ctx", None) is None:
            eng = Engine(path, threads=int(threads) or None)
            _ENGINES[key] = eng
    return H3Model(eng, key)


class H3ctlLoadModel:
    DESCRIPTION = "Open an H3 model folder (empty: the embedded h3-tiny). The model stays loaded across runs."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model_dir": ("STRING", {"default": "", "multiline": False,
                                     "tooltip": "model folder in the official layout; empty = h3-tiny"}),
            "threads": ("INT", {"default": 0, "min": 0, "max": 1024, "tooltip": "CPU threads, 0 = all cores"}),
        }}

    RETURN_TYPES = (MODEL,)
    RETURN_NAMES = ("model",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, model_dir, threads):
        return (load_engine(model_dir, threads),)


class H3ctlEncodePrompt:
    DESCRIPTION = "Run the text encoder on a prompt (used verbatim); the embeddings go to the model's prompt cache."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": (MODEL,),
            "prompt": ("STRING", {"multiline": True, "default": "a red circle moves right on a black background, "
                                                                "a high beep"}),
        }}

    RETURN_TYPES = (CONDITIONING,)
    RETURN_NAMES = ("conditioning",)
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    def encode(self, model, prompt):
        from .. import text
        from .._lib import H3Error
        from ..tokenizer import Tokenizer

        if not isinstance(prompt, str) or not prompt.strip():
            raise H3Error("the prompt is empty")
        _check_interrupted()
        eng = model.engine
        with _LOCK, _engine_lock(eng):
            tok = Tokenizer(eng._ctx.info()["components"]["tokenizer"]["path"])
            try:
                ids = tok.encode(prompt)
            finally:
                tok.close()
            # the engine's progress hook answers the text encoder's per-layer calls: ComfyUI's Cancel stops it
            # (the interrupt, raised inside the hook, ends the C call and is re-raised by hooked())
            with eng.hooked(lambda phase, done, total: _check_interrupted()) as ctx:
                embeds = text.encode(ctx, ids)
        return ({"prompt": prompt, "tokens": int(ids.size), "embeds": embeds, "model": model.key},)


class H3ctlSample:
    DESCRIPTION = ("Denoise video + audio latents for a prompt. width / height / frames 0 = the model's default; "
                   "frames align up to 17n+5. Progress and Cancel work through ComfyUI's progress bar and interrupt.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": (MODEL,),
            "conditioning": (CONDITIONING,),
            "seed": ("INT", {"default": 42, "min": 0, "max": SEED_MAX}),
            "steps": ("INT", {"default": 20, "min": 2, "max": 1000,
                              "tooltip": "sigma grid points including the final 0 (20 runs 19 evaluations)"}),
            "width": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32, "tooltip": "0 = the model's default"}),
            "height": ("INT", {"default": 0, "min": 0, "max": 4096, "step": 32, "tooltip": "0 = the model's default"}),
            "frames": ("INT", {"default": 0, "min": 0, "max": 1000, "tooltip": "at 24 fps; 0 = the model's default"}),
        }, "optional": {
            "live_preview": ("BOOLEAN", {"default": False, "tooltip": "per-step previews on the progress bar "
                                         "(the first use on a model fits a latent-to-RGB map, then it is cached)"}),
        }}

    RETURN_TYPES = (LATENT,)
    RETURN_NAMES = ("latent",)
    FUNCTION = "sample"
    CATEGORY = CATEGORY

    def sample(self, model, conditioning, seed, steps, width, height, frames, live_preview=False):
        eng = model.engine
        with _LOCK, _engine_lock(eng):  # prepare .. latents with no other thread in between
            req = eng.request(conditioning["prompt"], width or None, height or None, frames or None, None, steps,
                              seed)
            eng.plan(req)  # shape rules first, before any work
            bar = _progress_bar(max(1, steps - 1))
            denoise = {"total": max(1, steps - 1)}
            on_step = None
            image = _optional("PIL.Image") if live_preview else None
            if image is not None:
                from ..preview import Previewer

                def show(rgb, step):
                    frame = np.ascontiguousarray(rgb[len(rgb) // 2])
                    pil = image.fromarray(frame).resize((frame.shape[1] * 8, frame.shape[0] * 8))
                    if bar is not None:
                        bar.update_absolute(step, denoise["total"], ("JPEG", pil, 512))

                on_step = Previewer(eng, show, 1).stepper(req.steps)

            def progress(phase, done, total):
                _check_interrupted()
                if phase == "denoise":
                    denoise["total"] = total
                    if bar is not None and (on_step is None or done == 0):
                        bar.update_absolute(done, total)
                return False

            res = eng.run(req, progress=progress, on_step=on_step, decode=None)
            info = res.info
            video, audio = res.latents
        return ({"video": video, "audio": audio, "info": info, "seed": int(seed), "steps": int(steps),
                 "prompt": conditioning["prompt"], "model": model.key},)


class H3ctlDecode:
    DESCRIPTION = "Decode an h3ctl latent: IMAGE frames [F, H, W, 3] in 0..1, AUDIO (stereo, 32 kHz) and the fps."

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": (MODEL,), "latent": (LATENT,)}}

    RETURN_TYPES = ("IMAGE", "AUDIO", "FLOAT")
    RETURN_NAMES = ("images", "audio", "fps")
    FUNCTION = "decode"
    CATEGORY = CATEGORY

    def decode(self, model, latent):
        from ..parity.vae_audio import audio_decode
        from ..parity.vae_video import decode

        eng = model.engine
        info = latent["info"]
        bar = _progress_bar(2000)

        def video_progress(phase, done, total):
            _check_interrupted()
            if bar is not None and total:
                bar.update_absolute(1000 + int(1000 * done / total), 2000)
            return False

        def audio_progress(done, total):
            _check_interrupted()
            if bar is not None and total:
                bar.update_absolute(int(1000 * done / total), 2000)
            return False

        with _LOCK, _engine_lock(eng):
            _check_interrupted()
            pcm = audio_decode(eng._ctx, np.ascontiguousarray(latent["audio"], np.float32), progress=audio_progress)
            _, pixels = decode(eng._ctx, latent["video"], want_rgb=False, progress=video_progress)
        audio = {"waveform": _tensor(pcm[None].astype(np.float32)), "sample_rate": int(info["sample_rate"])}
        return (_tensor(pixels.astype(np.float32)), audio, float(info["fps"]))


NODE_CLASS_MAPPINGS = {
    "H3ctlLoadModel": H3ctlLoadModel,
    "H3ctlEncodePrompt": H3ctlEncodePrompt,
    "H3ctlSample": H3ctlSample,
    "H3ctlDecode": H3ctlDecode,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "H3ctlLoadModel": "H3ctl Load Model",
    "H3ctlEncodePrompt": "H3ctl Encode Prompt",
    "H3ctlSample": "H3ctl Sample (video + audio)",
    "H3ctlDecode": "H3ctl Decode (IMAGE + AUDIO)",
}
