"""Images in the terminal: kitty graphics, iTerm2 inline images, sixel, or Unicode half blocks.

`detect()` picks a protocol from the environment (no round trip to the terminal, so nothing can arrive on stdin
as stray keystrokes); `Display` draws previews in place (a reserved area under the cursor, redrawn through
save/restore cursor) and plays the final frames as an animation. Everything is written with plain escape
sequences; PNG payloads come from a minimal zlib encoder (h3ctl.media.encode_png).
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
import time

import numpy as np

from .media import encode_png
from .preview import upscale
from .showopts import CHOICES, PROTOCOLS, add_preview_arguments  # noqa: F401  (re-exported)

_KITTY_PROGRAMS = {"ghostty"}
_ITERM_PROGRAMS = {"iterm.app", "wezterm"}
_SIXEL_TERMS = ("foot", "mlterm", "yaft", "contour", "st-sixel", "xterm-sixel")
_TRUECOLOR_PROGRAMS = {"iterm.app", "wezterm", "vscode", "ghostty", "hyper", "tabby", "rio"}


def detect(env=None, stream=None) -> str:
    """The best protocol this terminal is known to speak, from TERM, TERM_PROGRAM, KITTY_WINDOW_ID, ...

    "none" when `stream` is not a terminal or TERM is dumb; "blocks" inside tmux/screen (they do not pass
    graphics through unless configured to) and for any terminal not known to do better.
    """
    env = os.environ if env is None else env
    if stream is not None:
        try:
            if not stream.isatty():
                return "none"
        except (AttributeError, ValueError):
            return "none"
    term = env.get("TERM", "").lower()
    prog = env.get("TERM_PROGRAM", "").lower()
    if term in ("", "dumb") and not prog:
        return "none"
    if env.get("TMUX") or term.startswith(("screen", "tmux")):
        return "blocks"
    if env.get("KITTY_WINDOW_ID") or term == "xterm-kitty" or prog in _KITTY_PROGRAMS or term == "xterm-ghostty":
        return "kitty"
    if prog in _ITERM_PROGRAMS or env.get("LC_TERMINAL", "").lower() == "iterm2":
        return "iterm"
    if "sixel" in term or term.startswith(_SIXEL_TERMS) or prog in ("mlterm", "contour"):
        return "sixel"
    return "blocks"


def truecolor(env=None) -> bool:
    env = os.environ if env is None else env
    return (env.get("COLORTERM", "").lower() in ("truecolor", "24bit") or env.get("TERM_PROGRAM", "").lower()
            in _TRUECOLOR_PROGRAMS or bool(env.get("KITTY_WINDOW_ID")) or "direct" in env.get("TERM", ""))


# -- encoders ----------------------------------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.standard_b64encode(data).decode("ascii")


def kitty(rgb: np.ndarray, cols: int, rows: int, image_id: int = 1, chunk: int = 4096) -> str:
    """Transmit and place a PNG (a=T, f=100) scaled to cols x rows cells; quiet (q=2), cursor kept (C=1)."""
    payload = _b64(encode_png(np.ascontiguousarray(rgb, np.uint8)))
    parts = [payload[i:i + chunk] for i in range(0, len(payload), chunk)] or [""]
    out = []
    for k, part in enumerate(parts):
        more = 1 if k + 1 < len(parts) else 0
        if k == 0:
            out.append(f"\x1b_Ga=T,f=100,t=d,i={image_id},c={cols},r={rows},C=1,q=2,m={more};{part}\x1b\\")
        else:
            out.append(f"\x1b_Gm={more};{part}\x1b\\")
    return "".join(out)


def kitty_delete(image_id: int) -> str:
    return f"\x1b_Ga=d,d=I,i={image_id},q=2\x1b\\"


def iterm(rgb: np.ndarray, cols: int, rows: int) -> str:
    """iTerm2 inline image (OSC 1337 File=...) of cols x rows cells."""
    png = encode_png(np.ascontiguousarray(rgb, np.uint8))
    return (f"\x1b]1337;File=inline=1;size={len(png)};width={cols};height={rows};preserveAspectRatio=0;"
            f"doNotMoveCursor=1:{_b64(png)}\x07")


def _cube(rgb: np.ndarray) -> np.ndarray:
    """Indices into the 6 x 6 x 6 colour cube (0..215)."""
    q = (np.asarray(rgb, np.int32) * 5 + 127) // 255
    return q[..., 0] * 36 + q[..., 1] * 6 + q[..., 2]


def cube_rgb(index: np.ndarray) -> np.ndarray:
    """The uint8 colour of cube indices (what sixel and 256-colour blocks show)."""
    index = np.asarray(index)
    levels = np.array([0, 51, 102, 153, 204, 255], np.uint8)
    return np.stack([levels[index // 36], levels[(index // 6) % 6], levels[index % 6]], axis=-1)


def sixel(rgb: np.ndarray) -> str:
    """DCS sixel image, colours quantised to the 6 x 6 x 6 cube, runs of 4 or more compressed (!n)."""
    img = np.ascontiguousarray(rgb, np.uint8)
    h, w, _ = img.shape
    idx = _cube(img)
    used = np.unique(idx)
    out = [f'\x1bP0;1;0q"1;1;{w};{h}']
    for c in used:
        r, g, b = (int(v) * 100 // 255 for v in cube_rgb(c))
        out.append(f"#{int(c)};2;{r};{g};{b}")
    for y0 in range(0, h, 6):
        band = idx[y0:y0 + 6]
        first = True
        for c in np.unique(band):
            bits = np.zeros(w, np.int32)
            for k in range(band.shape[0]):
                bits |= (band[k] == c).astype(np.int32) << k
            if not first:
                out.append("$")
            first = False
            out.append(f"#{int(c)}")
            chars = bits + 63
            # run-length encode
            change = np.flatnonzero(np.diff(chars)) + 1
            starts = np.concatenate([[0], change])
            ends = np.concatenate([change, [w]])
            for s, e in zip(starts, ends):
                ch = chr(int(chars[s]))
                n = int(e - s)
                out.append(f"!{n}{ch}" if n >= 4 else ch * n)
        out.append("-")
    out.append("\x1b\\")
    return "".join(out)


def blocks(rgb: np.ndarray, true_colour: bool = True) -> list[str]:
    """Unicode upper half blocks: one text line per two pixel rows (foreground = top, background = bottom)."""
    img = np.ascontiguousarray(rgb, np.uint8)
    if img.shape[0] % 2:
        img = np.concatenate([img, img[-1:]], axis=0)
    lines = []
    cube = None if true_colour else _cube(img) + 16
    for y in range(0, img.shape[0], 2):
        parts, last = [], None
        for x in range(img.shape[1]):
            if true_colour:
                t, b = img[y, x], img[y + 1, x]
                code = f"\x1b[38;2;{t[0]};{t[1]};{t[2]};48;2;{b[0]};{b[1]};{b[2]}m"
            else:
                code = f"\x1b[38;5;{cube[y, x]};48;5;{cube[y + 1, x]}m"
            parts.append(("" if code == last else code) + "\u2580")
            last = code
        lines.append("".join(parts) + "\x1b[0m")
    return lines


# -- in-place display ----------------------------------------------------------------------------------

def _cell_pixels(stream) -> tuple[int, int]:
    """(width, height) of one character cell in pixels, from TIOCGWINSZ; (10, 20) when unknown."""
    try:
        import fcntl
        import struct
        import termios

        raw = fcntl.ioctl(stream.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        rows, cols, xpx, ypx = struct.unpack("HHHH", raw)
        if rows and cols and xpx and ypx:
            return max(1, xpx // cols), max(1, ypx // rows)
    except (OSError, ImportError, AttributeError, ValueError):
        pass
    return 10, 20


class Display:
    """Draws images (uint8 [H, W, 3]) with a caption line into one area of the terminal, in place.

    The area (rows + 1 lines) is reserved below the cursor on the first draw; each draw restores the cursor to
    its top left (DECSC/DECRC), so nothing scrolls while previews update. `close()` leaves the cursor below it.
    """

    def __init__(self, protocol: str, stream=None, max_cols: int | None = None, env=None):
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown preview protocol {protocol!r}")
        self.protocol = protocol
        self.stream = stream if stream is not None else sys.stdout
        self.env = os.environ if env is None else env
        size = shutil.get_terminal_size((80, 24))
        self.term_cols, self.term_rows = size.columns, size.lines
        self.max_cols = max_cols
        self.rows = self.cols = 0
        self._open = False
        self._n = 0
        self.frames_drawn = 0

    @property
    def enabled(self) -> bool:
        return self.protocol != "none"

    def _geometry(self, h: int, w: int) -> tuple[int, int]:
        limit = self.max_cols or (48 if self.protocol == "blocks" else 40)
        cols = max(8, min(limit, self.term_cols - 1))
        rows = max(2, int(round(cols * h / w / 2)))
        max_rows = max(4, self.term_rows - 3)
        if rows > max_rows:
            rows = max_rows
            cols = max(4, int(round(rows * 2 * w / h)))
        return cols, rows

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.protocol = "none"

    def show(self, image: np.ndarray, caption: str = "") -> None:
        if not self.enabled:
            return
        img = np.asarray(image, np.uint8)
        h, w = img.shape[:2]
        if not self._open:
            self.cols, self.rows = self._geometry(h, w)
            # reserve the area (scrolling now if needed), go back to its top and remember it
            self._write("\n" * (self.rows + 1) + f"\x1b[{self.rows + 1}A\r\x1b7")
            self._open = True
        out = ["\x1b8"]
        if self.protocol == "blocks":
            pix = upscale(img, self.rows * 2, self.cols)
            lines = blocks(pix, truecolor(self.env))
            out.append("\r\n".join(lines))
        elif self.protocol == "kitty":
            target_w = self.cols * 10  # about the cells' pixels: small payloads, the terminal scales the rest
            pix = upscale(img, max(1, int(round(target_w * h / w))), target_w)
            image_id = 0x4833 + (self._n % 2)
            out.append(kitty(pix, self.cols, self.rows, image_id))
            if self._n:
                out.append(kitty_delete(0x4833 + ((self._n - 1) % 2)))
        elif self.protocol == "iterm":
            target_w = self.cols * 10
            out.append(iterm(upscale(img, max(1, int(round(target_w * h / w))), target_w), self.cols, self.rows))
        elif self.protocol == "sixel":
            cw, ch = _cell_pixels(self.stream)
            out.append(sixel(upscale(img, self.rows * ch, self.cols * cw)))
        out.append(f"\x1b8\x1b[{self.rows}B\r\x1b[2K{caption[: max(0, self.term_cols - 1)]}")
        self._n += 1
        self.frames_drawn += 1
        self._write("".join(out))

    def animate(self, frames, fps: float = 24.0, caption: str = "", loops: int = 1, stop=None) -> None:
        """Play frames [F, H, W, 3] in place at `fps`. Ctrl-C (KeyboardInterrupt) or a truthy `stop()` ends the
        animation and nothing else."""
        if not self.enabled:
            return
        frames = np.asarray(frames, np.uint8)
        try:
            for _ in range(max(1, loops)):
                t0 = time.perf_counter()
                for k, fr in enumerate(frames):
                    if stop is not None and stop():
                        return
                    self.show(fr, f"{caption} {k + 1}/{len(frames)}".strip())
                    delay = t0 + (k + 1) / fps - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
        except KeyboardInterrupt:
            pass

    def close(self) -> None:
        if self._open:
            self._write(f"\x1b8\x1b[{self.rows + 1}B\r")
            self._open = False


def open_display(choice: str, stream=None, env=None, max_cols: int | None = None) -> Display:
    """`choice` is "auto" or a protocol; auto detects from the environment and the stream."""
    stream = stream if stream is not None else sys.stdout
    if choice not in CHOICES:
        raise ValueError(f"preview protocol must be one of {', '.join(CHOICES)}, got {choice!r}")
    proto = detect(env, stream) if choice == "auto" else choice
    return Display(proto, stream, max_cols=max_cols, env=env)


# -- the --show options of render and session -------------------------------------------------------------

class LivePreview:
    """What --show does: per-step previews in place, a caption per phase, then the final frames once."""

    def __init__(self, engine, choice: str = "auto", every: int = 1, stream=None, notice=None, env=None):
        from .preview import load_map

        self.stream = stream if stream is not None else sys.stdout
        self.display = open_display(choice, self.stream, env=env)
        self.every = every
        self.total = 0
        self.map = None
        if not self.display.enabled:
            if choice == "auto" and notice is not None:
                notice("previews off: the output is not a terminal (or TERM is dumb); "
                       "--preview-protocol forces one")
            return

        def fitting():
            if notice is not None:
                notice("fitting the preview map for this model (once; it is cached)")

        self.map = load_map(engine, on_fit=fitting)

    @property
    def active(self) -> bool:
        return self.display.enabled

    def phase(self, phase: str, done: int, total: int) -> None:
        if phase == "denoise":
            self.total = total
        elif self.active and phase in ("audio_decode", "video_decode") and done == 0 and self.display.frames_drawn:
            self._caption(f"{phase.replace('_', ' ')}...")

    def _caption(self, text: str) -> None:
        d = self.display
        d._write(f"\x1b8\x1b[{d.rows}B\r\x1b[2K{text}")

    def callback(self, rgb, step) -> None:
        mid = rgb[len(rgb) // 2]
        total = f"/{self.total}" if self.total else ""
        self.display.show(mid, f"step {step}{total} (x0 estimate)")

    def finish(self, frames, fps: float = 24.0, stop=None) -> None:
        if self.active:
            self.display.animate(frames, fps, caption="final frames", stop=stop)

    def close(self) -> None:
        self.display.close()
