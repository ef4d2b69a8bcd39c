"""A diffusers-format MiniMax-H3 folder (`save_pretrained` of the pipeline's parts) read through the official names.

The weights stay where they are: libh3's single-file source maps diffusers' tensor names (transformer, video VAE)
in C; the text encoder and the audio VAE already use the official names. Only the small files are translated here,
into a temporary folder in the official layout that libh3 opens as the model directory (as `--config-dir` does for
ComfyUI's files): the transformer, video VAE, audio VAE configs, the text encoder's config, the tokenizer and the
schedulers' shifts (model_index.json). See docs/single-files.md.
"""

from __future__ import annotations

import atexit
import json
import math
import shutil
import tempfile
from pathlib import Path

from ._lib import H3Error

# folder -> (class name in model_index.json, weight file)
PARTS = {
    "transformer": ("MiniMaxH3Transformer3DModel", "diffusion_pytorch_model.safetensors"),
    "vae": ("AutoencoderKLMiniMaxH3", "diffusion_pytorch_model.safetensors"),
    "audio_vae": ("AutoencoderKLMiniMaxH3Audio", "diffusion_pytorch_model.safetensors"),
    "text_encoder": ("Qwen3VLForConditionalGeneration", "model.safetensors"),
}
FILE_KEYS = {"transformer": "transformer", "vae": "video_vae", "audio_vae": "audio_vae", "text_encoder": "text_encoder"}
_AUDIO_DEFAULT_RESBLOCK_KERNELS = [3, 7, 11]
_AUDIO_DEFAULT_DILATIONS = [[1, 3, 5], [1, 3, 5], [1, 3, 5]]


def _json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise H3Error(f"{path}: missing (a diffusers-format MiniMax-H3 folder needs it)") from None
    except (OSError, ValueError) as e:
        raise H3Error(f"{path}: not readable JSON ({e})") from None
    if not isinstance(obj, dict):
        raise H3Error(f"{path}: not a JSON object")
    return obj


def _transformer(c: dict) -> dict:
    h = int(c["hidden_size"])
    return {
        "_class_name": "MiniMaxH3DiTModel", "hidden_size": h, "num_layers": int(c["num_layers"]),
        "token_refiner_num_layers": int(c["num_refiner_layers"]),
        "num_attention_heads": int(c["num_attention_heads"]), "attention_head_dim": int(c["attention_head_dim"]),
        "ffn_hidden_size": int(c["ffn_dim"]), "latents_dim": int(c["in_channels"]),
        "audio_latents_dim": int(c["audio_in_channels"]), "patch_size": [int(p) for p in c["patch_size"]],
        "text_dim": int(c["text_dim"]), "timestep_input_dim": int(c["freq_dim"]),
        "time_embed_hidden_size": int(c["time_embed_hidden_dim"]), "time_embed_dim": int(c["time_embed_dim"]),
        "adaln_out_features": 18 * h, "final_adaln_out_features": 2 * h,
        "rope_inv_freq_len": int(c["rope_freq_dim"]), "rope_theta": float(c.get("rope_theta", 10000.0)),
        "norm_eps": float(c.get("norm_eps", 1e-5)), "qk_norm_eps": float(c.get("qk_norm_eps", 1e-5)),
        "final_norm_eps": float(c.get("final_norm_eps", 1e-5)),
    }


