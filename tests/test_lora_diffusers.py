"""LoRA against diffusers: the same LoRA file loaded by diffusers' MiniMaxH3LoraLoaderMixin (peft, unfused) and
merged by libh3 at load give the same render from the same noise.

The file uses the original checkpoint's names (ComfyUI / ai-toolkit style: `diffusion_model.` prefix, lora_down /
lora_up, an `.alpha`), which diffusers converts to its module names itself, so the key mapping, the row orders
(fused qkv, fc1's halves) and alpha / rank are all checked against diffusers' reading of them. The checkpoint is an
all-f32 fixture: libh3 then merges in f32, as diffusers' unfused LoRA computes.
"""

import numpy as np
import pytest
from safetensors.numpy import save_file

from h3ctl import Engine
from tests.pipeline_oracle import diffusers_pipeline, rel_l2, run as run_diffusers

PROMPT = "a red circle moves right on a black background, a high beep"
MODULES = ["blocks.0.attn.qkv_proj", "blocks.1.attn.out_proj", "blocks.0.mlp.fc1", "blocks.1.mlp.fc2",
           "blocks.1.adaln_proj.linear", "token_refiner.blocks.0.attn.qkv_proj", "condition_proj",
           "video_patch_proj", "final_layer.video_out", "time_embedder.proj_out"]


def test_lora_matches_diffusers_lora_loading(tmp_path):
    pytest.importorskip("peft", reason="diffusers loads LoRA weights through peft (the test extra installs it)")
    import torch

    from tests.fixtures import build_models, write_official

    models = build_models("tiny", seed=5)
    part = write_official(models, tmp_path / "m", dtype="f32")
    with Engine(part.parent, threads=2) as eng:
        eng.prepare(PROMPT, 64, 96, 22, steps=4, seed=11)
        v, a = eng.latents()
        shapes = {}
        from safetensors import safe_open

        for f in sorted((part / "transformer").glob("*.safetensors")):
            with safe_open(str(f), "np") as st:
                for k in st.keys():
                    shapes[k] = st.get_slice(k).get_shape()
        rng = np.random.default_rng(0)
        tensors = {}
        for m in MODULES:
            out_f, in_f = shapes[m + ".weight"]
            tensors[f"diffusion_model.{m}.lora_down.weight"] = (rng.standard_normal((4, in_f)) * 0.2).astype(np.float32)
            tensors[f"diffusion_model.{m}.lora_up.weight"] = (rng.standard_normal((out_f, 4)) * 0.2).astype(np.float32)
        tensors["diffusion_model.blocks.0.mlp.fc1.alpha"] = np.array(2.0, np.float32)  # scale alpha / rank = 0.5
        lora = tmp_path / "lora.safetensors"
        save_file(tensors, str(lora))
        ours = eng.render(PROMPT, 64, 96, 22, steps=4, seed=11, lora=[f"{lora}:0.8"])
        plain = eng.render(PROMPT, 64, 96, 22, steps=4, seed=11)
        eng.prepare(PROMPT, 64, 96, 22, steps=4, seed=11, lora=[f"{lora}:0.8"])
        while eng.step() > 0:
            pass
        px = eng.decode_video_f32()

    pipe = diffusers_pipeline(models, part / "tokenizer")
    pipe.load_lora_weights({k: torch.from_numpy(t) for k, t in tensors.items()}, adapter_name="test")
    pipe.set_adapters(["test"], adapter_weights=[0.8])
    ref_video, ref_audio = run_diffusers(pipe, PROMPT, 64, 96, 22, 4, v, a)
    ev, ea = rel_l2(px, ref_video[0]), rel_l2(ours.audio, ref_audio[0])
    print(f"lora vs diffusers: video rel-L2 {ev:.2e}, audio rel-L2 {ea:.2e}")
    assert ev <= 1e-3 and ea <= 1e-3
    # the LoRA matters at this scale: the plain model is far from diffusers' LoRA render
    assert rel_l2(plain.audio, ref_audio[0]) > 10 * max(ea, 1e-6)
