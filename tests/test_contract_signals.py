"""Issue #27, signals: SIGINT, SIGTERM and SIGHUP at each phase of a render (prompt, denoise, decode, each output
write) end with one line, exit 130 / 143 / 129, and nothing left behind: no output, no temporary.

The render runs in a subprocess through a small harness that, on the first event of the phase under test, writes a
marker file and waits there (inside the progress callback, or inside the writer), so the signal lands in that
phase every time."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

HARNESS = textwrap.dedent("""
    import os, sys, time
    phase, marker = sys.argv[1], sys.argv[2]
    from h3ctl import engine, media

    def hold(stop=lambda: False):
        if not os.path.exists(marker):
            open(marker, "w").close()
            for _ in range(3000):  # at most 30 s; the signal comes long before
                if stop():  # the handler asked the engine to stop: go on, so the C call sees it
                    return
                time.sleep(0.01)

    if phase in ("tokenize", "text_encoder", "denoise", "audio_decode", "video_decode"):
        orig = engine.Engine._on_progress
        def on_progress(self, user, ph, done, total):
            if ph and ph.decode() == phase:
                hold(lambda: self._cancel)
            return orig(self, user, ph, done, total)
        engine.Engine._on_progress = on_progress
    else:  # a writer: mp4, wav or frames
        name = {"mp4": "write_mp4", "wav": "write_wav", "frames": "encode_png"}[phase]
        orig_w = getattr(media, name)
        def writer(*a, **k):
            if name != "encode_png":
                out = orig_w(*a, **k)  # the temporary is complete, the final name not yet published
                hold()
                return out
            hold()
            return orig_w(*a, **k)
        setattr(media, name, writer)
    from h3ctl.cli import main
    sys.exit(main(sys.argv[3:]))
""")

PHASES = ["text_encoder", "denoise", "audio_decode", "video_decode", "mp4", "wav", "frames"]
SIGS = {"SIGINT": (signal.SIGINT, 130, "h3ctl: interrupted"),
        "SIGTERM": (signal.SIGTERM, 143, "h3ctl: terminated (SIGTERM)"),
        "SIGHUP": (signal.SIGHUP, 129, "h3ctl: hung up (SIGHUP)")}


def _run(tmp_path, phase, signame):
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "marker"
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    args = ["render", "-q", "-p", "a red circle moves right on a black background, a high beep", "--size", "128x128",
            "--frames", "5", "--steps", "3", "-o", work / "o.mp4", "--wav", work / "o.wav", "--frames-dir",
            work / "frames"]
    p = subprocess.Popen([sys.executable, str(harness), phase, str(marker), *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not marker.exists():
        assert p.poll() is None and time.time() < deadline, p.communicate()
        time.sleep(0.02)
    t0 = time.time()
    sig, code, line = SIGS[signame]
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, err, sorted(os.listdir(work)), time.time() - t0, code, line


# SIGTERM at every phase; SIGINT and SIGHUP at one computing phase and one write (the same handler serves all)
CASES = [(ph, "SIGTERM") for ph in PHASES] + [(ph, s) for s in ("SIGINT", "SIGHUP") for ph in ("denoise", "mp4",
                                                                                              "frames")]


@pytest.mark.parametrize("phase, signame", CASES)
def test_signal_at_each_phase(tmp_path, phase, signame):
    rc, err, left, _, code, line = _run(tmp_path, phase, signame)
    assert rc == code, err
    assert err.strip().splitlines() == [line], err
    assert left == [], left  # no output, no .partial file or folder


def test_sigint_acts_quickly_in_the_prompt_phase(tmp_path):
    _, _, left, dt, _, _ = _run(tmp_path, "text_encoder", "SIGINT")
    assert left == [] and dt < 1.5, dt  # the callback returns within 0.01 s; the rest is tear-down


def test_prompt_phases_check_cancellation_often():
    """At the longest prompt the model takes (just under h3-tiny's 4096 tokens), the tokenizer and the text
    encoder call the progress hook (where a cancel takes effect) at least every 0.5 s."""
    from h3ctl import Cancelled, Engine

    stamps = []

    def prog(phase, done, total):
        stamps.append((phase, time.perf_counter()))
        return phase == "prepare"  # stop before the transformer

    with Engine(threads=2) as eng:
        t0 = time.perf_counter()
        with pytest.raises(Cancelled):
            eng.render("red circle " * 2040, width=128, height=128, frames=5, steps=2, progress=prog)
    times = [t0] + [t for ph, t in stamps if ph in ("tokenize", "text_encoder")]
    assert len(times) >= 6 and {"tokenize", "text_encoder"} <= {ph for ph, _ in stamps}
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 0.5, gaps
