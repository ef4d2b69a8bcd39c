"""Shared pytest setup for h3ctl's Python tests.

* puts the repository root on `sys.path` so tests can `from tests.fixtures import ...`;
* session-scoped oracle fixtures (built lazily, so C-only test runs never import diffusers / transformers):
  `tiny_models`    - `build_models("tiny", seed=0)`;
  `tiny_ckpt`      - those models written with the released dtypes (BF16 DiT/text encoder, F32 islands and VAEs);
  `tiny_ckpt_f32`  - the same models written all-F32.
  Both checkpoint fixtures return the partition directory (`<tmp>/FL2VA`); the root tokenizer copy is at
  `<tmp>/tokenizer/tokenizer.json`.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def tiny_models():
    from tests.fixtures import build_models

    return build_models("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_models, tmp_path_factory):
    from tests.fixtures import write_official

    return write_official(tiny_models, tmp_path_factory.mktemp("h3_tiny_official"), dtype="official")


@pytest.fixture(scope="session")
def tiny_ckpt_f32(tiny_models, tmp_path_factory):
    from tests.fixtures import write_official

    return write_official(tiny_models, tmp_path_factory.mktemp("h3_tiny_f32"), dtype="f32")
