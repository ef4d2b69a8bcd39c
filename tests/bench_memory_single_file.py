"""Memory of the single-file transformer variants at the released widths on one GPU: libh3's estimate (what `h3ctl
info` prints for single files) next to the measured device peak, per variant, with and without a --vram budget
(not a test: prints a table, writes JSON). docs/single-files.md's memory table quotes the estimate; the measured
column is what this script prints on the H200.

    PYTHONPATH=python python3 tests/bench_memory_single_file.py [--blocks 4] [--shapes 864x480x56,1344x768x124]
                                                                [--variants bf16,fp8_scaled,int8_convrot]
                                                                [--out memory.json] [--dry-run]

Checkpoint: the released geometry with `--blocks` main blocks (the release: 50) and the 2 refiner blocks, random
weights scaled like a trained network's (tests/bench_cuda_dit.py's build_model), written once in the official
layout (its config says `--blocks` layers) and once per variant as a ComfyUI single file under the original names
([q;k;v] QKV, `model.diffusion_model.` prefix): bf16; fp8_scaled (e4m3 codes, one F32 scale per layer: amax / 448);
int8_convrot (each row rotated per group of 256 by the orthonormal Hadamard matrix, int8 codes, F32 scale per row:
amax / 127), the quantised layers being every block's qkv / out / fc1 / fc2 (the AdaLN projections stay bf16).

Per variant and shape, in a fresh context each (device cuda):
* estimate: h3_memory_estimate_json's denoise phase for the file (runtime/memory.c: the weights as the context
  holds them, fp8 codes on a GPU of compute capability 8.9+, the AdaLN tables and the activations of the shape);
  under --vram the weights dit_stream.c's rule keeps (blocks resident and streamed);
* measured: h3_device_memory_peak (cudaMemGetInfo's used memory, sampled at the backend's allocations: it includes
  the CUDA context and the libraries' workspaces) around one 2-step denoise (h3ctl.transformer.denoise) at the
  shape's latent geometry.
Extrapolation to the release's 50 blocks, the same for both numbers: value + (50 - blocks) x block, block = one
main block's GEMM weights as held (the estimate's block_bytes): the other buffers do not grow with depth. The --vram
budget is the fixed weights plus `--vram-blocks` resident blocks and the two ring slots (so it streams at any
`--blocks` > --vram-blocks); extrapolated, a budget holds the same weights whatever the depth.
`--dry-run`: toy widths on the CPU (checks the plumbing; the CPU has no device peak, so "measured" is the RSS peak).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

from tests import bench_cuda_dit as bdit  # noqa: E402

RELEASE_BLOCKS = 50
GIB = 1 << 30


def hadamard(torch, g: int, dev):
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float32, device=dev)
    h = torch.ones(1, 1, dtype=torch.float32, device=dev)
    while h.shape[0] < g:
        h = torch.kron(h, h4)
    return h / float(g) ** 0.5


def quantise(torch, w, variant: str, dev):
    """(codes, scale, comfy_quant spec) of one layer, as docs/single-files.md describes the released files."""
    w = w.to(dev, torch.float32)
    if variant == "fp8_scaled":
        s = (w.abs().max() / 448.0).clamp(min=1e-12)
        return (w / s).clamp(-448, 448).to(torch.float8_e4m3fn).cpu(), s.reshape(()).cpu(), {"format": "float8_e4m3fn"}
    n, k = w.shape
    g = 256 if k % 256 == 0 else 64
    rot = (w.reshape(n, k // g, g) @ hadamard(torch, g, dev).T).reshape(n, k)
    s = (rot.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
    q = torch.round(rot / s).clamp(-127, 127).to(torch.int8)
    return q.cpu(), s.cpu(), {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": g}


def write_single(torch, official: dict, heads: int, variant: str, path: Path, dev) -> Path:
    from safetensors.torch import save_file

    from tests.fixtures import single_file as sf

    out = {}
    for name, t in official.items():
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        x = sf.qkv_to_thirds(t, heads) if name.endswith(".attn.qkv_proj.weight") else t
        if variant != "bf16" and base and sf.is_block_linear(name) and "adaln" not in name and x.ndim == 2:
            q, s, spec = quantise(torch, x, variant, dev)
            out[sf.PREFIX + name] = q.contiguous()
            out[sf.PREFIX + base + ".weight_scale"] = s.contiguous()
            out[sf.PREFIX + base + ".comfy_quant"] = torch.tensor(list(json.dumps(spec).encode()), dtype=torch.uint8)
        else:
            out[sf.PREFIX + name] = x.contiguous()
    save_file(out, str(path))
    return path


def device_peak(ctx, reset: bool) -> int | None:
    from h3ctl import _lib

    peak = _lib.c_uint64(0)
    rc = _lib.lib().h3_device_memory_peak(ctx.ptr, 1 if reset else 0, _lib.ctypes.byref(peak))
    return int(peak.value) if rc == 1 else None


def one(root: Path, single: Path, g: dict, device: str, vram, inputs) -> dict:
    from h3ctl import transformer as tr
    from h3ctl.context import Context
    from h3ctl.info import peak_and_resident

    with Context(root, device=device, files={"transformer": single}, vram=vram) as ctx:
        est = ctx.memory_estimate(g["width"], g["height"], g["frames"], g["n_text"])
        ph = est["phases"]
        den = ph.get("under_vram_budget") or ph["denoise_precomputed_adaln"]
        codes = ctx.info()["components"]["transformer"].get("single_file_native_codes", 0)
        device_peak(ctx, True)
        t0 = time.perf_counter()
        pe, lat, aud = inputs
        tr.denoise(ctx, pe, lat, aud, 2)
        measured = device_peak(ctx, False)
        if measured is None:  # the CPU (--dry-run): the process's peak RSS
            measured = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"estimate_denoise": den["total"], "estimate_weights": den["weights"],
                "estimate": peak_and_resident(est), "block_bytes": den.get("block_bytes"),
                "streamed_blocks": den.get("blocks_streamed", 0), "native_codes_bytes": codes,
                "measured_peak": measured, "wall_s": round(time.perf_counter() - t0, 2)}


# Cards by the memory their driver reports (MiB): 24, 32, 48, 80 and 141 GB.
CARDS = (("24 GB", 24564), ("32 GB", 32607), ("48 GB", 49140), ("80 GB", 81559), ("141 GB", 143771))
ST_DTYPE = {"bf16": "BF16", "f32": "F32", "i8": "I8", "f8": "F8_E4M3", "u8": "U8"}


def release_layout(variant: str) -> list[tuple[str, str, tuple]]:
    """(name, safetensors dtype, shape) of every tensor of the release's transformer as single file `variant` (names
    and shapes from diffusers' model on the meta device and the official converter of tests/fixtures; no data)."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    from tests.fixtures import official as fx
    from tests.fixtures import single_file as sf

    with torch.device("meta"):
        m = MiniMaxH3Transformer3DModel(num_layers=RELEASE_BLOCKS)
    off = fx.dit_state_dict_to_official(m.state_dict(), int(m.config.num_attention_heads),
                                        torch.empty(int(m.config.rope_freq_dim) if hasattr(m.config, "rope_freq_dim")
                                                    else 16, device="meta"))
    pruned = variant.startswith("pruned_")
    quant = variant.replace("pruned_", "")
    out = []
    for name, t in off.items():
        dt = "f32" if fx.official_dit_dtype(name, "official") == torch.float32 else "bf16"
        shape = tuple(t.shape)
        if pruned and name.startswith("time_embedder."):
            continue
        if pruned and name.endswith("adaln_proj.linear.weight"):
            shape = (shape[0], 8)  # the released rank-8 AdaLN basis
        if quant != "bf16" and sf.is_block_linear(name) and "adaln" not in name:
            base = name[: -len(".weight")]
            out.append((sf.PREFIX + name, "i8" if quant == "int8_convrot" else "f8", shape))
            out.append((sf.PREFIX + base + ".weight_scale", "f32", (shape[0], 1) if quant == "int8_convrot" else ()))
            continue  # its format goes in the header's _quantization_metadata (write_sparse)
        out.append((sf.PREFIX + name, dt, shape))
    if pruned:
        out.append((sf.PREFIX + "adaln_t_table", "f32", (1025, 8)))
    return out


