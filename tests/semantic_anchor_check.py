"""Stage-7 (FL2VA) training/inference agreement checks, on the CPU, against diffusers itself:

1. ``train.data.encode_keyframes`` (the batched keyframe latents training uses) == diffusers' ``encode_vae_condition``
   on each keyframe (the shipped video VAE);
2. ``train.sample.generate(..., keyframes, anchors)`` (what stage 7 evaluates with) == diffusers' whole fl2va workflow
   (``MiniMaxH3Blocks`` with ``image`` / ``last_image``: resize, FL2VA text step with the vision tower, keyframe VAE
   encoder, conditioning noise, layout, loop) on the shipped h3-tiny, for first-only, last-only and both;
3. ``train.vision.selftest`` and ``train.dit_core.selftest`` (the batched text-encoder and DiT forwards training uses,
   against transformers' / diffusers' own forwards).

The Qwen3-VL image processor needs torchvision, which the CPU venv lacks: the pipeline gets train.vision's processor
(checked against transformers' PIL processor in train.vision.selftest), as tests/fl2va_oracle.py does with its stand-in.

    python tests/semantic_anchor_check.py [--quick]      # --quick: skips 3 (a few minutes on a busy 2-core box)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

TINY = ROOT / "python" / "h3ctl" / "models" / "h3-tiny" / "FL2VA"


class _ImageProcessor:
    """The image-processor interface the FL2VA text step calls, backed by train.vision."""

    def __init__(self):
        from train import vision

        self.v = vision
        self.merge_size = vision.PROCESSOR["merge_size"]

    def __call__(self, images, return_tensors="pt"):
        frames = self.v.resize_keyframes(np.stack([np.asarray(im) for im in images]))
        grid = self.v.grid_thw(*frames.shape[1:3])
        return {"pixel_values": self.v.pixel_values(torch.from_numpy(frames)),
                "image_grid_thw": torch.tensor([list(grid)] * len(images))}


def check_keyframe_latents(models, frames) -> float:
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    from train import data

    one = data.encode_keyframes(models.video_vae, frames, batch=1)      # the recipe, one keyframe at a time
    got = data.encode_keyframes(models.video_vae, frames, batch=len(frames))
    err, err_batched = 0.0, 0.0
    std = torch.tensor(models.video_vae.config.latents_std).view(-1, 1, 1, 1)
    for k, f in enumerate(frames):
        ref = encode_vae_condition(models.video_vae, torch.from_numpy(f).permute(2, 0, 1)[None, :, None],
                                   data.IMAGENET_MEAN, data.IMAGENET_STD, 42)[0]
        err = max(err, float((ref - one[k]).abs().max()))
        # batching the convolutions moves the last float32 bits, which can flip the float16 rounding: compare in
        # float16 ulps of the unnormalised latent
        mean = torch.tensor(models.video_vae.config.latents_mean).view(-1, 1, 1, 1)
        z = (ref * std + mean).abs().clamp_min(2 ** -14)
        ulp = torch.exp2(torch.floor(torch.log2(z)) - 10)
        err_batched = max(err_batched, float(((ref - got[k]) * std / ulp).abs().max()))
    return err, err_batched


def check_fl2va(models, case, steps=3, seed=5) -> float:
    from PIL import Image

    from tests.pipeline_oracle import diffusers_pipeline
    from train import dit_core, sample

    ref_clip = case.clip()
    kfs = [ref_clip.frames[0] if a == "first" else ref_clip.frames[-1] for a in case.anchors]
    frames, wav, (lat_rows, aud_rows) = sample.generate(models, case.prompt, steps=steps, seed=seed, keyframes=kfs,
                                                        anchors=case.anchors, return_latents=True)
    # the same draws: one per condition, then the target video and audio noise
    g = torch.Generator().manual_seed(seed)
    for _ in kfs:
        torch.randn((1, 24, 1, 8, 8), generator=g)
    noise_v = torch.randn((1, 24, 7, 8, 8), generator=g)
    noise_a = torch.randn((74, 32), generator=g).reshape(2, 37, 32).permute(0, 2, 1)
    pipe_models = {"transformer": models.transformer, "video_vae": models.video_vae, "audio_vae": models.audio_vae,
                   "text_encoder": models.text_encoder}
    pipe = diffusers_pipeline(pipe_models, TINY / "tokenizer")
    pipe.processor.image_processor = _ImageProcessor()
    first = Image.fromarray(ref_clip.frames[0]) if "first" in case.anchors else None
    last = Image.fromarray(ref_clip.frames[-1]) if "last" in case.anchors else None
    with torch.no_grad():
        out = pipe(prompt=case.prompt, image=first, last_image=last, height=128, width=128, num_frames=22,
                   num_inference_steps=steps, latents=noise_v, audio_latents=noise_a,
                   generator=torch.Generator().manual_seed(seed), output=["latents", "audio_latents"])
    ref_v = out["latents"].float()
    got_v = dit_core.unpatchify(lat_rows[None].float())
    ref_a = out["audio_latents"].float().reshape(2, 32, 37)
    got_a = dit_core.rows_to_audio(aud_rows[None].float())[0]
    return max(float((ref_v.reshape(got_v.shape) - got_v).abs().max()) / max(float(ref_v.abs().max()), 1e-6),
               float((ref_a - got_a).abs().max()) / max(float(ref_a.abs().max()), 1e-6))


def main() -> int:
    from train import sample, world

    torch.manual_seed(0)
    models = sample.load_official(TINY).to("cpu")
    cases = world.heldout_anchor_cases(3)                       # first, last, both
    frames = np.stack([cases[0].clip().frames[0], cases[2].clip().frames[-1]])
    e1, e1b = check_keyframe_latents(models, frames)
    print(f"keyframe latents: vs encode_vae_condition max |err| {e1:.2e} one at a time, {e1b:.2f} float16 ulps batched")
    assert e1 == 0.0 and e1b <= 1.05, (e1, e1b)  # one float16 rounding flip at most
    for c in cases:
        e2 = check_fl2va(models, c)
        print(f"fl2va {c.mode:5s}: train.sample.generate vs diffusers MiniMaxH3Blocks, max rel err {e2:.2e}")
        assert e2 < 1e-4, e2
    if "--quick" not in sys.argv:
        from train import dit_core, vision

        print("vision selftest:", vision.selftest())
        print("dit_core selftest:", dit_core.selftest())
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
