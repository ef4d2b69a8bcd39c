"""Parity stage `tokenize`: prompt bytes -> token ids, as `tokenizer(prompt, add_special_tokens=False)`."""

from __future__ import annotations

import os

import numpy as np

from .._lib import H3Error
from . import Stage, register


def _tokenizer_path(model_dir: str) -> str:
    """The partition's tokenizer/tokenizer.json, or the root copy, or a tokenizer.json given directly."""
    if os.path.isfile(model_dir):
        return model_dir
    for rel in ("FL2VA/tokenizer/tokenizer.json", "tokenizer/tokenizer.json", "tokenizer.json"):
        p = os.path.join(model_dir, rel)
        if os.path.isfile(p):
            return p
    raise H3Error(f"{model_dir}: no tokenizer/tokenizer.json")


def _run(model_dir, inputs, options):
    from ..tokenizer import Tokenizer

    prompt = np.asarray(inputs["prompt"])
    if prompt.dtype != np.uint8 or prompt.ndim != 1:
        raise H3Error(f"parity tokenize: 'prompt' must be a 1-D uint8 tensor of UTF-8 bytes, got {prompt.dtype} {list(prompt.shape)}")
    tok = Tokenizer(_tokenizer_path(model_dir))
    try:
        ids = tok.encode(prompt.tobytes())
    finally:
        tok.close()
    return {"input_ids": ids.astype(np.int64)[None, :]}


register(Stage(
    name="tokenize",
    doc="prompt -> token ids exactly as tokenizer(prompt, add_special_tokens=False)['input_ids'] "
        "(no chat template, no special tokens added); --model may be a model dir or a tokenizer.json",
    inputs={"prompt": "uint8 [bytes] UTF-8 text of the prompt"},
    outputs={"input_ids": "int64 [1, n]"},
    run=_run,
))
