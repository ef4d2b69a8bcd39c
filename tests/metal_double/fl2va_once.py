"""One FL2VA render of h3-tiny on the CPU and through device "metal" (the Metal test double on Linux), compared:
frames PSNR and audio rel-L2. Not part of the suite (about 90 s under the emulator). Usage:
    PYTHONPATH=python python tests/metal_double/fl2va_once.py FIRST_FRAME.png
"""
import sys
import time

import numpy as np
from h3ctl.engine import Engine
P = "a red circle moves right on a black background, a high beep"
out = {}
for dev in ("cpu", "metal"):
    with Engine(threads=2, device=dev) as eng:
        t = time.time()
        out[dev] = eng.render(P, 64, 64, 22, steps=2, seed=1, first_frame=sys.argv[1])
        print(dev, time.time() - t, flush=True)
a, b = out["cpu"], out["metal"]
mse = np.mean((a.frames.astype(np.float64) - b.frames) ** 2)
print("psnr", 10 * np.log10(255 ** 2 / mse) if mse else "inf", "audio rel", np.linalg.norm(a.audio.astype(np.float64) - b.audio) / np.linalg.norm(a.audio))
