"""Transformer blocks at the released widths on one GPU: libh3's CUDA backend next to diffusers, torch.compile and the
vendor libraries, side by side in one run (not a test: prints a table, writes JSON).

    PYTHONPATH=python python3 tests/bench_cuda_dit.py [--blocks 2] [--shapes 512x512x22:8,864x480x56:64,...]
                                                       [--repeats 5] [--steps 4] [--no-compile] [--out bench.json]

Model: the released MiniMax-H3 transformer (hidden 5376, 56 heads x 128, SwiGLU 14336, text 5120, time embedding
256 -> 5376 -> 2688, 2 refiner blocks, RoPE 16 frequencies per axis: diffusers' MiniMaxH3Transformer3DModel defaults,
which tests/fixtures/sparse.py also uses for the release) with `--blocks` transformer blocks instead of 50. Random
weights are drawn on the GPU, kept bf16 with the release's f32 islands (diffusers' _keep_in_fp32_modules), and written
once as an official-layout checkpoint (FL2VA/model_index.json + transformer/{config.json, model.safetensors}, all that
h3_init and h3_dit_denoise need); diffusers runs the very same tensors.

Shapes are WIDTHxHEIGHTxFRAMES:PROMPT_TOKENS. Tokens = text + 2 * audio latents + T * (h/2) * (w/2), with latent
h, w = pixels / 16, T = 5n + 2 for 17n + 5 frames and audio latents round(frames / 24 * 40): the defaults are 1,874,
7,135 and 37,838 tokens.

Columns, per transformer block, median over `--repeats` timed runs (CUDA events) unless said otherwise:
* libh3 cuda blocks: h3_dit_denoise with `--steps` grid points (steps - 1 forwards, as the engine runs them: text
  refined once, AdaLN precomputed), after one warm-up call; stack_ms_min of h3_dit_profile_json (the block stack
  alone, timed between two device waits) divided by the block count: the number comparable to one diffusers block.
* libh3 cuda fwd/blocks: forward_ms_min (the whole forward: patch projections, scatter, blocks, final layer, heads)
  divided by the block count: comparable to "diffusers fwd/blocks".
* diffusers eager / compiled: one MiniMaxH3TransformerBlock called with the arguments the model's forward gives it
  (captured from a full forward), eager and under torch.compile (default mode, static shapes; compile time reported).
* diffusers forward / blocks: the whole forward as its pipeline calls it (refiner, AdaLN projections and heads run
  inside every forward), divided by the block count: the number comparable to libh3's.
* attention alone: torch SDPA on [1, 56, L, 128] bf16 with the cuDNN backend and with the flash backend.
* vendor floor: bf16 torch.matmul of the block's four GEMMs (qkv, attention out, fc1, fc2) + the faster SDPA.
TFLOP/s counts the useful work of a block: 2 * L * (GEMM weights of the block) + 4 * L^2 * heads * head_dim.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

DEFAULT_SHAPES = "512x512x22:8,864x480x56:64,1344x768x124:128"
# --dry-run: the whole script at toy widths on the CPU (torch and libh3), to check it where there is no GPU.
DRY_CONFIG = dict(num_attention_heads=4, attention_head_dim=32, hidden_size=128, ffn_dim=256, text_dim=64, freq_dim=32,
                  time_embed_hidden_dim=128, time_embed_dim=64, rope_freq_dim=5)
DRY_SHAPES = "64x64x22:8,96x64x39:5"
DEV = "cuda"  # where torch runs; "cpu" only under --dry-run


def geometry(spec: str) -> dict:
    """WxHxF:TEXT -> latent geometry and token count (the pipeline's rules, see the module docstring)."""
    try:
        dims, text = spec.split(":")
        w, h, frames = (int(x) for x in dims.lower().split("x"))
        n_text = int(text)
    except ValueError:
        raise SystemExit(f"--shapes: '{spec}' is not WIDTHxHEIGHTxFRAMES:PROMPT_TOKENS") from None
    if w % 32 or h % 32 or (frames - 5) % 17 or frames < 22 or n_text < 1:
        raise SystemExit(f"--shapes: '{spec}': sides must be multiples of 32 and frames 17n + 5 (n >= 1)")
    lat_t = 5 * ((frames - 5) // 17) + 2
    audio = int(round(frames / 24 * 40))
    lh, lw = h // 16, w // 16
    return dict(spec=spec, width=w, height=h, frames=frames, n_text=n_text, lat_t=lat_t, lat_h=lh, lat_w=lw,
                audio=audio, tokens=n_text + 2 * audio + lat_t * (lh // 2) * (lw // 2))


def block_gemm_weights(cfg) -> int:
    """Weights of the four GEMMs of one block, from the config: qkv H->3A, out A->H, fc1 H->2F, fc2 F->H."""
    H, A, F = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"]
    return H * 3 * A + A * H + H * 2 * F + F * H


def block_flops(cfg, L: int) -> float:
    A = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return 2.0 * L * block_gemm_weights(cfg) + 4.0 * L * L * A


def cuda_ms(torch, fn, repeats: int, warmup: int = 1) -> list[float]:
    """Times of `fn` in ms by CUDA events, one event pair per call, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    if DEV == "cpu":
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def build_model(torch, blocks: int, seed: int, overrides: dict):
    """The released geometry with `blocks` blocks on the GPU: bf16 weights, f32 islands, random values."""
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.device(DEV):
        model = MiniMaxH3Transformer3DModel(num_layers=blocks, **overrides).eval()
    gen = torch.Generator(device=DEV).manual_seed(seed)
    keep = set(model._keep_in_fp32_modules or [])
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Scaled like a trained network's (unit-variance activations), so no bf16 overflow or denormal
            # traffic makes one engine's timing unrepresentative.
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=gen)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.normal_(1.0, 0.05, generator=gen)
            f32 = any(part in keep for part in name.split("."))
            p.data = p.data.to(torch.float32 if f32 else torch.bfloat16)
    return model


def write_checkpoint(torch, model, root: Path) -> None:
    """The model's tensors in the official layout (tests/fixtures), written once for libh3."""
    from tests import dit_support as ds
    from tests.fixtures import official as fx

    off = fx.dit_state_dict_to_official(model.state_dict(), int(model.config.num_attention_heads),
                                        model.rope.inv_freq.clone())
    cpu = {n: t.to(fx.official_dit_dtype(n, "official")).to("cpu").contiguous() for n, t in off.items()}
    del off
    ds.write_checkpoint(model, root, "official", tensors=cpu)


def diffusers_inputs(torch, model, g: dict, seed: int) -> dict:
    """Forward kwargs as the pipeline gives them at its second step: f32 latent rows, bf16 prompt, on the GPU."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3SetTimestepsStep, patchify_video_latents)

    from tests import dit_support as ds

    gen = torch.Generator().manual_seed(seed)
    pe = torch.randn(1, g["n_text"], model.config.text_dim, generator=gen)
    lat = torch.randn(1, 24, g["lat_t"], g["lat_h"], g["lat_w"], generator=gen)
    aud = torch.randn(2, 32, g["audio"], generator=gen)
    pos, tags, vidx, aidx, tidx, ncv, nca = ds.t2va_layout(model, g["n_text"], g["lat_t"], g["lat_h"], g["lat_w"],
                                                            g["audio"])
    sv, sa = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    sv.set_timesteps(20)
    sa.set_timesteps(20)
    ts, tsi = MiniMaxH3SetTimestepsStep.build_row_timesteps(vidx, aidx, ncv, nca, g["n_text"], float(sv.timesteps[1]),
                                                            float(sa.timesteps[1]), 0.999, 1.0)
    kw = dict(hidden_states=patchify_video_latents(lat, (1, 2, 2))[None], audio_hidden_states=
              aud.permute(0, 2, 1).reshape(-1, 32)[None], encoder_hidden_states=pe.to(torch.bfloat16), timestep=ts,
              timestep_indices=tsi, token_tags=tags, position_ids=pos, video_indices=vidx, audio_indices=aidx,
              text_indices=tidx)
    assert pos.shape[0] == g["tokens"], (pos.shape[0], g["tokens"])
    return {k: v.to(DEV) for k, v in kw.items()}, (pe[0].numpy(), lat[0].numpy(), aud.numpy())


def bench_libh3(ctx, tr, host_inputs, steps: int, blocks: int) -> dict:
    pe, lat, aud = host_inputs
    tr.denoise(ctx, pe, lat, aud, 2)  # warm-up: weights on the GPU, kernels and GEMM plans chosen
    t0 = time.perf_counter()
    _, _, evals = tr.denoise(ctx, pe, lat, aud, steps)
    wall = time.perf_counter() - t0
    prof = tr.profile(ctx)
    return {"forward_ms_min": prof["forward_ms_min"], "forward_ms_mean": prof["forward_ms_mean"],
            "block_ms": prof["stack_ms_min"] / blocks, "forward_per_block_ms": prof["forward_ms_min"] / blocks,
            "stack_ms_min": prof["stack_ms_min"], "forwards": evals, "denoise_wall_s": wall,
            "prepare_ms": prof.get("prepare_ms"), "refine_ms": prof.get("refine_ms"),
            "parts_ms": prof.get("forward_parts_ms", {})}


def bench_diffusers(torch, model, kw, repeats: int, compile_: bool) -> dict:
    captured = {}

    def grab(module, args):
        captured.setdefault("args", args)

    hook = model.transformer_blocks[0].register_forward_pre_hook(grab)
    with torch.no_grad():
        fwd = cuda_ms(torch, lambda: model(**kw, return_dict=False), max(2, repeats // 2), warmup=1)
    hook.remove()
    blocks = len(model.transformer_blocks)
    block = model.transformer_blocks[0]
    args = captured["args"]
    out = {"forward_ms": statistics.median(fwd), "forward_per_block_ms": statistics.median(fwd) / blocks}
    with torch.no_grad():
        out["eager_block_ms"] = statistics.median(cuda_ms(torch, lambda: block(*args), repeats, warmup=2))
        if compile_:
            try:
                cblock = torch.compile(block, dynamic=False)
                t0 = time.perf_counter()
                cblock(*args)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                out["compile_s"] = time.perf_counter() - t0
                out["compiled_block_ms"] = statistics.median(cuda_ms(torch, lambda: cblock(*args), repeats,
                                                                     warmup=2))
            except Exception as e:  # noqa: BLE001  a compiler failure is a result to report, not a crash
                out["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def bench_vendor(torch, cfg, L: int, repeats: int) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, heads, D, Fd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["attention_head_dim"], cfg["ffn_dim"]
    A = heads * D
    gen = torch.Generator(device=DEV).manual_seed(3)
    bf = dict(device=DEV, dtype=torch.bfloat16)
    x = torch.randn(L, H, generator=gen, **bf)
    wqkv, wo = torch.randn(3 * A, H, generator=gen, **bf) * 0.01, torch.randn(H, A, generator=gen, **bf) * 0.01
    w1, w2 = torch.randn(2 * Fd, H, generator=gen, **bf) * 0.01, torch.randn(H, Fd, generator=gen, **bf) * 0.01
    att = torch.randn(L, A, generator=gen, **bf)
    act = torch.randn(L, Fd, generator=gen, **bf)

    def gemms():
        torch.matmul(x, wqkv.t())
        torch.matmul(att, wo.t())
        torch.matmul(x, w1.t())
        torch.matmul(act, w2.t())

    out = {"gemm_ms": statistics.median(cuda_ms(torch, gemms, repeats, warmup=2))}
    q, k, v = (torch.randn(1, heads, L, D, generator=gen, **bf) for _ in range(3))
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out[f"sdpa_{name}_ms"] = statistics.median(
                    cuda_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v), repeats, warmup=2))
        except RuntimeError as e:  # a backend this build or GPU lacks: reported, not fatal
            out[f"sdpa_{name}_ms"] = None
            out[f"sdpa_{name}_error"] = str(e).splitlines()[0]
    best = [t for t in (out["sdpa_cudnn_ms"], out["sdpa_flash_ms"]) if t]
    out["floor_ms"] = out["gemm_ms"] + min(best) if best else None
    return out


def bench_vendor_fp8(torch, cfg, L: int, repeats: int) -> dict:
    """The block's four GEMMs as torch's rowwise-scaled fp8 matmuls (e4m3, one scale per row of each operand, bf16
    out): the fp8 GEMM floor, in the same run."""
    H, A, Fd = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"]
    f8 = torch.float8_e4m3fn
    gen = torch.Generator(device=DEV).manual_seed(4)

    def q(rows, cols):
        return (torch.randn(rows, cols, generator=gen, device=DEV) * 0.1).to(f8)

    def s(n, col):
        return torch.ones((n, 1) if col else (1, n), device=DEV, dtype=torch.float32)

    mats = [(q(L, H), q(3 * A, H)), (q(L, A), q(H, A)), (q(L, H), q(2 * Fd, H)), (q(L, Fd), q(H, Fd))]

    def gemms():
        for a, w in mats:
            torch._scaled_mm(a, w.t(), scale_a=s(a.shape[0], True), scale_b=s(w.shape[0], False),
                             out_dtype=torch.bfloat16)

    try:
        return {"fp8_gemm_ms": statistics.median(cuda_ms(torch, gemms, repeats, warmup=2))}
    except (RuntimeError, AttributeError) as e:  # a torch without rowwise fp8 on this GPU: reported
        return {"fp8_gemm_ms": None, "fp8_gemm_error": str(e).splitlines()[0]}


def rel_l2(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=2, help="transformer blocks in the checkpoint (default 2)")
    ap.add_argument("--shapes", help=f"WxHxFRAMES:PROMPT_TOKENS,... (default {DEFAULT_SHAPES})")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    ap.add_argument("--steps", type=int, default=4, help="libh3 grid points per timed denoise (steps - 1 forwards)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--ckpt", help="folder for the checkpoint (kept; reused when it already holds one); "
                                   "default: a temporary folder, removed at the end")
    ap.add_argument("--threads", type=int, default=8, help="libh3 CPU threads (prompt/layout work)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--fp8", action="store_true",
                    help="also libh3 with fp8 block weights (h3_options.precision): ms per block, the velocity's "
                         "rel-L2 against the bf16 path, and torch's rowwise fp8 GEMMs as the fp8 floor")
    ap.add_argument("--fp8-attention", action="store_true",
                    help="also libh3 with fp8 attention (H3_OPT_FP8_ATTENTION: cuDNN's fp8 SDPA in the blocks), over "
                         "bf16 weights and over fp8 weights: ms per block, attention ms, velocity rel-L2 vs bf16")
    ap.add_argument("--dry-run", action="store_true",
                    help=f"toy widths on the CPU (torch and libh3), shapes {DRY_SHAPES}: checks the script, no GPU")
    args = ap.parse_args()
    if args.blocks < 1 or args.repeats < 1 or args.steps < 2:
        ap.error("--blocks and --repeats must be >= 1 and --steps >= 2")
    global DEV
    DEV = "cpu" if args.dry_run else "cuda"
    shapes = [geometry(s) for s in (args.shapes or (DRY_SHAPES if args.dry_run else DEFAULT_SHAPES)).split(",") if s]

    import torch

    from h3ctl import _lib
    from h3ctl import transformer as tr
    from h3ctl.context import Context

    cuda = _lib.backends()["cuda"]
    if not cuda.get("available") and not args.dry_run:
        print(f"bench_cuda_dit: libh3's CUDA backend is not available: {cuda.get('reason')}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and not args.dry_run:
        print("bench_cuda_dit: torch sees no GPU", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    model = build_model(torch, args.blocks, seed=0, overrides=DRY_CONFIG if args.dry_run else {})
    cfg = dict(model.config)
    tmp = None
    if args.ckpt:
        root = Path(args.ckpt)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="h3_bench_cuda_dit_")
        root = Path(tmp.name)
    t0 = time.perf_counter()
    reuse = (root / "FL2VA" / "transformer" / "model.safetensors").is_file() and json.loads(
        (root / "FL2VA" / "transformer" / "config.json").read_text()).get("num_layers") == args.blocks
    if not reuse:
        write_checkpoint(torch, model, root)
    else:  # the same seed draws the same weights, so a kept checkpoint matches this model
        print(f"reusing the checkpoint in {root}")
    write_s = time.perf_counter() - t0
    gemm_w = block_gemm_weights(cfg)
    print(f"model: {'toy widths (--dry-run)' if args.dry_run else 'released widths'}, {args.blocks} blocks, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
          f"params (built {t0 - t_start:.1f} s, checkpoint written {write_s:.1f} s); GEMM weights per block "
          f"{gemm_w / 1e6:.1f}M (from the config: qkv {cfg['hidden_size']}->{3 * cfg['num_attention_heads'] * cfg['attention_head_dim']}, "
          f"out, fc1 ->{2 * cfg['ffn_dim']}, fc2)", flush=True)

    rows = []
    with Context(root, threads=args.threads, device="cpu" if args.dry_run else "cuda") as ctx:
        device_desc = ctx.device_description
        for g in shapes:
            L = g["tokens"]
            kw, host = diffusers_inputs(torch, model, g, seed=1)
            t0 = time.perf_counter()
            r = {"shape": g, "tokens": L, "flops_per_block": block_flops(cfg, L)}
            r["libh3"] = bench_libh3(ctx, tr, host, args.steps, args.blocks)
            if args.fp8 or args.fp8_attention:  # one forward's velocity (output latents minus input) on the bf16 path, for the fp8 check
                v, a, _ = tr.denoise(ctx, host[0], host[1], host[2], 2)
                r["_ref"] = (v - host[1], a - host[2])
            r["diffusers"] = bench_diffusers(torch, model, kw, args.repeats, not args.no_compile)
            del kw
            r["vendor"] = bench_vendor(torch, cfg, L, args.repeats)
            r["wall_s"] = time.perf_counter() - t0
            if DEV == "cuda":
                torch.cuda.empty_cache()
            rows.append(r)
            print(f"{g['spec']} ({L} tokens) measured in {r['wall_s']:.1f} s: libh3 {r['libh3']['block_ms']:.2f} "
                  f"ms/block, diffusers eager {r['diffusers']['eager_block_ms']:.2f}", flush=True)

    # Reduced-precision variants: (result key, label, weight precision, extra H3_OPT_* flags).
    variants = [("libh3_fp8", "fp8 weights", "fp8", 0)] if args.fp8 else []
    if args.fp8_attention:
        variants += [("libh3_fp8attn", "fp8 attention", "default", _lib.H3_OPT_FP8_ATTENTION),
                     ("libh3_fp8_fp8attn", "fp8 weights + attention", "fp8", _lib.H3_OPT_FP8_ATTENTION)]
    for key, label, prec, flags in variants if not args.dry_run else []:
        with Context(root, threads=args.threads, device="cuda", precision=prec, flags=flags) as ctx8:
            for r in rows:
                g = r["shape"]
                _, host = diffusers_inputs(torch, model, g, seed=1)
                r[key] = bench_libh3(ctx8, tr, host, args.steps, args.blocks)
                v, a, _ = tr.denoise(ctx8, host[0], host[1], host[2], 2)
                rv, ra = r["_ref"]
                r[key]["rel_l2_video"] = rel_l2(v - host[1], rv)
                r[key]["rel_l2_audio"] = rel_l2(a - host[2], ra)
                print(f"{g['spec']} {label}: libh3 {r[key]['block_ms']:.2f} ms/block (parts, ms per forward: "
                      f"{ {k: round(v, 2) for k, v in r[key]['parts_ms'].items()} }), velocity rel-L2 vs bf16 "
                      f"{r[key]['rel_l2_video']:.2e} (video) {r[key]['rel_l2_audio']:.2e} (audio)", flush=True)
    if args.fp8 and not args.dry_run:
        for r in rows:
            r["vendor"].update(bench_vendor_fp8(torch, cfg, r["tokens"], args.repeats))
    for r in rows:
        r.pop("_ref", None)

    def tf(ms, fl):
        return fl / (ms * 1e-3) / 1e12 if ms else float("nan")

    cols = [(f"libh3 {DEV} blocks", lambda r: r["libh3"]["block_ms"]),
            (f"libh3 {DEV} fwd/blocks", lambda r: r["libh3"]["forward_per_block_ms"]),
            ("diffusers eager", lambda r: r["diffusers"]["eager_block_ms"]),
            ("diffusers compiled", lambda r: r["diffusers"].get("compiled_block_ms")),
            ("diffusers fwd/blocks", lambda r: r["diffusers"]["forward_per_block_ms"]),
            ("GEMMs (cuBLAS)", lambda r: r["vendor"]["gemm_ms"]),
            ("SDPA cuDNN", lambda r: r["vendor"]["sdpa_cudnn_ms"]),
            ("SDPA flash", lambda r: r["vendor"]["sdpa_flash_ms"]),
            ("floor GEMMs+SDPA", lambda r: r["vendor"]["floor_ms"])]
    for key, label, _, _ in variants if not args.dry_run else []:
        cols.append((f"libh3 {label}"[:21], lambda r, key=key: r.get(key, {}).get("block_ms")))
    if args.fp8 and not args.dry_run:
        cols += [
                 ("fp8 GEMMs (torch)", lambda r: r["vendor"].get("fp8_gemm_ms")),
                 ("fp8 floor GEMMs+SDPA", lambda r: (r["vendor"]["fp8_gemm_ms"] + min(
                     t for t in (r["vendor"]["sdpa_cudnn_ms"], r["vendor"]["sdpa_flash_ms"]) if t))
                  if r["vendor"].get("fp8_gemm_ms") else None)]
    env = {"gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "none (--dry-run)",
           "libh3_device": device_desc, "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
           "diffusers": __import__("diffusers").__version__, "blocks": args.blocks, "repeats": args.repeats,
           "libh3_steps": args.steps, "gemm_weights_per_block": gemm_w, "config": {k: (list(v) if isinstance(
               v, tuple) else v) for k, v in cfg.items() if not k.startswith("_")}}
    for r in rows:
        d = r["diffusers"]
        if "compile_s" in d:
            print(f"torch.compile of one block at {r['tokens']} tokens took {d['compile_s']:.1f} s")
        for k in ("compile_error",):
            if k in d:
                print(f"torch.compile failed at {r['tokens']} tokens: {d[k]}")
        for k in ("sdpa_cudnn_error", "sdpa_flash_error"):
            if k in r["vendor"]:
                print(f"{k} at {r['tokens']} tokens: {r['vendor'][k]}")
    total = time.perf_counter() - t_start
    print(f"total {total:.1f} s")
    # The table comes last, so the tail of a log is the result.
    print(f"\n{env['gpu']}; libh3 {device_desc}; torch {env['torch']}, cuDNN {env['cudnn']}, diffusers "
          f"{env['diffusers']}; {args.blocks} blocks; medians of {args.repeats}; libh3 = min forward of "
          f"{args.steps - 1} / {args.blocks}")
    print("ms per block (TFLOP/s: GEMMs + attention of a block; the GEMM and SDPA rows count their own FLOPs)")
    print(f"{'':22}" + "".join(f"{r['shape']['spec'] + ' (' + format(r['tokens'], ',') + ')':>30}" for r in rows))
    for label, get in cols:
        cells = []
        for r in rows:
            ms = get(r)
            fl = r["flops_per_block"]
            if label.startswith("SDPA"):
                fl = 4.0 * r["tokens"] ** 2 * cfg["num_attention_heads"] * cfg["attention_head_dim"]
            elif label.startswith("GEMMs") or label.startswith("fp8 GEMMs"):
                fl = 2.0 * r["tokens"] * gemm_w
            cells.append(f"{ms:>10.2f} ms ({tf(ms, fl):6.1f} TF/s)" if ms else f"{'n/a':>28}")
        print(f"{label:22}" + "".join(f"{c:>30}" for c in cells))
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows, "total_s": total}, indent=2))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
