"""The C tokenizer (a Qwen2-family byte-level BPE read from tokenizer.json) from Python."""

from __future__ import annotations

import ctypes
import os

import numpy as np

from . import _lib
from ._lib import H3Error


class Tokenizer:
    def __init__(self, path: str | os.PathLike):
        self._h = _lib.lib().h3_tokenizer_load(os.fsencode(os.fspath(path)))
        if not self._h:
            raise H3Error(_lib.last_error())

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        lib = _lib.lib()
        cap = len(data) + 16
        for _ in range(2):
            buf = (ctypes.c_int32 * cap)()
            n = _lib.check(lib.h3_tokenize(self._h, data, len(data), buf, cap))
            if n <= cap:
                return np.frombuffer(buf, dtype=np.int32, count=n).copy()
            cap = n
        raise H3Error("tokenizer: id count changed between calls")

    def token_id(self, token: str) -> int:
        return int(_lib.lib().h3_token_id(self._h, token.encode("utf-8")))

    @property
    def vocab_size(self) -> int:
        return int(_lib.lib().h3_tokenizer_vocab_size(self._h))

    def decode(self, ids) -> bytes:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        ptr = ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        lib = _lib.lib()
        n = _lib.check(lib.h3_detokenize(self._h, ptr, len(ids), None, 0))
        out = ctypes.create_string_buffer(max(n, 1))
        _lib.check(lib.h3_detokenize(self._h, ptr, len(ids), out, n))
        return out.raw[:n]

    def close(self) -> None:
        if self._h:
            _lib.lib().h3_tokenizer_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
