"""Per-phase profile of a render: wall time, peak memory (RSS) and, on a GPU, peak device memory.

Phases follow libh3's progress callbacks (a new phase name starts a new interval) plus the boundaries the
Engine marks itself (the decoders, whose first callback comes after their weights are loaded) and the CLI's
"write" phase. A phase seen twice (text around a vision pass) accumulates.

Peak RSS: VmHWM of /proc/self/status, reset at each phase on Linux (clear_refs 5); elsewhere the process's
lifetime maximum. Peak device memory: libh3's h3_device_memory_peak, cudaMemGetInfo's total - free sampled
after each of the backend's allocations and reset at each phase, so it counts the CUDA context and anything
else on that GPU.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

# libh3 progress phase -> profile phase
PROFILE_PHASES = {
    "tokenize": "encode prompt",
    "text_encoder": "encode prompt",
    "vision_encoder": "vision",
    "video_encode": "encode frames",
    "audio_encode": "encode audio",
    "prepare": "load transformer",
    "denoise": "denoise",
    "audio_decode": "decode audio",
    "video_decode": "decode video",
}


class PhaseProfile:
    """Wall time, peak RSS and peak device memory per phase. `device_peak(reset) -> int | None` reads the GPU's
    high-water mark (None: no GPU)."""

    def __init__(self, device_peak: Callable[[bool], int | None] | None = None):
        self.rows: list[list] = []  # [phase, wall s, peak RSS bytes, peak device bytes or None]
        self._current = None
        self._t0 = 0.0
        self._linux = os.path.exists("/proc/self/clear_refs")
        self._device_peak = device_peak

    def _peak(self) -> int:
        if self._linux:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024

    def _reset_peak(self):
        if self._linux:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                self._linux = False

    def _device(self, reset: bool) -> int | None:
        return self._device_peak(reset) if self._device_peak is not None else None

    def progress(self, phase: str):
        """A libh3 progress callback's phase name."""
        self.enter(PROFILE_PHASES.get(phase, phase))

    def enter(self, label: str):
        if label == self._current:
            return
        self.finish()
        self._current = label
        self._reset_peak()
        self._device(True)
        self._t0 = time.perf_counter()

    def finish(self):
        if self._current is None:
            return
        wall, rss, dev = time.perf_counter() - self._t0, self._peak(), self._device(False)
        for row in self.rows:
            if row[0] == self._current:
                row[1] += wall
                row[2] = max(row[2], rss)
                row[3] = dev if row[3] is None else max(row[3], dev or 0)
                break
        else:
            self.rows.append([self._current, wall, rss, dev])
        self._current = None

    def as_dict(self) -> list[dict]:
        return [{"phase": p, "wall_s": w, "peak_rss_bytes": r, "peak_device_bytes": d} for p, w, r, d in self.rows]

    def table(self) -> str:
        from .info import human_bytes

        dev = any(r[3] is not None for r in self.rows)
        head = f"{'phase':<18}{'wall':>10}  {'peak memory':>12}" + (f"  {'peak device':>12}" if dev else "")
        lines = [head]
        for label, wall, peak, dpeak in self.rows:
            line = f"{label:<18}{wall:>9.3f}s  {human_bytes(peak):>12}"
            if dev:
                line += f"  {human_bytes(dpeak) if dpeak is not None else '-':>12}"
            lines.append(line)
        lines.append(f"{'total':<18}{sum(r[1] for r in self.rows):>9.3f}s")
        return "\n".join(lines)
