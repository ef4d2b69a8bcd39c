"""Where a model's parts come from: an official folder, single files, a ComfyUI `models/` folder, or a
diffusers-format folder (its configs translated by diffusers_folder.py, its weights read in place).

libh3 reads the official MiniMaxAI layout; single files (ComfyUI's repackages: `minimax_h3_fl2va_bf16.safetensors`,
`..._pruned_int8_convrot`, `..._pruned_fp8_scaled`, `qwen3vl_32b_minimax_h3_bf16`, the VAEs) replace a component's
weights while a folder in the official layout gives its configs (see docs/single-files.md). `resolve` turns what the
user gave into (the folder libh3 opens, {component: file}) and refuses, with one line, what cannot work, before any
model is read.

Configs: single files carry weights only. h3ctl ships the release's transformer config (python/h3ctl/configs); the
text encoder's, the VAEs' (their latent statistics) and the Qwen tokenizer are not shipped (h3ctl has only h3-tiny's
small tokenizer), so a render from those single files needs the official folder's small files: `-d` the official
folder (its weights may be absent) or `--tokenizer DIR`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._lib import H3Error

PARTS = ("transformer", "text_encoder", "video_vae", "audio_vae")
RELEASE_CONFIGS = Path(__file__).resolve().parent / "configs" / "MiniMax-H3"

# ComfyUI's folders and the repackage's names, in the order h3ctl prefers a variant when several are there.
COMFY_DIRS = {"transformer": ("diffusion_models", "unet"), "text_encoder": ("text_encoders", "clip"),
              "video_vae": ("vae",), "audio_vae": ("vae",)}
TRANSFORMER_VARIANTS = ("bf16", "pruned_bf16", "int8_convrot", "pruned_int8_convrot", "pruned_fp8_scaled",
                        "fp8_scaled")
TEXT_VARIANTS = ("bf16", "int8_convrot")
REFUSED_VARIANTS = {"nvfp4_awq": "nvfp4 (4-bit) weights are not read by libh3: use the bf16 or int8_convrot text "
                                 "encoder", "w6a8": "w6a8 weights are not read by libh3: use bf16, int8_convrot or "
                                                   "fp8_scaled"}


def _is_official(d: Path) -> bool:
    if is_diffusers_folder(d):  # it has a transformer/ folder too, under diffusers' names
        return False
    return (d / "FL2VA").is_dir() or (d / "Ref2VA").is_dir() or (d / "transformer").is_dir()


def _comfy_models_dir(d: Path) -> Path | None:
    for cand in (d, d / "models"):
        if any((cand / sub).is_dir() for sub in ("diffusion_models", "text_encoders", "vae", "unet")):
            return cand
    return None


def is_diffusers_folder(d: Path) -> bool:
    mi = d / "model_index.json"
    if not mi.is_file():
        return False
    try:
        text = mi.read_text()
    except OSError:
        return False
    return "MiniMaxH3Transformer3DModel" in text or ("_minimax_h3" not in text and (d / "vae").is_dir())


def _refuse_variant(path: Path) -> None:
    name = path.name.lower()
    for key, why in REFUSED_VARIANTS.items():
        if key in name:
            raise H3Error(f"{path}: {why}")


def _pick(files: list[Path], stem: str, variants: tuple[str, ...], what: str) -> Path | None:
    by_name = {f.name.lower(): f for f in files}
    for v in variants:
        f = by_name.get(f"{stem}_{v}.safetensors")
        if f is not None:
            return f
    seen = sorted(f.name for f in files if f.name.lower().startswith(stem))
    if seen:
        for f in seen:
            _refuse_variant(Path(f))
        raise H3Error(f"{what}: no variant libh3 reads among {', '.join(seen)} (known: "
                      f"{', '.join(stem + '_' + v for v in variants)})")
    return None


def comfy_files(models: Path, ref2va: bool) -> dict[str, Path]:
    """The MiniMax-H3 files of a ComfyUI models/ folder, by ComfyUI's folder names and the repackage's names."""
    def listing(part):
        out = []
        for sub in COMFY_DIRS[part]:
            d = models / sub
            if d.is_dir():
                out += sorted(p for p in d.iterdir() if p.suffix == ".safetensors" and p.is_file())
        return out

    task = "ref2va" if ref2va else "fl2va"
    found: dict[str, Path] = {}
    t = _pick(listing("transformer"), f"minimax_h3_{task}", TRANSFORMER_VARIANTS, f"{models}/diffusion_models")
    if t is not None:
        found["transformer"] = t
    te = _pick(listing("text_encoder"), "qwen3vl_32b_minimax_h3", TEXT_VARIANTS, f"{models}/text_encoders")
    if te is not None:
        found["text_encoder"] = te
    for part, stem in (("video_vae", "minimax_h3_video_vae"), ("audio_vae", "minimax_h3_audio_vae")):
        cands = [p for p in listing(part) if p.name.lower().startswith(stem)]
        if cands:
            found[part] = cands[0]
    if "transformer" not in found:
        other = "fl2va" if ref2va else "ref2va"
        if any(p.name.lower().startswith(f"minimax_h3_{other}") for p in listing("transformer")):
            raise H3Error(f"{models}/diffusion_models: only a {other.upper().replace('2VA', '2VA')} transformer; "
                          f"this render needs the {task} one ({'drop' if ref2va else 'add'} --ref2va)")
        raise H3Error(f"{models}: no minimax_h3_{task}_*.safetensors in diffusion_models/")
    return found


def _check_task(path: Path, ref2va: bool) -> None:
    name = path.name.lower()
    if ref2va and "fl2va" in name:
        raise H3Error(f"{path}: an FL2VA transformer, but the render asks for Ref2VA (references); give the ref2va file")
    if not ref2va and "ref2va" in name:
        raise H3Error(f"{path}: a Ref2VA transformer; FL2VA and Ref2VA parts cannot be mixed: pass --ref2va "
                      "(a render with references) or give the fl2va file")


def resolve(model_dir=None, *, ref2va: bool = False, transformer=None, text_encoder=None, video_vae=None,
            audio_vae=None, tokenizer=None, default_dir=None, config_dir=None) -> tuple[Path, dict[str, Path]]:
    """(the folder libh3 opens, {component: file, "tokenizer": folder}) for what the user gave.

    config_dir: an official-layout folder whose small files (configs, tokenizer) go with single files found in a
    ComfyUI folder given as model_dir (its weights may be absent)."""
    given = {k: v for k, v in (("transformer", transformer), ("text_encoder", text_encoder),
                               ("video_vae", video_vae), ("audio_vae", audio_vae)) if v is not None}
    files: dict[str, Path] = {k: Path(os.fspath(v)) for k, v in given.items()}
    folder = Path(os.fspath(model_dir)) if model_dir is not None else None
    if config_dir is not None and not _is_official(Path(os.fspath(config_dir))):
        raise H3Error(f"{config_dir}: not an official MiniMax-H3 folder (FL2VA/ with the components' config.json)")
    if config_dir is not None and (folder is None or not folder.is_dir() or _is_official(folder)):
        folder = Path(os.fspath(config_dir)) if folder is None else folder
    if folder is not None and folder.is_dir() and not _is_official(folder):
        models = None if is_diffusers_folder(folder) else _comfy_models_dir(folder)  # diffusers' vae/ too
        if models is not None:
            found = comfy_files(models, ref2va)
            files = {**found, **files}
            folder = Path(os.fspath(config_dir)) if config_dir is not None else None  # None: h3ctl's copy
        elif is_diffusers_folder(folder):
            from .diffusers_folder import translate

            try:  # its configs in the official layout; weights read in place
                folder, found = translate(folder)
            except H3Error as e:
                raise H3Error(f"a diffusers-format MiniMax-H3 folder libh3 cannot read: {e} (or give the official "
                              "MiniMaxAI folder)") from None
            files = {**found, **files}
    for part, path in files.items():
        if not path.is_file():
            raise H3Error(f"{path}: {'is a directory, expected a .safetensors file' if path.is_dir() else 'no such file'}"
                          f" (the {part.replace('_', ' ')})")
        _refuse_variant(path)
    if "transformer" in files:
        _check_task(files["transformer"], ref2va)
    if folder is None:
        if not files:
            folder = Path(default_dir) if default_dir is not None else None
        else:
            folder = RELEASE_CONFIGS
            missing = [p for p in files if p != "transformer"]
            if missing:
                raise H3Error(f"the {', '.join(m.replace('_', ' ') for m in missing)} single file"
                              f"{'s need' if len(missing) > 1 else ' needs'} the release's small config files, which "
                              "h3ctl does not ship: give the official MiniMax-H3 folder with -d, or with --config-dir "
                              "next to a ComfyUI folder (its weights may be absent)")
    if tokenizer is not None:
        tok = Path(os.fspath(tokenizer))
        if not (tok / "tokenizer.json").is_file():
            raise H3Error(f"{tok}: no tokenizer.json (give the official tokenizer/ folder)")
        files["tokenizer"] = tok
    return folder, files


def needs_tokenizer(folder: Path, files: dict) -> bool:
    """True when nothing gives libh3 a tokenizer (h3ctl ships only h3-tiny's small one, not the Qwen vocabulary)."""
    if "tokenizer" in files:
        return False
    return not any((folder / p / "tokenizer" / "tokenizer.json").is_file() for p in ("FL2VA", "Ref2VA", ".")) and \
        not (folder / "tokenizer" / "tokenizer.json").is_file()


def add_arguments(p) -> None:
    """--transformer / --text-encoder / --video-vae / --audio-vae / --tokenizer."""
    p.add_argument("--transformer", metavar="FILE", help="a single-file transformer (ComfyUI's minimax_h3_*: bf16, "
                   "pruned, fp8_scaled, int8_convrot) instead of the model folder's")
    p.add_argument("--text-encoder", metavar="FILE", help="a single-file text encoder (bf16, int8_convrot)")
    p.add_argument("--video-vae", metavar="FILE", help="a single-file video VAE")
    p.add_argument("--audio-vae", metavar="FILE", help="a single-file audio VAE")
    p.add_argument("--tokenizer", metavar="DIR", help="the official tokenizer/ folder (h3ctl ships only h3-tiny's)")
    p.add_argument("--config-dir", metavar="DIR", help="an official MiniMax-H3 folder whose configs and tokenizer go "
                   "with the single files of a ComfyUI folder given with -d (its weights may be absent)")


def from_args(args) -> dict:
    return {k: getattr(args, k, None)
            for k in ("transformer", "text_encoder", "video_vae", "audio_vae", "tokenizer", "config_dir")}


def describe_file(path) -> str | None:
    """One line for `h3ctl check FILE`: which MiniMax-H3 component a single file holds, its names, variant and dtypes
    (from the header alone), or None when it is none of them. libh3 has already validated the header."""
    import json as _json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = _json.loads(f.read(n))
    meta = header.pop("__metadata__", {}) or {}
    names = list(header)
    prefixed = any(k.startswith("model.diffusion_model.") for k in names)
    bare = {k[len("model.diffusion_model."):] if k.startswith("model.diffusion_model.") else k for k in names}
    dtypes: dict[str, int] = {}
    for v in header.values():
        dtypes[v["dtype"]] = dtypes.get(v["dtype"], 0) + 1
    if any(".lora_A." in k or ".lora_B." in k or "lora_down" in k for k in names):
        return "a LoRA (lora_A/lora_B pairs), not a model: give it with --lora"
    if {"transformer_blocks.0.attn.to_q.weight", "context_embedder.weight"} <= bare and not prefixed:
        return (f"MiniMax-H3 transformer under diffusers' names (give it with --transformer, -d the official folder "
                f"for its config); dtypes: {', '.join(f'{d} {c}' for d, c in sorted(dtypes.items()))}")
    if {"blocks.0.attn.qkv_proj.weight", "condition_proj.weight"} <= bare:
        part = "transformer (give it with --transformer)"
    elif "model.language_model.embed_tokens.weight" in bare:
        part = "text encoder (give it with --text-encoder)"
    else:
        return None
    quant = sum(k.endswith(".comfy_quant") for k in names)
    if "_quantization_metadata" in meta:
        quant = max(quant, len(_json.loads(meta["_quantization_metadata"]).get("layers", {})))
    variant = ("int8" + ("_convrot" if "I8" in dtypes else "") if "I8" in dtypes else
               "fp8_scaled" + (" (legacy scaled_fp8)" if "scaled_fp8" in bare else "") if any(
                   d.startswith("F8") for d in dtypes) else "bf16")
    if "adaln_t_table" in bare:
        variant = "pruned " + variant
    counts = ", ".join(f"{d} {c}" for d, c in sorted(dtypes.items()))
    return (f"MiniMax-H3 {part}; {'model.diffusion_model.' if prefixed else 'bare'} names; variant {variant}"
            f"{f', {quant} quantised layers' if quant else ''}; dtypes: {counts}")
