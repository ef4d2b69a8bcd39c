"""ComfyUI nodes for h3ctl: load a model, encode a prompt, sample, decode to IMAGE + AUDIO.

ComfyUI finds custom nodes only as folders in its custom_nodes directories (it has no package entry-point
mechanism), so `h3ctl comfy-install COMFYUI_DIR` writes a small `custom_nodes/h3ctl_nodes/__init__.py` that
imports this module. Nothing here imports ComfyUI, torch or PIL at import time: `comfy.utils` (ProgressBar),
`comfy.model_management` (interruption), torch (IMAGE / AUDIO tensors) and PIL (live previews) are used when
they can be imported, and the nodes run without them (numpy arrays instead of tensors).
"""

from .install import install
from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "install"]
