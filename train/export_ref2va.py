"""Export stage 9 (``train/train_ref2va.py``) as h3-tiny's shared-weight Ref2VA partition.

``python -m train.export_ref2va ATTN.safetensors --fl2va python/h3ctl/models/h3-tiny/FL2VA --out
python/h3ctl/models/h3-tiny/Ref2VA`` writes

* ``transformer/model.safetensors``: only the official tensors the fine-tune trains (the blocks' fused
  ``attn.qkv_proj``, ``attn.out_proj``, ``attn.q_norm``/``k_norm``, in the official dtypes), checked: every other
  tensor of the merged transformer is bit-identical to FL2VA's;
* ``transformer/model.safetensors.index.json``: those tensors -> ``model.safetensors``, every other one ->
  ``../../FL2VA/transformer/model.safetensors`` (the shared-weight form libh3 opens; written by
  ``tests.fixtures.write_shared_ref2va``, which ``tests/test_h3tiny_checkpoint.py`` checks);
* ``transformer/config.json`` (FL2VA's) and ``model_index.json`` (FL2VA's, partition "ref2va", task "ref2va", and
  ``reference_image_short_edge`` 128 and ``reference_aspect_width``/``_height`` 1:1: what stage 9 trained on).

``--full DIR`` instead writes a self-contained Ref2VA partition (every component copied), for loaders that do not
read shared shards.
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

from train.refs import REF_EDGE  # noqa: E402

# What stage 9 trained on: 128-pixel references and square 128 x 128 clips (the Ref2VA default canvas follows).
H3CTL_REF2VA = {"reference_image_short_edge": REF_EDGE, "reference_aspect_width": 1, "reference_aspect_height": 1}



def merged_official(attn: Path, fl2va: Path) -> tuple[dict, dict, dict]:
    """(merged official tensors, FL2VA's official tensors, FL2VA transformer config)."""
    from safetensors.torch import load_file

    from tests.fixtures.official import dit_state_dict_to_official, read_official_to_diffusers

    m = read_official_to_diffusers(fl2va)
    dit = m["transformer"]
    sd = {k: v.clone() for k, v in dit.state_dict().items()}
    new = load_file(str(attn))
    missing = [k for k in new if k not in sd]
    if missing:
        raise SystemExit(f"{attn}: tensors the transformer does not have: {missing[:3]}")
    for k, v in new.items():
        sd[k] = v.to(sd[k].dtype)
    cfg = json.loads((fl2va / "transformer" / "config.json").read_text())
    heads = dit.config.num_attention_heads
    base = load_file(str(fl2va / "transformer" / "model.safetensors"))
    merged = dit_state_dict_to_official(sd, heads, base["rope.inv_freq"])
    merged = {k: v.to(base[k].dtype) for k, v in merged.items()}
    return merged, base, cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn")
    ap.add_argument("--fl2va", default="python/h3ctl/models/h3-tiny/FL2VA")
    ap.add_argument("--out", default="python/h3ctl/models/h3-tiny/Ref2VA")
    ap.add_argument("--full", action="store_true", help="a self-contained partition (all components copied)")
    args = ap.parse_args(argv)
    from safetensors.torch import save_file

    fl2va, out = Path(args.fl2va), Path(args.out)
    merged, base, cfg = merged_official(Path(args.attn), fl2va)
    if set(merged) != set(base):
        raise SystemExit("the merged transformer's tensor names differ from FL2VA's")
    changed = sorted(k for k in merged if not torch.equal(merged[k], base[k]))
    from tests.fixtures.official import REF2VA_OWN_RE

    bad = [k for k in changed if not REF2VA_OWN_RE.match(k)]
    if bad:
        raise SystemExit(f"tensors the shared form cannot hold changed: {bad[:3]}")
    if not args.full:  # the checked shared-weight form, written by the fixtures' writer next to FL2VA
        from tests.fixtures.official import write_shared_ref2va

        if out.parent.resolve() != fl2va.parent.resolve() or out.name != "Ref2VA":
            raise SystemExit("the shared form goes next to FL2VA: --out must be FL2VA's sibling Ref2VA/")
        shutil.rmtree(out, ignore_errors=True)
        write_shared_ref2va(out.parent, merged, H3CTL_REF2VA)
    else:
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "transformer").mkdir(parents=True)
        for comp in ("text_encoder", "tokenizer", "video_vae", "audio_vae"):
            shutil.copytree(fl2va / comp, tmp / comp)
        save_file(merged, str(tmp / "transformer" / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "transformer" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        mi = json.loads((fl2va / "model_index.json").read_text())
        mi["_minimax_h3"].update(partition="ref2va", tasks=["ref2va"])
        mi["h3ctl"].update(H3CTL_REF2VA)
        (tmp / "model_index.json").write_text(json.dumps(mi, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    own = sum(merged[k].numel() * merged[k].element_size() for k in changed)
    print(f"{out}: {len(changed)} changed tensors ({own / 1e6:.2f} MB){' (full copy)' if args.full else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
