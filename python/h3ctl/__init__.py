"""h3ctl: native inference for MiniMax-H3 (joint video + stereo audio) on libh3."""

from ._lib import H3Error

__all__ = ["H3Error", "main", "__version__"]
__version__ = "0.1.0"


def main(argv=None):
    from .cli import main as _main

    return _main(argv)
