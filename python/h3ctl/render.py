"""`h3ctl render`: a prompt to an MP4 with synchronized stereo sound (plus optional WAV / frames)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import _lib
from ._lib import H3Error

PHASE_LABELS = {
    "tokenize": "encode prompt",
    "vision_encoder": "encode prompt",
    "video_encode": "encode frames",
    "audio_encode": "encode audio",
    "text_encoder": "encode prompt",
    "prepare": "prepare",
    "denoise": "denoise",
    "audio_decode": "decode audio",
    "video_decode": "decode video",
}


class _Reference(argparse.Action):
    """--ref-image / --ref-video / --ref-silent-video / --ref-audio: each value also goes to args.references as
    (kind, value), so the order of all reference options is kept (it is the order the model reads them in)."""

    KINDS = {"ref_image": "image", "ref_video": "video", "ref_silent_video": "silent_video", "ref_audio": "audio"}

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(getattr(namespace, self.dest) or []) + [values])
        kind = self.KINDS[self.dest]
        namespace.references = list(getattr(namespace, "references", None) or []) + [(kind, values)]

def add_arguments(p) -> None:
    p.add_argument("-p", "--prompt", required=True, help="what to render (used verbatim)")
    p.add_argument("-d", "--model-dir", help="model directory (official layout, or a ComfyUI models/ folder); "
                   "default: the embedded h3-tiny")
    from .components import add_arguments as add_component_arguments

    add_component_arguments(p)
    p.add_argument("-o", "--output", default="out.mp4", help="MP4 to write (default out.mp4; '' for none)")
    p.add_argument("--width", type=int, help="pixels, a multiple of 32 (default: the model's)")
    p.add_argument("--height", type=int, help="pixels, a multiple of 32 (default: the model's)")
    p.add_argument("--size", help="WxH shorthand for --width/--height")
    p.add_argument("--first-frame", metavar="IMG", help="start the video on this image (PNG, JPEG, WebP, GIF, BMP); "
                   "without a size the canvas follows its aspect (FL2VA)")
    p.add_argument("--last-frame", metavar="IMG", help="end the video on this image (stretched to the canvas, or "
                   "cover-cropped to it with --first-frame)")
    p.add_argument("--ref-image", metavar="IMG", action=_Reference, default=[],
                   help="a reference image (Ref2VA; repeatable, read in the order given); needs a model with Ref2VA/")
    p.add_argument("--ref-video", metavar="FILE", action=_Reference, default=[],
                   help="a reference video with its sound (Ref2VA; repeatable, at most 3; decoded with the bundled "
                   "ffmpeg, resampled to 24 fps; at least 13 frames at 24 fps)")
    p.add_argument("--ref-silent-video", metavar="FILE", action=_Reference, default=[],
                   help="a reference video without its sound (as --ref-video, the soundtrack dropped)")
    p.add_argument("--ref-audio", metavar="FILE", action=_Reference, default=[],
                   help="a reference sound (Ref2VA; repeatable, at most 3, needs a --ref-image too; decoded with the "
                   "bundled ffmpeg at its own rate, resampled by libh3); its place among the --ref-image options is kept")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--frames", type=int, help="frames at 24 fps, aligned up to 17n+5 (default: the model's)")
    g.add_argument("--seconds", type=float, help="duration; converted to frames at 24 fps and aligned up")
    p.add_argument("--steps", type=int, default=None, help="sigma grid points incl. the final 0 (default: the "
                   "preset's, else the model's: 20 for H3)")
    p.add_argument("--schedule", metavar="NAME", help="the sigma grid (h3, turbo-544p, turbo-768p, pdd, "
                   "h3c-lowstep; default: the one the model or LoRA declares, else h3); docs/few-step.md")
    p.add_argument("--seed", type=int, default=42, help="noise seed (default 42)")
    p.add_argument("--vae-tile", type=int, help="video decoder tile size in pixels (smaller = less memory; "
                   "default: the model's, 256 for H3)")
    p.add_argument("--frames-dir", help="also write every frame into this folder")
    p.add_argument("--frame-format", choices=["png", "ppm"], default="png", help="format of --frames-dir")
    p.add_argument("--wav", help="also write the audio as a 16-bit stereo WAV")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    p.add_argument("--threads", type=int, default=0, help="worker threads (default: all cores)")
    add_device_arguments(p)
    add_precision_argument(p)
    p.add_argument("--fp8-attention", action="store_true",
                   help="the transformer blocks' self-attention in fp8 (cuDNN's fp8 attention, CUDA on Hopper or "
                        "newer): faster at long clips, not exact; combines with any --precision")
    p.add_argument("--fp8-decoder", action="store_true",
                   help="the video decoder's layer GEMMs with fp8 weights (CUDA, compute capability 8.9+); not exact, "
                        "and measured slower than the bf16 decoder on an H200 (docs/few-step.md has its time and PSNR)")
    p.add_argument("--quantized", metavar="FILE",
                   help="with --precision fp8: the fp8 weights `h3ctl quantize` wrote from this model (with --ref2va "
                        "for renders with references), read instead of quantising at load; the output is the same "
                        "bytes. Refused with the reason when the file was made from another checkpoint")
    add_vram_argument(p)
    p.add_argument("--profile", action="store_true",
                   help="print each phase's wall time, peak RSS and (on a GPU) peak device memory to stderr")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.add_argument("--gpus", type=int, metavar="N", default=None,
                   help="split the transformer over N GPUs, one process each (sequence parallelism: N must divide "
                        "the model's attention heads; docs/multi-gpu.md). Rank 0 writes the outputs")
    from .showopts import add_preview_arguments

    add_preview_arguments(p)  # --show, --preview-every, --preview-protocol
    add_speed_arguments(p)


def add_speed_arguments(p) -> None:
    """--preset and the speed knobs (h3ctl.presets; `h3ctl presets` lists the presets with measured costs)."""
    from .presets import DEFAULT_PRESET, PRESETS

    g = p.add_argument_group("speed (quality for time; `h3ctl presets` shows each preset's measured cost)")
    g.add_argument("--preset", help=f"{', '.join(PRESETS)} (default {DEFAULT_PRESET}); knobs given below "
                                    "override the preset's")
    g.add_argument("--reuse", type=int, metavar="R", help="run the transformer at every R-th step only; "
                   "extrapolate the velocity between (0: off)")
    g.add_argument("--core-reuse", type=int, metavar="K", help="run the block stack at every K-th call only; "
                   "reuse its residual between (not with --reuse; 0: off)")
    g.add_argument("--layers", type=int, metavar="M", help="run M of the model's blocks (first two, last, and "
                   "the others by --layer-policy; 0: all of them, off)")
    g.add_argument("--layer-policy", choices=["gate", "uniform"], help="which blocks --layers keeps: largest "
                   "AdaLN gates (default) or evenly spaced")
    g.add_argument("--token-reduction", action="store_true", default=None,
                   help="average horizontally adjacent video tokens over the middle blocks")
    g.add_argument("--render-size", metavar="WxH", help="run the transformer and decoders at this smaller "
                   "canvas of the output's aspect; frames are resized (Lanczos-3) to the output size")
    g.add_argument("--cache-threshold", type=float, metavar="X", help="skip steps while the first block's "
                   "modulated input changes less than X in total (relative L1); reuses the last velocity")
    g.add_argument("--lora", action="append", metavar="FILE[:SCALE]", help="LoRA merged into the transformer "
                   "when it loads (diffusers or ComfyUI keys); repeatable")


def speed_knobs(args) -> dict:
    """The preset and knobs of parsed `render` arguments, as Engine.request takes them."""
    from .presets import DEFAULT_PRESET

    return {"preset": args.preset or DEFAULT_PRESET, "reuse": args.reuse, "core_reuse": args.core_reuse,
            "layers": args.layers, "layer_policy": args.layer_policy, "token_reduction": args.token_reduction,
            "render_size": args.render_size, "cache_threshold": args.cache_threshold, "lora": args.lora,
            "schedule": getattr(args, "schedule", None)}


def add_precision_argument(p) -> None:
    """--precision: how the transformer blocks' GEMM weights are held (h3_options.precision)."""
    p.add_argument("--precision", choices=["default", "bf16", "int8", "fp8"], default="default",
                   help="transformer block weights: default (= bf16; exact: the stored weights on the CPU, bf16 on a "
                        "GPU), int8 (CPU: int8 with a scale per output channel, half the memory of bf16) or fp8 "
                        "(CUDA, compute capability 8.9+); refused where the device cannot run it")


