"""The ctypes bindings declare exactly what libh3 exports, each with argtypes and restype."""

import re
from pathlib import Path

from h3ctl import _lib

ROOT = Path(__file__).resolve().parent.parent


def test_exported_symbols_match_bindings():
    exported = _lib.exported_symbols()
    declared = set(_lib.BINDINGS)
    assert exported == declared, (
        f"exported but not bound: {sorted(exported - declared)}; bound but not exported: {sorted(declared - exported)}"
    )


def _declared(name: str) -> set[str]:
    return set(re.findall(r"H3_API\s+[^;(]*?\b(h3_\w+)\s*\(", (ROOT / "libh3" / name).read_text()))


def test_headers_declare_exactly_the_exports():
    """h3.h (the embedder's contract) and h3_stages.h (stages and parity) together declare every export, each
    in one of them only."""
    public, stages = _declared("h3.h"), _declared("h3_stages.h")
    assert not public & stages, sorted(public & stages)
    assert public | stages == _lib.exported_symbols()


def test_public_header_is_the_render_contract():
    """The render path an embedder needs is in h3.h; stage and parity entry points are not."""
    public, stages = _declared("h3.h"), _declared("h3_stages.h")
    for name in ("h3_init", "h3_options_default", "h3_request_default", "h3_plan", "h3_prepare", "h3_step",
                 "h3_decode", "h3_render_info_get", "h3_set_progress", "h3_last_error", "h3_model_info_json",
                 "h3_get_latents", "h3_free"):
        assert name in public, name
    for name in ("h3_tokenize", "h3_text_encode", "h3_dit_forward", "h3_dit_denoise", "h3_video_decode",
                 "h3_audio_encode", "h3_audio_resample", "h3_keyframe_resize", "h3_reference_size",
                 "h3_decode_video_f32", "h3_bench_gemm", "h3_fp8_e4m3_from_f32", "h3_noise_fill"):
        assert name in stages and name not in public, name
    text = (ROOT / "libh3" / "h3.h").read_text()
    # the parity injections live in h3_stages.h's h3_parity; h3_request only points at it
    body = text[text.index("typedef struct h3_request {"):text.index("} h3_request;")]
    for field in ("video_noise", "audio_noise", "first_noise", "first_latent", "text_states", "text_tags"):
        assert field not in body, field
    assert "struct h3_parity *parity;" in body
    assert "typedef struct h3_parity {" in (ROOT / "libh3" / "h3_stages.h").read_text()


def test_parity_struct_matches_the_header():
    text = (ROOT / "libh3" / "h3_stages.h").read_text()
    body = re.sub(r"/\*.*?\*/", "", text[text.index("typedef struct h3_parity {"):text.index("} h3_parity;")],
                  flags=re.S)
    names = re.findall(r"\*?\s*(\w+)\s*[,;]", body.split("{", 1)[1])
    assert [n for n, _ in _lib.H3Parity._fields_] == names


def test_every_binding_has_types():
    lib = _lib.lib()
    for name, (restype, argtypes) in _lib.BINDINGS.items():
        fn = getattr(lib, name)
        assert fn.argtypes == argtypes and fn.restype is restype, name
        assert isinstance(argtypes, list), name
