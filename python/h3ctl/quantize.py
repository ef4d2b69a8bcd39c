"""`h3ctl quantize`: a model's fp8 transformer weights written once to a file (h3_quantize), for
`h3ctl render --precision fp8 --quantized FILE` / `Engine(precision="fp8", quantized=FILE)`.

The file holds the bits a GPU makes when it quantises at load, so a render from it is byte-identical; it records the
model's identity (a fingerprint of the transformer's config, shard headers and samples of the quantised weights) and
a context refuses it for any other checkpoint. No GPU is needed to write it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from . import _lib
from ._lib import H3Error


def quantize(model_dir: str | os.PathLike, output: str | os.PathLike, ref2va: bool = False, overwrite: bool = False,
             threads: int = 0, progress: Callable[[int, int], object] | None = None) -> Path:
    """Write `output` from the model's FL2VA transformer (Ref2VA's with `ref2va`). `progress(done, total)` is called
    per weight; a true return cancels. An existing `output` is replaced only with `overwrite`; on any failure nothing
    is written. H3Error with the one-line reason."""
    if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= 1024:
        raise H3Error(f"threads must be between 0 (all cores) and 1024, got {threads!r}")
    raised: list[BaseException] = []

    def hook(_user, _phase, done, total):
        if progress is None:
            return 0
        try:
            return 1 if progress(done, total) else 0
        except BaseException as e:  # noqa: BLE001  (re-raised below, outside the C call)
            raised.append(e)
            return 1

    fn = _lib.H3ProgressFn(hook)
    flags = _lib.H3_OPT_REF2VA if ref2va else 0
    rc = _lib.lib().h3_quantize(os.fsencode(os.fspath(model_dir)), flags, _lib.PRECISIONS["fp8"], threads,
                                os.fsencode(os.fspath(output)), 1 if overwrite else 0, fn, None)
    if raised:
        raise raised[0]
    _lib.check(rc)
    return Path(output)


def add_arguments(p) -> None:
    p.add_argument("model_dir", help="model directory (official layout)")
    p.add_argument("-o", "--output", required=True, help="the file to write (safetensors)")
    p.add_argument("--ref2va", action="store_true", help="the Ref2VA partition's transformer (for renders with "
                   "references)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--threads", type=int, default=0, help="worker threads (default: all cores)")


def main(args) -> int:
    from .info import human_bytes

    shown = {"step": 0}

    def progress(done: int, total: int) -> None:
        # about twenty lines for any model, and the last one always
        step = max(1, total // 20)
        if done == total or done >= shown["step"]:
            shown["step"] = done + step
            print(f"quantize: {done}/{total} weights", file=sys.stderr, flush=True)

    out = quantize(args.model_dir, args.output, ref2va=args.ref2va, overwrite=args.force, threads=args.threads,
                   progress=progress)
    print(f"{out}: fp8 weights of {args.model_dir}{' (Ref2VA)' if args.ref2va else ''}, "
          f"{human_bytes(out.stat().st_size)}")
    return 0
