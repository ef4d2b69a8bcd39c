"""The --show options shared by `render` and `session` (no numpy here: building the parser stays cheap)."""

from __future__ import annotations

import argparse

PROTOCOLS = ("kitty", "iterm", "sixel", "blocks", "none")
CHOICES = ("auto",) + PROTOCOLS


def _every(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {v}")
    return v


def add_preview_arguments(p) -> None:
    p.add_argument("--show", action="store_true",
                   help="show a preview of the video at each step in the terminal, then the final frames")
    p.add_argument("--preview-every", type=_every, default=1, metavar="N", help="preview every N steps (default 1)")
    p.add_argument("--preview-protocol", choices=CHOICES, default="auto",
                   help="terminal graphics: auto (from TERM, TERM_PROGRAM, KITTY_WINDOW_ID, ...), kitty, iterm, "
                        "sixel, blocks (Unicode half blocks, any colour terminal) or none")
