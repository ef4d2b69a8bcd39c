"""Hashes of h3-tiny renders on the GPU, one line per configuration, so two builds of the CUDA backend can be
compared bit for bit (the same seed and settings must give the same bytes per backend):

    python3 tests/gpu/render_hashes.py > a.txt      # with one build
    python3 tests/gpu/render_hashes.py > b.txt      # with the other
    diff a.txt b.txt

H3_HASH_DEVICE=cpu runs the same on the CPU. Each configuration runs in its own process (the attention choice is read once per process)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

PROMPT = "a red circle moves right on a black background, a high beep"
CONFIGS = [
    ("bf16", {}, {}),
    ("bf16-own-attention", {"H3_CUDA_ATTENTION": "own"}, {}),
    ("fp8", {}, {"precision": "fp8"}),
    ("fp8-fp8attention", {}, {"precision": "fp8", "fp8_attention": True}),
    ("bf16-256x256", {}, {"width": 256, "height": 256, "steps": 6}),
]

CHILD = r"""
import hashlib, json, sys, h3ctl
kw = json.loads(sys.argv[1])
prec = kw.pop("precision", None); fa = kw.pop("fp8_attention", False)
eng = h3ctl.Engine(device=sys.argv[3], **({"precision": prec} if prec else {}), **({"fp8_attention": True} if fa else {}))
r = eng.render(sys.argv[2], seed=7, **kw)
print(hashlib.sha256(r.frames.tobytes()).hexdigest()[:16], hashlib.sha256(r.audio.tobytes()).hexdigest()[:16])
"""


def main() -> int:
    bad = 0
    for name, env, kw in CONFIGS:
        p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kw), PROMPT, os.environ.get("H3_HASH_DEVICE", "cuda")], env={**os.environ, **env},
                           capture_output=True, text=True)
        line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else \
            "FAILED " + (p.stderr.strip().splitlines() or ["?"])[-1]
        bad += line.startswith("FAILED")
        print(f"{name:22s} {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
