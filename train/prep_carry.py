"""Local helper between device calls: unpack what a call returned (the folder the device tool copies $OUT into) into ``train/runs/`` and make
the BF16 VAE copies that fit a cold call's 64 MiB carry (``train/runs/vae16``). Usage: python -m train.prep_carry DIR

Stage 7 returns ema-*.safetensors + meta7.tar: the EMA weights and dit7/{tokenizer,latent_stats,dit-meta}.json land in
``train/runs/transport``, ready for ``train.export --weights train/runs/transport --meta train/runs/transport``."""

import shutil
import sys
import tarfile
from pathlib import Path

src = Path(sys.argv[1])
runs = Path(__file__).resolve().parent / "runs"
for sub in ("vae", "transport", "vae16", "returned"):
    (runs / sub).mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.name.startswith(("video_vae-model", "audio_vae-model")):
        shutil.copy(f, runs / "vae" / f.name)
    elif f.name.startswith("ema-"):
        shutil.copy(f, runs / "transport" / f.name)
    elif f.suffix == ".tar":
        with tarfile.open(f) as t:
            t.extractall(runs / "returned")
    else:
        shutil.copy(f, runs / "returned" / f.name)
ret = runs / "returned"
for name in ("vae/latent_stats.json", "vae/video_vae-meta.json", "vae/audio_vae-meta.json"):
    if (ret / name).exists():
        shutil.copy(ret / name, runs / name)
for name in ("dit/tokenizer.json", "dit/latent_stats.json", "dit/dit-meta.json",
             "dit7/tokenizer.json", "dit7/latent_stats.json", "dit7/dit-meta.json"):   # dit7: stage 7 (meta7.tar)
    if (ret / name).exists():
        shutil.copy(ret / name, runs / "transport" / Path(name).name)
if "--vae16" in sys.argv:
    import torch
    from safetensors.torch import load_file, save_file

    for f in (runs / "vae").glob("*-model*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(f)).items()}, str(runs / "vae16" / f.name))
    shutil.copy(runs / "vae" / "latent_stats.json", runs / "vae16" / "latent_stats.json")
print(sorted(str(p.relative_to(runs)) for p in runs.rglob("*") if p.is_file()))
