"""`h3ctl parity tokenize` against HF tokenizers on the fixture checkpoint's tokenizer.json."""

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from tests.h3cli import assert_clean_error, run


def test_parity_tokenize_matches_hf(tiny_ckpt, tmp_path):
    prompt = "a red circle moves right on a black background, a high beep <|im_start|>Ünïcödé 123"
    save_file({"prompt": np.frombuffer(prompt.encode(), dtype=np.uint8).copy()}, tmp_path / "in.safetensors")
    proc = run("parity", "tokenize", "--model", tiny_ckpt.parent, "--inputs", tmp_path / "in.safetensors",
               "--out", tmp_path / "out.safetensors")
    assert proc.returncode == 0, proc.stderr
    ids = load_file(tmp_path / "out.safetensors")["input_ids"]
    hf = Tokenizer.from_file(str(tiny_ckpt / "tokenizer" / "tokenizer.json"))
    assert ids.dtype == np.int64 and ids.shape[0] == 1
    assert ids[0].tolist() == hf.encode(prompt, add_special_tokens=False).ids


def test_parity_tokenize_bad_input(tiny_ckpt, tmp_path):
    save_file({"prompt": np.frombuffer(b"\xff\xfe", dtype=np.uint8).copy()}, tmp_path / "in.safetensors")
    out = tmp_path / "out.safetensors"
    proc = run("parity", "tokenize", "--model", tiny_ckpt.parent, "--inputs", tmp_path / "in.safetensors", "--out", out)
    assert_clean_error(proc, "invalid UTF-8 at byte offset 0")
    assert not out.exists()
    save_file({"text": np.zeros(3, np.uint8)}, tmp_path / "in2.safetensors")
    assert_clean_error(run("parity", "tokenize", "--model", tiny_ckpt.parent, "--inputs", tmp_path / "in2.safetensors",
                           "--out", out), "input tensor(s) missing: prompt")
    assert_clean_error(run("parity", "nosuchstage", "--inputs", tmp_path / "in2.safetensors", "--out", out),
                       "unknown stage 'nosuchstage'")
    assert not out.exists()
