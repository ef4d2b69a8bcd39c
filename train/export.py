"""Export h3-tiny to the official MiniMaxAI/MiniMax-H3 layout (``python/h3ctl/models/h3-tiny/``).

Two steps, because the device can only send back a few small files:

1. ``--transport DIT_RUN OUT`` (on the device, after training): the EMA transformer and text encoder in their
   *official* dtypes (BF16, except the F32 islands of the DiT: patch projections, time embedder, output heads), as
   diffusers state dicts split into files <= 15 MiB: ``ema-transformer[-k].safetensors``,
   ``ema-text_encoder.safetensors``. Nothing is lost: the export rounds to the same dtypes.
2. ``python -m train.export --weights DIR --vae-run VAE_RUN --meta DIR --out python/h3ctl/models/h3-tiny``: builds
   the four diffusers/transformers modules from ``train/models.py``, loads the weights (VAEs F32 from stage 1, with
   ``latents_mean``/``latents_std`` from ``latent_stats.json``), and writes them with the test fixtures' writer
   ``tests.fixtures.write_official(models, out, dtype="official")`` -> ``out/FL2VA/...`` + ``out/tokenizer/``.
   Also writes ``out/h3tiny.json`` (parameter counts, sizes, training facts gathered from the run metadata).

Stage 7 (FL2VA fine-tune of the shipped model) has no stage-1 run: ``--vae-official DIR`` takes both VAEs (F32, with
their ``latents_mean`` / ``latents_std``) from an official partition instead, and ``--meta`` needs only
``tokenizer.json`` (+ ``dit-meta.json``). Everything is loaded before anything is written, the partition is written
next to ``out`` and then moved into place, and the facts of an existing ``out/h3tiny.json`` are kept (``--stage-name``
names the new DiT stage)::

    python -m train.export --weights RETURNED --vae-official python/h3ctl/models/h3-tiny/FL2VA --meta RETURNED \
        --stage-name dit_stage_f_fl2va --out /tmp/h3-tiny-fl2va
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

DIT_F32_DIFFUSERS = ("proj_in.", "audio_proj_in.", "time_embedder.", "proj_out.", "audio_proj_out.")


H3CTL_BLOCK = {"default_width": 128, "default_height": 128, "default_frames": 22,
               "max_pixels": 256 * 256, "max_frames": 90}


def official_dtype_dit(name: str) -> torch.dtype:
    return torch.float32 if name.startswith(DIT_F32_DIFFUSERS) else torch.bfloat16


def transport(dit_run: Path, out: Path, split_bytes: int = 15 * 2**20) -> list[Path]:
    from safetensors.torch import save_file

    from train.common import load_weights

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for mod, dtype_of in (("transformer", official_dtype_dit), ("text_encoder", lambda n: torch.bfloat16)):
        sd = load_weights(dit_run, "dit", mod + "_ema")
        if sd is None:
            raise FileNotFoundError(f"{dit_run}: no dit-{mod}_ema weights")
        sd = {k: v.to(dtype_of(k)).contiguous() for k, v in sd.items()}
        parts, cur, nb = [], {}, 0
        for k in sorted(sd):
            b = sd[k].numel() * sd[k].element_size()
            if cur and nb + b > split_bytes:
                parts.append(cur)
                cur, nb = {}, 0
            cur[k] = sd[k]
            nb += b
        parts.append(cur)
        for i, p in enumerate(parts):
            path = out / (f"ema-{mod}.safetensors" if len(parts) == 1 else f"ema-{mod}-{i}.safetensors")
            save_file(p, str(path))
            written.append(path)
    print("transport:", ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in written))
    return written


def build_trained(weights: Path, vae_run: Path | None, meta: Path, vae_official: Path | None = None,
                  video_vae_weights: Path | None = None) -> dict:
    """The four trained modules (float32) + tokenizer_json, ready for `write_official`. VAEs from a stage-1 run
    (`vae_run`, statistics from `meta/latent_stats.json`) or from an official partition (`vae_official`)."""
    from train.common import load_weights
    from train.models import build_audio_vae, build_text_encoder, build_transformer, build_video_vae

    tok_json = (meta / "tokenizer.json").read_text()
    official = None
    if vae_official is not None:
        from tests.fixtures.official import read_official_to_diffusers

        official = read_official_to_diffusers(vae_official)
        vo, ao = official["video_vae"], official["audio_vae"]
        stats = {"video_mean": list(vo.config.latents_mean), "video_std": list(vo.config.latents_std),
                 "audio_mean": list(ao.config.latents_mean), "audio_std": list(ao.config.latents_std)}
    else:
        stats = json.loads((meta / "latent_stats.json").read_text())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        dit, te = build_transformer(), build_text_encoder(tok_json)
        vv = build_video_vae(latents_mean=stats["video_mean"], latents_std=stats["video_std"])
        av = build_audio_vae(latents_mean=stats["audio_mean"], latents_std=stats["audio_std"])
    f32 = lambda sd: {k: v.float() for k, v in sd.items()}  # noqa: E731
    dit.load_state_dict(f32(load_weights(weights, "ema", "transformer")))
    te.load_state_dict(f32(load_weights(weights, "ema", "text_encoder")))
    if official is not None:
        vv.load_state_dict(f32(official["video_vae"].state_dict()))
        av.load_state_dict(f32(official["audio_vae"].state_dict()))
    else:
        vv.load_state_dict(load_weights(vae_run, "video_vae", "model"))
        av.load_state_dict(load_weights(vae_run, "audio_vae", "model"))
    if video_vae_weights is not None:  # stage 8: the fine-tuned decoder (encoder side checked unchanged below)
        from safetensors.torch import load_file

        ft = load_file(str(video_vae_weights))
        enc = {k: v for k, v in vv.state_dict().items() if not k.startswith(("decoder.", "post_quant_conv."))}
        missing, unexpected = vv.load_state_dict({k: v.float() for k, v in ft.items()}, strict=False)
        if unexpected or any(k.startswith(("decoder.", "post_quant_conv.")) for k in missing):
            raise SystemExit(f"{video_vae_weights}: not a video VAE decoder state dict")
        for k, v in enc.items():
            if not torch.equal(vv.state_dict()[k], v):
                raise SystemExit(f"{video_vae_weights}: {k} differs from the partition's encoder side")
    models = {"transformer": dit, "text_encoder": te, "video_vae": vv, "audio_vae": av, "tokenizer_json": tok_json}
    for k, m in models.items():
        if k != "tokenizer_json":
            m.eval().requires_grad_(False)
    return models


def export(weights: Path, vae_run: Path | None, meta: Path, out: Path, vae_official: Path | None = None,
           stage_name: str | None = None, video_vae_weights: Path | None = None) -> Path:
    from tests.fixtures import write_official
    from train.models import exported_bytes, param_count

    models = build_trained(weights, vae_run, meta, vae_official, video_vae_weights)
    old_facts = {}
    if (out / "h3tiny.json").exists():
        old_facts = json.loads((out / "h3tiny.json").read_text())
    # Write next to `out`, then move into place: `out` may be the partition the VAEs were just read from.
    out.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.export-tmp"
    shutil.rmtree(stage, ignore_errors=True)
    pdir = write_official(models, stage, dtype="official")
    # h3ctl's per-model defaults and limits (model_index.json "h3ctl" block): h3-tiny was trained at
    # 128x128, 22 frames; larger canvases run but leave the training distribution.
    index_path = pdir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["h3ctl"] = H3CTL_BLOCK
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    sizes = exported_bytes(models)
    facts = dict(old_facts)
    facts.update({
        "params": {k: param_count(models[k]) for k in ("transformer", "text_encoder", "video_vae", "audio_vae")},
        "bytes": sizes,
        "total_bytes": sum(sizes.values()),
    })
    for name in ("dit-meta.json", "video_vae-meta.json", "audio_vae-meta.json", "video_decoder-meta.json"):
        for base in (meta, vae_run):
            p = base / name if base is not None else None
            if p is not None and p.exists():
                m = json.loads(p.read_text())
                m.pop("args", None)
                key = name.replace("-meta.json", "")
                facts[stage_name if (stage_name and key == "dit") else key] = m
                break
    for sub in ("FL2VA", "tokenizer"):
        shutil.rmtree(out / sub, ignore_errors=True)
        shutil.move(str(stage / sub), str(out / sub))
    shutil.rmtree(stage, ignore_errors=True)
    pdir = out / "FL2VA"
    (out / "h3tiny.json").write_text(json.dumps(facts, indent=1, default=float) + "\n")
    for f in out.rglob("*"):  # safetensors writes 0600 files; the shipped tree is 0644
        if f.is_file():
            f.chmod(0o644)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"exported to {pdir} ({total / 1e6:.2f} MB on disk)")
    return pdir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transport", nargs=2, metavar=("DIT_RUN", "OUT"))
    ap.add_argument("--weights", help="dir with ema-transformer*.safetensors / ema-text_encoder.safetensors")
    ap.add_argument("--vae-run", default="train/runs/vae")
    ap.add_argument("--vae-official", default=None, help="official partition dir to take both VAEs (and their "
                    "latent statistics) from instead of --vae-run")
    ap.add_argument("--meta", help="dir with tokenizer.json, latent_stats.json (and dit-meta.json)")
    ap.add_argument("--video-vae-weights", default=None, help="a fine-tuned video VAE (diffusers-layout safetensors, "
                    "stage 8) over the one read from --vae-official / --vae-run; its encoder side must be unchanged")
    ap.add_argument("--stage-name", default=None, help="h3tiny.json key for this run's dit-meta.json (default 'dit')")
    ap.add_argument("--out", default="python/h3ctl/models/h3-tiny")
    args = ap.parse_args(argv)
    if args.transport:
        transport(Path(args.transport[0]), Path(args.transport[1]))
        return 0
    vae_off = Path(args.vae_official) if args.vae_official else None
    export(Path(args.weights), None if vae_off else Path(args.vae_run), Path(args.meta or args.weights),
           Path(args.out), vae_off, args.stage_name,
           Path(args.video_vae_weights) if args.video_vae_weights else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
