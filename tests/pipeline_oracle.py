"""diffusers' MiniMaxH3ModularPipeline on a fixture checkpoint: the oracle of the end-to-end tests.

Two pipeline properties are adapted to tiny models, as the pipeline cannot be configured otherwise:
`text_encoder_layer` (hard-coded 50) becomes the fixture's conditioning layer, and `min_duration`
(5 s) becomes 0 so that short clips are allowed. The Qwen3-VL processor is only used in t2va for
`create_mm_token_type_ids` (all zeros for a text prompt); its image/video processors need
torchvision, which cannot be installed beside the CPU torch, so the processor is created without
them and given the token ids it reads.
"""

import numpy as np
import torch


def diffusers_pipeline(models, tokenizer_dir):
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3 import modular_blocks_minimax_h3 as blocks
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline
    from transformers import Qwen2TokenizerFast, Qwen3VLProcessor

    from tests.fixtures import conditioning_layer

    layer = conditioning_layer(models["text_encoder"])
    MiniMaxH3ModularPipeline.text_encoder_layer = property(lambda self: layer)
    MiniMaxH3ModularPipeline.min_duration = property(lambda self: 0.0)
    pipe = blocks.MiniMaxH3Blocks().init_pipeline()
    tok = Qwen2TokenizerFast.from_pretrained(str(tokenizer_dir))
    proc = object.__new__(Qwen3VLProcessor)
    proc.image_token_ids = [tok.convert_tokens_to_ids("<|image_pad|>")]
    proc.video_token_ids = [tok.convert_tokens_to_ids("<|video_pad|>")]
    proc.audio_token_ids = []
    pipe.update_components(transformer=models["transformer"], vae=models["video_vae"], audio_vae=models["audio_vae"],
                           text_encoder=models["text_encoder"], tokenizer=tok, processor=proc,
                           scheduler=MiniMaxH3Scheduler(shift=12.0), audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def run(pipe, prompt, width, height, frames, steps, latents, audio_latents):
    out = pipe(prompt=prompt, height=height, width=width, num_frames=frames, num_inference_steps=steps,
               latents=torch.from_numpy(latents)[None], audio_latents=torch.from_numpy(audio_latents),
               output_type="np")
    return np.asarray(out.get("videos"), dtype=np.float32), out.get("audio").float().numpy()


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
