"""The text encoder and both decoders at the released widths on one GPU: libh3's CUDA backend next to diffusers /
transformers (bf16 pipeline dtype) on the same GPU, in one run (not a test: prints a table, writes JSON).

    PYTHONPATH=python python3 tests/bench_cuda_stages.py [--only video,audio,text] [--video-layers 36]
                                                          [--text-layers 2] [--repeats 3] [--out stages.json]

* video: the released video VAE decoder (36 ViT layers, 32 heads x 64, ffn x4, 4 registers, 256 px tiles over 64 px
  overlaps, 17-frame clips; diffusers' AutoencoderKLMiniMaxH3 defaults, with a token encoder since decoding never
  reads it) at 864x480x56 (latents 17 x 30 x 54) and 1344x768x124 (37 x 48 x 84). Random weights drawn on the GPU,
  written once in the official layout with the release's F32 dtype. libh3: h3_video_decode to uint8 frames, the
  whole call: it loads the decoder (9.7 GB of f32 read from the page cache, rounded to bf16 on the GPU), decodes
  every tile and window, blends on the GPU and writes the frames to host memory; "load" is a 1-tile decode, which
  is mostly that loading. diffusers: vae.decode of the same latents with its default tiling (256 / 64 px), the model
  as a bf16 pipeline holds it (norms, layer scales in f32), already on the GPU. Anchors measured earlier on an H200:
  diffusers 1.51 s / 7.56 s.
* audio: the released audio VAE (BigVGAN, 1024 -> 8 channels over rates 5,5,2,2,2,2,2, resblocks 3/7/11) decoding
  2.3 s (93 latents, the 56-frame render) and 5.2 s (207, 124 frames) of stereo. libh3: h3_audio_decode, whole call
  (weights read, weight norm folded on the host, uploaded, decoded in f32); diffusers: the decode step's arithmetic on
  the resident model, which diffusers keeps in f32 at any pipeline dtype (anchors 43 / 49 ms).
* text: the Qwen3-VL language model at the release's widths (hidden 5120, 64 query / 8 kv heads of 128, MLP 25600,
  vocab 151936) with `--text-layers` layers, prompts of 64 and 128 tokens. libh3: h3_text_encode with the prompt
  cache off, the whole call: it streams each layer's 0.93 GB of bf16 from the page cache to the GPU, then computes
  (the design that keeps the text encoder's memory at two layers); transformers: the resident bf16 model's forward.
  Per layer = the call divided by the layer count.

Times: libh3 the best of `--repeats` calls after one warm-up call (wall clock, the call returns with the outputs on the
host); torch the median of `--repeats` by CUDA events after a warm-up. The whole run takes about two minutes on an
H200 (most of it writing the 9.7 GB video checkpoint); `--dry-run` runs it at toy widths on the CPU.
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

DEV = "cuda"
VIDEO_SHAPES = [(864, 480, 56), (1344, 768, 124)]
AUDIO_FRAMES = [93, 207]
TEXT_TOKENS = [64, 128]
# --dry-run: toy widths (CPU, libh3 on its CPU backend) to check the script where there is no GPU.
DRY_VIDEO = dict(decoder_num_layers=2, decoder_num_attention_heads=2, decoder_attention_head_dim=16)
DRY_VIDEO_SHAPES = [(64, 64, 22), (96, 64, 39)]
DRY_AUDIO = dict(encoder_dim=4, encoder_rates=(4, 5, 3), latent_dim=64, num_attention_heads=1, decoder_dim=24,
                 decoder_rates=(4, 5, 3), decoder_kernel_sizes=(9, 5, 8), resblock_kernel_sizes=(5, 3),
                 resblock_dilation_sizes=((1, 2), (3, 4)), sampling_rate=24000)
DRY_AUDIO_FRAMES = [8, 20]
DRY_TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                vocab_size=1000)


def cuda_ms(torch, fn, repeats: int, warmup: int = 1) -> float:
    """Median ms of `fn` (CUDA events; wall clock on the CPU) after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if DEV == "cpu":
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def best_s(fn, repeats: int, warmup: int = 1):
    """(best wall seconds over `repeats` calls after `warmup` untimed ones, the last result)."""
    out = None
    for _ in range(warmup):
        out = fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def init_params_(torch, model, seed: int) -> None:
    """Random values drawn on the model's device, scaled like a trained network's (fixtures' rules): norm weights
    ~ 1, biases small, layer scales U(0.1, 0.3), weight-norm gains U(0.5, 1), snake parameters small, embeddings
    0.5 N, other weights N(0, 1 / fan_in)."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for _, mod in model.named_modules():
            cls = type(mod).__name__
            is_norm = "Norm" in cls and "Attention" not in cls
            for name, p in mod.named_parameters(recurse=False):
                if name in ("scale1", "scale2"):
                    p.uniform_(0.1, 0.3, generator=gen)
                elif name == "register_tokens" or isinstance(mod, torch.nn.Embedding):
                    p.normal_(0.0, 0.5, generator=gen)
                elif name == "weight_g":
                    p.uniform_(0.5, 1.0, generator=gen)
                elif cls.endswith("SnakeBeta") or cls.endswith("Snake1d"):
                    p.normal_(0.0, 0.2, generator=gen)
                elif is_norm and name == "weight":
                    p.normal_(1.0, 0.1, generator=gen)
                elif name.endswith("bias") or p.dim() < 2:
                    p.normal_(0.0, 0.05, generator=gen)
                else:
                    p.normal_(0.0, 1.0 / math.sqrt(max(1, p.numel() // p.shape[0])), generator=gen)


def to_pipeline_dtype(torch, model) -> None:
    """In place: what from_pretrained(torch_dtype=torch.bfloat16) keeps (diffusers' _keep_in_fp32_modules rule)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    for name, p in model.named_parameters():
        p.data = p.data.to(torch.float32 if any(part in keep for part in name.split(".")) else torch.bfloat16)


def save_cpu(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(path))


# ---- video --------------------------------------------------------------------------------------------------------


def bench_video(torch, root: Path, args, out: dict) -> None:
    from diffusers import AutoencoderKLMiniMaxH3

    from h3ctl.parity import vae_video as PV
    from h3ctl.context import Context
    from tests.fixtures import official as fx

    cfg = dict(block_out_channels=(32,) * 6, norm_num_groups=8)  # the encoder is never read by decoding
    cfg.update(DRY_VIDEO if args.dry_run else dict(decoder_num_layers=args.video_layers))
    t0 = time.perf_counter()
    with torch.device(DEV):
        vae = AutoencoderKLMiniMaxH3(**cfg, latents_mean=tuple(0.1 * ((i % 5) - 2) for i in range(24)),
                                     latents_std=tuple(0.8 + 0.05 * (i % 7) for i in range(24))).eval()
    init_params_(torch, vae, seed=1)
    top, src = fx.video_vae_official_configs(dict(vae.config))
    part = root / "video" / "FL2VA"
    d = part / "video_vae"
    (d / "source").mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(top, indent=1))
    (d / "source" / "config.json").write_text(json.dumps(src, indent=1))
    save_cpu(fx.video_vae_state_dict_to_official(vae.state_dict(), int(vae.config.decoder_num_attention_heads)),
             d / "source" / "model.safetensors")
    out["video_setup_s"] = time.perf_counter() - t0
    to_pipeline_dtype(torch, vae)
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = 256
    vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = 64
    mean = torch.tensor(vae.config.latents_mean, device=DEV).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=DEV).view(1, -1, 1, 1, 1)
    device = "cpu" if args.dry_run else "cuda"
    shapes = DRY_VIDEO_SHAPES if args.dry_run else VIDEO_SHAPES
    rows = []
    with Context(part, threads=args.threads, device=device) as ctx:
        small = torch.randn(24, 3, 2, 2, generator=torch.Generator().manual_seed(0)).numpy()  # one 32 px tile
        load_s, _ = best_s(lambda: PV.decode(ctx, small, want_pixels=False), max(1, args.repeats - 1))
        for w, h, frames in shapes:
            T = 5 * ((frames - 5) // 17) + 2
            lat = torch.randn(24, T, h // 16, w // 16, generator=torch.Generator().manual_seed(frames)).numpy()
            # one warm-up call at the first shape only: a tile's GEMM plans are the same at every canvas
            h3_s, (rgb, _) = best_s(lambda: PV.decode(ctx, lat, want_pixels=False), 1 if frames > 60 else args.repeats,
                                    warmup=0 if rows else 1)
            z = torch.from_numpy(lat).to(DEV)[None] * std + mean
            if DEV == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                d_ms = cuda_ms(torch, lambda: vae.decode(z, return_dict=False), 1, warmup=0 if rows else 1)
            peak = torch.cuda.max_memory_allocated() / 2**30 if DEV == "cuda" else None
            rows.append({"shape": f"{w}x{h}x{frames}", "latents": [24, T, h // 16, w // 16],
                         "frames": int(rgb.shape[0]), "libh3_s": h3_s, "diffusers_s": d_ms / 1e3,
                         "speedup": d_ms / 1e3 / h3_s, "diffusers_peak_gib": peak})
            print(f"video {w}x{h}x{frames}: libh3 {h3_s:.2f} s (load ~{load_s:.2f} s), diffusers {d_ms / 1e3:.2f} s",
                  flush=True)
    out["video"] = {"layers": int(vae.config.decoder_num_layers), "load_s": load_s, "rows": rows}
    del vae
    if DEV == "cuda":
        torch.cuda.empty_cache()


# ---- audio --------------------------------------------------------------------------------------------------------


def bench_audio(torch, root: Path, args, out: dict) -> None:
    from diffusers import AutoencoderKLMiniMaxH3Audio

    from h3ctl.context import Context
    from h3ctl.parity.vae_audio import audio_decode
    from tests.fixtures import official as fx

    t0 = time.perf_counter()
    mean = [0.1 * ((i % 5) - 2) for i in range(32)]
    std = [0.8 + 0.05 * (i % 7) for i in range(32)]
    with torch.device(DEV):
        model = AutoencoderKLMiniMaxH3Audio(**(DRY_AUDIO if args.dry_run else {}), latents_mean=mean,
                                            latents_std=std).eval()
    init_params_(torch, model, seed=2)
    d = root / "audio" / "FL2VA" / "audio_vae"
    d.mkdir(parents=True, exist_ok=True)
    top, meta = fx.audio_vae_official_configs(dict(model.config))
    (d / "config.json").write_text(json.dumps(top))
    (d / "metadata.json").write_text(json.dumps(meta))
    save_cpu({k: v.float() for k, v in model.state_dict().items()}, d / "model.safetensors")
    out["audio_setup_s"] = time.perf_counter() - t0
    to_pipeline_dtype(torch, model)  # diffusers pins the decoder to f32: nothing it runs changes
    m_t = torch.tensor(mean, device=DEV).view(1, -1, 1)
    s_t = torch.tensor(std, device=DEV).view(1, -1, 1)
    rows = []
    with Context(root / "audio", threads=args.threads, device="cpu" if args.dry_run else "cuda") as ctx:
        for frames in DRY_AUDIO_FRAMES if args.dry_run else AUDIO_FRAMES:
            lat = torch.randn(2, 32, frames, generator=torch.Generator().manual_seed(frames)).numpy()
            h3_s, pcm = best_s(lambda: audio_decode(ctx, lat), args.repeats)
            z = torch.from_numpy(lat).to(DEV) * s_t + m_t
            with torch.no_grad():
                d_ms = cuda_ms(torch, lambda: model.decode(z, return_dict=False), args.repeats)
                ref = model.decode(z, return_dict=False)[0].float().cpu().numpy().reshape(2, -1)
            err = float(((pcm - ref) ** 2).sum() ** 0.5 / max((ref ** 2).sum() ** 0.5, 1e-30))
            rows.append({"latents": frames, "seconds": pcm.shape[1] / model.config.sampling_rate,
                         "libh3_ms": h3_s * 1e3, "diffusers_ms": d_ms, "speedup": d_ms / (h3_s * 1e3), "rel_l2": err})
            print(f"audio {frames} latents ({pcm.shape[1] / model.config.sampling_rate:.1f} s): libh3 {h3_s * 1e3:.0f} "
                  f"ms, diffusers {d_ms:.0f} ms, rel-L2 {err:.1e}", flush=True)
    out["audio"] = {"rows": rows}
    del model


# ---- text ---------------------------------------------------------------------------------------------------------


def bench_text(torch, root: Path, args, out: dict) -> None:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from h3ctl import text
    from h3ctl.context import Context

    layers = args.text_layers
    t_cfg = dict(DRY_TEXT) if args.dry_run else dict(hidden_size=5120, intermediate_size=25600,
                                                     num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                                                     vocab_size=151936)
    vocab = t_cfg["vocab_size"]
    # One layer more than the conditioning layer (libh3 requires it, as the release has 64 for 50); it is never
    # written: libh3 does not read it, transformers runs it (its time per layer divides by layers + 1).
    t_cfg.update(num_hidden_layers=layers + 1, rms_norm_eps=1e-6, max_position_embeddings=4096,
                 rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                  "mrope_interleaved": True})
    if args.dry_run:
        t_cfg["rope_parameters"]["mrope_section"] = [4, 2, 2]
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=t_cfg["hidden_size"],
                  num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(text_config=t_cfg, vision_config=vision, tie_word_embeddings=False,
                        image_token_id=vocab - 4, video_token_id=vocab - 3, vision_start_token_id=vocab - 2,
                        vision_end_token_id=vocab - 1)
    t0 = time.perf_counter()
    with torch.device(DEV):
        model = Qwen3VLForConditionalGeneration(cfg).eval().requires_grad_(False)
    lm = model.model.language_model
    init_params_(torch, lm, seed=3)
    for p in model.parameters():  # the checkpoint's dtype and the pipeline's: bf16 (buffers such as inv_freq f32)
        p.data = p.data.to(torch.bfloat16)
    d = root / "text" / "FL2VA" / "text_encoder"
    d.mkdir(parents=True, exist_ok=True)
    c = model.config.to_dict()
    c["architectures"] = ["Qwen3VLForConditionalGeneration"]
    c["dtype"] = "bfloat16"
    c["minimax_h3_conditioning_layer"] = layers
    (d / "config.json").write_text(json.dumps(c, indent=1))
    skip = f"model.language_model.layers.{layers}."
    sd = {k: v for k, v in model.state_dict().items()
          if k.startswith("model.language_model.") and not k.startswith(skip)}
    save_cpu(sd, d / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in sd}}))
    del sd
    out["text_setup_s"] = time.perf_counter() - t0
    rows = []
    with Context(root / "text", threads=args.threads, device="cpu" if args.dry_run else "cuda") as ctx:
        text.set_cache_budget(ctx, 0)  # every call computes
        for n in TEXT_TOKENS:
            ids = torch.randint(0, vocab - 8, (n,), generator=torch.Generator().manual_seed(n))
            h3_s, emb = best_s(lambda: text.encode(ctx, ids.numpy()), args.repeats)
            t = ids.to(DEV)[None]
            kw = dict(input_ids=t, attention_mask=torch.ones_like(t), mm_token_type_ids=torch.zeros_like(t),
                      use_cache=False, output_hidden_states=True)
            with torch.no_grad():
                t_ms = cuda_ms(torch, lambda: model.model(**kw), args.repeats)
                ref = model.model(**kw).hidden_states[layers][0].float().cpu().numpy()
            err = float(((emb - ref) ** 2).sum() ** 0.5 / max((ref ** 2).sum() ** 0.5, 1e-30))
            t_layer = t_ms / (layers + 1)
            rows.append({"tokens": n, "libh3_ms": h3_s * 1e3, "libh3_ms_per_layer": h3_s * 1e3 / layers,
                         "transformers_ms": t_ms, "transformers_ms_per_layer": t_layer, "rel_l2": err})
            print(f"text {n} tokens, {layers} layers: libh3 {h3_s * 1e3:.0f} ms ({h3_s * 1e3 / layers:.1f} per layer, "
                  f"weights streamed), transformers {t_layer:.2f} ms per layer (resident), rel-L2 {err:.1e}",
                  flush=True)
    out["text"] = {"layers": layers, "rows": rows}
    del model


