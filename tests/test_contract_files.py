"""Issue #27, files: every file option refuses a directory, a FIFO (whose open or read would block forever), a
device (/dev/zero reads without end), a symlink loop, an empty file and one larger than the format can need, by
name, in one line, quickly, writing nothing."""

import os

import pytest

from tests.h3cli import assert_clean_error, run

BASE = ["render", "-q", "-p", "a red circle moves right on a black background, a high beep"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    os.mkfifo(d / "fifo")
    (d / "folder").mkdir()
    os.symlink(d / "loop_b", d / "loop_a")
    os.symlink(d / "loop_a", d / "loop_b")
    (d / "empty").write_bytes(b"")
    with open(d / "huge", "wb") as f:  # sparse: no disk used
        f.truncate(5 << 30)
    return d


KINDS = {"fifo": "is a FIFO, not a regular file", "folder": "is a directory, not a regular file",
         "loop_a": "a symbolic link loop", "/dev/zero": "is a device, not a regular file"}


def _path(hostile, kind):
    return kind if kind.startswith("/") else str(hostile / kind)


@pytest.mark.parametrize("option", ["--first-frame", "--last-frame", "--ref-image", "--ref-audio", "--ref-video",
                                    "--ref-silent-video", "--lora", "--quantized"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_non_regular_inputs_refused(hostile, tmp_path, option, kind):
    out = tmp_path / "o.mp4"
    proc = run(*BASE, "-o", out, option, _path(hostile, kind), timeout=30)
    assert_clean_error(proc, KINDS[kind], _path(hostile, kind))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option, needle", [("--first-frame", "the file is empty"), ("--ref-image", "the file is empty"),
                                            ("--ref-audio", "the file is empty")])
def test_empty_inputs_refused(hostile, tmp_path, option, needle):
    proc = run(*BASE, "-o", tmp_path / "o.mp4", option, hostile / "empty", timeout=30)
    assert_clean_error(proc, needle)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option, needle", [("--first-frame", "more than the format can need"),
                                            ("--last-frame", "more than the format can need"),
                                            ("--ref-audio", "more than the 4096 MiB this input can need"),
                                            ("--ref-video", "more than the 4096 MiB this input can need")])
def test_huge_inputs_refused_without_reading(hostile, tmp_path, option, needle):
    proc = run(*BASE, "-o", tmp_path / "o.mp4", option, hostile / "huge", timeout=30)
    assert_clean_error(proc, needle)
    assert not list(tmp_path.iterdir())


def test_libh3_refuses_a_fifo_without_blocking(hostile):
    """libh3's own readers (safetensors headers, configs) open without blocking and refuse a FIFO."""
    proc = run("check", hostile / "fifo", timeout=30)
    assert_clean_error(proc, "not a regular file")


def test_lora_directory_is_not_missing(hostile, tmp_path):
    proc = run(*BASE, "-o", tmp_path / "o.mp4", "--lora", f"{hostile / 'folder'}:0.5", timeout=30)
    assert_clean_error(proc, "is a directory")
