"""libh3's layers, checked on every #include under libh3/ (`make check-layers`, which the library and the
C tests depend on, runs this file as a script; pytest runs the tests below).

The layers (README "Layout"): core/ at the bottom (files, formats, host helpers), backend/ (the seam and
its cpu/ and cuda/ implementations) over core/, models/ (one stage per file) over core/ and the seam,
runtime/ over all of those, api/ on top, the only code that knows the context. Stages never call up.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBH3 = ROOT / "libh3"
SOURCE_SUFFIXES = {".c", ".h", ".inc", ".cu", ".cuh"}
# The context's private header: the definition of struct h3_ctx.
CONTEXT_HEADER = "api/api.h"

# (layer of the including file, what it must not include, why). A layer is the path under libh3/
# ("models/dit.c" is in models/, "backend/cpu/ops.c" in backend/ and in backend/cpu/); a target is
# matched by prefix of the included file's path under libh3/.
RULES: list[tuple[str, str, str]] = [
    ("core/", "models/", "core/ is below the stages"),
    ("core/", "backend/", "core/ is below the backends (host helpers live in core/host.h)"),
    ("core/", "runtime/", "core/ is below the runtime"),
    ("core/", "api/", "core/ is below the API"),
    ("backend/", "models/", "backends compute ops, they know no model"),
    ("backend/", "runtime/", "backends are below the runtime"),
    ("backend/", "api/", "backends are below the API"),
    ("models/", "runtime/", "stages receive what they need and never call up"),
    ("models/", "api/", "stages never call up"),
    ("models/", "backend/cpu/", "stages reach a backend through the seam (backend/backend.h) only"),
    ("models/", "backend/cuda/", "stages reach a backend through the seam (backend/backend.h) only"),
    ("runtime/", "api/", "the runtime knows no context"),
]

# The environment is read in one place (core/tuning.h: the knobs, docs/environment.md).
ENV_READER = "core/tuning.c"
GETENV = re.compile(r"\b(?:secure_)?getenv[ \t]*\(")

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def includes(text: str) -> list[tuple[int, str]]:
    """(line, quoted name) of every #include "..." in a source text (angle includes are the system's)."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in INCLUDE.finditer(text)]


def resolve(including: str, name: str, known: set[str]) -> str | None:
    """The path under libh3/ an include names: next to the including file first, then from libh3/ (-Ilibh3)."""
    here = os.path.normpath(os.path.join(os.path.dirname(including), name)).replace(os.sep, "/")
    if here in known:
        return here
    return name if name in known else None


def violations(files: dict[str, str]) -> list[str]:
    """Every broken rule in `files` (path under libh3/ -> text), one line each: file:line: what and why."""
    known = set(files)
    out = []
    for path in sorted(files):
        if path != ENV_READER:
            for m in GETENV.finditer(files[path]):
                line = files[path].count("\n", 0, m.start()) + 1
                out.append(f"libh3/{path}:{line}: getenv: the environment is read in {ENV_READER} only (h3_tuning)")
        for line, name in includes(files[path]):
            target = resolve(path, name, known)
            where = f"libh3/{path}:{line}: #include \"{name}\""
            if target is None:
                out.append(f"{where}: not a file under libh3/ (use <...> for system headers)")
                continue
            if target == CONTEXT_HEADER and not path.startswith("api/"):
                out.append(f"{where}: only api/ includes the context's private header ({CONTEXT_HEADER})")
            for layer, banned, why in RULES:
                if path.startswith(layer) and target.startswith(banned):
                    out.append(f"{where}: {layer} must not include {banned} ({why})")
    return out


def read_tree(root: Path = LIBH3) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8", errors="replace")
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in SOURCE_SUFFIXES}


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else LIBH3
    files = read_tree(root)
    if not files:
        print(f"check-layers: no sources under {root}", file=sys.stderr)
        return 2
    bad = violations(files)
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"check-layers: {len(bad)} forbidden include(s) or getenv(s) (rules: tests/test_layering.py)",
              file=sys.stderr)
        return 1
    print(f"check-layers: {len(files)} files, {sum(len(includes(t)) for t in files.values())} includes, layers sealed,"
          f" getenv only in {ENV_READER}")
    return 0


# ---- tests ---------------------------------------------------------------------------------------


def test_the_tree_keeps_its_layers():
    files = read_tree()
    assert len(files) > 100 and "core/host.h" in files and "backend/backend.h" in files
    assert violations(files) == []


