"""Parity stage `text`: token ids -> the Qwen3-VL conditioning hidden state.

Reference: diffusers' `get_qwen3vl_prompt_embeds` for a text-only prompt, i.e.
`Qwen3VLForConditionalGeneration.model(input_ids, attention_mask=1, output_hidden_states=True)
.hidden_states[K]` with K = `minimax_h3_conditioning_layer` of text_encoder/config.json (50 for the
release), in f32.
"""

from __future__ import annotations

import numpy as np

from .. import text as _text
from .._lib import H3Error
from . import Stage, open_context, register


def _run(model_dir: str, inputs: dict[str, np.ndarray], options: dict) -> dict[str, np.ndarray]:
    ids = inputs["input_ids"]
    if ids.dtype not in (np.int64, np.int32):
        raise H3Error(f"parity text: input_ids must be int64 or int32, got {ids.dtype}")
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise H3Error(f"parity text: input_ids must have shape [1, n], got {list(ids.shape)}")
    with open_context(model_dir, options) as ctx:
        emb = _text.encode(ctx, ids[0])
    return {"prompt_embeds": emb[None]}


register(Stage(
    name="text",
    doc="Qwen3-VL text encoder: hidden_states[minimax_h3_conditioning_layer] (no final norm)",
    inputs={"input_ids": "int64 or int32 [1, n], n >= 1: tokenizer ids without special tokens"},
    outputs={"prompt_embeds": "f32 [1, n, hidden]"},
    run=_run,
))
