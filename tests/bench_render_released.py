"""A whole render at the released widths on one GPU, phase by phase: libh3's `h3ctl render` path next to diffusers'
pipeline stages, both extrapolated to the released depth (not a test: prints a table, writes JSON).

    PYTHONPATH=python python3 tests/bench_render_released.py [--shapes 864x480x56,1344x768x124] [--blocks 4]
                                                             [--text-layers 4] [--steps 3] [--no-compile]
                                                             [--out render.json] [--dry-run]

Checkpoint: generated on the GPU with torch (random values scaled like a trained network's), written once in the
official MiniMaxAI/MiniMax-H3 layout (FL2VA/: model_index.json, transformer/, text_encoder/, video_vae/,
audio_vae/, tokenizer/): the released widths everywhere, with `--blocks` transformer blocks (the release: 50),
`--text-layers` text-encoder layers before the conditioning layer (the release conditions on hidden_states[50] of
its 64 Qwen3-VL layers) and the FULL decoders (36-layer video decoder in the release's f32, the full BigVGAN audio
decoder). The text encoder's vocabulary and the vision tower are the test fixtures' small ones (a render reads only
the prompt's embedding rows, and a text-only render never runs the vision tower); everything the render computes
is at the released size. The video VAE's encoder is a small one (a text-to-video render never encodes video).

libh3: Engine.render(profile=True) on the CUDA backend (what `h3ctl render --profile` prints), two renders per
shape in one context with different prompts: the first ("cold": decoder weights uploaded, GEMM plans chosen), the
second ("warm": the decoders' weights and the text encoder's layers kept on the GPU by the first). Phases: text
(tokenizer + text encoder: streamed in the cold render, from the kept layers in the warm one), load transformer (open + upload of the blocks, refined text, AdaLN tables),
denoise (`--steps` grid points: steps - 1 forwards), audio decode, video decode, then writing the MP4 (the bundled
ffmpeg) timed apart.

diffusers / transformers (bf16 pipeline dtype, models resident on the GPU, as a pipeline holds them): the text
encoder's forward (Qwen3VLModel to hidden_states[layers]), one transformer forward with the kwargs the pipeline
gives it (median of `--repeats`; one block also under torch.compile unless --no-compile), the video VAE's tiled
decode (256 / 64 px) and the audio VAE's decode of the same latent shapes. Times by CUDA events after a warm-up.

Extrapolation to the release (50 blocks, 50 text layers, 20 steps = 19 forwards):
* text: the measured phase / layers x 50 (tokenizer and embedding rows are noise). The warm render's layers are the
  kept ones: the release's 50 (~46 GiB) are kept by default only where the GPU's free memory less them still holds
  the transformer plus 16 GiB (an H200 does; an 80 GB card does not, and streams them: the cold column).
`--fp8`: the same renders in a second context with fp8 weights and fp8 attention, extrapolated the same way.
* denoise, ours: forwards x (fixed + 50 x block), fixed = forward_ms_mean - stack_ms_mean and block =
  stack_ms_mean / blocks from libh3's transformer profile, + the phase's time outside the forwards.
  diffusers: 19 x (forward - blocks x block + 50 x block), block = one block's eager time (compiled: its compiled
  time, the rest of the forward eager).
* decoders: measured at full size.
* the total adds text + denoise + both decodes (the model resident: "load transformer" is listed apart, and so is
  writing the MP4, which diffusers' numbers leave out).
The whole run takes about four minutes on an H200 (writing ~17 GB of checkpoint is most of the first minute);
`--dry-run` runs it at toy widths on the CPU (checks the script's plumbing, no GPU).
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

from tests import bench_cuda_dit as bdit  # noqa: E402
from tests import bench_cuda_stages as bst  # noqa: E402

DEFAULT_SHAPES = "864x480x56,1344x768x124"
DRY_SHAPES = "64x64x22"
FULL_BLOCKS, FULL_STEPS = 50, 20
PROMPTS = ("a red fox runs through fresh snow at dawn, wind and birdsong",
           "waves roll onto a pebble beach under a grey sky, surf and gulls",
           "a paper boat drifts down a rain gutter in the city, rain and traffic",
           "a drummer plays on a rooftop at sunset, drums and distant sirens")
RENDERS = 2  # per shape: a cold one, then the warm one the tables report
RELEASED_TEXT = dict(hidden_size=5120, intermediate_size=25600, num_attention_heads=64, num_key_value_heads=8,
                     head_dim=128)
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
                   temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64,
                   deepstack_visual_indexes=[0], hidden_act="gelu_pytorch_tanh")
DEV = "cuda"


def geometry(spec: str) -> dict:
    w, h, frames = (int(x) for x in spec.lower().split("x"))
    if w % 32 or h % 32 or frames < 22 or (frames - 5) % 17:
        raise SystemExit(f"--shapes: '{spec}': sides must be multiples of 32 and frames 17n + 5 (n >= 1)")
    return dict(spec=spec, width=w, height=h, frames=frames, lat_t=5 * ((frames - 5) // 17) + 2, lat_h=h // 16,
                lat_w=w // 16, audio=int(round(frames / 24 * 40)))


def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


# ---- the checkpoint -----------------------------------------------------------------------------------------------


def build_and_write(torch, root: Path, args) -> dict:
    """Build the four models on the device, write the official layout, return them (bf16 pipeline dtype)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
    from safetensors.torch import save_file
    from transformers import Qwen3VLForConditionalGeneration

    from tests.fixtures import official as fx
    from tests.fixtures import tokenizer as ftok

    timings = {}
    pdir = root / "FL2VA"
    t0 = time.perf_counter()
    # transformer: bench_cuda_dit's released geometry (bf16 with the f32 islands), `--blocks` blocks
    dit = bdit.build_model(torch, args.blocks, seed=0, overrides=bdit.DRY_CONFIG if args.dry_run else {})
    text_dim = int(dit.config.text_dim)
    tok_json = ftok.build_tokenizer_json(128)
    vocab = ftok.padded_vocab_size(tok_json)
    special = fx._special_ids_for(tok_json)
    t_cfg = dict(bst.DRY_TEXT) if args.dry_run else dict(RELEASED_TEXT)
    t_cfg.update(vocab_size=vocab, num_hidden_layers=args.text_layers + 1, rms_norm_eps=1e-6,
                 max_position_embeddings=4096,
                 rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                  "mrope_section": [4, 2, 2] if args.dry_run else [24, 20, 20],
                                  "mrope_interleaved": True})
    assert t_cfg["hidden_size"] == text_dim, (t_cfg["hidden_size"], text_dim)
    section = {"text_config": t_cfg, "vision_config": dict(TINY_VISION, out_hidden_size=text_dim),
               "conditioning_layer": args.text_layers}
    te_config = fx._qwen3vl_config(section, vocab, special)
    with torch.device(DEV):
        te = Qwen3VLForConditionalGeneration(te_config).eval().requires_grad_(False)
    bst.init_params_(torch, te, seed=3)
    for p in te.parameters():
        p.data = p.data.to(torch.bfloat16)
    # video VAE: the released decoder (or the dry run's), a small encoder that decoding never reads
    vcfg = dict(block_out_channels=(32,) * 6, norm_num_groups=8)
    vcfg.update(bst.DRY_VIDEO if args.dry_run else {})
    with torch.device(DEV):
        vae = AutoencoderKLMiniMaxH3(**vcfg, latents_mean=tuple(0.1 * ((i % 5) - 2) for i in range(24)),
                                     latents_std=tuple(0.8 + 0.05 * (i % 7) for i in range(24))).eval()
        # the dry run's audio VAE: the tiny fixture's (32 kHz, hop 800 like the release, as the DiT's audio rows
        # assume); bench_cuda_stages' DRY_AUDIO has another hop
        avae = AutoencoderKLMiniMaxH3Audio(**(fx.TINY_CONFIGS["tiny"]["audio_vae"] if args.dry_run else {}),
                                           latents_mean=[0.1 * ((i % 5) - 2) for i in range(32)],
                                           latents_std=[0.8 + 0.05 * (i % 7) for i in range(32)]).eval()
    bst.init_params_(torch, vae, seed=1)
    bst.init_params_(torch, avae, seed=2)
    timings["build_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    models = {"transformer": dit, "text_encoder": te, "video_vae": vae, "audio_vae": avae}
    for rel, obj in fx.official_json_files(models, "official", "FL2VA").items():
        fx._write_json(pdir / rel, obj)
    off = fx.dit_state_dict_to_official(dit.state_dict(), int(dit.config.num_attention_heads),
                                        dit.rope.inv_freq.clone())
    (pdir / "transformer").mkdir(parents=True, exist_ok=True)
    save_file({n: t.to(fx.official_dit_dtype(n, "official")).to("cpu").contiguous() for n, t in off.items()},
              str(pdir / "transformer" / "model.safetensors"), metadata={"format": "pt"})
    del off
    # text encoder: bf16 as released, in one shard with its index; the layer past the conditioning one is never
    # read by libh3 (transformers needs it to exist), so it is not written
    skip = f"model.language_model.layers.{args.text_layers}."
    sd = {k: v for k, v in te.state_dict().items() if not k.startswith(skip)}
    shard = "model-00001-of-00001.safetensors"
    bst.save_cpu(sd, pdir / "text_encoder" / shard)
    fx._write_json(pdir / "text_encoder" / "model.safetensors.index.json",
                   {"metadata": {}, "weight_map": {k: shard for k in sorted(sd)}})
    del sd
    bst.save_cpu(fx.video_vae_state_dict_to_official(vae.state_dict(), int(vae.config.decoder_num_attention_heads)),
                 pdir / "video_vae" / "source" / "model.safetensors")
    bst.save_cpu({k: v.float() for k, v in avae.state_dict().items()}, pdir / "audio_vae" / "model.safetensors")
    fx.write_tokenizer(tok_json, pdir, root)
    timings["write_s"] = time.perf_counter() - t0
    timings["gb"] = sum(f.stat().st_size for f in pdir.rglob("*.safetensors")) / 1e9
    bst.to_pipeline_dtype(torch, vae)
    bst.to_pipeline_dtype(torch, avae)
    models["timings"] = timings
    return models


def park(torch, models: dict, device: str) -> None:
    for m in models.values():
        m.to(device)
    if DEV == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---- libh3 --------------------------------------------------------------------------------------------------------


def bench_libh3(root: Path, shapes: list[dict], args, frames: dict | None = None, **engine_kw) -> dict:
    """Two renders per shape in one context (module docstring); `frames`, when given, receives the last render's
    frames of each shape (the same prompt and seed in every context: the fp8 renders are compared with them)."""
    from h3ctl import Engine, media

    out, runs_by_shape = {}, []
    with Engine(root, threads=args.threads, device="cpu" if args.dry_run else "cuda", **engine_kw) as eng:
        out["device"] = eng.device_description
        for g in shapes:
            runs = []
            for i in range(RENDERS):
                prompt = PROMPTS[(len(runs_by_shape) * RENDERS + i) % len(PROMPTS)]  # never a prompt-cache hit
                t0 = time.perf_counter()
                r = eng.render(prompt, g["width"], g["height"], g["frames"], steps=args.steps, seed=i,
                               profile=True, **({"schedule": args.schedule} if args.schedule else {}))
                wall = time.perf_counter() - t0
                write_s = None
                if i == RENDERS - 1:  # the MP4 once per shape (ffmpeg on the CPU: the same every time)
                    with tempfile.TemporaryDirectory(prefix="h3_bench_render_") as tmp:
                        t1 = time.perf_counter()
                        try:
                            media.write_mp4(Path(tmp) / "out.mp4", r.frames, r.audio, r.sample_rate, fps=r.fps)
                            write_s = time.perf_counter() - t1
                        except media.H3Error as e:  # a GPU image without the bundled ffmpeg: no write column
                            print(f"write skipped: {e}", flush=True)
                tp = dict(eng.last_transformer_profile)
                phases = {row["phase"]: row for row in r.profile}
                runs.append({"prompt_tokens": int(len(eng.prompt_tokens())), "wall_s": wall, "write_s": write_s,
                             "phases": phases, "transformer": {k: tp.get(k) for k in (
                                 "forwards", "forward_ms_mean", "forward_ms_min", "stack_ms_mean", "stack_ms_min",
                                 "refine_ms", "prepare_ms", "transformer_ms", "layers_run")},
                             "frames": list(r.frames.shape), "audio_samples": int(r.audio.shape[1])})
                print(f"libh3{' ' + str(engine_kw) if engine_kw else ''} {g['spec']} render {i + 1}: {wall:.2f} s: "
                      + ", ".join(
                    f"{p} {row['wall_s']:.2f} s" for p, row in phases.items())
                      + (f"; write {write_s:.2f} s" if write_s is not None else ""), flush=True)
            out[g["spec"]] = runs
            runs_by_shape.append(g["spec"])
            if frames is not None:
                frames[g["spec"]] = r.frames
    return out


def frame_quality(ref: dict, got: dict) -> dict:
    """PSNR over every frame and SSIM over every 8th (SSIM's float64 windows over a whole 1344x768x124 video would
    take ~30 GB) of `got` against `ref`, per shape: the fp8 render against the bf16 one (same prompt, seed)."""
    from tests import quality

    out = {}
    for spec, f in got.items():
        out[spec] = {"psnr_db": quality.psnr(f, ref[spec]), "ssim": quality.ssim(f[::8], ref[spec][::8])}
        print(f"fp8 weights + fp8 attention vs bf16, {spec}: frames PSNR {out[spec]['psnr_db']:.2f} dB, SSIM "
              f"{out[spec]['ssim']:.4f}", flush=True)
    return out


CACHE_HIT_S = 0.005  # an encode this short came from the prompt cache (a 4-layer encode streams ~4 GB)


def extrapolate_libh3(run: dict, args, text_s: float | None = None) -> dict:
    """A full render from one measured render: the text encoder per layer (`text_s`: a warm, uncached encode when
    this render's prompt came from the cache), the block stack per block and the rest of a forward once per forward
    (both their fastest forward: a render's first forward also builds the GEMM plans and the attention graphs), the
    decoders as measured."""
    ph, tp = run["phases"], run["transformer"]

    def wall(name):
        return ph.get(name, {}).get("wall_s", 0.0)

    enc = wall("encode prompt") if wall("encode prompt") >= CACHE_HIT_S or text_s is None else text_s
    text = enc / args.text_layers * args.full_text_layers
    fwd, stack, n = tp["forward_ms_min"] / 1e3, tp["stack_ms_min"] / 1e3, tp["forwards"]
    block = stack / args.blocks
    outside = max(0.0, wall("denoise") - tp["transformer_ms"] / 1e3)
    denoise = outside + (args.full_steps - 1) * (fwd - stack + FULL_BLOCKS * block)
    out = {"text_s": text, "text_encode_s": enc, "denoise_s": denoise, "audio_decode_s": wall("decode audio"),
           "video_decode_s": wall("decode video"), "block_ms": block * 1e3, "forward_fixed_ms": (fwd - stack) * 1e3,
           "forwards_measured": n, "load_transformer_s_measured": wall("load transformer"),
           "load_transformer_s_full": wall("load transformer") * FULL_BLOCKS / args.blocks, "write_s": run["write_s"],
           "peak_device_gib": max((row.get("peak_device_bytes") or 0) for row in ph.values()) / 2**30}
    out["total_s"] = out["text_s"] + out["denoise_s"] + out["audio_decode_s"] + out["video_decode_s"]
    return out


# ---- diffusers ----------------------------------------------------------------------------------------------------


def bench_diffusers(torch, models: dict, shapes: list[dict], n_text: dict, args) -> dict:
    dit, te, vae, avae = models["transformer"], models["text_encoder"], models["video_vae"], models["audio_vae"]
    vae.use_tiling = True
    vae.tile_sample_min_height = vae.tile_sample_min_width = 256
    vae.tile_sample_min_overlap_height = vae.tile_sample_min_overlap_width = 64
    vmean = torch.tensor(vae.config.latents_mean, device=DEV).view(1, -1, 1, 1, 1)
    vstd = torch.tensor(vae.config.latents_std, device=DEV).view(1, -1, 1, 1, 1)
    amean = torch.tensor(avae.config.latents_mean, device=DEV).view(1, -1, 1)
    astd = torch.tensor(avae.config.latents_std, device=DEV).view(1, -1, 1)
    out = {}
    for gi, g in enumerate(shapes):
        n = n_text[g["spec"]]
        r = {"prompt_tokens": n}
        ids = torch.randint(0, te.config.text_config.vocab_size - 8, (1, n), generator=torch.Generator().manual_seed(n))
        ids = ids.to(DEV)
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=torch.zeros_like(ids),
                  use_cache=False, output_hidden_states=True)
        with torch.no_grad():
            r["text_ms"] = bst.cuda_ms(torch, lambda: te.model(**kw), args.repeats)
        # hidden_states[layers] needs layers + 1 layers to run in transformers: per layer = forward / (layers + 1)
        r["text_ms_per_layer"] = r["text_ms"] / (args.text_layers + 1)
        dg = bdit.geometry(f"{g['width']}x{g['height']}x{g['frames']}:{n}")
        fkw, _ = bdit.diffusers_inputs(torch, dit, dg, seed=1)
        r["transformer"] = bdit.bench_diffusers(torch, dit, fkw, args.repeats, not args.no_compile)
        del fkw
        lat = torch.randn(1, 24, g["lat_t"], g["lat_h"], g["lat_w"], generator=torch.Generator().manual_seed(5))
        z = lat.to(DEV) * vstd + vmean
        with torch.no_grad():
            r["video_decode_ms"] = bst.cuda_ms(torch, lambda: vae.decode(z, return_dict=False), 1,
                                               warmup=0 if gi else 1)
        del z
        alat = torch.randn(2, 32, g["audio"], generator=torch.Generator().manual_seed(6))
        za = alat.to(DEV) * astd + amean
        with torch.no_grad():
            # (the dry run skips the warm-up: torch's CPU BigVGAN is its slowest part)
            r["audio_decode_ms"] = bst.cuda_ms(torch, lambda: avae.decode(za, return_dict=False), args.repeats,
                                               warmup=0 if args.dry_run else 1)
        if DEV == "cuda":
            torch.cuda.empty_cache()
        t = r["transformer"]
        print(f"diffusers {g['spec']}: text {r['text_ms_per_layer']:.1f} ms/layer, forward {t['forward_ms']:.1f} ms "
              f"({t['eager_block_ms']:.2f} ms/block eager"
              + (f", {t['compiled_block_ms']:.2f} compiled" if t.get("compiled_block_ms") else "")
              + f"), video decode {r['video_decode_ms'] / 1e3:.2f} s, audio decode {r['audio_decode_ms']:.0f} ms",
              flush=True)
        out[g["spec"]] = r
    return out


