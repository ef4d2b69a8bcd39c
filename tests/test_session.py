"""`h3ctl session`: driven through a pipe (scripts) and through a pseudo-terminal (prompts, readline, Ctrl-C).

Every case checks the files in the session folder, the messages (one line per problem, no traceback) and the
exit status."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from h3ctl import media
from tests.h3cli import assert_clean_error

P1 = "a red circle moves right on a black background, a high beep"
P2 = "a blue square moves left on a white background"


def session(*args, script="", cwd=None, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "h3ctl", "session", *map(str, args)], input=script,
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def err_lines(proc):
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return lines


def mp4s(folder):
    return sorted(p.name for p in folder.glob("*.mp4"))


def test_piped_script(tmp_path):
    out = tmp_path / "s"
    opened = tmp_path / "opened.txt"
    opener = tmp_path / "opener.py"
    opener.write_text(f"import sys\nopen({str(opened)!r}, 'w').write(sys.argv[1])\n")
    script = "\n".join([
        "!size 64x64", "!steps 3", P1,          # 001, seed 42
        "!again",                               # 002, seed 43, same prompt: a prompt-cache hit
        "!seed 7", "!frames 30", P2,            # 003, seed 7, 39 frames
        "!seconds 1.5", "!settings", "!history", "!open",
        "!bogus", "!size 100x64", "!size big", "!steps x", "!steps 1", "!frames -3", "!seconds soon",
        "!seed -1", "!show maybe", "!show on", "!", "!preset fast", "!first a.png", "!last b.png",
        "", "   ",
        "!quit", "this line is never rendered",
    ]) + "\n"
    env = dict(os.environ, H3CTL_OPENER=f"{sys.executable} {opener}")
    proc = session("--out", out, script=script, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "h3> " not in proc.stdout  # no prompts on a pipe

    names = mp4s(out)
    assert [n[:4] for n in names] == ["001-", "002-", "003-"]
    assert names[0] == "001-a-red-circle-moves-right-on-a-black.mp4"
    assert names[2] == "003-a-blue-square-moves-left-on-a-white.mp4"
    for name, frames in zip(names, (22, 22, 39)):
        info = media.probe_mp4(out / name)
        assert "64x64" in info["video"] and "32000 Hz" in info["audio"]
        assert len(media.read_mp4_frames(out / name)) == frames
    # the same prompt with the next seed is a different video
    assert (out / names[0]).read_bytes() != (out / names[1]).read_bytes()

    log = [json.loads(x) for x in (out / "renders.jsonl").read_text().splitlines()]
    assert [(r["file"], r["seed"], r["frames"], r["steps"]) for r in log] == [
        (names[0], 42, 22, 3), (names[1], 43, 22, 3), (names[2], 7, 39, 3)]
    assert log[0]["prompt"] == P1 == log[1]["prompt"] and log[2]["prompt"] == P2
    history = (out / "history.txt").read_text().splitlines()
    assert history == [ln for ln in script.splitlines() if ln.strip()][:-1]  # every line, nothing after !quit

    o = proc.stdout
    assert "seconds 1.5 (39 frames)" in o
    assert "size 64x64, 39 frames (1.62 s), steps 3, seed 7, show off" in o
    hits = int(re.search(r"prompt cache: entries (\d+), hits (\d+)", o).group(2))
    assert hits >= 1  # the model and its prompt cache stayed loaded between renders
    for name, seed in zip(names, (42, 43, 7)):
        assert f"{name}  seed {seed}  64x64" in o  # !history
    assert opened.read_text() == str(out / names[2]) and f"opened {names[2]}" in o

    errs = err_lines(proc)
    expected = [
        "unknown command !bogus", "!size 100x64: width and height must be multiples of 32", "!size wants WIDTHxHEIGHT",
        "!steps wants a whole number", "!steps 1: steps must be between 2 and 1000", "!frames wants a positive",
        "!seconds wants a duration", "!seed must be between 0", "!show wants on or off",
        "!show: no preview protocol for this output (stdout is not a terminal", "a command name must follow !",
        "!first: first frame a.png: no such file", "!last: last frame b.png: no such file",
    ]
    assert len(errs) == len(expected), errs
    for line, needle in zip(errs, expected):
        assert line.startswith("h3ctl: ") and needle in line, (line, needle)


def test_default_folder_and_continued_numbering(tmp_path):
    proc = session(script="!size 64x64\n!steps 2\n!seed random\nfirst\n", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (folder,) = list(tmp_path.iterdir())
    assert re.fullmatch(r"h3-session-\d{8}-\d{6}", folder.name)
    assert mp4s(folder) == ["001-first.mp4"] and f"renders go to {folder}" in proc.stdout
    seed = json.loads((folder / "renders.jsonl").read_text())["seed"]
    assert "seed random" in proc.stdout and seed != 42
    assert f"001-first.mp4: rendering 64x64, 22 frames, 2 steps, seed {seed}" in proc.stdout

    # an existing folder: numbering goes on after its highest number, nothing is overwritten, history is kept
    (folder / "007-mine.mp4").write_bytes(b"precious")
    proc = session("--out", folder, script="!size 64x64\n!steps 2\n!history\nsecond\n")
    assert proc.returncode == 0, proc.stderr
    assert mp4s(folder) == ["001-first.mp4", "007-mine.mp4", "008-second.mp4"]
    assert (folder / "007-mine.mp4").read_bytes() == b"precious"
    assert f"001-first.mp4  seed {seed}  64x64 22 frames 2 steps  first" in proc.stdout
    assert (folder / "history.txt").read_text().splitlines()[-1] == "second"


def test_unwritable_session_folders(tmp_path):
    # cannot be created at all: refused at the start
    (tmp_path / "file").write_text("x")
    assert_clean_error(session("--out", tmp_path / "file"), "exists and is not a folder")
    assert_clean_error(session("--out", "/proc/h3ctl-no/such"), "cannot create the session folder")
    assert_clean_error(session("--out", tmp_path / "s", "-d", tmp_path / "nomodel"), "no such directory")
    assert not (tmp_path / "s").exists()

    # exists but cannot be written: one line at the start, one per render, the session goes on
    if os.geteuid() == 0:
        folder = "/proc/self"  # root writes anywhere else; nobody creates files here
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
    proc = session("--out", folder, script=f"!size 64x64\n!steps 2\n{P1}\n!again\n!history\n!settings\n")
    assert proc.returncode == 0
    errs = err_lines(proc)
    assert len(errs) == 3 and all("the session folder is not writable" in e for e in errs), errs
    assert "nothing rendered" in errs[1] and "nothing rendered" in errs[2]
    assert "no renders yet" in proc.stdout and "size 64x64" in proc.stdout  # commands still work


def test_ctrl_c_cancels_the_render_and_keeps_the_session(tmp_path):
    out = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-m", "h3ctl", "session", "--out", str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    proc.stdin.write(f"!size 128x128\n!steps 1000\n{P1}\n")
    proc.stdin.flush()
    _read_until(proc.stdout, "rendering 128x128", 60)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert "cancelled, nothing written" in proc.stderr.readline()
    proc.stdin.write(f"!steps 2\n!size 64x64\n{P2}\n")
    proc.stdin.close()
    rest = proc.stdout.read()
    proc.wait(60)
    assert proc.returncode == 0
    assert "001-a-blue-square-moves-left-on-a-white.mp4: 22 frames 64x64" in rest  # the number was not used up
    assert sorted(p.name for p in out.iterdir()) == ["001-a-blue-square-moves-left-on-a-white.mp4", "history.txt",
                                                     "renders.jsonl"]  # no partial file


def _read_until(stream, needle, timeout):
    end = time.time() + timeout
    seen = ""
    while time.time() < end:
        line = stream.readline()
        seen += line
        if needle in line:
            return seen
        if not line:
            break
    raise AssertionError(f"{needle!r} not seen in {seen!r}")


# -- a real terminal -----------------------------------------------------------------------------------------

class Pty:
    def __init__(self, args, env):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child: the session on a terminal of its own (it is the terminal's foreground)
            os.execvpe(sys.executable, [sys.executable, "-m", "h3ctl", "session", *map(str, args)], env)
        self.buf = b""

    def expect(self, pattern, timeout=60):
        import select

        rx = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        end = time.time() + timeout
        while time.time() < end:
            m = rx.search(self.buf)
            if m:
                before, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return before.decode("utf-8", "replace")
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                self.buf += chunk
        raise AssertionError(f"{pattern!r} not seen; got {self.buf[-2000:]!r}")

    def send(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 65536)
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("the session did not end")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_terminal_prompt_readline_history_and_ctrl_c(tmp_path):
    pytest.importorskip("readline")
    out = tmp_path / "s"
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="80", LINES="24")
    env.pop("COLORTERM", None)
    t = Pty(["--out", out], env)
    t.expect(r"!help lists the commands")
    t.expect("h3> ")
    t.send("size 64x64\x01!\r")  # Ctrl-A: readline's start of line, then "!": runs !size 64x64
    t.expect(r"size 64x64\r\n")
    t.expect("h3> ")
    t.send("!steps 1000\r")
    t.expect("h3> ")
    t.send(P1 + "\r")
    t.expect(r"rendering 64x64")
    t.expect(r"denoise \d+/999")  # the status line of a render in progress
    t.send("\x03")  # Ctrl-C: the terminal sends SIGINT
    t.expect(r"cancelled, nothing written")
    t.expect("h3> ")
    t.send("!steps 2\r")
    t.expect("h3> ")
    t.send("\x1b[A\x1b[A\r")  # Up twice: readline's history brings back the prompt
    t.expect(r"001-a-red-circle-moves-right-on-a-black\.mp4: 22 frames 64x64")
    t.expect("h3> ")
    t.send("half a line\x03")  # Ctrl-C at the prompt drops the line, the session goes on
    t.expect("h3> ")
    t.send("!settings\r")
    t.expect(r"steps 2, seed 42")
    t.expect("h3> ")
    t.send("\x04")  # Ctrl-D: end of input
    assert t.wait() == 0
    assert mp4s(out) == ["001-a-red-circle-moves-right-on-a-black.mp4"]
    assert (out / "history.txt").read_text().splitlines() == ["!size 64x64", "!steps 1000", P1, "!steps 2", P1,
                                                             "!settings"]

    # a new session in the same folder starts from that history
    t = Pty(["--out", out], env)
    t.expect("h3> ")
    t.send("\x1b[A\r")  # Up: the last line of the last session, !settings (a new session: default settings)
    t.expect(r"!settings\r\nsize 128x128, 22 frames \(0\.92 s\), steps 20, seed 42")
    t.expect("h3> ")
    t.send("!quit\r")
    assert t.wait() == 0


def test_open_without_an_opener_and_show_blocks(tmp_path, monkeypatch):
    """In-process (the opener lookup is replaced): a missing opener is one line; !show on with forced blocks
    draws the previews and the final frames into the output, after one line about the (first) map fit."""
    import io
    import shutil

    import numpy as np

    from h3ctl import Engine, preview
    from h3ctl import session as sess

    grey = np.zeros((25, 3), np.float32)
    grey[24] = 0.5  # a fixed map stands in for the fit (its quality is measured in test_preview)
    monkeypatch.setattr(preview, "fit_map", lambda engine, **kw: preview.PreviewMap(grey))
    monkeypatch.delenv("H3CTL_OPENER", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "40")
    out = tmp_path / "s"
    script = f"!open\n!size 64x64\n!steps 3\n!show on\n{P1}\n!open\n!show off\n!settings\n"
    stdout, stderr = io.StringIO(), io.StringIO()
    with Engine(threads=2) as eng:
        s = sess.Session(eng, sess.prepare_folder(str(out)), protocol="blocks", stdin=io.StringIO(script),
                         stdout=stdout, stderr=stderr)
        assert s.run() == 0
    errs = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
    assert errs[0] == "h3ctl: error: !open: nothing rendered yet"
    assert errs[1] == "h3ctl: fitting the preview map for this model (once; it is cached)"
    assert errs[2].startswith("h3ctl: error: !open: no opener found for ") and "H3CTL_OPENER" in errs[2]
    assert len(errs) == 3, errs
    o = stdout.getvalue()
    assert "step 2/2 (x0 estimate)" in o and "final frames 22/22" in o and "\u2580" in o
    assert "show off; folder" in o
    assert mp4s(out) == ["001-a-red-circle-moves-right-on-a-black.mp4"]
