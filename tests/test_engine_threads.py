"""One Engine shared between threads (h3ctl.Engine's threading rules).

* Two and four threads rendering different prompts at once: no crash, no hang, and every thread's result is
  byte-identical to the same render done alone.
* render() holds the engine for the whole render: progress reports of concurrent renders never interleave, and
  another thread's call made during a render returns only after that render's last report.
* A progress callback that calls back into its own engine gets H3Error("engine is busy: ...") instead of a
  deadlock or a re-entered C context, and the engine stays usable.
* close() from another thread waits for the running render; later calls say the engine is closed.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from h3ctl import Engine, H3Error

# The embedded model's smallest decodable render: a 32-pixel canvas, 22 frames (3 latent frames is the video
# decoder's minimum), 2 sigma grid points (one transformer evaluation).
SHAPE = dict(width=32, height=32, frames=22, steps=2)
PROMPTS = [
    "a red circle moves right on a black background, a high beep",
    "a blue square moves left on a white background, a low hum",
    "a green triangle bounces on a gray background, a mid tone",
    "a yellow star spins on a purple background, a chirp",
]
SEEDS = [3, 5, 7, 11]
TIMEOUT = 300  # seconds for any group of threads; a deadlock fails instead of hanging the suite


@pytest.fixture(scope="module")
def engine():
    eng = Engine(threads=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def alone(engine):
    """Each prompt rendered on its own, before any thread shares the engine."""
    return [engine.render(p, seed=s, **SHAPE) for p, s in zip(PROMPTS, SEEDS)]


def run_threads(targets):
    """Start all targets together; return their results (or exceptions), failing on a hang."""
    results: list = [None] * len(targets)
    start = threading.Barrier(len(targets))

    def wrap(i, fn):
        try:
            start.wait()
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            results[i] = e

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads still running: a deadlock or a hang"
    return results


def same_bytes(a, b) -> bool:
    return (a.frames.shape == b.frames.shape and a.frames.tobytes() == b.frames.tobytes()
            and a.audio.shape == b.audio.shape and a.audio.tobytes() == b.audio.tobytes())


@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_renders_match_renders_alone(engine, alone, n):
    events: list[tuple[int, str]] = []  # (render index, phase) in the order the reports arrive

    def render(i):
        def progress(phase, done, total):
            events.append((i, phase))

        return engine.render(PROMPTS[i], seed=SEEDS[i], progress=progress, **SHAPE)

    results = run_threads([lambda i=i: render(i) for i in range(n)])
    for i, r in enumerate(results):
        assert not isinstance(r, BaseException), f"thread {i}: {r!r}"
        assert r.frames.shape == (22, 32, 32, 3) and r.audio.dtype == np.float32
        assert same_bytes(r, alone[i]), f"thread {i}'s render differs from the same render done alone"
    # Different prompts really give different results (otherwise the comparison above proves little).
    assert not same_bytes(alone[0], alone[1])
    # Each render's reports form one unbroken run: render() held the engine from prepare to the last decode.
    order = [i for i, _ in events]
    runs = [order[0]] + [b for a, b in zip(order, order[1:]) if a != b]
    assert sorted(runs) == list(range(n)), f"renders interleaved: {runs}"
    assert {p for _, p in events} >= {"tokenize", "denoise", "audio_decode", "video_decode"}


def test_calls_from_another_thread_wait_for_the_render(engine, alone):
    inside = threading.Event()
    last_report = [0.0]

    def progress(phase, done, total):
        inside.set()
        last_report[0] = time.monotonic()
        if phase == "denoise":
            time.sleep(0.05)  # widen the window in which the other thread calls in

    def renderer():
        return engine.render(PROMPTS[2], seed=SEEDS[2], progress=progress, **SHAPE)

    def caller():
        assert inside.wait(TIMEOUT)
        info = engine.render_info()  # blocks until the render releases the engine
        return time.monotonic(), info

    r, (returned, info) = run_threads([renderer, caller])
    assert not isinstance(r, BaseException), r
    assert same_bytes(r, alone[2])
    assert returned >= last_report[0], "render_info() ran while the render was still reporting progress"
    assert info["steps_done"] == info["steps"] and info["frames"] == 22


@pytest.mark.parametrize("reentry", ["render_info", "step", "render", "threads"])
def test_progress_callback_reentry_is_refused(engine, alone, reentry):
    seen: list[str] = []

    def progress(phase, done, total):
        seen.append(phase)
        if reentry == "render_info":
            engine.render_info()
        elif reentry == "step":
            engine.step()
        elif reentry == "render":
            engine.render(PROMPTS[1], **SHAPE)
        else:
            engine.threads  # noqa: B018 - a property that calls into the context

    def renderer():
        return engine.render(PROMPTS[0], seed=SEEDS[0], progress=progress, **SHAPE)

    (err,) = run_threads([renderer])
    assert isinstance(err, H3Error), f"expected H3Error, got {err!r}"
    assert "engine is busy" in str(err) and f"{reentry}()" in str(err)
    assert seen == ["tokenize"], "the render went on after the refused call"  # stopped at the first report
    # The engine is intact: the next render is the same as before.
    assert same_bytes(engine.render(PROMPTS[0], seed=SEEDS[0], **SHAPE), alone[0])


def test_cancel_from_the_progress_callback_is_allowed(engine, alone):
    def progress(phase, done, total):
        if phase == "denoise":
            engine.cancel()  # takes no lock: the one call a callback may make

    # the engine reports a cancel() as KeyboardInterrupt (its Ctrl-C path); either way the render stops
    with pytest.raises((KeyboardInterrupt, H3Error)):
        engine.render(PROMPTS[3], seed=SEEDS[3], progress=progress, **SHAPE)
    assert same_bytes(engine.render(PROMPTS[3], seed=SEEDS[3], **SHAPE), alone[3])


def test_close_from_another_thread_waits_for_the_render(alone):
    eng = Engine(threads=1)
    inside = threading.Event()

    def progress(phase, done, total):
        inside.set()

    def renderer():
        return eng.render(PROMPTS[1], seed=SEEDS[1], progress=progress, **SHAPE)

    def closer():
        assert inside.wait(TIMEOUT)
        eng.close()

    r, closed = run_threads([renderer, closer])
    assert not isinstance(r, BaseException), r
    assert closed is None
    assert same_bytes(r, alone[1])
    with pytest.raises(H3Error, match="closed"):
        eng.render_info()
    eng.close()  # closing twice is harmless