def table(out: dict) -> str:
    lines = ["| stage | case | libh3 cuda | diffusers / transformers bf16 | ratio | note |", "|" + " --- |" * 6]
    for r in out.get("video", {}).get("rows", []):
        load = out["video"]["load_s"]
        lines.append(f"| video decode | {r['shape']} ({r['frames']} frames) | {r['libh3_s']:.2f} s | "
                     f"{r['diffusers_s']:.2f} s | {r['speedup']:.2f}x | libh3's call loads the weights (a 1-tile "
                     f"decode: {load:.2f} s); without: ~{r['libh3_s'] - load:.2f} s, "
                     f"{r['diffusers_s'] / max(r['libh3_s'] - load, 1e-9):.2f}x |")
    for r in out.get("audio", {}).get("rows", []):
        lines.append(f"| audio decode | {r['seconds']:.1f} s of stereo | {r['libh3_ms']:.0f} ms | "
                     f"{r['diffusers_ms']:.0f} ms | {r['speedup']:.2f}x | rel-L2 {r['rel_l2']:.1e}; libh3 incl. "
                     "loading |")
    for r in out.get("text", {}).get("rows", []):
        lines.append(f"| text encoder, {out['text']['layers']} layers | {r['tokens']} tokens | "
                     f"{r['libh3_ms_per_layer']:.1f} ms / layer | {r['transformers_ms_per_layer']:.2f} ms / layer | "
                     f"{r['transformers_ms_per_layer'] / r['libh3_ms_per_layer']:.3f}x | libh3 streams each layer's "
                     f"weights; rel-L2 {r['rel_l2']:.1e} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="video,audio,text", help="comma-separated stages (video, audio, text)")
    ap.add_argument("--video-layers", type=int, default=36, help="video decoder layers (the release: 36)")
    ap.add_argument("--text-layers", type=int, default=2, help="text encoder layers at the released widths")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measurement")
    ap.add_argument("--threads", type=int, default=8, help="libh3 CPU threads")
    ap.add_argument("--ckpt", help="folder for the checkpoints (default: a temporary folder, removed at the end)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--dry-run", action="store_true", help="toy widths on the CPU: checks the script, no GPU")
    args = ap.parse_args()
    stages = [s for s in args.only.split(",") if s]
    if set(stages) - {"video", "audio", "text"} or args.repeats < 1 or args.video_layers < 1 or args.text_layers < 1:
        ap.error("--only takes video, audio, text; --repeats and the layer counts must be >= 1")
    global DEV
    DEV = "cpu" if args.dry_run else "cuda"

    import torch

    from h3ctl import _lib

    if not args.dry_run:
        cuda = _lib.backends()["cuda"]
        if not cuda.get("available"):
            print(f"bench_cuda_stages: libh3's CUDA backend is not available: {cuda.get('reason')}", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("bench_cuda_stages: torch sees no GPU", file=sys.stderr)
            return 2
    t_start = time.perf_counter()
    tmp = None if args.ckpt else tempfile.TemporaryDirectory(prefix="h3_bench_cuda_stages_")
    root = Path(args.ckpt) if args.ckpt else Path(tmp.name)
    out = {"machine": {"gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
                       "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}}
    try:
        for stage in stages:
            {"video": bench_video, "audio": bench_audio, "text": bench_text}[stage](torch, root, args, out)
            if DEV == "cuda":
                torch.cuda.empty_cache()
    finally:
        if tmp:
            tmp.cleanup()
    out["total_s"] = time.perf_counter() - t_start
    print(table(out))
    print(f"total {out['total_s']:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
