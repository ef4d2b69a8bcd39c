"""diffusers' fl2va workflow (first / last keyframe) on a fixture checkpoint: the oracle of tests/test_fl2va.py.

Two entry points:
  * `run_fl2va`: the whole `MiniMaxH3Blocks` workflow with `image` / `last_image`: the resize step (PIL's
    Lanczos), the FL2VA text step (Qwen3-VL with its vision tower), the keyframe VAE encoder, the conditioning
    noise, the packed layout and the loop, returning the final latents and the tensors a libh3 run needs injected.
  * `run_core`: only `MiniMaxH3FL2VACoreDenoiseStep` (layout, conditioning noise, timesteps, loop) fed with given
    prompt embeddings, tags and condition latents, so libh3's layout and sampler are checked on their own.

Every random draw is made from a seeded torch generator exactly as diffusers makes it, and reproduced here to be
injected into libh3: the posterior of each keyframe is sampled under a fresh generator seeded 42
(`keyframe_encode_seed`), and the conditioning noise is one draw per condition, in packed order, from the request's
generator (the target noise is passed in, so nothing else is drawn from it).

The Qwen3-VL image processor needs torchvision, which cannot be installed beside the CPU torch; the stand-in of
tests/test_vision_tower.py (torchvision's uint8 resize done with torch's own interpolate) replaces it.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.pipeline_oracle import diffusers_pipeline


def fl2va_pipeline(models, tokenizer_dir):
    """The modular pipeline of pipeline_oracle.py with an image processor for the keyframes."""
    from tests.test_vision_tower import DEFAULT_PROC, OracleImageProcessor

    pipe = diffusers_pipeline(models, tokenizer_dir)
    pipe.processor.image_processor = OracleImageProcessor(DEFAULT_PROC)
    pipe._blocks.sub_blocks.pop("decode")  # the comparison is on the final latents: skip both decoders
    return pipe


def _pil(img):
    from PIL import Image

    return None if img is None else Image.fromarray(np.ascontiguousarray(img))


def condition_noise(seed: int, shapes) -> list[np.ndarray]:
    """The request generator's draws of MiniMaxH3PrepareConditionLatentsStep: one per condition, in order."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tuple(s), generator=g, dtype=torch.float32).numpy() for s in shapes]


def posterior_noise(shape) -> np.ndarray:
    """encode_vae_condition's `posterior.sample(torch.Generator().manual_seed(42))` draw."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(42), dtype=torch.float32).numpy()


@torch.no_grad()
def run_fl2va(pipe, prompt, frames, steps, latents, audio_latents, image=None, last_image=None, width=None,
              height=None, seed=0):
    """The whole fl2va workflow. Returns a dict: latents [C, T, h, w], audio_latents [2, C_a, T_a],
    condition_latents (list of [C, 1, h, w]), cond_noise / posterior_noise (the draws, same shapes),
    prompt_embeds [n, hidden], text_token_tags [n], height, width."""
    keys = ["latents", "audio_latents", "condition_latents", "prompt_embeds", "text_token_tags", "height", "width"]
    kw = {} if width is None else {"width": width, "height": height}
    out = pipe(prompt=prompt, image=_pil(image), last_image=_pil(last_image), num_frames=frames,
               num_inference_steps=steps, latents=torch.from_numpy(latents)[None],
               audio_latents=torch.from_numpy(audio_latents), generator=torch.Generator().manual_seed(seed),
               output=keys, **kw)
    cond = [c[0].float().numpy() for c in out["condition_latents"]]
    return {"latents": out["latents"][0].float().numpy(), "audio_latents": out["audio_latents"].float().numpy(),
            "condition_latents": cond, "cond_noise": condition_noise(seed, [c.shape for c in cond]),
            "posterior_noise": [posterior_noise(c.shape) for c in cond],
            "prompt_embeds": out["prompt_embeds"][0].float().numpy(),
            "text_token_tags": out["text_token_tags"].numpy().astype(np.uint8),
            "height": int(out["height"]), "width": int(out["width"])}


@torch.no_grad()
def run_core(models, prompt_embeds, text_tags, anchors, condition_latents, width, height, frames, steps, latents,
             audio_latents, seed=0):
    """MiniMaxH3FL2VACoreDenoiseStep alone: the given conditioning through diffusers' layout, conditioning noise
    (the request generator seeded `seed`) and loop. Returns (latents [C, T, h, w], audio [2, C_a, T_a])."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3FL2VACoreDenoiseStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    MiniMaxH3ModularPipeline.min_duration = property(lambda self: 0.0)
    pipe = MiniMaxH3FL2VACoreDenoiseStep().init_pipeline()
    pipe.update_components(transformer=models["transformer"], scheduler=MiniMaxH3Scheduler(shift=12.0),
                           audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt_embeds=torch.from_numpy(prompt_embeds)[None], text_token_tags=torch.from_numpy(
               np.asarray(text_tags, np.int64)), keyframe_anchors=tuple(anchors),
               condition_latents=[torch.from_numpy(c)[None] for c in condition_latents], height=height, width=width,
               num_frames=frames, num_inference_steps=steps, latents=torch.from_numpy(latents)[None],
               audio_latents=torch.from_numpy(audio_latents), generator=torch.Generator().manual_seed(seed),
               output=["latents", "audio_latents"])
    return out["latents"][0].float().numpy(), out["audio_latents"].float().numpy()


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
