"""h3ctl: native inference for MiniMax-H3 (joint video + stereo audio) on libh3."""

from ._lib import H3Error
from .errors import Cancelled

__all__ = ["Engine", "Result", "H3Error", "Cancelled", "main", "__version__"]
__version__ = "0.1.0"


def main(argv=None):
    from .cli import main as _main

    return _main(argv)


def __getattr__(name):
    # Engine/Result import numpy and the bindings lazily, so `import h3ctl` stays cheap.
    if name in ("Engine", "Result"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
