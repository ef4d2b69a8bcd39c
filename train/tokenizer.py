"""h3-tiny tokenizer: a small byte-level BPE learned with HF `tokenizers` on the world's caption language.

Structure is Qwen2's (what the released MiniMax-H3 ships and what libh3's tokenizer reads):

* normalizer NFC;
* pre-tokenizer ``Sequence[Split(<Qwen2 regex>, Isolated), ByteLevel(add_prefix_space=False, use_regex=False)]``;
* ``ByteLevel`` decoder (and post-processor, as Qwen ships it);
* model BPE: ids ``0..255`` are the 256 byte symbols in GPT-2/Qwen ``bytes_to_unicode`` order (so printable ASCII ids
  coincide with Qwen's: ``"A"`` is 32), then the learned merges in merge order, then the Qwen2.5-VL added tokens
  (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ..., ``<|vision_start|>``, ``<|vision_end|>``,
  ``<|image_pad|>``, ``<|video_pad|>``, ...), exactly the list and order the test fixtures use
  (``tests/fixtures/tokenizer.py``), so ``tokenizer_config.json`` written by the fixtures' writer matches.

The merges are learned by ``tokenizers.trainers.BpeTrainer`` (byte-level initial alphabet) over a fixed corpus:
``world.caption_words()`` (each word alone and space-prefixed) plus the one-line and Context-IR captions of the first
``n_specs`` *training-split* specs (``world.iter_specs(n, seed, "train")``). Everything is deterministic: the same
arguments give a byte-identical ``tokenizer.json`` (checked by :func:`build_tokenizer_json` itself, which trains twice
when ``verify=True``).

Training-only module (imports ``train.world``); the runtime package never imports it.

CLI: ``python -m train.tokenizer OUT_DIR`` writes ``OUT_DIR/tokenizer.json`` and prints vocabulary statistics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures.tokenizer import (  # noqa: E402,F401  (shared structure: regex, added tokens, byte order)
    QWEN2_SPLIT_REGEX,
    VOCAB_PAD_MULTIPLE,
    bytes_to_unicode,
    padded_vocab_size,
    special_token_ids,
    token_count,
    tokenizer_doc,
)
from train import world  # noqa: E402

#: Default learned vocabulary size (256 byte symbols + merges). 22 added tokens come on top.
DEFAULT_VOCAB = 512
DEFAULT_SPECS = 4000
DEFAULT_SEED = 0


def corpus(n_specs: int = DEFAULT_SPECS, seed: int = DEFAULT_SEED) -> list[str]:
    """The training corpus (list of documents), deterministic."""
    docs: list[str] = []
    words = world.caption_words()
    docs += words
    docs += [" " + w for w in words]
    for spec in world.iter_specs(n_specs, seed=seed, split="train"):
        docs.append(world.caption_line(spec))
        docs.append(world.caption_ir(spec))
    return docs


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def learn_merges(vocab_size: int = DEFAULT_VOCAB, n_specs: int = DEFAULT_SPECS,
                 seed: int = DEFAULT_SEED) -> list[tuple[str, str]]:
    """Learn BPE merges with HF `tokenizers` (BpeTrainer over the byte-level alphabet)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(n_specs, seed), trainer=trainer)
    doc = json.loads(tok.to_str())
    merges = []
    for m in doc["model"]["merges"]:
        a, b = (m.split(" ", 1) if isinstance(m, str) else m)
        merges.append((a, b))
    return merges


def _tokenizer_doc(merges: list[tuple[str, str]]) -> dict:
    vocab: dict[str, int] = {}
    for symbol in bytes_to_unicode().values():
        vocab[symbol] = len(vocab)
    kept = []
    for a, b in merges:
        if a not in vocab or b not in vocab:
            raise AssertionError(f"merge {a!r}+{b!r} uses an unknown symbol")
        if a + b in vocab:  # a second merge producing an existing token: BPE keeps the first rank only
            continue
        vocab[a + b] = len(vocab)
        kept.append([a, b])
    return tokenizer_doc(vocab, kept)


def build_tokenizer_json(vocab_size: int = DEFAULT_VOCAB, n_specs: int = DEFAULT_SPECS, seed: int = DEFAULT_SEED,
                         verify: bool = False) -> str:
    """The `tokenizer.json` text of the h3-tiny tokenizer (deterministic)."""
    text = json.dumps(_tokenizer_doc(learn_merges(vocab_size, n_specs, seed)), ensure_ascii=False, indent=2)
    if verify:
        again = json.dumps(_tokenizer_doc(learn_merges(vocab_size, n_specs, seed)), ensure_ascii=False, indent=2)
        if again != text:
            raise RuntimeError("BPE training is not deterministic")
    return text


def load(tokenizer_json: str):
    """A `tokenizers.Tokenizer` from the JSON text (what `tokenizer(prompt, add_special_tokens=False)` runs)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--vocab", type=int, default=DEFAULT_VOCAB)
    ap.add_argument("--specs", type=int, default=DEFAULT_SPECS)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    text = build_tokenizer_json(args.vocab, args.specs, args.seed, verify=True)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(text)
    tok = load(text)
    lens = [len(encode(tok, c)) for c in corpus(500, 1)[2 * len(world.caption_words()):]]
    print(f"tokens {token_count(text)} (padded {padded_vocab_size(text)}); caption lengths {min(lens)}..{max(lens)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
