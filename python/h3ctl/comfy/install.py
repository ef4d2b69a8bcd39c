"""`h3ctl comfy-install DIR`: write custom_nodes/h3ctl_nodes/__init__.py, which imports h3ctl.comfy."""

from __future__ import annotations

import os
from pathlib import Path

from .._lib import H3Error

PACKAGE = "h3ctl_nodes"
MARKER = "written by `h3ctl comfy-install`"

TEMPLATE = '''"""The h3ctl node pack for ComfyUI, {marker} (h3ctl {version}).

ComfyUI imports this folder from custom_nodes; the nodes themselves live in the h3ctl package. When ComfyUI runs
in a Python environment without h3ctl, the h3ctl that wrote this file is found at the path below (its
dependency numpy must then be importable in ComfyUI's environment, which it always is).
"""

import sys

try:
    from h3ctl.comfy import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
except ImportError:
    _H3CTL_PATH = {path!r}
    if _H3CTL_PATH not in sys.path:
        sys.path.append(_H3CTL_PATH)
    from h3ctl.comfy import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
'''


def install(target: str | os.PathLike, overwrite: bool = False) -> str:
    """Install into a ComfyUI folder (or straight into its custom_nodes folder); returns one line to print."""
    from .. import __version__

    t = Path(target)
    if not t.is_dir():
        raise H3Error(f"{t}: no such folder (give the ComfyUI folder or its custom_nodes folder)")
    nodes_dir = t if t.name == "custom_nodes" else t / "custom_nodes"
    if not nodes_dir.is_dir():
        raise H3Error(f"{t}: has no custom_nodes folder (give the ComfyUI folder or its custom_nodes folder)")
    pkg = nodes_dir / PACKAGE
    init = pkg / "__init__.py"
    if pkg.exists() and not overwrite:
        try:
            ours = init.is_file() and MARKER in init.read_text(errors="replace")
        except OSError:
            ours = False
        if not ours:
            raise H3Error(f"{pkg}: exists and was not written by h3ctl (pass --overwrite to replace it)")
    if pkg.exists() and not pkg.is_dir():
        raise H3Error(f"{pkg}: exists and is not a folder")
    h3ctl_parent = str(Path(__file__).resolve().parents[2])
    text = TEMPLATE.format(marker=MARKER, version=__version__, path=h3ctl_parent)
    try:
        pkg.mkdir(exist_ok=True)
        tmp = pkg / f".__init__.py.partial-{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, init)
    except OSError as e:
        raise H3Error(f"{pkg}: cannot write the node pack ({e.strerror or e})") from None
    return f"{pkg}: installed the h3ctl nodes (restart ComfyUI; they are under the h3ctl category)"
