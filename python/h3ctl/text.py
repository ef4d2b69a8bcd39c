"""Text encoder of libh3 from Python: token ids -> the conditioning hidden state, and the prompt cache."""

from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np

from . import _lib
from ._lib import H3Error

_INT32_MAX = 2**31 - 1


def hidden_size(ctx) -> int:
    return _lib.check(_lib.lib().h3_text_hidden_size(ctx.ptr))


def _as_ids(ids) -> np.ndarray:
    a = np.asarray(ids)
    if a.ndim != 1:
        raise H3Error(f"token ids must be one-dimensional, got shape {list(a.shape)}")
    if a.dtype.kind not in "iu":
        raise H3Error(f"token ids must be integers, got {a.dtype}")
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        bad = lo if lo < 0 else (hi if hi > _INT32_MAX else None)
        if bad is not None:
            pos = int(np.flatnonzero(a == bad)[0])
            raise H3Error(f"text encoder: token id {bad} at position {pos} is outside the vocabulary")
    return np.ascontiguousarray(a, dtype=np.int32)


def encode(ctx, ids, progress: Callable[[str, int, int], object] | None = None) -> np.ndarray:
    """[n, hidden] f32: hidden_states[conditioning layer] of the prompt `ids` (1-D integer array).

    `progress(phase, done, total)` is called per layer; a truthy return value cancels (H3Error, code
    H3_E_CANCELLED). An exception raised inside it cancels too and is re-raised here.
    """
    lib = _lib.lib()
    a = _as_ids(ids)
    h = hidden_size(ctx)
    out = np.empty((a.size, h), dtype=np.float32)
    raised: list[BaseException] = []
    cb = None
    if progress is not None:
        def _tramp(_user, phase, done, total):
            try:
                return 1 if progress(phase.decode(), done, total) else 0
            except BaseException as e:  # noqa: BLE001  (re-raised below, after C has unwound)
                raised.append(e)
                return 1

        cb = _lib.H3ProgressFn(_tramp)
        lib.h3_set_progress(ctx.ptr, cb, None)
    try:
        rc = lib.h3_text_encode(ctx.ptr, a.ctypes.data_as(_lib.c_int32_p), int(a.size),
                                out.ctypes.data_as(_lib.c_float_p))
    finally:
        if cb is not None:
            lib.h3_set_progress(ctx.ptr, _lib.H3ProgressFn(), None)
    if raised:
        raise raised[0]
    _lib.check(rc)
    return out


def cache_stats(ctx) -> dict:
    s = _lib.H3TextCacheStats()
    s.struct_size = ctypes.sizeof(s)
    _lib.check(_lib.lib().h3_text_cache_stats_get(ctx.ptr, ctypes.byref(s)))
    return {name: int(getattr(s, name)) for name, _ in s._fields_ if name not in ("struct_size", "reserved")}


def set_cache_budget(ctx, nbytes: int) -> None:
    if nbytes < 0:
        raise H3Error(f"cache budget must be >= 0 bytes, got {nbytes}")
    _lib.check(_lib.lib().h3_text_cache_set_budget(ctx.ptr, int(nbytes)))


def clear_cache(ctx) -> None:
    _lib.lib().h3_text_cache_clear(ctx.ptr)
