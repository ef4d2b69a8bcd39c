"""The package's cancellation exception (h3ctl.Cancelled)."""

from __future__ import annotations

from ._lib import H3Error


class Cancelled(H3Error):
    """A render stopped before its end: engine.cancel() (Ctrl-C in the CLI), or a progress / preview callback that
    returned True. An H3Error (so `except Exception` and `except H3Error` catch it), not a KeyboardInterrupt."""