def write_sparse(path: Path, layout) -> Path:
    """A safetensors file of `layout` whose data area is a hole (truncate): libh3's estimate reads headers only. The
    quantised layers' formats are in __metadata__._quantization_metadata (the form that needs no data)."""
    size = {"bf16": 2, "f32": 4, "i8": 1, "f8": 1, "u8": 1}
    layers = {}
    for name, dt, shape in layout:
        if dt in ("i8", "f8"):
            layers[name[: -len(".weight")]] = ({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
                                               if dt == "i8" else {"format": "float8_e4m3fn"})
    hdr, off = {}, 0
    if layers:
        hdr["__metadata__"] = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}
    for name, dt, shape in layout:
        n = size[dt]
        for d in shape:
            n *= d
        hdr[name] = {"dtype": ST_DTYPE[dt], "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(hdr).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.truncate(8 + len(raw) + off)
    return path


def estimate_table(args) -> int:
    """docs/single-files.md's memory table from libh3's estimate (CPU context: headers only, nothing computed)."""
    import os

    from h3ctl import components
    from h3ctl.context import Context
    from h3ctl.info import peak_and_resident

    shapes = [bdit.geometry(s) for s in args.shapes.split(",") if s]
    tmp = tempfile.TemporaryDirectory(prefix="h3-mem-table-")
    rows = []
    for variant in args.variants.split(","):
        single = write_sparse(Path(tmp.name) / f"minimax_h3_fl2va_{variant}.safetensors", release_layout(variant))
        for mode in (("gpu",) if args.device == "cuda" else ("gpu", "cpu")):
            if mode == "cpu" and "int8" not in variant:
                continue
            if mode == "gpu" and args.device == "cpu":
                # a GPU widens int8 (and fp8 below compute capability 8.9); a CUDA context (--device cuda) applies
                # its own rule, fp8 from its codes on 8.9+
                os.environ["H3_QUANT_WIDEN"] = "1"
            try:
                for g in shapes:
                    kw = dict(device=args.device, files={"transformer": single})
                    with Context(components.RELEASE_CONFIGS, **kw) as c:
                        est = c.memory_estimate(g["width"], g["height"], g["frames"], g["n_text"])
                    with Context(components.RELEASE_CONFIGS, vram=1 << 19, **kw) as c:
                        ub = c.memory_estimate(g["width"], g["height"], g["frames"], g["n_text"])["phases"][
                            "under_vram_budget"]
                    smallest = (ub["fixed_gemm_bytes"] + 2 * ub["block_bytes"]) / GIB
                    with Context(components.RELEASE_CONFIGS, vram=smallest, **kw) as c:
                        low = c.memory_estimate(g["width"], g["height"], g["frames"], g["n_text"])
                    a, b = peak_and_resident(est), peak_and_resident(low)
                    rows.append(dict(variant=variant, mode=mode, shape=f"{g['width']}x{g['height']}x{g['frames']}",
                                     resident=a["resident"], peak=a["peak"], vram_gib=smallest,
                                     vram_resident=b["resident"], vram_peak=b["peak"]))
            finally:
                os.environ.pop("H3_QUANT_WIDEN", None)
    fits = lambda b: ", ".join(n for n, mib in CARDS if b <= mib * (1 << 20)) or "none"  # noqa: E731
    print("| file | where | render | weights resident | peak | fits (no --vram) | smallest --vram | peak with it "
          "| fits with it | measured peak (H200) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        native = args.device == "cuda" and r["variant"].endswith("fp8_scaled")
        where = "GPU (fp8 codes)" if native else "GPU (widened)" if r["mode"] == "gpu" and "bf16" not in r["variant"] else (
            "GPU" if r["mode"] == "gpu" else "CPU (native int8; RAM)")
        print(f"| {r['variant']} | {where} | {r['shape']} | {r['resident'] / GIB:.1f} GiB | {r['peak'] / GIB:.1f} GiB "
              f"| {fits(r['peak']) if r['mode'] == 'gpu' else '-'} | {r['vram_gib']:.1f} GiB | "
              f"{r['vram_peak'] / GIB:.1f} GiB | {fits(r['vram_peak']) if r['mode'] == 'gpu' else '-'} | pending |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--shapes", default="864x480x56:64,1344x768x124:64")
    ap.add_argument("--variants", default="bf16,fp8_scaled,int8_convrot")
    ap.add_argument("--vram-blocks", type=int, default=1, help="resident blocks of the --vram run (0: no such run)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="--estimate-table's context (cuda: the GPU's own rule, fp8 from its codes on 8.9+)")
    ap.add_argument("--estimate-table", action="store_true",
                    help="no GPU: the estimate for the release's 50 blocks from header-only files (docs' table)")
    args = ap.parse_args()
    if args.estimate_table:
        return estimate_table(args)
    import torch

    dev = "cpu" if args.dry_run else "cuda"
    bdit.DEV = dev
    if not args.dry_run and not torch.cuda.is_available():
        print("bench_memory_single_file: no GPU (use --dry-run to check the script on the CPU)")
        return 2
    shapes = [bdit.geometry(s) for s in (bdit.DRY_SHAPES if args.dry_run else args.shapes).split(",") if s]
    model = bdit.build_model(torch, args.blocks, seed=0, overrides=bdit.DRY_CONFIG if args.dry_run else {})
    heads = int(model.config.num_attention_heads)
    from tests.fixtures import official as fx

    off = fx.dit_state_dict_to_official(model.state_dict(), heads, model.rope.inv_freq.clone())
    official = {n: t.to(fx.official_dit_dtype(n, "official")).to("cpu").contiguous() for n, t in off.items()}
    del off
    tmp = tempfile.TemporaryDirectory(prefix="h3-bench-mem-")
    root = Path(tmp.name)
    from tests import dit_support as ds

    ds.write_checkpoint(model, root, "official", tensors=official)
    cfg = dict(model.config)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    rng = np.random.default_rng(1)
    res = {"blocks": args.blocks, "release_blocks": RELEASE_BLOCKS, "device": dev, "runs": []}
    for variant in args.variants.split(","):
        single = write_single(torch, official, heads, variant, root / f"minimax_h3_fl2va_{variant}.safetensors", dev)
        for g in shapes:
            inputs = (rng.standard_normal((g["n_text"], cfg["text_dim"])).astype(np.float32),
                      rng.standard_normal((24, g["lat_t"], g["lat_h"], g["lat_w"])).astype(np.float32),
                      rng.standard_normal((2, 32, g["audio"])).astype(np.float32))
            from h3ctl.context import Context

            # one block's GEMM weights as held, the fixed ones (an estimate under a budget that keeps everything)
            with Context(root, device=dev, files={"transformer": single}, vram=1 << 19) as c:
                ub = c.memory_estimate(g["width"], g["height"], g["frames"], g["n_text"])["phases"]["under_vram_budget"]
            r = one(root, single, g, dev, None, inputs)
            runs = [("no --vram", None, r)]
            if args.vram_blocks > 0 and args.vram_blocks + 2 < args.blocks:
                # the budget: the fixed weights + vram_blocks blocks + the two ring slots
                budget = ub["fixed_gemm_bytes"] + (args.vram_blocks + 2) * ub["block_bytes"]
                runs.append((f"--vram {budget / GIB:.4g}", budget, one(root, single, g, dev, budget / GIB, inputs)))
            for label, budget, rr in runs:
                grow = 0 if budget else (RELEASE_BLOCKS - args.blocks) * ub["block_bytes"]
                row = dict(variant=variant, shape=g["spec"], vram=label, **rr,
                           estimate_release=rr["estimate_denoise"] + grow, measured_release=rr["measured_peak"] + grow)
                res["runs"].append(row)
                u, un = (1 << 20, "MiB") if args.dry_run else (GIB, "GiB")
                print(f"{variant:13s} {g['spec']:18s} {label:12s} estimate {rr['estimate_denoise'] / u:8.2f} {un}  "
                      f"measured {rr['measured_peak'] / u:8.2f} {un}  | at {RELEASE_BLOCKS} blocks: estimate "
                      f"{row['estimate_release'] / u:8.2f} {un}, measured {row['measured_release'] / u:8.2f} {un}"
                      f"  ({rr['streamed_blocks']} blocks streamed, codes {rr['native_codes_bytes'] / u:.2f} {un})",
                      flush=True)
        single.unlink()
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
