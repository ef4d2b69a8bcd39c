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

Video references: the text step reads them through `processor.video_processor` (Qwen3VLVideoProcessor, torchvision
backend). As for images (tests/test_vision_tower.py), torchvision cannot be installed beside the CPU torch, so
`OracleVideoProcessor` keeps every step of transformers' class but the one torchvision call, made the way
torchvision makes it (torch's own uint8 bicubic antialiased interpolate): its smart_resize, its fused rescale +
normalise, its patchify. The fixture ships no processor config, so its settings are the class's own.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.fl2va_oracle import condition_noise, fl2va_pipeline, posterior_noise


class OracleVideoProcessor:
    """Qwen3VLVideoProcessor (class settings, no frame sampling) with the resize done as torchvision does it."""

    def __init__(self):
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        cls = Qwen3VLVideoProcessor
        self.cls = cls
        self.patch_size, self.temporal_patch_size, self.merge_size = cls.patch_size, cls.temporal_patch_size, \
            cls.merge_size
        self.size = dict(cls.size)
        self.mean, self.std = list(cls.image_mean), list(cls.image_std)

    def __call__(self, videos, do_sample_frames=False, return_tensors="pt"):
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        from tests.test_vision_tower import torch_resize

        assert not do_sample_frames
        pixels, grids = [], []
        for video in videos:
            t, h, w = video.shape[:3]
            rh, rw = smart_resize(t, h, w, temporal_factor=self.temporal_patch_size,
                                  factor=self.patch_size * self.merge_size, min_pixels=self.size["shortest_edge"],
                                  max_pixels=self.size["longest_edge"])
            frames = np.stack([torch_resize(f, rh, rw) for f in video])
            x = torch.from_numpy(frames).permute(0, 3, 1, 2)[None].to(torch.float32)
            # the fused rescale + normalise: mean and std scaled by 1 / rescale_factor, then (x - mean) / std
            mean = torch.tensor(self.mean) * (1.0 / (1 / 255))
            std = torch.tensor(self.std) * (1.0 / (1 / 255))
            x = (x - mean.view(1, 1, 3, 1, 1)) / std.view(1, 1, 3, 1, 1)
            patches, gt, gh, gw = self.cls.patchify(None, x, patch_size=self.patch_size, merge_size=self.merge_size,
                                                    temporal_patch_size=self.temporal_patch_size)
            pixels.append(patches[0])
            grids.append([gt, gh, gw])
        return {"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids, dtype=torch.long)}


def ref2va_pipeline(models, ref_transformer, tokenizer_dir, reference_edge: int, canvas=None):
    """fl2va_pipeline's pipeline with the Ref2VA transformer, the fixture's reference short edge, its canvas rule
    (short edge, max pixels: what a video reference is put on) and the video processor stand-in."""
    pipe = fl2va_pipeline(models, tokenizer_dir)
    pipe.update_components(transformer_ref=ref_transformer)
    pipe.register_to_config(reference_image_short_edge=reference_edge)
    if canvas:
        pipe.register_to_config(canvas_short_edge=canvas[0], canvas_max_pixels=canvas[1])
    pipe.processor.video_processor = OracleVideoProcessor()
    return pipe


@torch.no_grad()
def run_ref2va(pipe, prompt, images, frames, steps, latents, audio_latents, width=None, height=None, seed=0):
    """The whole ref2va workflow with image references (uint8 [H, W, 3] arrays, request order), audio references
    (("audio", waveform, sample_rate) items) and video references (("video", uint8 frames [T, H, W, 3], fps,
    waveform or None, sample_rate or None) items). Returns a dict (the draws: visual references only):
    latents [C, T, h, w], audio_latents [2, C_a, T_a], condition_latents (list of [C, t_k, h_k, w_k]),
    cond_noise / posterior_noise (the draws, same shapes), prompt_embeds, text_token_tags, height, width."""
    from diffusers.modular_pipelines.minimax_h3.references import (MiniMaxH3AudioReference, MiniMaxH3ImageReference,
                                                                   MiniMaxH3VideoReference)
    from PIL import Image

    def ref(im):
        if isinstance(im, tuple) and im[0] == "video":
            audio = None if im[3] is None else torch.from_numpy(np.ascontiguousarray(im[3]))
            return MiniMaxH3VideoReference(frames=np.ascontiguousarray(im[1]), fps=im[2], audio=audio,
                                           sample_rate=im[4])
        if isinstance(im, tuple):
            return MiniMaxH3AudioReference(audio=torch.from_numpy(np.ascontiguousarray(im[1])), sample_rate=im[2])
        return MiniMaxH3ImageReference(image=Image.fromarray(np.ascontiguousarray(im)))

    refs = [ref(im) for im in images]
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
