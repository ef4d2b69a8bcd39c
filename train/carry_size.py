"""What a device call would carry: the working tree that travels (tracked files + untracked files git does not ignore)
plus the ignored paths named in ``carry``, against the 64 MiB limit. Files only; run from anywhere in the repo.

    python -m train.carry_size .whl            # stage 7: the tree (with the shipped model) + the diffusers wheel
"""

import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20
root = Path(subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())


def files(*args):
    out = subprocess.check_output(["git", "-C", str(root), "ls-files", "-z", *args], text=True)
    return [root / p for p in out.split("\0") if p]


tree = [f for f in files() + files("--others", "--exclude-standard") if f.is_file()]
carried = [f for c in sys.argv[1:] for f in ([root / c] if (root / c).is_file() else (root / c).rglob("*"))
           if f.is_file()]
t = sum(f.stat().st_size for f in tree)
c = sum(f.stat().st_size for f in carried)
print(f"tree {t / 2**20:.2f} MiB ({len(tree)} files) + carry {c / 2**20:.2f} MiB = {(t + c) / 2**20:.2f} MiB "
      f"of {LIMIT / 2**20:.0f} MiB: {'OK' if t + c <= LIMIT else 'TOO LARGE'} "
      f"({(LIMIT - t - c) / 2**20:+.2f} MiB left)")
sys.exit(0 if t + c <= LIMIT else 1)
