"""`h3ctl session`: a prompt line with a warm model.

Each plain line renders with the current settings into a numbered MP4 in the session folder
(`001-a-red-circle.mp4`, ...); `!` commands change settings or act (`!help`). The model, its prompt cache and
the preview map stay loaded between renders. Ctrl-C cancels the render in progress (nothing is written, the
number is not used up) and the session goes on; at an empty prompt it clears the line. End of input (Ctrl-D,
or the end of a pipe) or `!quit` ends the session with exit status 0.

Reading from a pipe works the same without prompts, so scripts and tests can drive a session. Every problem a
line can cause (an unknown command, a bad value, a failed render) is answered with one line on stderr and the
session continues.

The session folder: `--out DIR` (created when missing, reused when it exists: numbering continues after the
highest number there, nothing is overwritten) or a new `h3-session-YYYYMMDD-HHMMSS` folder in the current
directory. It holds the MP4s, `history.txt` (every line entered, appended as it is entered; the prompt line's
Up-arrow history starts from it) and `renders.jsonl` (one JSON object per written MP4: file, prompt, seed,
size, frames, steps, seconds). A folder that cannot be created ends the session before it starts (exit 2); a
folder that exists but cannot be written to is reported once at the start, then each render is refused with
one line before any compute (so no work is lost) while settings, history and the other commands keep working
(the history then lives in memory only); renders go through again as soon as the folder is writable.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._lib import H3Error
from .errors import Cancelled
from .outputs import Interrupted

PROMPT = "h3> "
HISTORY = "history.txt"
LOG = "renders.jsonl"

HELP = """\
a plain line renders it with the current settings into the next numbered MP4 of the session folder
!size WxH            canvas in pixels, multiples of 32 (e.g. !size 128x128)
!frames N            frames at 24 fps, aligned up to 17n+5
!seconds S           duration instead of frames
!steps N             sigma grid points including the final 0 (the default 20 runs 19 evaluations)
!seed N | random     a fixed seed for every render, or a new random one each time
!again               the last prompt again with the next seed
!show on | off       per-step previews and the final frames in the terminal
!open                open the last MP4 with the system's opener ($H3CTL_OPENER overrides it)
!history             the renders of this session folder
!settings            the current settings
!preset NAME | off   a speed preset for the renders (`h3ctl presets` lists them; off: the exact render)
!first PATH | off    start the videos on this image (FL2VA); off: no first frame
!last PATH | off     end the videos on this image; off: no last frame
!help                this list
!quit                end the session (so does Ctrl-D or the end of piped input)
Ctrl-C cancels a render in progress; the session goes on."""


def add_arguments(p) -> None:
    p.add_argument("-d", "--model-dir", help="model directory (official layout); default: the embedded h3-tiny")
    p.add_argument("--out", help="session folder (default: a new h3-session-DATE-TIME folder here)")
    p.add_argument("--threads", type=int, default=0, help="worker threads (default: all cores)")
    try:
        from .render import add_device_arguments
    except ImportError:  # pragma: no cover - older render.py
        pass
    else:
        add_device_arguments(p)
    from .showopts import add_preview_arguments

    add_preview_arguments(p)


def slug(prompt: str, limit: int = 40) -> str:
    words = re.findall(r"[a-z0-9]+", prompt.lower())
    out = ""
    for w in words:
        cand = f"{out}-{w}" if out else w
        if len(cand) > limit:
            break
        out = cand
    return out or "render"


def _default_folder(now: datetime.datetime | None = None) -> Path:
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path.cwd() / f"h3-session-{stamp}"
    cand, k = base, 2
    while cand.exists():
        cand = base.with_name(f"{base.name}-{k}")
        k += 1
    return cand


def prepare_folder(out: str | None) -> Path:
    """Create (or reuse) the session folder; H3Error when it cannot be had at all."""
    folder = Path(out) if out else _default_folder()
    if folder.exists() and not folder.is_dir():
        raise H3Error(f"{folder}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise H3Error(f"{folder}: cannot create the session folder ({e.strerror or e})") from None
    return folder


def folder_writable(folder: Path) -> bool:
    """A real probe (a temporary file), not os.access: root passes access() on folders it cannot write."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".h3-probe-"):
            pass
        return True
    except OSError:
        return False