def add_vram_argument(p) -> None:
    """--vram: the transformer's weight budget in GiB (h3_options.vram_bytes)."""
    p.add_argument("--vram", metavar="GiB", default=None,
                   help="GiB the transformer's GEMM weights may hold on the device (default: auto, every block "
                        "resident when they fit the free GPU memory with 8 GiB to spare; the CPU keeps them all). "
                        "Blocks beyond the budget stream from host memory (CPU: from the shards, read ahead) through "
                        "two slots while the previous block computes; the output is byte-identical")


def add_device_arguments(p) -> None:
    """--device / --device-index, shared by every command that opens a model."""
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "metal"], default="auto",
                   help="where the model runs: auto (a GPU when the CUDA backend, or on a Mac the Metal backend, is "
                        "built and one answers, else the CPU), cpu, cuda or metal (fails when there is none). The "
                        "transformer, the text encoder "
                        "and both decoders run on that device (H3_STAGES_CPU=1 keeps the text encoder and the "
                        "decoders on the CPU)")
    p.add_argument("--device-index", type=int, default=0, metavar="N", help="GPU number for --device cuda/auto")


def _size(args):
    from . import limits

    if args.size:
        try:
            w, h = args.size.lower().split("x")
            w, h = int(w), int(h)
        except ValueError:
            raise H3Error(f"--size must look like 128x128, got '{args.size}'") from None
    else:
        w, h = args.width, args.height
    return (None if w is None else limits.side("width", w)), (None if h is None else limits.side("height", h))


