"""A thin owner of an `h3_ctx`: opens a model directory and frees it deterministically."""

from __future__ import annotations

import ctypes
import json
import os

from . import _lib
from ._lib import H3Error


class Context:
    def __init__(self, model_dir: str | os.PathLike, threads: int = 0, ref2va: bool = False):
        lib = _lib.lib()
        opts = _lib.H3Options()
        lib.h3_options_default(ctypes.byref(opts))
        opts.threads = int(threads or 0)
        opts.flags = _lib.H3_OPT_REF2VA if ref2va else 0
        self._ptr = lib.h3_init(os.fsencode(os.fspath(model_dir)), ctypes.byref(opts))
        if not self._ptr:
            raise H3Error(_lib.last_error() or f"{model_dir}: cannot open")
        self.model_dir = os.fspath(model_dir)

    @property
    def ptr(self) -> int:
        if not self._ptr:
            raise H3Error("the model context is closed")
        return self._ptr

    @property
    def threads(self) -> int:
        return _lib.lib().h3_threads(self.ptr)

    def info(self) -> dict:
        raw = _lib.lib().h3_model_info_json(self.ptr)
        if raw is None:
            raise H3Error(_lib.last_error())
        return json.loads(raw.decode("utf-8"))

    def memory_estimate(self, width: int, height: int, frames: int, prompt_tokens: int) -> dict:
        raw = _lib.lib().h3_memory_estimate_json(self.ptr, width, height, frames, prompt_tokens)
        if raw is None:
            raise H3Error(_lib.last_error())
        return json.loads(raw.decode("utf-8"))

    def close(self) -> None:
        if self._ptr:
            _lib.lib().h3_free(self._ptr)
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
