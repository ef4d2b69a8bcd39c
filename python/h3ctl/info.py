"""`h3ctl info`: what a model directory holds and what a render of it will need."""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import _lib
from ._lib import H3Error
from .context import Context

COMPONENT_ORDER = ["transformer", "text_encoder", "tokenizer", "video_vae", "audio_vae"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


# The shapes a single file's description is estimated at (issue #25): the release's 864x480 and 1344x768 renders.
SINGLE_FILE_SHAPES = ((864, 480, 56), (1344, 768, 124))


def peak_and_resident(est: dict) -> dict:
    """One estimate (libh3's h3_memory_estimate_json, runtime/memory.c) as the two numbers a card is chosen by:
    the transformer's weights held while denoising (resident) and the largest phase (peak); under a budget, the
    weights and total libh3's streaming rule gives."""
    ph = est["phases"]
    den = ph.get("under_vram_budget") or ph.get("denoise_precomputed_adaln") or {}
    totals = [v["total"] for k, v in ph.items() if isinstance(v, dict) and "total" in v
              and k not in ("denoise_without_precompute", "denoise_precomputed_adaln", "under_vram_budget")]
    totals.append(den.get("total", 0))
    return {"resident": den.get("weights", 0), "peak": max(totals), "streamed_blocks": den.get("blocks_streamed", 0)}


def single_file_estimates(ctx, vram_ctx, prompt_tokens: int) -> list[dict]:
    """The resident and peak estimate at SINGLE_FILE_SHAPES, without a budget and (vram_ctx) with --vram's."""
    rows = []
    for w, h, f in SINGLE_FILE_SHAPES:
        row = {"width": w, "height": h, "frames": f, "no_vram": peak_and_resident(ctx.memory_estimate(w, h, f,
                                                                                                      prompt_tokens))}
        if vram_ctx is not None:
            row["vram"] = peak_and_resident(vram_ctx.memory_estimate(w, h, f, prompt_tokens))
        rows.append(row)
    return rows


def check_lines(path, prompt_tokens: int = 64) -> list[str]:
    """`h3ctl check FILE` of a transformer single file of the release's shapes: libh3's estimate (CPU context,
    h3ctl's copy of the release's transformer config; headers only) at SINGLE_FILE_SHAPES, without a budget and
    with the smallest --vram (no block resident: the fixed GEMM weights and the two ring slots, dit_stream.c's
    rule). [] when the file is not of the release's shapes (h3ctl info -d the model's folder estimates it then)."""
    from .components import RELEASE_CONFIGS

    files = {"transformer": str(path)}
    lines = []
    try:
        with Context(RELEASE_CONFIGS, device="cpu", files=files) as ctx, \
                Context(RELEASE_CONFIGS, device="cpu", files=files, vram=1 << 19) as big:
            for w, h, f in SINGLE_FILE_SHAPES:
                a = peak_and_resident(ctx.memory_estimate(w, h, f, prompt_tokens))
                ub = big.memory_estimate(w, h, f, prompt_tokens)["phases"]["under_vram_budget"]
                gib = (ub["fixed_gemm_bytes"] + 2 * ub["block_bytes"]) / 2**30
                with Context(RELEASE_CONFIGS, device="cpu", files=files, vram=gib) as low:
                    b = peak_and_resident(low.memory_estimate(w, h, f, prompt_tokens))
                lines.append(f"  estimate {w}x{h}x{f}: transformer weights {human_bytes(a['resident'])}, denoise peak "
                             f"{human_bytes(a['peak'])}; with --vram {gib:.1f} (no block resident): "
                             f"{human_bytes(b['resident'])} on the device, peak {human_bytes(b['peak'])}")
    except H3Error:
        return []
    return ["  memory (libh3's estimate on the CPU, where int8 layers run from their codes; a GPU widens them, and "
            "runs fp8 from its codes at compute capability 8.9+):"] + lines


def collect(model_dir: str, width: int, height: int, frames: int, prompt_tokens: int, ref2va: bool = False,
            device: str = "auto", device_index: int = 0, precision: str = "default", parts: dict | None = None,
            vram=None) -> dict:
    from .components import resolve
    from .engine import default_model_dir

    t0 = time.perf_counter()
    folder, files = resolve(model_dir, ref2va=ref2va, **(parts or {}))
    model_dir = folder if folder is not None else default_model_dir()
    with Context(model_dir, ref2va=ref2va, device=device, device_index=device_index, precision=precision,
                 files=files) as ctx:
        info = ctx.info()
        if any(c.get("single_file") for c in info["components"].values()):
            if vram:
                with Context(model_dir, ref2va=ref2va, device=device, device_index=device_index,
                             precision=precision, files=files, vram=vram) as vctx:
                    info["single_file_estimates"] = single_file_estimates(ctx, vctx, prompt_tokens)
            else:
                info["single_file_estimates"] = single_file_estimates(ctx, None, prompt_tokens)
            info["single_file_estimates_vram_gib"] = float(vram) if vram else None
        info["device"] = {"name": ctx.device, "description": ctx.device_description, "stages": ctx.stages_device}
        info["memory_estimate"] = ctx.memory_estimate(width, height, frames, prompt_tokens)
        info["memory_estimate"]["render"] = {
            "width": width,
            "height": height,
            "frames": frames,
            "prompt_tokens": prompt_tokens,
        }
    info["elapsed_s"] = round(time.perf_counter() - t0, 4)
    # After the timing: elapsed_s is the cost of reading the model, and asking the CUDA driver is not that.
    info["backends"] = _lib.backends()
    return info


def kernel_cache_line(folder: str | None) -> str:
    """The CUDA kernel cache folder (h3_backends_json's kernel_cache: H3_KERNEL_CACHE or the user's cache folder)
    and what it holds: its entries (<module>-<key hash>.cubin, cuda_kernels.cpp) and their bytes."""
    if not folder:
        return "off (H3_KERNEL_CACHE=off, or no home folder): kernels are compiled in memory by every process"
    p = Path(folder)
    if not p.exists():
        return f"{folder} (nothing cached yet)"
    if not p.is_dir():
        return f"{folder} is not a folder: kernels are compiled in memory by every process"
    sizes = []
    for e in p.glob("*.cubin"):
        try:
            if e.is_file():
                sizes.append(e.stat().st_size)
        except OSError:  # removed meanwhile
            pass
    return f"{folder}: {len(sizes)} {'entry' if len(sizes) == 1 else 'entries'}, {human_bytes(sum(sizes))}"


def backend_lines(backends: dict) -> list[str]:
    """One line per backend: what this build of libh3 has and what it found."""
    lines = []
    cpu = backends.get("cpu", {})
    lines.append(f"cpu: {'available' if cpu.get('available') else 'not available'}"
                 f"{', kernels ' + cpu['kernels'] if cpu.get('kernels') else ''}")
    cuda = backends.get("cuda", {})
    if cuda.get("available"):
        mem = f", {human_bytes(cuda['memory_bytes'])}" if cuda.get("memory_bytes") else ""
        cc = f", compute capability {cuda['compute_capability']}" if cuda.get("compute_capability") else ""
        fa = ""
        if "fp8_attention" in cuda:  # what --fp8-attention would get
            fa = ("; fp8 attention: yes" if cuda["fp8_attention"] else
                  f"; fp8 attention: no ({cuda.get('fp8_attention_reason') or 'no reason given'})")
        lines.append(f"cuda: available: {cuda.get('device', 'a GPU')}{cc}{mem}{fa}")
        if cuda.get("driver_cuda"):
            lines.append(f"cuda: NVIDIA driver for CUDA {cuda['driver_cuda']}")
        if "cudnn_attention" in cuda:  # the cuDNN path's own line: its version and library, or why it cannot run
            how = "cuDNN" if cuda["cudnn_attention"] else "libh3's own kernel, not cuDNN"
            lines.append(f"cuda: bf16 attention: {how} ({cuda.get('cudnn') or 'no reason given'})")
        if "fp8_weights" in cuda:  # what --precision fp8 would get
            lines.append("cuda: fp8 weights: yes" if cuda["fp8_weights"] else
                         f"cuda: fp8 weights: no ({cuda.get('fp8_weights_reason') or 'no reason given'})")
    else:
        built = "built" if cuda.get("built") else "not built"
        lines.append(f"cuda: not available ({built}): {cuda.get('reason') or 'no reason given'}")
    if cuda.get("built") and "kernel_cache" in cuda:
        lines.append(f"cuda: kernel cache: {kernel_cache_line(cuda['kernel_cache'])}")
    metal = backends.get("metal", {})
    if metal.get("available"):
        # the description names the GPU, its Apple family and memory, and that no Mac run is recorded yet
        mem = f", {human_bytes(metal['memory_bytes'])}" if metal.get("memory_bytes") else ""
        lines.append(f"metal: available: {metal.get('device', 'an Apple GPU')}{mem}")
    elif metal:
        built = "built" if metal.get("built") else "not built"
        lines.append(f"metal: not available ({built}): {metal.get('reason') or 'no reason given'}")
    return lines


def tuning_lines(tuning: dict) -> list[str]:
    """The environment's knobs in effect (libh3 reads them once, at h3_init; docs/environment.md): one
    line per variable that is set, or one line saying that every default holds."""
    def show(v) -> str:
        return {True: "1", False: "0"}.get(v, str(v)) if isinstance(v, bool) else str(v)
    set_ = [f"{k}={show(v)}" for k, v in tuning.items() if v is not None]
    return set_ or ["none set: every default holds"]


def render_text(info: dict) -> str:
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, width=110, force_terminal=False, color_system=None)
    # a partition folder opened directly is reported by libh3 as the partition "partition"
    where = "(a partition folder)" if info["partition"] == "partition" else f"partition {info['partition']}"
    console.print(f"[bold]{info['root']}[/]  {where}"
                  f"{'  (Ref2VA also present)' if info.get('ref2va_present') else ''}")
    table = Table(show_header=True, header_style="bold")
    for col in ("component", "files", "tensors", "dtypes", "size"):
        table.add_column(col)
    for name in COMPONENT_ORDER:
        c = info["components"].get(name, {})
        if not c.get("present"):
            table.add_row(name, "-", "-", "missing", "-")
            continue
        label = name
        # a shared-weight Ref2VA partition: the folders it lacks are FL2VA's, and its index reads FL2VA's shards
        if c.get("shared_from"):
            label += f" (shared from {c['shared_from']})"
        elif c.get("tensors_shared_from_FL2VA"):
            label += f" ({c['tensors_shared_from_FL2VA']} tensors from FL2VA)"
        if name == "tokenizer":
            table.add_row(label, "1", "-", "tokenizer.json", human_bytes(c.get("bytes", 0)))
            continue
        dtypes = ", ".join(f"{k} {v['tensors']}" for k, v in c["dtypes"].items())
        table.add_row(label, str(c["files"]), str(c["tensors"]), dtypes, human_bytes(c["bytes"]))
    console.print(table)
    for name in COMPONENT_ORDER:
        c = info["components"].get(name, {})
        if c.get("single_file"):
            native = c.get("single_file_native_codes", 0)
            how = (f"; its quantised layers computed from their stored codes ({human_bytes(native)}), "
                   "not dequantised" if native else "")
            console.print(f"[bold]{name}[/] from {escape(c['single_file'])}: {escape(c['single_file_format'])}{how}; "
                          f"{human_bytes(c.get('single_file_owned_bytes', 0))} of it written into memory at load "
                          "(the configs come from the model folder)", highlight=False, soft_wrap=True)
    est = info.get("single_file_estimates")
    if est:
        vg = info.get("single_file_estimates_vram_gib")
        st = Table(show_header=True, header_style="bold", title="single files: memory estimate")
        st.add_column("render")
        st.add_column("resident (no --vram)", justify="right")
        st.add_column("peak (no --vram)", justify="right")
        if vg:
            st.add_column(f"resident (--vram {vg:g})", justify="right")
            st.add_column(f"peak (--vram {vg:g})", justify="right")
        for r in est:
            cells = [f"{r['width']}x{r['height']}x{r['frames']}", human_bytes(r["no_vram"]["resident"]),
                     human_bytes(r["no_vram"]["peak"])]
            if vg:
                cells += [human_bytes(r["vram"]["resident"]) + f" ({r['vram']['streamed_blocks']} blocks streamed)",
                          human_bytes(r["vram"]["peak"])]
            st.add_row(*cells)
        console.print(st)
    for name in COMPONENT_ORDER:
        cfg = info["components"].get(name, {}).get("config")
        if cfg:
            dims = ", ".join(f"{k}={v}" for k, v in cfg.items())
            console.print(f"[bold]{name}[/]: {dims}")
    mem = info["memory_estimate"]
    r = mem["render"]
    console.print(
        f"\n[bold]Peak memory estimate[/] for {r['width']}x{r['height']}, {mem['frames']} frames, "
        f"{r['prompt_tokens']} prompt tokens ({mem['sequence']} packed tokens):"
    )
    labels = {
        "text_encoding": "text encoding (layers streamed)",
        "denoise_precomputed_adaln": "denoise, AdaLN precomputed",
        "denoise_without_precompute": "denoise, AdaLN computed per step",
        "video_decode": "video decode (one tile)",
        "audio_decode": "audio decode",
    }
    mt = Table(show_header=True, header_style="bold")
    mt.add_column("phase")
    mt.add_column("peak", justify="right")
    for key, label in labels.items():
        if key in mem["phases"]:
            mt.add_row(label, human_bytes(mem["phases"][key]["total"]))
    console.print(mt)
    bg = mem["phases"].get("block_gemm_weights")
    if bg:
        console.print(
            f"Transformer block GEMM weights held as {bg['precision']}: {human_bytes(bg['resident'])} resident "
            f"(stored {human_bytes(bg['stored'])}; counted in the denoise phases)."
        )
    if "adaln_weights_released" in mem["phases"]:
        console.print(
            f"AdaLN precompute releases {human_bytes(mem['phases']['adaln_weights_released'])} of adaln_proj "
            "weights during denoising."
        )
    console.print("\n[bold]Backends[/] of this libh3:")
    for line in backend_lines(info.get("backends", {})):
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)  # a reason is one line, greppable
    if "tuning" in info:
        console.print("\n[bold]Tuning[/] (environment, read at h3_init):")
        for line in tuning_lines(info["tuning"]):
            console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    dev = info.get("device")
    if dev:
        console.print(f"The transformer runs on: {escape(dev['description'])}; the text encoder and the decoders "
                      f"on the {dev.get('stages', 'cpu')}.", highlight=False, soft_wrap=True)
    console.print(f"[dim]read in {info['elapsed_s']:.3f} s (headers only)[/]")
    return out.getvalue()


def main(args) -> int:
    from .components import from_args

    parts = from_args(args)
    model_dir = args.model_dir
    if model_dir is None and not any(parts.values()):
        from .engine import default_model_dir

        model_dir = default_model_dir()  # as `h3ctl render`: the embedded model (or H3CTL_MODEL)
        if not Path(model_dir).exists():
            raise H3Error(f"{model_dir}: the embedded model is missing from this installation")
    info = collect(model_dir, args.width, args.height, args.frames, args.prompt_tokens, args.ref2va,
                   device=getattr(args, "device", "auto"), device_index=getattr(args, "device_index", 0),
                   precision=getattr(args, "precision", "default"), parts=parts, vram=getattr(args, "vram", None))
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(render_text(info), end="")
    return 0