def main(args) -> int:
    from . import limits

    if getattr(args, "gpus", None) is not None:
        from . import launch

        return launch.main(args)
    limits.threads(args.threads, "--threads")
    try:  # checked before anything is opened or written
        _lib.vram_bytes(getattr(args, "vram", None))
    except H3Error:
        raise H3Error(f"--vram must be a number of GiB between 0 (auto) and {_lib.VRAM_MAX_GIB}, got "
                      f"'{args.vram}'") from None
    width, height = _size(args)
    if getattr(args, "quantized", None):
        from .outputs import check_input

        check_input(args.quantized, f"--quantized {args.quantized}")
    from . import outputs as outs
    from .launch import rank

    if rank()[0] > 0:
        # a rank of a multi-GPU render other than 0: computes its share, writes nothing (rank 0 does)
        with outs.Signals() as sig:
            sig.computing = False
            args.wav = args.frames_dir = None
            return _render(args, width, height, None, {}, sig, quiet_summary=True)
    outputs = []
    out = args.output or None
    if out:
        outputs.append(outs.check_target(out, args.overwrite))
    if args.wav:
        outputs.append(outs.check_target(args.wav, args.overwrite))
    if not (out or args.wav or args.frames_dir):
        raise H3Error("nothing to write: give -o, --wav or --frames-dir")
    if out:
        from .media import ffmpeg_exe

        ffmpeg_exe()  # the MP4 writer's ffmpeg is missing: say so now, not after the render
    if len({str(Path(p).resolve()) for p in outputs}) != len(outputs):
        raise H3Error("the MP4 and the WAV must be different files")
    # Every output is reserved before any work: its temporary is created now (an unwritable folder fails
    # here), published without replacing what appeared meanwhile, and removed on any failure or signal.
    reserved = {}
    try:
        with outs.Signals() as sig:  # a signal before the render computes stops at once
            sig.computing = False
            if out:
                reserved["mp4"] = outs.Reserved(out, args.overwrite)
            if args.wav:
                reserved["wav"] = outs.Reserved(args.wav, args.overwrite)
            if args.frames_dir:
                reserved["frames"] = outs.ReservedDir(args.frames_dir, args.overwrite)
            return _render(args, width, height, out, reserved, sig)
    finally:
        for r in reserved.values():
            if not getattr(r, "done", False):
                r.discard()


