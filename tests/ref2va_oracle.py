"""diffusers' ref2va workflow (image references) on a fixture checkpoint: the oracle of tests/test_ref2va.py.

`run_ref2va` runs the whole `MiniMaxH3Blocks` workflow with `references`: the setup step (the 16:9 canvas unless
given, num_frames aligned, each image resized with PIL's Lanczos to the model's reference short edge), the ref2va
text step (`"<Picture k>: "` and Qwen3-VL's vision tower per image), the reference encoder (the video VAE's encoder,
posterior sampled under a fresh generator seeded 42), the conditioning noise, the packed layout and the loop against
`transformer_ref`. It returns the final latents and the random draws a libh3 run needs injected: one conditioning
draw per visual reference in request order from the request's generator (the target noise is passed in, so
nothing else is drawn from it), and each reference's posterior draw.

The reference short edge is a pipeline config (`reference_image_short_edge`, 2048 for the release); the fixture
model states its own value in model_index.json's "h3ctl" block and the same value is registered here.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.fl2va_oracle import condition_noise, fl2va_pipeline, posterior_noise


def ref2va_pipeline(models, ref_transformer, tokenizer_dir, reference_edge: int):
    """fl2va_pipeline's pipeline with the Ref2VA transformer and the fixture's reference short edge."""
    pipe = fl2va_pipeline(models, tokenizer_dir)
    pipe.update_components(transformer_ref=ref_transformer)
    pipe.register_to_config(reference_image_short_edge=reference_edge)
    return pipe


@torch.no_grad()
def run_ref2va(pipe, prompt, images, frames, steps, latents, audio_latents, width=None, height=None, seed=0):
    """The whole ref2va workflow with image references (uint8 [H, W, 3] arrays, request order) and audio references
    (("audio", waveform, sample_rate) items). Returns a dict (the draws: visual references only):
    latents [C, T, h, w], audio_latents [2, C_a, T_a], condition_latents (list of [C, 1, h_k, w_k]),
    cond_noise / posterior_noise (the draws, same shapes), prompt_embeds, text_token_tags, height, width."""
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference
    from PIL import Image

    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference

    # an item ("audio", waveform [channels, samples] float32, sample_rate) is an audio reference
    refs = [MiniMaxH3AudioReference(audio=torch.from_numpy(np.ascontiguousarray(im[1])), sample_rate=im[2])
            if isinstance(im, tuple) else MiniMaxH3ImageReference(image=Image.fromarray(np.ascontiguousarray(im)))
            for im in images]
    keys = ["latents", "audio_latents", "condition_latents", "prompt_embeds", "text_token_tags", "height", "width"]
    kw = {} if width is None else {"width": width, "height": height}
    out = pipe(prompt=prompt, references=refs, num_frames=frames, num_inference_steps=steps,
               latents=torch.from_numpy(latents)[None], audio_latents=torch.from_numpy(audio_latents),
               generator=torch.Generator().manual_seed(seed), output=keys, **kw)
    cond = [c[0].float().numpy() for c in out["condition_latents"]]
    return {"latents": out["latents"][0].float().numpy(), "audio_latents": out["audio_latents"].float().numpy(),
            "condition_latents": cond, "cond_noise": condition_noise(seed, [c.shape for c in cond]),
            "posterior_noise": [posterior_noise(c.shape) for c in cond],
            "prompt_embeds": out["prompt_embeds"][0].float().numpy(),
            "text_token_tags": out["text_token_tags"].numpy().astype(np.uint8),
            "height": int(out["height"]), "width": int(out["width"])}
