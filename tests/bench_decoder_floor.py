"""Where the video decode's time goes at the released widths (issue #26 part 4; not a test: prints tables, writes
JSON): the decoder's vendor floor (its GEMMs and its attention alone, through torch: cuBLAS / cuDNN / flash) at the
shapes the tiled decode runs, next to libh3's own decode and diffusers' decoder, per layer group.

    PYTHONPATH=python python3 tests/bench_decoder_floor.py [--shapes 864x480x56] [--layers 36] [--repeats 5]
                                                           [--no-libh3] [--out floor.json] [--dry-run]

The decoder: diffusers' AutoencoderKLMiniMaxH3 defaults (36 ViT layers, 32 heads x 64 = 2048 wide, SwiGLU 2048 ->
2 x 8192 -> 2048, 4 register tokens + 1 zero token, patch 4 x 16 x 16), random weights (tests/bench_cuda_stages.py's
init), tiling as the config says (256 px tiles, 64 px minimum overlap, 17-frame clips with token_drop 3). The passes
(one decoder forward per tile and temporal window) and their token counts are recorded from diffusers' own decode
(a hook on `vae.decoder`); libh3 runs the same tiles and windows (its parity suite checks it).

Rows, per shape:
* diffusers: `vae.decode` of the bf16 pipeline model (norms in f32 as the model pins them), whole call by CUDA
  events, then per layer group by CUDA events recorded in forward hooks (a second call): the q/k/v/out GEMMs, the
  attention core (what the attention module does around its four linears: q/k RMSNorm in f32, RoPE, SDPA), the MLP
  GEMMs, the MLP's SwiGLU, the rest of each block (its two RMSNorms, layer scales, residuals), and the rest of the
  decode (proj_in / proj_out / post_quant_conv, token assembly, tile blending).
* floor: each GEMM of one pass alone (F.linear, bf16 in / bf16 out, cuBLAS), the same as fp8 (torch._scaled_mm,
  e4m3 x e4m3 -> bf16, per-tensor scales; where the GPU has it), and the attention alone (SDPA on [1, 32, L, 64]
  bf16 with each backend torch offers: flash, cuDNN, memory-efficient), each the median of --repeats after a
  warm-up, times 36 layers and the pass count. "batched" repeats the GEMM floor with every pass of one temporal
  window in one GEMM (M = tiles x L): what batching the tiles would buy.
* libh3: h3_video_decode (h3ctl.parity.vae_video.decode) on the same latents in one context, best of --repeats
  after a warm-up; "one tile" is the call at a 32-pixel canvas (mostly the decoder's load: libh3 loads the
  decoder per call here, while a render keeps it warm, see bench_render_released.py), and the difference is the
  decode without that load.
The checkpoint for libh3 is written once in the official layout (the release's f32, ~9.7 GB: about a minute).
`--dry-run`: toy widths on the CPU (libh3's CPU backend), to check the script where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

from tests import bench_cuda_stages as bst  # noqa: E402

DEV = "cuda"
DRY = dict(decoder_num_layers=2, decoder_num_attention_heads=2, decoder_attention_head_dim=16)
DRY_SHAPES = "64x64x22"


def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed_ms(torch, fn, repeats: int) -> float:
    return bst.cuda_ms(torch, fn, repeats, warmup=1)


def build_vae(torch, args):
    from diffusers import AutoencoderKLMiniMaxH3

    cfg = dict(block_out_channels=(32,) * 6, norm_num_groups=8)  # decoding never reads the encoder
    cfg.update(DRY if args.dry_run else dict(decoder_num_layers=args.layers))
    with torch.device(DEV):
        vae = AutoencoderKLMiniMaxH3(**cfg, latents_mean=tuple(0.1 * ((i % 5) - 2) for i in range(24)),
                                     latents_std=tuple(0.8 + 0.05 * (i % 7) for i in range(24))).eval()
    bst.init_params_(torch, vae, seed=1)
    return vae


def write_checkpoint(torch, vae, root: Path) -> Path:
    from tests.fixtures import official as fx

    top, src = fx.video_vae_official_configs(dict(vae.config))
    part = root / "FL2VA"
    d = part / "video_vae"
    (d / "source").mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(top, indent=1))
    (d / "source" / "config.json").write_text(json.dumps(src, indent=1))
    bst.save_cpu(fx.video_vae_state_dict_to_official(vae.state_dict(), int(vae.config.decoder_num_attention_heads)),
                 d / "source" / "model.safetensors")
    return part


# ---- diffusers: the whole decode, its passes, and per layer group ------------------------------------------------


def diffusers_decode(torch, vae, z, args) -> dict:
    passes = []
    h = vae.decoder.register_forward_pre_hook(lambda m, a: passes.append(tuple(a[0].shape)))
    with torch.no_grad():
        total = timed_ms(torch, lambda: vae.decode(z, return_dict=False), 1)
    h.remove()
    passes = passes[len(passes) // 2:]  # the warm-up's passes, then the timed call's: keep one call's
    # per layer group: CUDA events in hooks, one more call
    events: dict[str, list] = {}
    hooks = []

    def timing(group, module):
        def pre(m, a):
            e = torch.cuda.Event(enable_timing=True) if DEV == "cuda" else time.perf_counter()
            if DEV == "cuda":
                e.record()
            events.setdefault(group, []).append([e, None])

        def post(m, a, out):
            e = torch.cuda.Event(enable_timing=True) if DEV == "cuda" else time.perf_counter()
            if DEV == "cuda":
                e.record()
            events[group][-1][1] = e

        hooks.append(module.register_forward_pre_hook(pre))
        hooks.append(module.register_forward_hook(post))

    for blk in vae.decoder.transformer_blocks:
        timing("block", blk)
        timing("attention", blk.attn)
        for lin in (blk.attn.to_q, blk.attn.to_k, blk.attn.to_v, blk.attn.to_out[0]):
            timing("qkv+out GEMMs", lin)
        timing("MLP", blk.ff)
        for lin in (blk.ff.net[0].proj, blk.ff.net[2]):
            timing("MLP GEMMs", lin)
    # vae.decode is not a forward: the whole call between two events of its own
    start = torch.cuda.Event(enable_timing=True) if DEV == "cuda" else time.perf_counter()
    if DEV == "cuda":
        start.record()
    with torch.no_grad():
        vae.decode(z, return_dict=False)
    end = torch.cuda.Event(enable_timing=True) if DEV == "cuda" else time.perf_counter()
    if DEV == "cuda":
        end.record()
    events["decode"] = [[start, end]]
    sync(torch)
    for hk in hooks:
        hk.remove()

    def ms(group):
        if DEV == "cuda":
            return sum(a.elapsed_time(b) for a, b in events.get(group, []))
        return sum((b - a) * 1e3 for a, b in events.get(group, []))

    g = {k: ms(k) for k in ("block", "attention", "qkv+out GEMMs", "MLP", "MLP GEMMs", "decode")}
    groups = {"qkv+out GEMMs": g["qkv+out GEMMs"], "attention core (qk-norm, RoPE, SDPA)": g["attention"] - g[
        "qkv+out GEMMs"], "MLP GEMMs": g["MLP GEMMs"], "SwiGLU": g["MLP"] - g["MLP GEMMs"],
              "block rest (norms, scales, residuals)": g["block"] - g["attention"] - g["MLP"],
              "outside the blocks (proj_in/out, tokens, blending)": g["decode"] - g["block"]}
    return {"total_ms": total, "hooked_total_ms": g["decode"], "groups_ms": groups, "passes": [list(p) for p in passes]}


# ---- the floor -----------------------------------------------------------------------------------------------------


def gemm_shapes(vae) -> dict:
    """(N, K) of each GEMM of one decoder pass (y[M, N] = x[M, K] W^T), per layer or per pass."""
    cfg = vae.config
    d = int(cfg.decoder_num_attention_heads) * int(cfg.decoder_attention_head_dim)
    f = int(vae.decoder.transformer_blocks[0].ff.net[2].in_features)
    pt, ps = vae.decoder.patch_size_t, vae.decoder.patch_size
    return {"per_layer": {"qkv (fused)": (3 * d, d), "out": (d, d), "MLP up (gate + up)": (2 * f, d),
                          "MLP down": (d, f)},
            "per_pass": {"proj_in": (d, int(cfg.latent_channels)), "proj_out": (3 * pt * ps * ps, d)}}


def fp8_linear(torch):
    """A function (x_fp8, w_fp8, scale_x, scale_w) -> bf16 through torch._scaled_mm, or None where it does not run."""
    if DEV != "cuda" or not hasattr(torch, "_scaled_mm") or torch.cuda.get_device_capability() < (8, 9):
        return None

    def f(x, w, sx, sw):
        return torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)

    try:
        a = torch.randn(32, 64, device=DEV).to(torch.float8_e4m3fn)
        b = torch.randn(32, 64, device=DEV).to(torch.float8_e4m3fn)
        one = torch.ones((), device=DEV)
        f(a, b, one, one)
        return f
    except Exception as e:  # noqa: BLE001 (reported, the column is left out)
        print(f"fp8 GEMM floor skipped: {type(e).__name__}: {e}", flush=True)
        return None


def gemm_floor(torch, M: int, N: int, K: int, repeats: int, fp8) -> dict:
    g = torch.Generator(device=DEV).manual_seed(M + N + K)
    dt = torch.bfloat16 if DEV == "cuda" else torch.float32
    x = torch.randn(M, K, device=DEV, generator=g).to(dt)
    w = (torch.randn(N, K, device=DEV, generator=g) / K ** 0.5).to(dt)
    import torch.nn.functional as F

    out = {"bf16_ms": timed_ms(torch, lambda: F.linear(x, w), repeats)}
    out["bf16_tflops"] = 2 * M * N * K / out["bf16_ms"] / 1e9
    # e4m3 GEMMs need both inner and output widths divisible by 16 (cuBLASLt's fp8 rule); the GEMMs that are
    # not (proj_in's 24 latent channels) keep their bf16 time in the fp8 column: that is what an fp8 decoder runs
    if fp8 is not None and K % 16 == 0 and N % 16 == 0:
        xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=DEV)
        out["fp8_ms"] = timed_ms(torch, lambda: fp8(xf, wf, one, one), repeats)
        out["fp8_tflops"] = 2 * M * N * K / out["fp8_ms"] / 1e9
    return out


def attention_floor(torch, L: int, heads: int, hd: int, repeats: int) -> dict:
    import torch.nn.functional as F

    dt = torch.bfloat16 if DEV == "cuda" else torch.float32
    g = torch.Generator(device=DEV).manual_seed(L)
    q, k, v = (torch.randn(1, heads, L, hd, device=DEV, generator=g).to(dt) for _ in range(3))
    out = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    except ImportError:
        backends = {}
    for name, be in backends.items():
        if DEV == "cuda" and name == "math":
            continue
        try:
            with sdpa_kernel([be]):
                out[f"{name}_ms"] = timed_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v), repeats)
        except Exception as e:  # noqa: BLE001 (a backend this GPU / build does not offer)
            out[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    if not any(k.endswith("_ms") for k in out):
        out["default_ms"] = timed_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v), repeats)
    best = min(v for k, v in out.items() if k.endswith("_ms"))
    out["best_ms"] = best
    out["tflops"] = 4 * heads * hd * L * L / best / 1e9
    return out


def floor(torch, vae, passes: list, args) -> dict:
    """The vendor floor of the recorded passes (module docstring)."""
    cfg = vae.config
    heads, hd = int(cfg.decoder_num_attention_heads), int(cfg.decoder_attention_head_dim)
    layers = len(vae.decoder.transformer_blocks)
    regs = int(vae.decoder.num_register_tokens) + 1
    by_L: dict[int, int] = {}
    windows: dict[int, int] = {}
    for b, c, t, h, w in passes:
        L = t * h * w + regs
        by_L[L] = by_L.get(L, 0) + b
    fp8 = fp8_linear(torch)
    shapes = gemm_shapes(vae)
    out = {"passes": sum(by_L.values()), "tokens_per_pass": by_L, "layers": layers, "per_L": {}}
    tot = {"gemm_bf16_ms": 0.0, "gemm_fp8_ms": 0.0, "attention_ms": 0.0}
    per_group = {}
    for L, n in by_L.items():
        row = {"gemms": {}, "attention": attention_floor(torch, L, heads, hd, args.repeats)}
        for scope, gs in shapes.items():
            reps = layers if scope == "per_layer" else 1
            for name, (N, K) in gs.items():
                r = gemm_floor(torch, L, N, K, args.repeats, fp8)
                row["gemms"][name] = r
                per_group.setdefault(name, [0.0, 0.0])
                f8 = r.get("fp8_ms", r["bf16_ms"] if fp8 is not None else float("nan"))
                per_group[name][0] += r["bf16_ms"] * reps * n
                per_group[name][1] += f8 * reps * n
                tot["gemm_bf16_ms"] += r["bf16_ms"] * reps * n
                tot["gemm_fp8_ms"] += f8 * reps * n
        tot["attention_ms"] += row["attention"]["best_ms"] * layers * n
        out["per_L"][L] = row
        windows[L] = n
    out["per_group_ms"] = {k: {"bf16": v[0], "fp8": v[1]} for k, v in per_group.items()}
    out["attention_ms"] = tot["attention_ms"]
    out["gemm_bf16_ms"], out["gemm_fp8_ms"] = tot["gemm_bf16_ms"], tot["gemm_fp8_ms"]
    out["floor_bf16_ms"] = tot["gemm_bf16_ms"] + tot["attention_ms"]
    out["floor_fp8_gemm_ms"] = tot["gemm_fp8_ms"] + tot["attention_ms"]
    # batched: every tile of one temporal window in one GEMM (M = tiles x L), per-layer GEMMs only
    L0 = max(by_L, key=by_L.get)
    n_windows = max(1, args.windows_hint or 1)
    tiles = max(1, by_L[L0] // n_windows)
    b_ms = 0.0
    for name, (N, K) in shapes["per_layer"].items():
        b_ms += gemm_floor(torch, tiles * L0, N, K, args.repeats, None)["bf16_ms"] * layers * n_windows
    out["batched"] = {"tiles_per_gemm": tiles, "windows": n_windows, "gemm_bf16_ms": b_ms}
    return out


# ---- libh3 --------------------------------------------------------------------------------------------------------


def libh3_decode(part: Path, lat, args, fp8: bool = False) -> dict:
    """`fp8`: the context with H3_OPT_FP8_DECODER (the decoder layers' GEMMs with fp8 weights)."""
    from h3ctl import _lib
    from h3ctl.context import Context
    from h3ctl.parity import vae_video as PV

    device = "cpu" if args.dry_run else "cuda"
    import numpy as np

    with Context(part, threads=args.threads, device=device, flags=_lib.H3_OPT_FP8_DECODER if fp8 else 0) as ctx:
        small = np.random.default_rng(0).standard_normal((24, 3, 2, 2)).astype(np.float32)  # one 32 px tile
        one_s, _ = bst.best_s(lambda: PV.decode(ctx, small, want_pixels=False), args.repeats)
        stamps: list = []

        def prog(phase, done, total):
            stamps.append((time.perf_counter(), done, total))
            return False

        full_s, _ = bst.best_s(lambda: PV.decode(ctx, lat, want_pixels=False), args.repeats)
        stamps.clear()
        PV.decode(ctx, lat, want_pixels=False, progress=prog)
        steps = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])]
        rgb, _ = PV.decode(ctx, lat, want_pixels=False)
        return {"rgb": rgb,"device": ctx.device_description if hasattr(ctx, "device_description") else device,
                "decode_s": full_s, "one_tile_s": one_s, "decode_less_load_s": max(0.0, full_s - one_s),
                "progress_steps": len(steps),
                "progress_step_median_ms": statistics.median(steps) * 1e3 if steps else None}