def _render(args, width, height, out, reserved, sig, quiet_summary: bool = False) -> int:
    from . import media
    from . import outputs as outs
    from .engine import Engine, default_model_dir
    from .errors import Cancelled

    # Keyframes are decoded and checked before the model is opened.
    keyframes = {f"{k}_frame": media.read_image(v, f"{k} frame") if v else None
                 for k, v in (("first", args.first_frame), ("last", args.last_frame))}
    # References in the order given; audio is decoded once the model (its sample rate) is open.
    refs = []
    for i, (kind, v) in enumerate(getattr(args, "references", None) or [], 1):
        if kind == "image":
            refs.append(media.read_image(v, f"reference image {i}"))
        else:
            outs.check_input(v, f"reference {'audio' if kind == 'audio' else 'video'} {i}: {v}")
            refs.append((kind, v))
    from . import components

    parts = components.from_args(args)
    folder, files = components.resolve(args.model_dir, ref2va=bool(refs), **parts)  # before any model is read
    if files and components.needs_tokenizer(folder or default_model_dir(), files):
        raise H3Error("a render from single files needs the Qwen tokenizer, which h3ctl does not ship (only h3-tiny's "
                      "small one): give the official tokenizer/ folder with --tokenizer DIR, or -d the official folder")
    if refs and not files and not (Path(args.model_dir or default_model_dir()) / "Ref2VA").is_dir():
        which = ("--ref-image" if args.ref_image else "--ref-video" if args.ref_video else
                 "--ref-silent-video" if args.ref_silent_video else "--ref-audio")
        raise H3Error(f"{args.model_dir or 'the embedded h3-tiny'}: {which} needs a model with a Ref2VA/ folder")

    from . import presets

    # a few-step preset's fp8 weights where the GPU has them (an explicit --precision wins)
    precision = presets.gpu_precision(presets.get(args.preset or presets.DEFAULT_PRESET).knobs,
                                      getattr(args, "precision", "default"), args.device)
    engine = Engine(args.model_dir, threads=args.threads, device=args.device, device_index=args.device_index,
                    precision=precision, ref2va=bool(refs),
                    vram=getattr(args, "vram", None), fp8_attention=getattr(args, "fp8_attention", False),
                    fp8_decoder=getattr(args, "fp8_decoder", False),
                    quantized=getattr(args, "quantized", None), **parts)
    from .context import cpu_fallback_note

    note = cpu_fallback_note(args.device, engine.device)
    if note:
        print(f"h3ctl: {note}", file=sys.stderr, flush=True)
    # read now: the engine is closed before the profile is printed
    # where h3_stages_device says the text encoder and the decoders run (the device unless H3_STAGES_CPU=1)
    stages = getattr(engine, "stages_device", None) or engine.device
    device_line = f"device: {engine.device_description}; text encoder and decoders on the {stages}"
    knobs = speed_knobs(args)
    req = engine.request(args.prompt, width, height, args.frames, args.seconds, args.steps, args.seed, args.vae_tile,
                         **keyframes, references=refs or None, **knobs)
    plan = engine.plan(req)  # every shape rule checked before any work

    live = None
    if args.show and not quiet_summary:
        from .terminal import LivePreview

        live = LivePreview(engine, args.preview_protocol, args.preview_every,
                           notice=lambda msg: print(f"h3ctl: {msg}", file=sys.stderr, flush=True))
    profile = None
    if args.profile:
        from .profile import PhaseProfile

        profile = PhaseProfile(engine.device_memory_peak)
    progress_ui = None
    tasks = {}
    if not args.quiet and not (live is not None and live.active):  # previews own the terminal with --show
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        progress_ui = Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                               transient=False, disable=not sys.stderr.isatty(), console=None)

    def on_progress(phase: str, done: int, total: int):
        label = PHASE_LABELS.get(phase, phase)
        if live is not None:
            live.phase(phase, done, total)
        if progress_ui is not None:
            if label not in tasks:
                tasks[label] = progress_ui.add_task(label, total=total)
            progress_ui.update(tasks[label], completed=done, total=total)
        return False

    # SIGINT, SIGTERM and SIGHUP: while libh3 computes, ask it to stop at its next unit of work (a Python
    # exception cannot cross the C call); while files are written, interrupt at once. Either way the
    # temporaries are removed and nothing reaches a final name.
    sig.cancel = engine.cancel
    sig.computing = True
    sig.check()
    t0 = time.perf_counter()
    try:
        if progress_ui is not None:
            progress_ui.start()
        try:
            # the request built above: its keyframes and references were decoded once, for the plan and the render
            if quiet_summary:
                # a rank other than 0 of a multi-GPU render: its share of the transformer, no decoders (rank 0
                # decodes and writes)
                result = engine.run(req, progress=on_progress, decode=None, profile=profile)
            else:
                result = engine.render(req, progress=on_progress,
                                       preview=live.callback if live is not None and live.active else None,
                                       preview_every=args.preview_every, profile=profile)
        except Cancelled:
            sig.check()
            raise
        sig.computing = False
        sig.check()
        if engine.cancelled:
            raise outs.Interrupted()
        if profile:
            profile.enter("write outputs")
        if progress_ui is not None and (out or args.wav or args.frames_dir):
            tasks["mux"] = progress_ui.add_task("write outputs", total=None)
        for key, write in (("mp4", lambda p: media.write_mp4(p, result.frames, result.audio, result.sample_rate,
                                                             fps=result.fps)),
                           ("wav", lambda p: media.write_wav(p, result.audio, result.sample_rate))):
            if key in reserved:
                r = reserved[key]
                try:
                    write(r.tmp)
                except H3Error as e:
                    raise H3Error(outs.replace_path(str(e), r.tmp, r.final)) from None
        if "frames" in reserved:
            media.write_frames_dir(reserved["frames"].tmp, result.frames, args.frame_format, overwrite=True)
        # every file is complete: publish them (never over a file that appeared meanwhile)
        for key in ("mp4", "wav", "frames"):
            if key in reserved:
                reserved[key].publish()
                reserved[key].done = True
        if progress_ui is not None and "mux" in tasks:
            progress_ui.update(tasks["mux"], total=1, completed=1)
        if profile:
            profile.finish()
        if live is not None:
            t_show = time.perf_counter()
            live.finish(result.frames, result.fps)  # the final frames, once
            t0 += time.perf_counter() - t_show  # the summary's wall time leaves the animation out
    finally:
        if live is not None:
            live.close()
        if progress_ui is not None:
            progress_ui.stop()
        sig.computing = False
        engine.close()
    wall = time.perf_counter() - t0
    if quiet_summary:
        return 0
    written = [p for p in (out, args.wav, args.frames_dir) if p]
    print(f"{', '.join(written)}: {plan['frames']} frames {plan['width']}x{plan['height']} at 24 fps "
          f"({plan['frames'] / 24:.2f} s), {result.sample_rate // 1000} kHz stereo, {result.steps} steps, "
          f"seed {args.seed}, {wall:.2f} s")
    if profile:
        # The profile goes to stderr (stdout keeps the one-line summary): wall time per phase, peak RSS, and on a
        # GPU the device's peak memory in use (h3_device_memory_peak: cudaMemGetInfo sampled at allocations).
        from .info import human_bytes

        err = sys.stderr
        print(device_line, file=err)
        print(profile.table(), file=err)
        tp = engine.last_transformer_profile
        if tp:
            print(f"transformer: {tp['forwards']} forwards, {tp['forward_ms_mean']:.1f} ms each ({tp['kernels']} "
                  f"kernels, {tp['threads']} threads); AdaLN precompute released "
                  f"{human_bytes(tp['adaln_weight_bytes'])} of adaln_proj weights for "
                  f"{human_bytes(tp['adaln_table_bytes'])} of tables", file=err)
            print(f"transformer work (preset {knobs['preset']}): {tp['evaluations']} evaluations, "
                  f"{tp['skipped_steps']} steps skipped, {tp['block_runs']} block-stack runs of {tp['layers_run']} "
                  f"blocks, {tp['transformer_ms'] / 1000:.3f} s in the steps", file=err)
            sp = tp.get("sequence_parallel")
            if sp:  # the block stack split over ranks (H3_LOOPBACK_RANKS, --gpus): who ran what, what moved
                print(f"sequence parallel: {sp['kind']}, {sp['world']} ranks over {sp['sequence']} rows", file=err)
                for r in sp["ranks"]:
                    print(f"  {r['name']}: rows {r['rows'][0]}-{r['rows'][1] - 1}; each block's all-to-alls sent "
                          f"{human_bytes(r['qkv_all_to_all_bytes'])} (q/k/v) and {human_bytes(r['out_all_to_all_bytes'])} "
                          f"(attention output); {r['all_to_all_calls']} all-to-alls sent "
                          f"{human_bytes(r['all_to_all_bytes'])}, all-gathers {human_bytes(r['all_gather_bytes'])}",
                          file=err)
    return 0