def extrapolate_diffusers(r: dict, args) -> dict:
    t = r["transformer"]
    fixed = t["forward_ms"] - args.blocks * t["eager_block_ms"]
    out = {"text_s": r["text_ms_per_layer"] * args.full_text_layers / 1e3,
           "denoise_s": (args.full_steps - 1) * (fixed + FULL_BLOCKS * t["eager_block_ms"]) / 1e3,
           "video_decode_s": r["video_decode_ms"] / 1e3, "audio_decode_s": r["audio_decode_ms"] / 1e3,
           "block_ms": t["eager_block_ms"], "forward_fixed_ms": fixed}
    if t.get("compiled_block_ms"):
        out["denoise_compiled_s"] = (args.full_steps - 1) * (fixed + FULL_BLOCKS * t["compiled_block_ms"]) / 1e3
    out["total_s"] = out["text_s"] + out["denoise_s"] + out["video_decode_s"] + out["audio_decode_s"]
    if "denoise_compiled_s" in out:
        out["total_compiled_s"] = out["total_s"] - out["denoise_s"] + out["denoise_compiled_s"]
    return out


# ---- report -------------------------------------------------------------------------------------------------------


def table(res: dict, args) -> str:
    lines = []
    for spec, ex in res["extrapolated"].items():
        ours, dif = ex["libh3"], ex["diffusers"]
        comp = dif.get("total_compiled_s")
        cold = ex["libh3_cold"]
        lines += [f"\n{spec}: extrapolated to {FULL_BLOCKS} blocks, {args.full_text_layers} text layers, "
                  f"{args.full_steps} steps ({args.full_steps - 1} forwards"
                  + (f", schedule {args.schedule}" if getattr(args, "schedule", None) else "") + "); libh3 = the warm render",
                  f"| phase | libh3 | diffusers bf16 | note |", "|" + " --- |" * 4,
                  f"| text encoder | {ours['text_s']:.2f} s | {dif['text_s']:.2f} s | libh3: the layers the cold render "
                  f"kept on the GPU (streamed in the cold render: {cold['text_s']:.2f} s); diffusers resident |",
                  f"| denoise | {ours['denoise_s']:.2f} s | {dif['denoise_s']:.2f} s"
                  + (f" ({dif['denoise_compiled_s']:.2f} s compiled)" if "denoise_compiled_s" in dif else "")
                  + f" | {ours['block_ms']:.2f} vs {dif['block_ms']:.2f} ms per block |",
                  f"| video decode | {ours['video_decode_s']:.2f} s | {dif['video_decode_s']:.2f} s | full decoder |",
                  f"| audio decode | {ours['audio_decode_s']:.2f} s | {dif['audio_decode_s']:.2f} s | full decoder |",
                  f"| **total** | **{ours['total_s']:.2f} s** | **{dif['total_s']:.2f} s**"
                  + (f" ({comp:.2f} s compiled)" if comp else "") + " | model resident |",
                  f"| load transformer | {ours['load_transformer_s_full']:.1f} s | - | measured "
                  f"{ours['load_transformer_s_measured']:.2f} s x {FULL_BLOCKS}/{args.blocks}; not in the total |",
                  f"| write MP4 | " + (f"{ours['write_s']:.2f} s" if ours["write_s"] is not None else "-")
                  + " | - | not in the total" + ("" if ours["write_s"] is not None else "; no ffmpeg on this machine")
                  + " |",
                  f"| peak device memory | {ours['peak_device_gib']:.1f} GiB | - | {args.blocks}-block checkpoint |"]
        fp8 = ex.get("libh3_fp8")
        if fp8:
            q = res.get("fp8_quality", {}).get(spec)
            lines += [f"| **total, libh3 fp8 weights + fp8 attention** | **{fp8['total_s']:.2f} s** | - | text "
                      f"{fp8['text_s']:.2f} s, denoise {fp8['denoise_s']:.2f} s ({fp8['block_ms']:.2f} ms per block), "
                      f"video {fp8['video_decode_s']:.2f} s, audio {fp8['audio_decode_s']:.2f} s"
                      + (f"; frames vs bf16 {q['psnr_db']:.1f} dB PSNR, SSIM {q['ssim']:.3f}" if q else "") + " |"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help=f"WIDTHxHEIGHTxFRAMES,... (default {DEFAULT_SHAPES})")
    ap.add_argument("--blocks", type=int, default=4, help="transformer blocks in the checkpoint (the release: 50)")
    ap.add_argument("--text-layers", type=int, default=4, help="text-encoder layers (the release conditions on 50)")
    ap.add_argument("--full-text-layers", type=int, default=50,
                    help="the release's conditioning layer: text layers a full render runs (default 50)")
    ap.add_argument("--steps", type=int, default=3, help="libh3 grid points per render (steps - 1 forwards)")
    ap.add_argument("--full-steps", type=int, default=None,
                    help="grid points of the render the tables extrapolate to (default 20 = 19 forwards; 5 = the "
                         "4-evaluation few-step render of issue #26: then give --steps 5 too, measured = reported); "
                         "with --report it replaces the saved run's (9 = an 8-evaluation render from the same "
                         "measurements)")
    ap.add_argument("--schedule", default=None, help="the sigma grid by name (h3ctl.schedules, e.g. turbo-544p for "
                    "a 4-step Turbo render); speed does not depend on it, the frames do")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per diffusers measurement (median)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile of a diffusers block")
    ap.add_argument("--threads", type=int, default=8, help="libh3 CPU threads")
    ap.add_argument("--fp8", action="store_true", help="also render with libh3's fp8 weights and fp8 attention (a "
                    "second context; reported next to bf16)")
    ap.add_argument("--ckpt", help="folder for the checkpoint (default: a temporary folder, removed at the end)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--dry-run", action="store_true", help=f"toy widths on the CPU, shapes {DRY_SHAPES}: checks the "
                                                           "script's plumbing, no GPU")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a saved run (its --out file) again, with "
                    "this script's arithmetic; no GPU, nothing measured")
    args = ap.parse_args()
    if args.report:
        res = json.loads(Path(args.report).read_text())
        for k, v in res["config"].items():
            if k in ("blocks", "text_layers", "full_text_layers", "steps", "full_steps", "schedule") \
                    and not (k == "full_steps" and args.full_steps is not None):
                setattr(args, k, v)
        args.full_steps = args.full_steps or FULL_STEPS
        return report(res, [geometry(s) for s in res["diffusers"]], args)
    if args.full_steps is None:
        args.full_steps = FULL_STEPS
    if args.blocks < 1 or args.text_layers < 1 or args.steps < 2 or args.repeats < 1 or args.full_text_layers < 1 \
            or args.full_steps < 2:
        ap.error("--blocks, --text-layers, --full-text-layers and --repeats must be >= 1, --steps and --full-steps "
                 ">= 2")
    global DEV
    DEV = "cpu" if args.dry_run else "cuda"
    bdit.DEV = bst.DEV = DEV
    if args.dry_run:
        args.no_compile = True
    shapes = [geometry(s) for s in (args.shapes or (DRY_SHAPES if args.dry_run else DEFAULT_SHAPES)).split(",") if s]

    import torch

    from h3ctl import _lib

    if not args.dry_run:
        cuda = _lib.backends()["cuda"]
        if not cuda.get("available"):
            print(f"bench_render_released: libh3's CUDA backend is not available: {cuda.get('reason')}",
                  file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("bench_render_released: torch sees no GPU", file=sys.stderr)
            return 2
    t_start = time.perf_counter()
    tmp = None if args.ckpt else tempfile.TemporaryDirectory(prefix="h3_bench_render_released_")
    root = Path(args.ckpt) if args.ckpt else Path(tmp.name)
    res = {"machine": {"gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
                       "torch": torch.__version__, "diffusers": __import__("diffusers").__version__,
                       "python": platform.python_version()},
           "config": {"blocks": args.blocks, "text_layers": args.text_layers, "full_blocks": FULL_BLOCKS,
                      "full_text_layers": args.full_text_layers, "full_steps": args.full_steps, "steps": args.steps,
                      "schedule": args.schedule}}
    try:
        models = build_and_write(torch, root, args)
        res["checkpoint"] = models.pop("timings")
        print(f"checkpoint: {res['checkpoint']['gb']:.1f} GB built in {res['checkpoint']['build_s']:.1f} s, written "
              f"in {res['checkpoint']['write_s']:.1f} s", flush=True)
        # libh3 renders with the torch models off the GPU, so its device peaks are its own (plus torch's context)
        park(torch, models, "cpu")
        bf16_frames, fp8_frames = {}, {}
        res["libh3"] = bench_libh3(root, shapes, args, bf16_frames)
        if args.fp8:
            res["libh3_fp8"] = bench_libh3(root, shapes, args, fp8_frames, precision="fp8", fp8_attention=True)
            res["fp8_quality"] = frame_quality(bf16_frames, fp8_frames)
            del bf16_frames, fp8_frames
        park(torch, models, DEV)
        n_text = {g["spec"]: res["libh3"][g["spec"]][-1]["prompt_tokens"] for g in shapes}
        res["diffusers"] = bench_diffusers(torch, models, shapes, n_text, args)
        del models
    finally:
        if tmp:
            tmp.cleanup()
    res["total_s"] = time.perf_counter() - t_start
    return report(res, shapes, args)


def warm_text_s(res: dict, shapes: list) -> float | None:
    """The encode time of the last warm render whose prompt was not in the cache (None when there is none)."""
    got = None
    for g in shapes:
        for run in res["libh3"][g["spec"]][1:]:
            t = run["phases"].get("encode prompt", {}).get("wall_s", 0.0)
            if t >= CACHE_HIT_S:
                got = t
    return got


def report(res: dict, shapes: list, args) -> int:
    text_s = warm_text_s(res, shapes)
    res["extrapolated"] = {g["spec"]: {"libh3": extrapolate_libh3(res["libh3"][g["spec"]][-1], args, text_s),
                                       "libh3_cold": extrapolate_libh3(res["libh3"][g["spec"]][0], args),
                                       "diffusers": extrapolate_diffusers(res["diffusers"][g["spec"]], args)}
                           for g in shapes}
    if res.get("libh3_fp8"):
        fp8 = {"libh3": res["libh3_fp8"]}
        fp8_text = warm_text_s(fp8, shapes)
        for g in shapes:
            res["extrapolated"][g["spec"]]["libh3_fp8"] = extrapolate_libh3(res["libh3_fp8"][g["spec"]][-1], args,
                                                                            fp8_text)
    print(f"\n{res['machine']['gpu']}; libh3 {res['libh3']['device']}; torch {res['machine']['torch']}, diffusers "
          f"{res['machine']['diffusers']}; checkpoint with {args.blocks} blocks, {args.text_layers} text layers, "
          f"full decoders; run took {res['total_s']:.0f} s")
    print(table(res, args))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
