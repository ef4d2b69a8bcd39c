"""h3-tiny: the MiniMax-H3 architecture at a few-million-parameter scale, built from diffusers' / transformers' classes.

Every component is the released class with a small config, so the checkpoint schema (tensor names, fused layouts,
dtypes once exported) is exactly MiniMax-H3's. Ties between components are the released ones:

* ``transformer.in_channels == video_vae.latent_channels == 24`` and ``audio_in_channels == audio latent 32``
  (the released latent widths are kept, so engine code that fixes them still runs);
* ``transformer.text_dim == text hidden_size == vision out_hidden_size``;
* ``6 * rope_freq_dim <= attention_head_dim`` (release: 6*16 = 96 of 128 rotated; here 6*8 = 48 of 64);
* video VAE: 16x spatial (2,2,2,2), 4x temporal (1,2,2,1), clip_length 17, token_drop 3, i.e. the released
  ``17 n + 5`` frames -> ``5 n + 2`` latents scheme (22 frames -> 7 latents);
* audio VAE: encoder rates (2,4,4,5,5) and decoder rates (5,5,8,4) both multiply to 800 (40 Hz at 32 kHz), decoder
  kernels follow the released rule ``2u - u % 2`` = (9,9,16,8) (so no metadata extension is needed), decoder_dim 128
  halves to 8 channels at 32 kHz, as the released 1024 halves to 8 after 7 stages;
* text encoder: Qwen3-VL; the DiT reads ``hidden_states[COND_LAYER]`` (h3ctl extension key
  ``minimax_h3_conditioning_layer`` in ``text_encoder/config.json``; release: 50 of 64 layers). Here 3 of 4 layers:
  the 4th layer exists (diffusers refuses a stack of exactly ``layer`` layers) but is never read or trained.

Dimensions (release in brackets)::

    DiT          hidden 256 [5376], 6 blocks [50], 6 heads x 64 [56 x 128] (attention width 384 > hidden, like
                 7168 > 5376), SwiGLU 704 [14336], 2 refiner blocks [2], text_dim 192 [5120], time freq 256 [256],
                 time hidden 256 [5376], time out 128 [2688], rope 8 freqs/axis [16], theta 1e4
    text enc.    Qwen3-VL text: hidden 192, 4 layers (reads 3), 3 q heads / 1 kv head x 64, MLP 512, vocab 512
                 (484 tokens padded to 64), rope theta 5e6, mrope [12,10,10] interleaved; vision tower: 2 blocks x 32,
                 patch 16, merge 2, deepstack [0,1] -> 192 (untrained: h3-tiny is text-to-video+audio only)
    video VAE    encoder channels (16,32,64,128), 1 res block/level, GroupNorm 8; ViT decoder 4 layers x 4 heads x 64
                 (dim 256), SwiGLU x2, 4 registers, rope ratio 0.75; 24 latent channels
    audio VAE    encoder_dim 8 (-> 256), latent_dim 256, pre_block 4 heads (runs of 2), 32 latent channels;
                 BigVGAN decoder_dim 128, rates (5,5,8,4), kernels (9,9,16,8), resblocks (3,7,11) x (1,3,5)

``python -m train.models`` prints parameter counts and the exported size per component (official dtypes).
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

COND_LAYER = 3

CONFIG: dict[str, Any] = {
    "transformer": dict(
        num_attention_heads=6, attention_head_dim=64, hidden_size=256, num_layers=6, num_refiner_layers=2,
        ffn_dim=704, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=192, freq_dim=256,
        time_embed_hidden_dim=256, time_embed_dim=128, rope_freq_dim=8, rope_theta=10000.0,
        norm_eps=1e-5, qk_norm_eps=1e-5, final_norm_eps=1e-5,
    ),
    "video_vae": dict(
        in_channels=3, out_channels=3, latent_channels=24, block_out_channels=(16, 32, 64, 128),
        layers_per_block=1, spatial_downsample_factors=(2, 2, 2, 2), temporal_downsample_factors=(1, 2, 2, 1),
        norm_num_groups=8, norm_eps=1e-6, spatial_padding_mode="reflect",
        decoder_num_layers=4, decoder_num_attention_heads=4, decoder_attention_head_dim=64,
        decoder_num_register_tokens=4, decoder_ffn_mult=2, decoder_rope_theta=100.0,
        decoder_rope_dim_ratio=0.75, decoder_norm_eps=1e-5, clip_length=17, token_drop=3,
    ),
    "audio_vae": dict(
        encoder_dim=8, encoder_rates=(2, 4, 4, 5, 5), latent_dim=256, latent_channels=32, num_attention_heads=4,
        decoder_dim=128, decoder_rates=(5, 5, 8, 4), decoder_kernel_sizes=(9, 9, 16, 8),
        resblock_kernel_sizes=(3, 7, 11), resblock_dilation_sizes=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
        sampling_rate=32000,
    ),
    "text_encoder": {
        "text_config": dict(
            hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=3,
            num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [12, 10, 10],
                             "mrope_interleaved": True},
        ),
        "vision_config": dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
            temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=192, num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh",
        ),
        "conditioning_layer": COND_LAYER,
    },
}

# Shape the DiT is trained and sampled at.
WIDTH = HEIGHT = 128
FRAMES = 22
LATENT_FRAMES = 7
LATENT_HW = 8
AUDIO_LATENTS = 37
AUDIO_SAMPLES = AUDIO_LATENTS * 800
VIDEO_SHIFT = 12.0
AUDIO_SHIFT = 3.0

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def config() -> dict[str, Any]:
    return copy.deepcopy(CONFIG)


def check_config(cfg: dict[str, Any] | None = None) -> None:
    cfg = cfg or CONFIG
    t, v, a, te = cfg["transformer"], cfg["video_vae"], cfg["audio_vae"], cfg["text_encoder"]
    assert t["in_channels"] == v["latent_channels"] and t["audio_in_channels"] == a["latent_channels"]
    assert t["text_dim"] == te["text_config"]["hidden_size"] == te["vision_config"]["out_hidden_size"]
    assert 6 * t["rope_freq_dim"] <= t["attention_head_dim"]
    assert math.prod(v["spatial_downsample_factors"]) == 16 and math.prod(v["temporal_downsample_factors"]) == 4
    assert v["clip_length"] == 17 and v["token_drop"] == 3
    assert math.prod(a["encoder_rates"]) == 800 == math.prod(a["decoder_rates"])
    assert a["decoder_dim"] // 2 ** len(a["decoder_rates"]) >= 1
    assert list(a["decoder_kernel_sizes"]) == [2 * u - u % 2 for u in a["decoder_rates"]]
    assert 0 < te["conditioning_layer"] < te["text_config"]["num_hidden_layers"]
    assert sum(te["text_config"]["rope_parameters"]["mrope_section"]) * 2 == te["text_config"]["head_dim"]


def build_transformer(cfg=None):
    from diffusers import MiniMaxH3Transformer3DModel

    return MiniMaxH3Transformer3DModel(**(cfg or CONFIG)["transformer"])


def build_video_vae(cfg=None, latents_mean=None, latents_std=None):
    from diffusers import AutoencoderKLMiniMaxH3

    v = (cfg or CONFIG)["video_vae"]
    n = v["latent_channels"]
    return AutoencoderKLMiniMaxH3(**v, latents_mean=tuple(latents_mean or (0.0,) * n),
                                  latents_std=tuple(latents_std or (1.0,) * n))


def build_audio_vae(cfg=None, latents_mean=None, latents_std=None):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    a = (cfg or CONFIG)["audio_vae"]
    n = a["latent_channels"]
    return AutoencoderKLMiniMaxH3Audio(**a, latents_mean=list(latents_mean or [0.0] * n),
                                       latents_std=list(latents_std or [1.0] * n))


def text_encoder_config(tokenizer_json: str, cfg=None):
    """Qwen3VLConfig with the tokenizer's padded vocab, its special ids and the conditioning-layer extension."""
    from transformers import Qwen3VLConfig

    from tests.fixtures.official import CONDITIONING_LAYER_KEY
    from train import tokenizer as tk

    sec = (cfg or CONFIG)["text_encoder"]
    text = dict(sec["text_config"], vocab_size=tk.padded_vocab_size(tokenizer_json))
    ids = tk.special_token_ids(tokenizer_json)
    conf = Qwen3VLConfig(
        text_config=text, vision_config=dict(sec["vision_config"]), tie_word_embeddings=False,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    conf.architectures = ["Qwen3VLForConditionalGeneration"]
    setattr(conf, CONDITIONING_LAYER_KEY, int(sec["conditioning_layer"]))
    return conf


def build_text_encoder(tokenizer_json: str, cfg=None):
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration(text_encoder_config(tokenizer_json, cfg))


def init_dit_(model, std: float = 0.02) -> None:
    """Training init for the DiT: small normal weights, zero-initialised AdaLN projections (gates start at 0, i.e.
    every block starts as identity, DiT-style) and zero output heads. Norm weights stay 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                continue
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=std)
            else:
                p.zero_()
        for blk in model.transformer_blocks:
            blk.adaln_proj.linear.weight.zero_()
            blk.adaln_proj.linear.bias.zero_()
        model.norm_out.linear.weight.zero_()
        model.norm_out.linear.bias.zero_()
        for head in (model.proj_out, model.audio_proj_out):
            head.weight.zero_()
            head.bias.zero_()


def param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def exported_bytes(models: dict) -> dict[str, int]:
    """Bytes of the tensors each component stores in the official layout (official dtypes)."""
    from tests.fixtures.official import official_tensors

    tensors = official_tensors(models, "official")
    return {c: sum(t.numel() * t.element_size() for t in ts.values()) for c, ts in tensors.items()}


def build_all(tokenizer_json: str, cfg=None) -> dict:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return {
            "transformer": build_transformer(cfg),
            "video_vae": build_video_vae(cfg),
            "audio_vae": build_audio_vae(cfg),
            "text_encoder": build_text_encoder(tokenizer_json, cfg),
            "tokenizer_json": tokenizer_json,
        }


def main() -> int:
    from train import tokenizer as tk

    check_config()
    tok = tk.build_tokenizer_json()
    models = build_all(tok)
    sizes = exported_bytes(models)
    total = 0
    for name in ("transformer", "text_encoder", "video_vae", "audio_vae"):
        m = models[name]
        extra = ""
        if name == "text_encoder":
            lm = param_count(m.model.language_model) + m.lm_head.weight.numel()
            extra = f" (language model + head {lm:,}, vision {param_count(m.model.visual):,})"
        if name == "video_vae":
            extra = f" (encoder {param_count(m.encoder):,}, decoder {param_count(m.decoder):,})"
        if name == "audio_vae":
            enc = param_count(m.encoder) + param_count(m.pre_block) + param_count(m.mean_proj) + param_count(
                m.logs_proj)
            extra = f" (encoder {enc:,}, decoder {param_count(m.decoder) + param_count(m.dec_in_proj):,})"
        print(f"{name:13s} {param_count(m):>11,} params  {sizes[name] / 2**20:7.2f} MiB{extra}")
        total += sizes[name]
    print(f"{'total':13s} {'':>11s}         {total / 2**20:7.2f} MiB ({total:,} bytes) + tokenizer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def init_audio_vae_(vae, std: float = 0.01) -> None:
    """BigVGAN/DAC-style init: every weight-normed conv of the decoder gets v ~ N(0, std) and g = ||v|| (what the
    reference gets by initialising weights before applying weight_norm)."""
    with torch.no_grad():
        for mod in vae.decoder.modules():
            if hasattr(mod, "weight_v") and hasattr(mod, "weight_g"):
                mod.weight_v.normal_(0.0, std)
                dims = tuple(range(1, mod.weight_v.dim()))
                mod.weight_g.copy_(mod.weight_v.norm(dim=dims, keepdim=True))
