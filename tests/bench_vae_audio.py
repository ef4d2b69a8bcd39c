"""Audio VAE decode benchmark: libh3 vs diffusers 0.42.1 on the same checkpoint, on CPU, with the same threads.

    PYTHONPATH=python python tests/bench_vae_audio.py [--config release] [--frames 8 40] [--threads 2]

Both sides run the whole decode step of a stereo clip: de-normalisation, both sides, clamp. libh3's time includes
reading and folding the weights (its API loads them per call and releases them after); diffusers' model is already
in memory. `--memory FRAMES` instead reports libh3's peak resident memory for one decode in a fresh process
(release geometry: `--memory 600` is a 15 s clip).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "python")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _checkpoint(config: str, workdir: Path, need_model: bool = True):
    """(diffusers model or None, root of the official layout); the files are reused when present."""
    from tests.audio_vae_oracle import build_audio_vae, write_audio_vae

    root = workdir / f"avae_{config}"
    present = (root / "FL2VA" / "audio_vae" / "model.safetensors").exists()
    model = build_audio_vae(config) if need_model or not present else None
    if not present:
        write_audio_vae(model, root)
    return model, root


def _best(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def run(config="release", frames=(8, 40), threads=(1, 2), repeat=1, workdir=None) -> list[dict]:
    import numpy as np

    from h3ctl.context import Context
    from h3ctl.parity.vae_audio import audio_decode
    from tests.audio_vae_oracle import diffusers_decode, latents_for, rel_l2

    workdir = Path(workdir or tempfile.mkdtemp(prefix="h3_bench_avae_"))
    model, root = _checkpoint(config, workdir)
    rows = []
    for n in frames:
        lat = latents_for(model, n, seed=n)
        for th in threads:
            t_ref, ref = _best(lambda: diffusers_decode(model, lat, num_threads=th), repeat)
            with Context(root, threads=th) as ctx:
                t_h3, pcm = _best(lambda: audio_decode(ctx, lat), repeat)
            sr = model.config.sampling_rate
            rows.append({"config": config, "frames": n, "seconds": pcm.shape[1] / sr, "threads": th,
                         "diffusers_ms": t_ref * 1e3, "h3_ms": t_h3 * 1e3, "ratio": t_ref / t_h3,
                         "rel_l2": rel_l2(pcm[None], ref), "clipped": float(np.mean(np.abs(ref) >= 1))})
    return rows


def table(rows: list[dict]) -> str:
    head = "| section | config | latent frames | audio s | threads | diffusers ms | libh3 ms | speed-up | rel-L2 |"
    out = [head, "|" + " --- |" * 9]
    for r in rows:
        out.append(f"| audio | {r['config']} | {r['frames']} | {r['seconds']:.2f} | {r['threads']} | "
                   f"{r['diffusers_ms']:.0f} | {r['h3_ms']:.0f} | {r['ratio']:.2f}x | {r['rel_l2']:.2g} |")
    return "\n".join(out)


_MEM_CHILD = r"""
import sys, time, numpy as np
from h3ctl.context import Context
from h3ctl.parity.vae_audio import audio_decode, audio_info
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
root, frames, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with Context(root, threads=threads) as ctx:
    ch = audio_info(ctx)["latent_channels"]
    lat = np.random.default_rng(0).standard_normal((2, ch, frames)).astype(np.float32)
    base = hwm()
    t = time.perf_counter()
    pcm = audio_decode(ctx, lat)
    print(base, hwm(), time.perf_counter() - t, pcm.shape[1])
"""


def memory(config: str, frames: int, threads: int, workdir=None) -> dict:
    """Peak RSS of one libh3 decode in a fresh process without torch (VmHWM after minus before)."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="h3_bench_avae_"))
    _, root = _checkpoint(config, workdir, need_model=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    out = subprocess.run([sys.executable, "-c", _MEM_CHILD, str(root), str(frames), str(threads)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    base, peak, secs, samples = int(out[0]), int(out[1]), float(out[2]), int(out[3])
    weights = (root / "FL2VA" / "audio_vae" / "model.safetensors").stat().st_size
    return {"config": config, "frames": frames, "samples": samples, "decode_peak_bytes": peak - base,
            "process_peak_bytes": peak, "file_bytes": weights, "seconds": secs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="release", help="release (diffusers defaults), wide, tiny, odd, weird")
    ap.add_argument("--frames", type=int, nargs="+", default=[8, 40], help="latent frames per clip (40 per second)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (both engines)")
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs")
    ap.add_argument("--workdir", help="where the checkpoint is written (reused when present)")
    ap.add_argument("--memory", type=int, metavar="FRAMES", help="measure libh3's peak memory instead")
    args = ap.parse_args(argv)
    if args.memory:
        m = memory(args.config, args.memory, args.threads[-1], args.workdir)
        mib = 1 << 20
        print(f"audio decode, {m['config']}, {m['frames']} frames ({m['samples']} samples per side): peak RSS of the "
              f"decode {m['decode_peak_bytes'] / mib:.0f} MiB (process {m['process_peak_bytes'] / mib:.0f} MiB, "
              f"weights file {m['file_bytes'] / mib:.0f} MiB), {m['seconds']:.1f} s")
        return 0
    print(table(run(args.config, args.frames, args.threads, args.repeat, args.workdir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
