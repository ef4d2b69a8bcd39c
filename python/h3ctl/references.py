"""Ref2VA references: the packed layout of a request with image / video / audio references.

The layout is libh3's (`h3_dit_ref2va_layout`, models/dit_layout.c), exposed here so it can be held against
diffusers' `build_ref2va_packed_sequence` and inspected by tools; renders build it inside libh3.
"""

from __future__ import annotations

import ctypes

import numpy as np

from h3ctl import _lib

KINDS = {"image": 0, "video": 1, "audio": 2}


def _ptr(a, ctype):
    return None if a is None else a.ctypes.data_as(ctypes.POINTER(ctype))


def ref2va_layout(ctx, n_text: int, references, latent_frames: int, latent_height: int, latent_width: int,
                  audio_latents: int, text_tags=None) -> dict[str, np.ndarray]:
    """The ref2va packed layout. `references`: (kind, latent_frames, latent_height, latent_width, audio_latents)
    per reference in request order (kind "image" / "video" / "audio"; zeros where a kind has none). Returns
    position_ids, token_tags, text/video/audio_indices (diffusers' names), roles and n_condition (video, audio)."""
    lib = _lib.lib()
    refs = np.ascontiguousarray(np.asarray([[KINDS.get(r[0], r[0]), *r[1:]] for r in references], np.int32))
    tags = None if text_tags is None else np.ascontiguousarray(np.asarray(text_tags, np.uint8))
    args = (ctx.ptr, int(n_text), _ptr(tags, ctypes.c_uint8), _ptr(refs, ctypes.c_int32), int(len(refs)),
            int(latent_frames), int(latent_height), int(latent_width), int(audio_latents))
    ncond = np.zeros(2, np.int64)
    seq = _lib.check(lib.h3_dit_ref2va_layout(*args, None, None, None, None, None, None, _ptr(ncond, ctypes.c_int64)))
    n_audio = 2 * int(audio_latents) + int(ncond[1])
    pos = np.zeros((seq, 3), np.float64)
    tok = np.zeros(seq, np.int64)
    tix = np.zeros(int(n_text), np.int64)
    vix = np.zeros(seq - int(n_text) - n_audio, np.int64)
    aix = np.zeros(n_audio, np.int64)
    roles = np.zeros(seq, np.uint8)
    _lib.check(lib.h3_dit_ref2va_layout(*args, _ptr(pos, ctypes.c_double), _ptr(tok, ctypes.c_int64),
                                        _ptr(tix, ctypes.c_int64), _ptr(vix, ctypes.c_int64),
                                        _ptr(aix, ctypes.c_int64), _ptr(roles, ctypes.c_uint8), None))
    return {"position_ids": pos, "token_tags": tok, "text_indices": tix, "video_indices": vix, "audio_indices": aix,
            "roles": roles, "n_condition": ncond}
