"""The `h3ctl` command line.

Every failure the user can cause (bad paths, malformed files, impossible sizes, unwritable
outputs) ends as one line on stderr and exit status 2; Ctrl-C exits with 130. Set H3CTL_DEBUG=1
to see Python tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys

from ._lib import H3Error
from .errors import Cancelled

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise H3Error(f"{self.prog}: {message} (see --help)")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if not 1 <= v <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number (1 to {2**31 - 1}), got {v}")
    return v


def _join_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--size -32x64` -> `--size=-32x64`: argparse takes a value that starts with '-' (and is not a plain
    negative number) for an option and reports 'expected one argument'; a value-taking option's next word is its
    value unless it is itself an option, so the range check can name it."""
    takes, known = set(), set()
    stack = [parser]
    while stack:
        p = stack.pop()
        for a in p._actions:
            known.update(a.option_strings)
            if a.option_strings and a.nargs is None and a.const is None and not isinstance(
                    a, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction)):
                takes.update(a.option_strings)
            if isinstance(a, argparse._SubParsersAction):
                stack.extend(a.choices.values())
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok in takes and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1] not in known \
                and argv[i + 1].split("=", 1)[0] not in known and argv[i + 1] != "--":
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="h3ctl", description="Native MiniMax-H3 video+audio generation on libh3.")
    p.add_argument("--version", action="store_true", help="print versions and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    pr = sub.add_parser("render", help="render a prompt to an MP4 with stereo sound")
    from .render import add_arguments, add_device_arguments, add_precision_argument

    add_arguments(pr)

    pi = sub.add_parser("info", help="describe a model directory: official, ComfyUI models/ or diffusers-format (headers only)")
    pi.add_argument("-d", "--model-dir", help="model directory (official layout, or a ComfyUI models/ folder); "
                    "default: the embedded h3-tiny")
    pi.add_argument("--json", action="store_true", help="machine-readable output")
    pi.add_argument("--width", type=_positive_int, default=864, help="render width for the memory estimate")
    pi.add_argument("--height", type=_positive_int, default=480, help="render height for the memory estimate")
    pi.add_argument("--frames", type=_positive_int, default=121, help="frames for the memory estimate")
    pi.add_argument("--prompt-tokens", type=_positive_int, default=64, help="prompt length for the estimate")
    pi.add_argument("--ref2va", action="store_true", help="describe the Ref2VA partition")
    from .components import add_arguments as add_component_arguments

    add_component_arguments(pi)  # single files: their format, variant and what was inferred
    add_device_arguments(pi)
    add_precision_argument(pi)  # the memory estimate counts the weights as that precision holds them
    from .render import add_vram_argument

    add_vram_argument(pi)  # the estimate also says what a budget keeps resident and streams

    pp = sub.add_parser("parity", help="run one libh3 stage on tensors from a safetensors file")
    pp.add_argument("stage", nargs="?", help="stage name (see --list)")
    pp.add_argument("--model", help="model directory")
    pp.add_argument("--inputs", help="input tensors (.safetensors)")
    pp.add_argument("--out", help="output tensors (.safetensors)")
    pp.add_argument("--threads", type=int, default=0, help="worker threads (0 = all cores)")
    add_device_arguments(pp)
    pp.add_argument("--list", action="store_true", help="list stages and their tensors")

    pq = sub.add_parser("quantize", help="write a model's fp8 transformer weights to a file, for render --precision "
                        "fp8 --quantized FILE (no GPU needed)")
    from .quantize import add_arguments as add_quantize_arguments

    add_quantize_arguments(pq)

    pc = sub.add_parser("check", help="validate safetensors files, or a model directory: official, ComfyUI models/ or "
                        "diffusers-format (all components, headers only)")
    pc.add_argument("paths", nargs="+", help="files (.safetensors) or model directories")

    sub.add_parser("presets", help="the speed presets: settings, measured speed-up and quality")

    pw = sub.add_parser("warmup", help="compile the CUDA kernels for this GPU ahead of time (kept in the kernel cache)")
    pw.add_argument("--gpu", type=int, default=0, help="CUDA device index (default 0)")

    ps = sub.add_parser("session", help="an interactive prompt line with a warm model (also reads a pipe)")
    from .session import add_arguments as add_session_arguments

    add_session_arguments(ps)

    pk = sub.add_parser("comfy-install", help="install the h3ctl node pack into a ComfyUI folder")
    pk.add_argument("dir", help="the ComfyUI folder, or its custom_nodes folder")
    pk.add_argument("--overwrite", action="store_true", help="replace a custom_nodes/h3ctl_nodes not written by h3ctl")
    return p


def _cmd_parity(args) -> int:
    from . import parity, stages  # noqa: F401  (stages registers the available stages)

    if args.list:
        print(parity.describe())
        return 0
    if not args.stage:
        raise H3Error("parity: a stage name is required (see `h3ctl parity --list`)")
    if not args.inputs or not args.out:
        raise H3Error("parity: --inputs and --out are required")
    parity.run(args.stage, args.model, args.inputs, args.out,
               {"threads": args.threads, "device": args.device, "device_index": args.device_index})
    return 0


def _cmd_check(args) -> int:
    from . import _lib
    from .context import Context

    lib = _lib.lib()
    for path in args.paths:
        from pathlib import Path

        from . import components

        if os.path.isdir(path) and components.is_diffusers_folder(Path(path)):
            # a diffusers-format folder: its configs translate (or the reason why not), each part's file checked
            _, found = components.resolve(path)
            for part, f in found.items():
                _lib.check(lib.h3_safetensors_check(os.fsencode(f)))
                print(f"{f}: ok ({part}): {components.describe_file(f) or 'read in place'}")
            continue
        models = components._comfy_models_dir(Path(path)) if os.path.isdir(path) else None
        if models is not None and not components._is_official(Path(path)):
            # a ComfyUI models/ folder: each MiniMax-H3 file it holds, checked and described
            for part, f in components.comfy_files(models, ref2va=False).items():
                _lib.check(lib.h3_safetensors_check(os.fsencode(f)))
                print(f"{f}: ok ({part}): {components.describe_file(f) or 'not recognised by its tensor names'}")
            continue
        if os.path.isdir(path):
            with Context(path) as ctx:
                _lib.check(lib.h3_model_check(ctx.ptr, 1))
                info = ctx.info()
            n = sum(c.get("tensors", 0) for c in info["components"].values())
            print(f"{path}: ok ({n} tensors, every component a render needs is present and well formed)")
        else:
            _lib.check(lib.h3_safetensors_check(os.fsencode(path)))
            from .components import describe_file

            what = describe_file(path) if path.endswith(".safetensors") else None
            print(f"{path}: ok{': ' + what if what else ''}")
            if what and "transformer (give it with --transformer)" in what:
                from .info import check_lines

                for line in check_lines(path):
                    print(line)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(_join_dash_values(parser, argv))
        args.argv = argv  # `render --gpus` starts its ranks with the same arguments
        if args.version:
            from . import __version__, _lib

            lib = _lib.lib()
            print(f"h3ctl {__version__}, libh3 {lib.h3_version().decode()} ({lib.h3_cpu_features().decode()})")
            return 0
        if args.command == "render":
            from . import render

            return render.main(args)
        if args.command == "info":
            from . import info

            return info.main(args)
        if args.command == "parity":
            return _cmd_parity(args)
        if args.command == "quantize":
            from . import quantize

            return quantize.main(args)
        if args.command == "check":
            return _cmd_check(args)
        if args.command == "presets":
            from . import presets

            print(presets.table())
            return 0
        if args.command == "warmup":
            from . import _lib

            if _lib.lib().h3_cuda_warmup(args.gpu) != 0:
                print(f"h3ctl: error: {_lib.last_error() or 'the CUDA kernels could not be prepared'}", file=sys.stderr)
                return 1
            from .info import kernel_cache_line

            # what the cache holds now (off, or an unwritable folder: compiled for this process only, already said)
            cache = _lib.backends().get("cuda", {}).get("kernel_cache")
            print(f"h3ctl: the CUDA kernels are compiled for this GPU; kernel cache: {kernel_cache_line(cache)}")
            return 0
        if args.command == "session":
            from . import session

            return session.main(args)
        if args.command == "comfy-install":
            from .comfy import install

            print(install(args.dir, overwrite=args.overwrite))
            return 0
        parser.print_help()
        return EXIT_BAD_INPUT
    except Cancelled:
        print("h3ctl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except H3Error as e:
        print(f"h3ctl: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # SIGINT 130, SIGTERM 143, SIGHUP 129 (h3ctl.outputs.Interrupted)
        from .outputs import Interrupted, exit_code

        print(f"h3ctl: {e if isinstance(e, Interrupted) else 'interrupted'}", file=sys.stderr)
        return exit_code(e)
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001
        if os.environ.get("H3CTL_DEBUG"):
            raise
        print(f"h3ctl: internal error: {type(e).__name__}: {e} (set H3CTL_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1
