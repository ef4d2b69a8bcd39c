"""`h3ctl render --gpus N`: one render split over N GPUs, one process per GPU (docs/multi-gpu.md).

The launcher starts N copies of the same `h3ctl render` command, rank r with the environment every
distributed stack uses (RANK=r, WORLD_SIZE=N, LOCAL_RANK=r: the GPU it drives) and H3_RENDEZVOUS, a
file in a fresh temporary folder through which rank 0 hands the NCCL unique id to the others. Rank 0
shows the progress and writes the outputs; the other ranks write nothing. The launcher waits for all
of them; when one fails it stops the others (SIGTERM, then SIGKILL after a grace period), so every
rank ends, and prints one line naming the rank and its own last message. Rank 0 publishes its files
only after a complete render, so a failed run leaves no output file.

Embedders start ranks themselves with the same variables (docs/multi-gpu.md: the rendezvous file
must be a new path per run, on a file system every rank sees; several nodes on paper)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._lib import H3Error

MAX_RANKS = 64
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "H3_RENDEZVOUS")


def gpu_count() -> int:
    """GPUs this process may use (the CUDA driver's count, CUDA_VISIBLE_DEVICES applied); 0 without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    n = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


def model_heads(model_dir) -> int | None:
    """The transformer's attention heads from its config.json (None when it cannot be read here: the library
    checks again when it opens the model)."""
    from .engine import default_model_dir

    root = Path(model_dir) if model_dir else Path(default_model_dir())
    for sub in ("FL2VA", "Ref2VA", "."):
        cfg = root / sub / "transformer" / "config.json"
        if cfg.is_file():
            try:
                return int(json.loads(cfg.read_text())["num_attention_heads"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None


def check(n, heads: int | None, gpus: int, device: str) -> None:
    """Refuse a rank count the render cannot run (bad input: exit 2)."""
    if not isinstance(n, int) or n < 1 or n > MAX_RANKS:
        raise H3Error(f"--gpus must be a whole number of GPUs from 1 to {MAX_RANKS}, got '{n}'")
    if heads is not None and heads % n:
        ok = ", ".join(str(k) for k in range(1, min(heads, MAX_RANKS) + 1) if heads % k == 0)
        raise H3Error(f"--gpus {n}: {n} ranks do not divide the model's {heads} attention heads (ranks that do: {ok})")
    if device == "cpu":
        raise H3Error(f"--gpus {n} runs one process per GPU; --device cpu cannot (H3_LOOPBACK_RANKS={n} splits "
                      "the render over threads on the CPU)")
    if n > gpus:
        raise H3Error(f"--gpus {n}: more ranks than GPUs (this machine shows {gpus})")


def strip_gpus(argv: list[str]) -> list[str]:
    """The render arguments without --gpus N / --gpus=N."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--gpus":
            skip = True
            continue
        if a.startswith("--gpus="):
            continue
        out.append(a)
    return out


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_ranks(commands: list[list[str]], envs: list[dict], log_dir: Path, grace_s: float = 10.0,
              poll_s: float = 0.05, rank0_stderr=None) -> tuple[int, str]:
    """Start one process per command (rank r gets envs[r]); wait for all. Returns (exit status, message):
    (0, "") when every rank succeeded; else the first failing rank's status and one line naming it, after the
    other ranks were stopped. Rank 0's stderr goes to rank0_stderr (the terminal), the others' to log_dir."""
    procs, logs = [], []
    try:
        for r, (cmd, env) in enumerate(zip(commands, envs)):
            log = log_dir / f"rank{r}.stderr"
            logs.append(log)
            fh = None if (r == 0 and rank0_stderr is None) else open(log, "wb") if r else rank0_stderr
            procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL,
                                          stderr=fh, start_new_session=False))
            if r and fh is not None:
                fh.close()
        failed = None
        while failed is None:
            alive = False
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    alive = True
                elif rc != 0:
                    failed = r
                    break
            if failed is None and not alive:
                return 0, ""
            if failed is None:
                time.sleep(poll_s)
        # stop the others: SIGTERM (they remove their temporaries), SIGKILL after the grace period
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        for p in procs:
            while p.poll() is None and time.monotonic() - t0 < grace_s:
                time.sleep(poll_s)
            if p.poll() is None:
                p.kill()
                p.wait()
        rc = procs[failed].returncode
        why = _last_line(logs[failed]) if failed else ""
        how = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
        msg = f"rank {failed} of {len(procs)} failed ({how})" + (f": {why}" if why else "") + \
              "; the other ranks were stopped, nothing was written"
        return (rc if rc > 0 else 1), msg
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main(args) -> int:
    """`h3ctl render --gpus N`."""
    n = args.gpus
    check(n, model_heads(args.model_dir), gpu_count(), args.device)
    argv = strip_gpus(list(getattr(args, "argv", None) or sys.argv[1:]))
    with tempfile.TemporaryDirectory(prefix="h3ctl-ranks-") as tmp:
        rdv = Path(tmp) / "nccl-unique-id"
        commands, envs = [], []
        for r in range(n):
            env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
            env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), H3_RENDEZVOUS=str(rdv))
            cmd = [sys.executable, "-m", "h3ctl"] + argv + ["--device-index", str(r)]
            if r:
                cmd.append("-q")
            commands.append(cmd)
            envs.append(env)
        rc, msg = run_ranks(commands, envs, Path(tmp), rank0_stderr=None)
        if rc and not msg.startswith("rank 0 "):  # rank 0's own line is on the terminal already
            print(f"h3ctl: error: {msg}", file=sys.stderr)
        return rc


def rank() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) this process was started as (0, 1 when not one of several)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        r = int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        raise H3Error("RANK and WORLD_SIZE must be whole numbers") from None
    return (r, world) if world > 1 else (0, 1)