def _tree(**extra: str) -> dict[str, str]:
    base = {
        "h3.h": "",
        "api/api.h": '#include "runtime/runtime.h"\n',
        "api/context.c": '#include "api/api.h"\n#include "models/dit.h"\n',
        "runtime/runtime.h": '#include "backend/backend.h"\n',
        "runtime/runtime.c": '#include "runtime/runtime.h"\n#include "models/dit.h"\n#include "backend/cpu/ops.h"\n',
        "models/dit.h": '#include "backend/backend.h"\n#include "core/host.h"\n',
        "models/dit.c": '#include "models/dit.h"\n',
        "backend/backend.h": '#include "core/internal.h"\n',
        "backend/cpu/ops.h": '#include "core/host.h"\n',
        "backend/cpu/ops_avx2.c": '#include "backend/cpu/ops.h"\n#include "kernels.inc"\n',
        "backend/cpu/kernels.inc": "",
        "backend/cuda/cuda_backend.cu": '#include "backend/backend.h"\n#include "h3.h"\n',
        "core/internal.h": '#include "h3.h"\n',
        "core/host.h": '#include "core/internal.h"\n',
    }
    base.update(extra)
    return base


def test_a_clean_synthetic_tree_passes():
    assert violations(_tree()) == []


def test_each_planted_violation_is_caught_with_its_place():
    cases = {
        "models/dit.c": ('#include "runtime/runtime.h"', "models/ must not include runtime/"),
        "models/dit.h": ('#include "backend/cpu/ops.h"', "models/ must not include backend/cpu/"),
        "core/host.h": ('#include "backend/cpu/ops.h"', "core/ must not include backend/"),
        "core/internal.h": ('#include "models/dit.h"', "core/ must not include models/"),
        "backend/cpu/ops_avx2.c": ('#include "models/dit.h"', "backend/ must not include models/"),
        "backend/cuda/cuda_backend.cu": ('#include "models/dit.h"', "backend/ must not include models/"),
        "runtime/runtime.c": ('#include "api/api.h"', "only api/ includes the context's private header"),
    }
    for path, (line, message) in cases.items():
        tree = _tree()
        tree[path] = tree[path] + "\n/* planted */\n  #  include " + line.split(" ", 1)[1] + "\n"
        bad = violations(tree)
        want_line = tree[path].count("\n")
        assert len(bad) >= 1 and all(f"libh3/{path}:{want_line}:" in b for b in bad), (path, bad)
        assert any(message in b for b in bad), (path, bad)


def test_getenv_outside_the_tuning_reader_is_caught():
    assert violations(_tree(**{"core/tuning.c": 'x = getenv("H3_X");\n'})) == []
    bad = violations(_tree(**{"models/x.c": '#include "models/dit.h"\n\nint n = atoi(getenv ("H3_X"));\n'}))
    assert bad == ["libh3/models/x.c:3: getenv: the environment is read in core/tuning.c only (h3_tuning)"]


def test_relative_and_unknown_includes():
    # "kernels.inc" next to the file resolves; a name that is no file under libh3/ is reported, so a
    # typo cannot hide an include from the rules.
    assert violations(_tree(**{"models/x.c": '#include "dit.h"\n'})) == []
    bad = violations(_tree(**{"models/x.c": '#include "runtim/runtime.h"\n'}))
    assert bad == ['libh3/models/x.c:1: #include "runtim/runtime.h": not a file under libh3/ (use <...> for '
                   'system headers)']
    # a relative path that climbs into a forbidden layer is resolved and caught
    bad = violations(_tree(**{"models/x.c": '#include "../runtime/runtime.h"\n'}))
    assert bad and "models/ must not include runtime/" in bad[0]
    # angle includes are the system's, never checked
    assert violations(_tree(**{"models/x.c": "#include <runtime/runtime.h>\n"})) == []


def test_the_script_fails_on_a_planted_file_in_a_copy(tmp_path):
    import shutil
    import subprocess

    copy = tmp_path / "libh3"
    shutil.copytree(LIBH3, copy, ignore=shutil.ignore_patterns("*.o", "*.so"))
    run = [sys.executable, str(Path(__file__)), str(copy)]
    ok = subprocess.run(run, capture_output=True, text=True)
    assert ok.returncode == 0 and "layers sealed" in ok.stdout, ok.stderr
    planted = copy / "models" / "video_vae.c"
    planted.write_text(planted.read_text() + '\n#include "runtime/runtime.h"\n')
    bad = subprocess.run(run, capture_output=True, text=True)
    assert bad.returncode == 1
    assert "libh3/models/video_vae.c:" in bad.stderr and "models/ must not include runtime/" in bad.stderr
    assert "check-layers: 1 forbidden" in bad.stderr


if __name__ == "__main__":
    sys.exit(main(sys.argv))
