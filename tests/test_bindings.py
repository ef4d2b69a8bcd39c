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


def test_header_declares_exactly_the_exports():
    header = (ROOT / "libh3" / "h3.h").read_text()
    in_header = set(re.findall(r"H3_API\s+[^;(]*?\b(h3_\w+)\s*\(", header))
    assert in_header == _lib.exported_symbols()


def test_every_binding_has_types():
    lib = _lib.lib()
    for name, (restype, argtypes) in _lib.BINDINGS.items():
        fn = getattr(lib, name)
        assert fn.argtypes == argtypes and fn.restype is restype, name
        assert isinstance(argtypes, list), name
