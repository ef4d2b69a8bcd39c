"""Issue #27, outputs: an output is never overwritten unless --overwrite (and then only a regular file), never
left partial, and an unwritable one fails before any work. Renders are h3-tiny at 128x128, 2 steps."""

import os
import subprocess
import sys
import time

import pytest

from tests.h3cli import assert_clean_error, run

PROMPT = "a red circle moves right on a black background, a high beep"
SMALL = ["--size", "128x128", "--steps", "2", "--frames", "5"]
BIG = ["--size", "256x256", "--frames", "90", "--steps", "2"]


def render(*args, **kw):
    return run("render", "-q", "-p", PROMPT, *args, **kw)


def popen(*args):
    return subprocess.Popen([sys.executable, "-m", "h3ctl", "render", "-q", "-p", PROMPT, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name)


def test_concurrent_renders_to_one_path(tmp_path):
    """Two renders to one path: exactly one wins, the other fails with one line; neither replaces the other."""
    out = tmp_path / "same.mp4"
    a, b = popen("-o", out, *SMALL, "--seed", "1"), popen("-o", out, *SMALL, "--seed", "2")
    ra, rb = a.communicate(timeout=120), b.communicate(timeout=120)
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 2], (ra, rb)
    loser = ra if a.returncode else rb
    assert "same.mp4" in loser[1] and ("appeared there while rendering" in loser[1] or "already exists" in loser[1])
    assert out.stat().st_size > 1000 and not leftovers(tmp_path)


def test_file_created_during_render_is_kept(tmp_path):
    out = tmp_path / "late.mp4"
    p = popen("-o", out, *BIG)
    deadline = time.time() + 60
    while not any(".partial" in n.name for n in tmp_path.iterdir()) and time.time() < deadline:
        time.sleep(0.02)
    out.write_text("precious\n")
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2, err
    assert "a file appeared there while rendering; it was kept" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "precious\n" and not leftovers(tmp_path)


def test_overwrite_never_replaces_a_device(tmp_path):
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    proc = render("-o", fifo, "--overwrite", *SMALL, timeout=60)
    assert_clean_error(proc, "is a FIFO; only regular files are ever replaced")
    assert __import__("stat").S_ISFIFO(os.lstat(fifo).st_mode)
    proc = render("-o", "/dev/null", "--overwrite", *SMALL, timeout=60)
    assert_clean_error(proc, "/dev/null: exists and is a device; only regular files are ever replaced")
    assert __import__("stat").S_ISCHR(os.stat("/dev/null").st_mode)


def test_unwritable_output_fails_before_work(tmp_path):
    t0 = time.perf_counter()
    proc = render("-o", "/proc/h3probe.mp4", *BIG, timeout=60)
    assert_clean_error(proc, "/proc/h3probe.mp4: cannot be written")
    assert time.perf_counter() - t0 < 3.0  # no compute ran (BIG takes several seconds)


@pytest.mark.parametrize("setup, target, needle", [
    ("dir", "o.mp4", "o.mp4: is a directory; give a file name"),
    ("file", "some.png/x.mp4", "some.png is a file, not a folder"),
    (None, "nodir/x.mp4", "nodir: output folder does not exist"),
    ("exists", "o.mp4", "o.mp4: already exists (pass --overwrite to replace it)"),
])
def test_output_messages(tmp_path, setup, target, needle):
    if setup == "dir":
        (tmp_path / "o.mp4").mkdir()
    elif setup == "file":
        (tmp_path / "some.png").write_bytes(b"png")
    elif setup == "exists":
        (tmp_path / "o.mp4").write_bytes(b"mine")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_clean_error(render("-o", tmp_path / target, *SMALL, timeout=60), needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if setup == "exists":
        assert (tmp_path / "o.mp4").read_bytes() == b"mine"


def test_overwrite_replaces_a_regular_file_and_frames_dir_is_staged(tmp_path):
    out, frames = tmp_path / "o.mp4", tmp_path / "frames"
    out.write_bytes(b"old")
    proc = render("-o", out, "--overwrite", "--frames-dir", frames, "--wav", tmp_path / "o.wav", *SMALL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 1000 and (tmp_path / "o.wav").stat().st_size > 1000
    names = sorted(p.name for p in frames.iterdir())
    assert len(names) == 22 and names[0] == "frame-0001.png" and not leftovers(tmp_path)


def test_result_save_never_replaces(tmp_path):
    from h3ctl import Engine, H3Error

    with Engine(threads=1) as eng:
        res = eng.render("x", width=128, height=128, frames=5, steps=2)
    p = tmp_path / "a.wav"
    p.write_bytes(b"mine")
    with pytest.raises(H3Error, match="already exists"):
        res.save(p)
    assert p.read_bytes() == b"mine"
    res.save(p, overwrite=True)
    assert p.stat().st_size > 1000 and not leftovers(tmp_path)
