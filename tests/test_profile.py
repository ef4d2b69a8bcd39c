"""Engine.render(profile=True): one row per phase, wall times that add up to the render, peak memory measured."""

import time

from h3ctl import Engine

PROMPT = "a red circle moves right on a black background, a high beep"


def test_render_profile_rows():
    with Engine(threads=2) as e:
        assert e.device_memory_peak() is None  # a CPU engine: the profile measures RSS only
        t0 = time.perf_counter()
        r = e.render(PROMPT, 64, 64, steps=3, seed=1, profile=True)
        wall = time.perf_counter() - t0
        plain = e.render(PROMPT, 64, 64, steps=3, seed=1)
    phases = [row["phase"] for row in r.profile]
    assert phases == ["encode prompt", "load transformer", "denoise", "decode audio", "decode video"], phases
    for row in r.profile:
        assert row["wall_s"] > 0 and row["peak_rss_bytes"] > 1 << 20 and row["peak_device_bytes"] is None, row
    assert sum(row["wall_s"] for row in r.profile) <= wall
    # profiling only observes: the same render without it gives the same bytes
    assert plain.profile is None
    assert plain.frames.tobytes() == r.frames.tobytes() and plain.audio.tobytes() == r.audio.tobytes()