def _opener() -> list[str] | None:
    env = os.environ.get("H3CTL_OPENER")
    if env is not None:
        return shlex.split(env) or None
    if sys.platform == "darwin":
        return ["open"]
    if os.name == "nt":
        return ["cmd", "/c", "start", ""]
    if shutil.which("xdg-open"):
        return ["xdg-open"]
    if shutil.which("gio"):
        return ["gio", "open"]
    return None


class Session:
    def __init__(self, engine, folder: Path, *, show: bool = False, protocol: str = "auto", every: int = 1,
                 stdin=None, stdout=None, stderr=None):
        self.engine = engine
        self.folder = folder
        self.stdin = stdin if stdin is not None else sys.stdin
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        self.interactive = self._isatty(self.stdin)
        d = engine.defaults
        self.width, self.height = int(d["width"]), int(d["height"])
        self.frames: int | None = int(d["frames"])
        self.seconds: float | None = None
        self.steps = int(d["steps"])
        self.seed: int | None = 42  # None: a random seed for every render
        self.preset: str | None = None  # None: every knob off, the exact render
        self.keyframes: dict = {"first_frame": None, "last_frame": None}  # decoded RGB arrays
        self.protocol = protocol
        self.every = every
        self.show = False
        self.renders: list[dict] = []
        self.last_prompt: str | None = None
        self.last_seed: int | None = None
        self._number = 0
        self._readline = None
        self._load_log()
        if show:
            self.set_show(True, "--show")

    # -- output ----------------------------------------------------------------------------------
    @staticmethod
    def _isatty(stream) -> bool:
        try:
            return bool(stream.isatty())
        except (AttributeError, ValueError):
            return False

    def say(self, text: str) -> None:
        print(text, file=self.stdout, flush=True)

    def error(self, text: str) -> None:
        print(f"h3ctl: error: {text}", file=self.stderr, flush=True)

    def note(self, text: str) -> None:
        print(f"h3ctl: {text}", file=self.stderr, flush=True)

    # -- folder, history, log --------------------------------------------------------------------
    def _load_log(self) -> None:
        try:
            lines = (self.folder / LOG).read_text().splitlines()
        except OSError:
            return
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "file" in rec:
                self.renders.append(rec)

    def _append(self, name: str, text: str) -> None:
        try:
            with open(self.folder / name, "a", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError:
            pass  # an unwritable folder keeps the history in memory; renders report the folder themselves

    def next_number(self) -> int:
        top = self._number
        try:
            for p in self.folder.iterdir():
                m = re.match(r"^(\d+)-.*\.mp4$", p.name)
                if m:
                    top = max(top, int(m.group(1)))
        except OSError:
            pass
        for r in self.renders:
            m = re.match(r"^(\d+)-", str(r.get("file", "")))
            if m:
                top = max(top, int(m.group(1)))
        return top + 1

    # -- settings ----------------------------------------------------------------------------------
    def plan(self, width=None, height=None, frames=None, seconds=None, steps=None) -> dict:
        """Validate settings against the model (H3Error naming the problem), computing nothing."""
        width = self.width if width is None else width
        height = self.height if height is None else height
        if frames is None and seconds is None:
            frames, seconds = self.frames, self.seconds
        steps = self.steps if steps is None else steps
        req = self.engine.request("plan", width, height, frames, seconds, steps, 0, preset=self.preset,
                                  **self.keyframes)
        return self.engine.plan(req)

    def settings_line(self) -> str:
        try:
            p = self.plan()
            frames = f"{p['frames']} frames ({p['frames'] / 24:.2f} s)"
        except H3Error:
            frames = f"{self.frames} frames" if self.seconds is None else f"{self.seconds} s"
        seed = "random" if self.seed is None else str(self.seed)
        try:
            from .text import cache_stats

            st = cache_stats(self.engine._ctx)
            cache = f"; prompt cache: entries {st['entries']}, hits {st['hits']}"
        except (H3Error, AttributeError, KeyError):
            cache = ""
        return (f"size {self.width}x{self.height}, {frames}, steps {self.steps}, seed {seed}, "
                f"show {'on' if self.show else 'off'}; folder {self.folder}; model {self.engine.model_dir}{cache}")

    def set_show(self, on: bool, origin: str = "!show") -> None:
        if not on:
            self.show = False
            return
        from .terminal import open_display

        disp = open_display(self.protocol, self.stdout)
        if not disp.enabled:
            self.show = False
            self.error(f"{origin}: no preview protocol for this output (stdout is not a terminal, or TERM is "
                       "dumb; --preview-protocol forces one); previews stay off")
            return
        self.show = True

    # -- commands ----------------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run one `!` command; False ends the session."""
        name, _, arg = line[1:].strip().partition(" ")
        name, arg = name.lower(), arg.strip()
        if name in ("quit", "exit"):
            return False
        handler = getattr(self, f"cmd_{name}", None) if re.fullmatch(r"[a-z]+", name or "") else None
        if handler is None:
            self.error(f"unknown command !{name} (see !help)" if name else "a command name must follow ! (see !help)")
            return True
        handler(arg)
        return True

    def cmd_help(self, arg):
        self.say(HELP)

    def cmd_size(self, arg):
        m = re.fullmatch(r"(\d+)\s*[xX\u00d7]\s*(\d+)", arg)
        if not m:
            self.error(f"!size wants WIDTHxHEIGHT, e.g. !size 128x128 (got '{arg}')")
            return
        w, h = int(m.group(1)), int(m.group(2))
        try:
            self.plan(width=w, height=h)
        except H3Error as e:
            self.error(f"!size {w}x{h}: {e}")
            return
        self.width, self.height = w, h
        self.say(f"size {w}x{h}")

    def cmd_frames(self, arg):
        try:
            n = int(arg)
        except ValueError:
            self.error(f"!frames wants a whole number of frames (got '{arg}')")
            return
        if n <= 0:
            self.error(f"!frames wants a positive number of frames (got {n})")
            return
        try:
            p = self.plan(frames=n)
        except H3Error as e:
            self.error(f"!frames {n}: {e}")
            return
        self.frames, self.seconds = n, None
        self.say(f"frames {p['frames']}" + (f" (aligned up from {n})" if p["frames"] != n else ""))

    def cmd_seconds(self, arg):
        try:
            s = float(arg)
        except ValueError:
            self.error(f"!seconds wants a duration in seconds (got '{arg}')")
            return
        try:
            p = self.plan(seconds=s)
        except H3Error as e:
            self.error(f"!seconds {arg}: {e}")
            return
        self.frames, self.seconds = None, s
        self.say(f"seconds {s:g} ({p['frames']} frames)")

    def cmd_steps(self, arg):
        try:
            n = int(arg)
        except ValueError:
            self.error(f"!steps wants a whole number (got '{arg}')")
            return
        try:
            self.plan(steps=n)
        except H3Error as e:
            self.error(f"!steps {n}: {e}")
            return
        self.steps = n
        self.say(f"steps {n}")

    def cmd_seed(self, arg):
        if arg.lower() == "random":
            self.seed = None
            self.say("seed random (a new one for every render)")
            return
        try:
            n = int(arg)
        except ValueError:
            self.error(f"!seed wants a number or 'random' (got '{arg}')")
            return
        if not 0 <= n < 2**64:
            self.error(f"!seed must be between 0 and 2^64-1 (got {n})")
            return
        self.seed = n
        self.say(f"seed {n}")

    def cmd_again(self, arg):
        if self.last_prompt is None:
            self.error("!again: nothing rendered yet")
            return
        self.render(self.last_prompt, (self.last_seed + 1) % 2**64)

    def cmd_show(self, arg):
        if arg.lower() not in ("on", "off"):
            self.error(f"!show wants on or off (got '{arg}')")
            return
        self.set_show(arg.lower() == "on")
        self.say(f"show {'on' if self.show else 'off'}")

    def cmd_open(self, arg):
        if not self.renders:
            self.error("!open: nothing rendered yet")
            return
        path = self.folder / self.renders[-1]["file"]
        cmd = _opener()
        if cmd is None:
            self.error(f"!open: no opener found for {path} (install xdg-utils, or set H3CTL_OPENER to a command)")
            return
        try:
            subprocess.Popen(cmd + [str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            self.error(f"!open: cannot run {cmd[0]}: {e.strerror or e}")
            return
        self.say(f"opened {path.name} with {cmd[0]}")

    def cmd_history(self, arg):
        if not self.renders:
            self.say("no renders yet")
            return
        for r in self.renders:
            self.say(f"{r['file']}  seed {r['seed']}  {r['width']}x{r['height']} {r['frames']} frames "
                     f"{r['steps']} steps  {r['prompt']}")

    def cmd_settings(self, arg):
        self.say(self.settings_line())

    def cmd_preset(self, arg):
        from . import presets

        if arg.lower() in ("off", "none"):
            self.preset = None
            self.say("preset off (the exact render)")
            return
        try:
            p = presets.get(arg)
        except H3Error as e:
            self.error(f"!preset: {e}")
            return
        self.preset = p.name
        self.say(f"preset {p.name}: {presets.describe(p.knobs)}")

    def _keyframe(self, which: str, arg: str) -> None:
        from . import media

        key = f"{which}_frame"
        if not arg:
            self.error(f"!{which} wants an image path or 'off'")
            return
        if arg.lower() == "off":
            self.keyframes[key] = None
            self.say(f"{which} frame off")
            return
        path = os.path.expanduser(arg)
        old = self.keyframes[key]
        try:
            self.keyframes[key] = media.read_image(path, f"{which} frame")
            self.plan()  # the model can take it (a vision tower, the canvas)
        except H3Error as e:
            self.keyframes[key] = old
            self.error(f"!{which}: {e}")
            return
        h, w = self.keyframes[key].shape[:2]
        self.say(f"{which} frame {path} ({w}x{h})")

    def cmd_first(self, arg):
        self._keyframe("first", arg)

    def cmd_last(self, arg):
        self._keyframe("last", arg)

    # -- rendering ---------------------------------------------------------------------------------
    def render(self, prompt: str, seed: int | None = None) -> None:
        from . import media

        if seed is None:
            seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        try:
            plan = self.plan()
        except H3Error as e:
            self.error(str(e))
            return
        self.last_prompt, self.last_seed = prompt, seed
        if not self.folder.is_dir() or not folder_writable(self.folder):
            self.error(f"{self.folder}: the session folder is not writable; nothing rendered "
                       "(the session goes on)")
            return
        number = self.next_number()
        name = f"{number:03d}-{slug(prompt)}.mp4"
        path = self.folder / name
        eng = self.engine
        # What Ctrl-C does depends on the phase: while libh3 computes, ask it to stop at its next unit of work;
        # while the MP4 is written, interrupt at once (the writer removes its temporary file); once the file is
        # there, the render is recorded whatever happens (the key only stops the final animation).
        state = {"phase": "computing", "pending": False, "term": None}
        live = None
        status = self._isatty(self.stderr) and not self.show

        def on_sigint(signum, frame):
            if signum != signal.SIGINT:  # SIGTERM / SIGHUP: stop like Ctrl-C, then end the session
                state["term"] = signum
                if state["phase"] == "computing":
                    eng.cancel()
                    return
                raise Interrupted(signum)
            if state["phase"] == "computing":
                eng.cancel()
            elif state["phase"] == "recording":
                state["pending"] = True
            else:
                raise KeyboardInterrupt

        def on_progress(phase, done, total):
            if status:
                self.stderr.write(f"\r\x1b[2K{phase} {done}/{total}")
                self.stderr.flush()
            if live is not None:
                live.phase(phase, done, total)
            return False

        handled = [sg for sg in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                   if sg is not None]
        previous = {sg: signal.getsignal(sg) for sg in handled}
        for sg in handled:
            signal.signal(sg, on_sigint)
        t0 = time.perf_counter()
        try:
            self.say(f"{name}: rendering {plan['width']}x{plan['height']}, {plan['frames']} frames, "
                     f"{self.steps} steps, seed {seed}")  # Ctrl-C cancels from here on
            if self.show:
                from .terminal import LivePreview

                live = LivePreview(eng, self.protocol, self.every, self.stdout, notice=self.note)
            try:
                result = eng.render(prompt, self.width, self.height, self.frames, self.seconds, self.steps, seed,
                                    progress=on_progress, preview=live.callback if live and live.active else None,
                                    preview_every=self.every, preset=self.preset, **self.keyframes)
                state["phase"] = "writing"
                if eng.cancelled:
                    raise KeyboardInterrupt
                from .outputs import Reserved

                res = Reserved(path, False)  # never over a file another writer put there meanwhile
                try:
                    media.write_mp4(res.tmp, result.frames, result.audio, result.sample_rate, fps=result.fps)
                    res.publish()
                finally:
                    if not res.done:
                        res.discard()
                state["phase"] = "recording"
            finally:
                if status:
                    self.stderr.write("\r\x1b[2K")
                    self.stderr.flush()
            wall = time.perf_counter() - t0
            rec = {"file": name, "prompt": prompt, "seed": seed, "width": plan["width"], "height": plan["height"],
                   "frames": plan["frames"], "steps": self.steps, "seconds": round(wall, 3)}
            self.renders.append(rec)
            self._number = max(self._number, number)
            self._append(LOG, json.dumps(rec))
            if live is not None and live.active and not state["pending"]:
                live.finish(result.frames, result.fps, stop=lambda: state["pending"])  # Ctrl-C: stop playing
            if live is not None:
                live.close()
            self.say(f"{name}: {plan['frames']} frames {plan['width']}x{plan['height']} "
                     f"({plan['frames'] / 24:.2f} s), {self.steps} steps, seed {seed}, {wall:.2f} s")
        except (KeyboardInterrupt, Cancelled) as e:
            if isinstance(e, Interrupted):  # SIGTERM / SIGHUP end the session (after the cleanup above)
                raise
            if state["term"] is not None:
                raise Interrupted(state["term"]) from None
            self.note(f"{name}: cancelled, nothing written")
        except H3Error as e:
            self.error(f"{name}: {e}")
        finally:
            for sg, h in previous.items():
                signal.signal(sg, h)
            if live is not None:
                live.close()

    # -- the loop ----------------------------------------------------------------------------------
    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:  # pragma: no cover - Windows without pyreadline
            return
        self._readline = readline
        try:
            lines = (self.folder / HISTORY).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        readline.clear_history()
        for line in lines[-1000:]:
            if line.strip():
                readline.add_history(line)

    def read_line(self) -> str | None:
        if self.interactive:
            try:
                return input(PROMPT)
            except EOFError:
                print(file=self.stdout, flush=True)
                return None
        raw = getattr(self.stdin, "buffer", None)
        if raw is not None:  # bytes, so a line that is not UTF-8 is reported (run) rather than ending the session
            data = raw.readline()
            line = data.decode("utf-8", "surrogateescape")
        else:
            line = self.stdin.readline()
        if line == "":
            return None
        return line.rstrip("\r\n")

    def run(self) -> int:
        if self.interactive:
            self._setup_readline()
            # A terminal's Ctrl-C must reach the prompt even when the session was started with SIGINT ignored (a
            # shell's background job, some process managers): Python then leaves it ignored at start-up.
            if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
                signal.signal(signal.SIGINT, signal.default_int_handler)
        self.say(f"h3ctl session: model {self.engine.model_dir}; renders go to {self.folder}"
                 + ("; !help lists the commands" if self.interactive else ""))
        if not folder_writable(self.folder):
            self.error(f"{self.folder}: the session folder is not writable; renders are refused until it is "
                       "(the session goes on)")
        while True:
            try:
                line = self.read_line()
            except KeyboardInterrupt:
                if self.interactive:
                    print(file=self.stdout, flush=True)
                continue
            if line is None:
                return 0
            line = line.strip()
            if not line:
                continue
            bad = next((i for i, ch in enumerate(line) if "\ud800" <= ch <= "\udfff"), None)
            if bad is not None:  # bytes the input could not decode (surrogateescape): report, go on
                ch = line[bad]
                what = f"byte 0x{ord(ch) - 0xDC00:02X}" if ch >= "\udc80" else f"U+{ord(ch):04X}"
                self.error(f"the line is not valid UTF-8 ({what} at character {bad}); skipped")
                continue
            self._append(HISTORY, line)
            try:
                if line.startswith("!"):
                    if not self.command(line):
                        return 0
                else:
                    self.render(line)
            except (KeyboardInterrupt, Cancelled) as e:
                if isinstance(e, Interrupted):
                    raise
                self.note("interrupted")
            except H3Error as e:  # whatever a line causes is one line, and the session goes on
                self.error(str(e))


def main(args) -> int:
    from .engine import Engine

    from . import limits

    limits.threads(args.threads, "--threads")
    kw = {k: getattr(args, k) for k in ("device", "device_index") if hasattr(args, k)}
    engine = Engine(args.model_dir, threads=args.threads, **kw)
    try:
        from . import _lib

        # a model that cannot render ends the session now (exit 2), not at every render
        _lib.check(_lib.lib().h3_model_check(engine._ctx.ptr, 1))
        folder = prepare_folder(args.out)
        session = Session(engine, folder, show=args.show, protocol=args.preview_protocol, every=args.preview_every)
        import signal as _signal

        def on_term(signum, frame):  # SIGTERM / SIGHUP: stop the render, clean up, exit 128 + signum
            raise Interrupted(signum)

        for sig in (getattr(_signal, "SIGTERM", None), getattr(_signal, "SIGHUP", None)):
            if sig is not None:
                _signal.signal(sig, on_term)
        return session.run()
    finally:
        engine.close()
