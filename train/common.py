"""Shared training plumbing: seeding, time-budgeted cosine schedule, resumable checkpoints, logging."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def device_of(arg: str | None = None) -> torch.device:
    if arg:
        return torch.device(arg)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def fast_cuda(dev: torch.device, cudnn_benchmark: bool = True) -> None:
    """TF32 matmuls and convolutions (and cuDNN autotuning) on CUDA; nothing on other devices."""
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        if cudnn_benchmark:
            torch.backends.cudnn.benchmark = True


def optimizer_step(opt, loss: torch.Tensor, params, lr: float, clip: float = 1.0) -> torch.Tensor:
    """One update at learning rate `lr` (times a group's "lr_mult", if it has one): backward, clip the global grad
    norm, step. Returns the norm before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_mult", 1.0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return gn


class StepStats:
    """Per-step metric vectors kept on the device (no sync per step), reported every `every` steps and at step 1."""

    def __init__(self, every: int):
        self.every, self.rows, self.t = every, [], time.time()

    def add(self, step: int, values: list) -> torch.Tensor | None:
        """Returns the float rows [n, len(values)] since the last report when one is due, else None."""
        self.rows.append(torch.stack([v.detach().float() for v in values]))
        if step % self.every and step != 1:
            return None
        rows = torch.stack(self.rows).float()
        self.rows = []
        self.sec_per_step = (time.time() - self.t) / len(rows)
        self.t = time.time()
        return rows


class Saver:
    """Checkpoints every `seconds` of wall time (resumable state between a run's end-of-budget saves)."""

    def __init__(self, run_dir: Path, name: str, modules: dict, optimizer, seconds: float):
        self.args, self.seconds, self.last = (run_dir, name, modules, optimizer), seconds, time.time()

    def save(self, budget: "Budget", **meta) -> None:
        save_state(*self.args, {"step": budget.step, "elapsed": budget.elapsed, **meta})
        self.last = time.time()

    def maybe(self, budget: "Budget") -> None:
        if time.time() - self.last > self.seconds:
            self.save(budget)


class Logger:
    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, *parts) -> None:
        msg = " ".join(str(p) for p in parts)
        print(msg, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(msg + "\n")


class Budget:
    """Training progress measured in seconds of training (summed across resumes) or steps, whichever ends first."""

    def __init__(self, seconds: float, max_steps: int | None, elapsed: float = 0.0, step: int = 0,
                 deadline: float | None = None):
        self.deadline = deadline  # absolute wall-clock time (epoch s) at which training stops regardless
        self.seconds = float(seconds)
        self.max_steps = max_steps
        self.elapsed0 = float(elapsed)
        self.t0 = time.time()
        self.step = int(step)

    @property
    def elapsed(self) -> float:
        return self.elapsed0 + time.time() - self.t0

    @property
    def fraction(self) -> float:
        f = self.elapsed / max(self.seconds, 1e-9)
        if self.max_steps:
            f = max(f, self.step / self.max_steps)
        return min(1.0, f)

    def done(self) -> bool:
        return self.fraction >= 1.0 or (self.deadline is not None and time.time() >= self.deadline)


def lr_at(base: float, fraction: float, step: int, warmup: int, floor: float = 0.1) -> float:
    w = min(1.0, (step + 1) / max(1, warmup))
    cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, fraction)))
    return base * w * cos


def save_state(run_dir: Path, name: str, modules: dict, optimizer, meta: dict, split_bytes: int = 15 * 2**20) -> None:
    """Weights as float32 safetensors (split per module, and per `split_bytes` within one), optimizer as torch.save.

    Files: `{name}-{module}[-k].safetensors`, `{name}-optim.pt`, `{name}-meta.json`. Written atomically (tmp+rename).
    """
    from safetensors.torch import save_file

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for mod_name, module in modules.items():
        sd = {k: v.detach().float().cpu().contiguous() for k, v in module.state_dict().items()}
        parts, cur, cur_bytes = [], {}, 0
        for k in sorted(sd):
            nb = sd[k].numel() * 4
            if cur and cur_bytes + nb > split_bytes:
                parts.append(cur)
                cur, cur_bytes = {}, 0
            cur[k] = sd[k]
            cur_bytes += nb
        parts.append(cur)
        for old in run_dir.glob(f"{name}-{mod_name}*.safetensors"):
            old.unlink()
        for i, part in enumerate(parts):
            suffix = "" if len(parts) == 1 else f"-{i}"
            tmp = run_dir / f".tmp-{name}-{mod_name}{suffix}.safetensors"
            save_file(part, str(tmp))
            os.replace(tmp, run_dir / f"{name}-{mod_name}{suffix}.safetensors")
    if optimizer is not None:
        tmp = run_dir / f".tmp-{name}-optim.pt"
        torch.save(optimizer.state_dict(), tmp)
        os.replace(tmp, run_dir / f"{name}-optim.pt")
    tmp = run_dir / f".tmp-{name}-meta.json"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, run_dir / f"{name}-meta.json")


def load_weights(run_dir: Path, name: str, mod_name: str) -> dict | None:
    from safetensors.torch import load_file

    files = sorted(Path(run_dir).glob(f"{name}-{mod_name}.safetensors")) + sorted(
        Path(run_dir).glob(f"{name}-{mod_name}-[0-9]*.safetensors"))
    if not files:
        return None
    sd = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def load_state(run_dir: Path, name: str, modules: dict, optimizer=None, strict: bool = True) -> dict | None:
    """Restore what `save_state` wrote; returns meta (None when there is no checkpoint)."""
    meta_path = Path(run_dir) / f"{name}-meta.json"
    if not meta_path.exists():
        return None
    for mod_name, module in modules.items():
        sd = load_weights(run_dir, name, mod_name)
        if sd is None:
            raise FileNotFoundError(f"{run_dir}: no weights for {name}-{mod_name}")
        module.load_state_dict(sd, strict=strict)
    opt_path = Path(run_dir) / f"{name}-optim.pt"
    if optimizer is not None and opt_path.exists():
        try:
            optimizer.load_state_dict(torch.load(opt_path, map_location="cpu", weights_only=False))
        except Exception as e:  # a shape change etc.: restart the moments
            print(f"optimizer state not restored: {e}", file=sys.stderr)
    return json.loads(meta_path.read_text())