def _video_vae(c: dict) -> tuple[dict, dict]:
    channels = [int(x) for x in c["block_out_channels"]]
    ch = channels[0]
    if any(x % ch for x in channels):
        raise H3Error(f"vae/config.json: block_out_channels {channels} are not multiples of the first level")
    latent = int(c["latent_channels"])
    top = {
        "_class_name": "MiniMaxH3VideoVAE", "latent_channels": latent,
        "latents_mean": [float(x) for x in c["latents_mean"]], "latents_std": [float(x) for x in c["latents_std"]],
        "source_path": "source", "source_class_name": "AutoencoderKLLegacy",
        "source_safetensors_path": "model.safetensors", "vae_clip_length": int(c.get("clip_length", 17)),
        "vae_token_drop": int(c.get("token_drop", 3)),
    }
    space = [int(s) for s in c["spatial_downsample_factors"]]
    time = [int(t) for t in c["temporal_downsample_factors"]]
    source = {
        "_class_name": "AutoencoderKLLegacy", "in_channels": int(c.get("in_channels", 3)),
        "out_ch": int(c.get("out_channels", 3)), "z_channels": latent, "embed_dim": latent, "ch": ch,
        "ch_mult": [x // ch for x in channels], "num_res_blocks": int(c["layers_per_block"]),
        "space_down": space, "time_down": time, "vae_ratio": math.prod(space), "vae_ratio_t": math.prod(time),
        "padding_mode": c.get("spatial_padding_mode", "reflect"), "norm_num_groups": int(c.get("norm_num_groups", 32)),
        "norm_eps": float(c.get("norm_eps", 1e-6)), "use_3d_conv": True, "use_t_isolated_gn": True,
        "causal_encoder": True, "causal_decoder": False, "use_vit_decoder": True, "pixel_norm_type": "imagenet",
        "vit_decoder_kwargs": {
            "num_layers": int(c["decoder_num_layers"]), "heads": int(c["decoder_num_attention_heads"]),
            "dim_head": int(c["decoder_attention_head_dim"]), "rope_theta": float(c.get("decoder_rope_theta", 100.0)),
            "rope_dim_ratio": float(c.get("decoder_rope_dim_ratio", 0.75)),
            "num_register_tokens": int(c.get("decoder_num_register_tokens", 4)),
            "ffn_mult": int(c.get("decoder_ffn_mult", 4)), "eps": float(c.get("decoder_norm_eps", 1e-5)),
            "ffn_activation_fn": "silu", "ffn_use_gated": True, "norm_type": "rms_norm", "norm_affine": True,
            "qk_norm_type": "rms_norm", "qk_norm_affine": False,
        },
    }
    return top, source


def _audio_vae(c: dict) -> tuple[dict, dict]:
    latent = int(c["latent_channels"])
    rate = int(c["sampling_rate"])
    top = {
        "_class_name": "MiniMaxH3AudioVAE", "output_channel": 2, "sample_rate": rate,
        "source_config_path": "config.yaml", "source_safetensors_path": "model.safetensors",
        "source_metadata_path": "metadata.json", "latent_channels": latent,
        "latents_mean": [float(x) for x in c["latents_mean"]], "latents_std": [float(x) for x in c["latents_std"]],
    }
    rates = [int(r) for r in c["decoder_rates"]]
    kw = {
        "encoder_dim": int(c["encoder_dim"]), "encoder_rates": [int(r) for r in c["encoder_rates"]],
        "latent_dim": int(c["latent_dim"]), "vae_latent_channels": latent, "decoder_dim": int(c["decoder_dim"]),
        "decoder_rates": rates, "decoder_type": "bigvgan", "attn_proj": True, "sample_rate": rate,
    }
    # Fields the released converter derives or hard-codes: written only when they differ.
    kernels = [int(k) for k in c.get("decoder_kernel_sizes", [2 * r - r % 2 for r in rates])]
    if kernels != [2 * r - r % 2 for r in rates]:
        kw["decoder_kernel_sizes"] = kernels
    rk = [int(k) for k in c.get("resblock_kernel_sizes", _AUDIO_DEFAULT_RESBLOCK_KERNELS)]
    if rk != _AUDIO_DEFAULT_RESBLOCK_KERNELS:
        kw["resblock_kernel_sizes"] = rk
    rd = [[int(d) for d in ds] for ds in c.get("resblock_dilation_sizes", _AUDIO_DEFAULT_DILATIONS)]
    if rd != _AUDIO_DEFAULT_DILATIONS:
        kw["resblock_dilation_sizes"] = rd
    if int(c.get("num_attention_heads", 8)) != 8:
        kw["num_attention_heads"] = int(c["num_attention_heads"])
    return top, {"metadata": {"kwargs": kw}}


def _shift(folder: Path, sub: str, default: float) -> float:
    p = folder / sub / "scheduler_config.json"
    if not p.is_file():
        return default
    v = _json(p).get("shift", default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1e6:
        raise H3Error(f"{p}: shift {v!r} is not a positive number")
    return float(v)


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def translate(folder: Path) -> tuple[Path, dict[str, Path]]:
    """(a temporary official-layout config folder, {component: weight file}) for a diffusers-format folder, or
    H3Error naming what is missing or wrong. The temporary folder is removed at exit."""
    index = _json(folder / "model_index.json")
    files: dict[str, Path] = {}
    configs: dict[str, dict] = {}
    for sub, (cls, fname) in PARTS.items():
        entry = index.get(sub)
        if not (isinstance(entry, list) and len(entry) == 2):
            raise H3Error(f"{folder}/model_index.json: no '{sub}' component (a MiniMax-H3 pipeline names {cls})")
        if entry[1] != cls:
            raise H3Error(f"{folder}/model_index.json: '{sub}' is {entry[1]!r}, expected {cls}")
        weights = folder / sub / fname
        if not weights.is_file():
            shards = sorted((folder / sub).glob(fname.replace(".safetensors", "-*-of-*.safetensors")))
            raise H3Error(f"{weights}: {'sharded weights are not read yet' if shards else 'missing'} "
                          f"(the {sub.replace('_', ' ')})")
        configs[sub] = _json(folder / sub / "config.json")
        files[FILE_KEYS[sub]] = weights
    tok = folder / "tokenizer" / "tokenizer.json"
    if not tok.is_file():
        raise H3Error(f"{tok}: missing (the tokenizer)")
    try:
        v_top, v_src = _video_vae(configs["vae"])
        a_top, a_meta = _audio_vae(configs["audio_vae"])
        dit = _transformer(configs["transformer"])
    except (KeyError, TypeError, ValueError) as e:
        raise H3Error(f"{folder}: a component config lacks or mistypes {e}") from None
    out = Path(tempfile.mkdtemp(prefix="h3-diffusers-"))
    atexit.register(shutil.rmtree, out, True)
    part = out / "FL2VA"
    _write(part / "model_index.json", {
        "_class_name": "MiniMaxH3Pipeline",
        "transformer": ["diffusers", "MiniMaxH3DiTModel"],
        "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"],
        "video_vae": ["diffusers", "MiniMaxH3VideoVAE"], "audio_vae": ["diffusers", "MiniMaxH3AudioVAE"],
        "_minimax_h3": {"schema_version": 1, "partition": "fl2va", "tasks": ["t2va", "fl2va"], "task_aliases": {},
                        "sigma_shift_scales": {"video": _shift(folder, "scheduler", 12.0),
                                               "audio": _shift(folder, "audio_scheduler", 3.0)}},
    })
    _write(part / "transformer" / "config.json", dit)
    _write(part / "text_encoder" / "config.json", configs["text_encoder"])
    _write(part / "video_vae" / "config.json", v_top)
    _write(part / "video_vae" / "source" / "config.json", v_src)
    _write(part / "audio_vae" / "config.json", a_top)
    _write(part / "audio_vae" / "metadata.json", a_meta)
    (part / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (folder / "tokenizer" / name).is_file():
            shutil.copyfile(folder / "tokenizer" / name, part / "tokenizer" / name)
    return out, files