# ---- report -------------------------------------------------------------------------------------------------------


def report(res: dict) -> str:
    lines = []
    for spec, r in res["shapes"].items():
        d, f, h = r["diffusers"], r["floor"], r.get("libh3")
        lines += [f"\n{spec}: {f['passes']} decoder passes of {', '.join(f'{L} tokens x {n}' for L, n in f['tokens_per_pass'].items())}, "
                  f"{f['layers']} layers",
                  "| layer group | diffusers bf16 | floor bf16 (cuBLAS / best SDPA) | floor fp8 GEMM |",
                  "| --- | --- | --- | --- |"]
        g = d["groups_ms"]
        pg = f["per_group_ms"]
        qkv_b = pg["qkv (fused)"]["bf16"] + pg["out"]["bf16"]
        qkv_f = pg["qkv (fused)"]["fp8"] + pg["out"]["fp8"]
        mlp_b = pg["MLP up (gate + up)"]["bf16"] + pg["MLP down"]["bf16"]
        mlp_f = pg["MLP up (gate + up)"]["fp8"] + pg["MLP down"]["fp8"]
        io_b = pg["proj_in"]["bf16"] + pg["proj_out"]["bf16"]
        io_f = pg["proj_in"]["fp8"] + pg["proj_out"]["fp8"]
        lines += [f"| q/k/v + out GEMMs | {g['qkv+out GEMMs']:.0f} ms | {qkv_b:.0f} ms | {qkv_f:.0f} ms |",
                  f"| attention core | {g['attention core (qk-norm, RoPE, SDPA)']:.0f} ms | {f['attention_ms']:.0f} ms "
                  f"(SDPA alone) | - |",
                  f"| MLP GEMMs | {g['MLP GEMMs']:.0f} ms | {mlp_b:.0f} ms | {mlp_f:.0f} ms |",
                  f"| SwiGLU | {g['SwiGLU']:.0f} ms | - | - |",
                  f"| block rest (norms, scales, residuals) | {g['block rest (norms, scales, residuals)']:.0f} ms | - | - |",
                  f"| outside the blocks | {g['outside the blocks (proj_in/out, tokens, blending)']:.0f} ms | "
                  f"{io_b:.1f} ms (proj_in + proj_out) | {io_f:.1f} ms |",
                  f"| **total** | **{d['total_ms']:.0f} ms** (hooked {d['hooked_total_ms']:.0f}) | "
                  f"**{f['floor_bf16_ms']:.0f} ms** | **{f['floor_fp8_gemm_ms']:.0f} ms** |",
                  f"| GEMMs with a window's {f['batched']['tiles_per_gemm']} tiles in one GEMM | - | "
                  f"{f['batched']['gemm_bf16_ms']:.0f} ms (bf16, per-layer GEMMs) | - |"]
        if h:
            lines += [f"| **libh3** | h3_video_decode {h['decode_s'] * 1e3:.0f} ms, one-tile call {h['one_tile_s'] * 1e3:.0f} ms"
                      f" -> {h['decode_less_load_s'] * 1e3:.0f} ms without the load | | |"]
        h8 = r.get("libh3_fp8")
        if h8:
            lines += [f"| **libh3, fp8 decoder** | h3_video_decode {h8['decode_s'] * 1e3:.0f} ms -> "
                      f"{h8['decode_less_load_s'] * 1e3:.0f} ms without the load | frames vs bf16 decoder "
                      f"{h8['psnr_db']:.1f} dB PSNR, SSIM {h8['ssim']:.4f} | |"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="WIDTHxHEIGHTxFRAMES,... (default 864x480x56)")
    ap.add_argument("--layers", type=int, default=36, help="decoder layers (the release: 36)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--no-libh3", action="store_true", help="skip libh3 (and writing its checkpoint)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--dry-run", action="store_true", help=f"toy widths on the CPU ({DRY_SHAPES})")
    args = ap.parse_args()
    if args.layers < 1 or args.repeats < 1:
        ap.error("--layers and --repeats must be >= 1")
    global DEV
    DEV = "cpu" if args.dry_run else "cuda"
    bst.DEV = DEV
    import torch

    if DEV == "cuda" and not torch.cuda.is_available():
        print("bench_decoder_floor: torch sees no GPU", file=sys.stderr)
        return 2
    if DEV == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    shapes = (args.shapes or (DRY_SHAPES if args.dry_run else "864x480x56")).split(",")
    t_start = time.perf_counter()
    vae = build_vae(torch, args)
    res = {"machine": {"gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
                       "torch": torch.__version__, "diffusers": __import__("diffusers").__version__,
                       "python": platform.python_version()},
           "layers": len(vae.decoder.transformer_blocks), "shapes": {}}
    tmp = None
    part = None
    if not args.no_libh3:
        tmp = tempfile.TemporaryDirectory(prefix="h3_bench_decoder_floor_")
        t0 = time.perf_counter()
        part = write_checkpoint(torch, vae, Path(tmp.name))
        res["checkpoint_write_s"] = time.perf_counter() - t0
    bst.to_pipeline_dtype(torch, vae)
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = 256
    vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = 64
    mean = torch.tensor(vae.config.latents_mean, device=DEV).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=DEV).view(1, -1, 1, 1, 1)
    try:
        for spec in shapes:
            w, h, frames = (int(x) for x in spec.lower().split("x"))
            T = 5 * ((frames - 5) // 17) + 2
            lat = torch.randn(24, T, h // 16, w // 16, generator=torch.Generator().manual_seed(frames))
            z = lat.to(DEV)[None] * std + mean
            r = {"latents": [24, T, h // 16, w // 16]}
            r["diffusers"] = diffusers_decode(torch, vae, z, args)
            # temporal windows: passes come tile by tile within a window, windows in order
            tiles = len({(p[3], p[4]) for p in r["diffusers"]["passes"]})
            args.windows_hint = max(1, len(r["diffusers"]["passes"]) // max(1, tiles))
            r["floor"] = floor(torch, vae, [tuple(p) for p in r["diffusers"]["passes"]], args)
            print(f"{spec}: diffusers {r['diffusers']['total_ms']:.0f} ms, floor bf16 {r['floor']['floor_bf16_ms']:.0f} ms "
                  f"(GEMMs {r['floor']['gemm_bf16_ms']:.0f}, attention {r['floor']['attention_ms']:.0f}), fp8 GEMMs "
                  f"{r['floor']['gemm_fp8_ms']:.0f} ms", flush=True)
            if part is not None:
                vae.to("cpu")
                if DEV == "cuda":
                    torch.cuda.empty_cache()
                r["libh3"] = libh3_decode(part, lat.numpy(), args)
                print(f"{spec}: libh3 {r['libh3']['decode_s']:.2f} s (one-tile call {r['libh3']['one_tile_s']:.2f} s)",
                      flush=True)
                if fp8_linear(torch) is not None:  # the fp8 decoder (--fp8-decoder) where the GPU has fp8
                    from tests import quality

                    f8 = r["libh3_fp8"] = libh3_decode(part, lat.numpy(), args, fp8=True)
                    f8["psnr_db"] = quality.psnr(r["libh3"]["rgb"], f8["rgb"])
                    f8["ssim"] = quality.ssim(r["libh3"]["rgb"], f8["rgb"])
                    print(f"{spec}: libh3 fp8 decoder {f8['decode_s']:.2f} s (one-tile call {f8['one_tile_s']:.2f} s);"
                          f" frames vs the bf16 decoder {f8['psnr_db']:.1f} dB PSNR, SSIM {f8['ssim']:.4f}", flush=True)
                    del f8["rgb"]
                del r["libh3"]["rgb"]
                vae.to(DEV)
            res["shapes"][spec] = r
    finally:
        if tmp:
            tmp.cleanup()
    res["total_s"] = time.perf_counter() - t_start
    print(f"\n{res['machine']['gpu']}; torch {res['machine']['torch']}, diffusers {res['machine']['diffusers']}; "
          f"run took {res['total_s']:.0f} s")
    print(report(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
