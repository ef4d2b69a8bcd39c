"""Issue #27, messages and the session: a bad model_index.json "h3ctl" block is refused by check, info and render
in the same words; info names a partition folder once; the session has !preset and !first, survives lines that are
not UTF-8, refuses a model that cannot render at start, and ends on SIGTERM with 143 and nothing partial."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import h3ctl
from tests.h3cli import assert_clean_error, run

TINY = Path(h3ctl.__file__).resolve().parent / "models" / "h3-tiny"


def _linked_model(root: Path, index_edit=None, drop=()):
    """h3-tiny as symlinks (no copy of the weights), with an edited model_index.json or components left out."""
    (root / "FL2VA").mkdir(parents=True)
    for c in (TINY / "FL2VA").iterdir():
        if c.is_dir() and c.name not in drop:
            os.symlink(c, root / "FL2VA" / c.name)
    index = json.loads((TINY / "FL2VA" / "model_index.json").read_text())
    if index_edit:
        index_edit(index)
    (root / "FL2VA" / "model_index.json").write_text(json.dumps(index))
    os.symlink(TINY / "tokenizer", root / "tokenizer")
    return root


@pytest.mark.parametrize("key, value, shown", [("default_width", "wide", '"wide"'), ("max_frames", -5, "-5"),
                                               ("max_pixels", 1.5, "1.5")])
def test_h3ctl_block_one_validation(tmp_path, key, value, shown):
    model = _linked_model(tmp_path / "m", lambda ix: ix["h3ctl"].__setitem__(key, value))
    needle = f"model_index.json: h3ctl.{key} must be a whole number between 1 and"
    lines = [assert_clean_error(run("check", model), needle, f"got {shown}"),
             assert_clean_error(run("info", "-d", model), needle),
             assert_clean_error(run("render", "-q", "-d", model, "-p", "x", "-o", tmp_path / "o.mp4"), needle)]
    assert len(set(lines)) == 1  # the same words everywhere
    assert not (tmp_path / "o.mp4").exists()


def test_info_partition_folder():
    proc = run("info", "-d", TINY / "FL2VA")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "partition partition" not in first and "(a partition folder)" in first


def session(*args, script: bytes, timeout=120):
    return subprocess.run([sys.executable, "-m", "h3ctl", "session", *map(str, args)], input=script,
                          capture_output=True, timeout=timeout)


def test_session_preset_first_and_bad_bytes(tmp_path):
    from h3ctl import media

    img = tmp_path / "first.png"
    rgb = __import__("numpy").zeros((64, 64, 3), "uint8")
    rgb[:, :, 0] = 255
    img.write_bytes(media.encode_png(rgb))
    script = (b"a red \xff\xfe circle\n!settings\n!preset fast\n!preset bogus\n!size 64x64\n!steps 2\n"
              b"!first /dev/zero\n!first " + str(img).encode() + b"\na red\x00 circle\na red circle\n!first off\n"
              b"a red circle\n")
    out = tmp_path / "s"
    proc = session("--out", out, script=script)
    err, so = proc.stderr.decode(), proc.stdout.decode()
    assert proc.returncode == 0, err
    assert "h3ctl: error: the line is not valid UTF-8 (byte 0xFF at character 6); skipped" in err
    assert "preset fast: reuse 4" in so and "unknown preset 'bogus'" in err
    assert "!first: first frame /dev/zero: is a device" in err and f"first frame {img} (64x64)" in so
    assert "NUL character" in err and "does not have yet" not in err + so
    names = sorted(p.name for p in out.glob("*.mp4"))
    assert len(names) == 2  # the NUL line rendered nothing
    # the session's render is the API's render with that keyframe and preset (and not the one without)
    from h3ctl import Engine

    with Engine() as eng:
        want = eng.render("a red circle", 64, 64, steps=2, seed=42, first_frame=rgb, preset="fast")
    want.save(tmp_path / "want.mp4")
    got = [media.read_mp4_frames(out / n) for n in names]
    ref = media.read_mp4_frames(tmp_path / "want.mp4")
    assert (got[0] == ref).all() and not (got[1] == ref).all()


def test_session_refuses_a_broken_model_at_start(tmp_path):
    model = _linked_model(tmp_path / "m", drop=("transformer",))
    proc = session("-d", model, "--out", tmp_path / "s", script=b"a red circle\n")
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "component 'transformer' is missing" in lines[0]
    assert not (tmp_path / "s").exists()


def test_session_sigterm(tmp_path):
    out = tmp_path / "s"
    p = subprocess.Popen([sys.executable, "-m", "h3ctl", "session", "--out", str(out)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(b"!size 256x256\n!frames 90\n!steps 20\na red circle moves right\n")
    p.stdin.flush()
    deadline = time.time() + 60
    line = b""
    while b"rendering" not in line and time.time() < deadline:
        line = p.stdout.readline()
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert err.decode().strip().splitlines()[-1] == "h3ctl: terminated (SIGTERM)"
    assert not list(out.glob("*.mp4")) and not [n for n in os.listdir(out) if ".partial" in n]
