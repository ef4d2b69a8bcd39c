"""`h3ctl parity STAGE`: tensor-in/tensor-out entry points for checking libh3 against any reference.

Each stage reads its inputs from a safetensors file, runs one libh3 stage and writes its outputs
to another safetensors file. Tensor names are the diffusers argument and output names of that
stage, so a reference run in diffusers can be compared name by name. Stages are listed here as
they land in libh3; `h3ctl parity --list` prints them with their tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .._lib import H3Error


@dataclass
class Stage:
    name: str
    doc: str
    inputs: dict[str, str]   # tensor name -> description (dtype, shape)
    outputs: dict[str, str]
    run: Callable[[str, dict[str, np.ndarray], dict], dict[str, np.ndarray]]
    needs_model: bool = True


STAGES: dict[str, Stage] = {}


def register(stage: Stage) -> Stage:
    STAGES[stage.name] = stage
    return stage


def read_inputs(path: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if not os.path.isfile(path):
        raise H3Error(f"{path}: no such file")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise H3Error(f"{path}: cannot read safetensors inputs: {e}") from None


def write_outputs(path: str, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    tmp = f"{path}.partial-{os.getpid()}"
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise H3Error(f"{path}: cannot write outputs: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def require(inputs: dict[str, np.ndarray], stage: Stage) -> None:
    missing = [k for k, desc in stage.inputs.items() if k not in inputs and "optional" not in desc]
    if missing:
        raise H3Error(f"parity {stage.name}: input tensor(s) missing: {', '.join(missing)}")


def open_context(model_dir: str, options: dict):
    """The stage's model context with the command's --threads / --device / --device-index."""
    from ..context import Context

    return Context(model_dir, threads=int(options.get("threads") or 0), device=options.get("device", "auto"),
                   device_index=int(options.get("device_index") or 0))


def open_engine(model_dir: str, options: dict):
    """Same, as an Engine (stages that render)."""
    from ..engine import Engine

    return Engine(model_dir, threads=int(options.get("threads") or 0), device=options.get("device", "auto"),
                  device_index=int(options.get("device_index") or 0))


def run(stage_name: str, model_dir: str | None, inputs_path: str, out_path: str, options: dict) -> None:
    stage = STAGES.get(stage_name)
    if stage is None:
        known = ", ".join(sorted(STAGES)) or "none yet"
        raise H3Error(f"parity: unknown stage '{stage_name}' (available: {known})")
    if stage.needs_model and not model_dir:
        raise H3Error(f"parity {stage_name}: --model DIR is required")
    inputs = read_inputs(inputs_path)
    require(inputs, stage)
    outputs = stage.run(model_dir, inputs, options)
    write_outputs(out_path, outputs)


def describe() -> str:
    if not STAGES:
        return "no parity stages are available yet"
    lines = []
    for s in STAGES.values():
        lines.append(f"{s.name}: {s.doc}")
        for k, v in s.inputs.items():
            lines.append(f"    in  {k}: {v}")
        for k, v in s.outputs.items():
            lines.append(f"    out {k}: {v}")
    return "\n".join(lines)
