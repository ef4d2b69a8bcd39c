"""`h3ctl quantize`: fp8 transformer weights written once (h3_quantize) and read by a context (quantized_path).

What is checked on the CPU (the GPU side, byte-identical renders from the file, is tests/gpu/test_cuda_quantize.py):

* libh3's f32 -> e4m3 conversion against torch's float8_e4m3fn conversion on every kind of value in range (random
  over all binades, e4m3 subnormals, exact ties between neighbours, +-0, 448), and saturation beyond it as CUDA's
  SATFINITE does (asserted on its own: torch versions differ there, some give NaN), NaN as CUDA canonicalises it
  (0x7F whatever the sign; torch keeps the sign).
* The file of h3-tiny and of a random F32 checkpoint against a torch reference of the formula (the GPU's bf16 copy
  of the weight, s = amax / 448 per output row, q = e4m3(w / s)): every tensor, byte for byte, and the metadata.
* Refusals, each one line with exit 2 and nothing written: an existing output without --force, an unwritable
  folder; and at load (h3_init, before any work): a file of another checkpoint of the same shapes, a truncated
  file, another format string, a missing tensor, a wrong dtype, a quantized file without fp8, fp8 on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "python"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from h3ctl import H3Error, _lib  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.engine import EMBEDDED_MODEL  # noqa: E402
from h3ctl.quantize import quantize  # noqa: E402
from tests import h3cli  # noqa: E402

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

FORMAT = "fp8-e4m3-per-output-channel/1"
PARTS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")


def e4m3(x: np.ndarray) -> np.ndarray:
    """libh3's conversion (h3_fp8_e4m3_from_f32)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(x.size, np.uint8)
    _lib.check(_lib.lib().h3_fp8_e4m3_from_f32(x.ctypes.data_as(_lib.c_float_p), x.size,
                                               out.ctypes.data_as(_lib.c_uint8_p)))
    return out.reshape(x.shape)


def torch_e4m3(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def e4m3_values() -> np.ndarray:
    """The 126 positive finite e4m3 values in order (0x01 .. 0x7E)."""
    return torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).numpy()


def test_e4m3_conversion_matches_torch_in_range():
    rng = np.random.default_rng(0)
    v = e4m3_values()
    ties = (v[:-1] + v[1:]) / 2  # exact in f32: a tie between neighbours, rounded to the even one
    near = np.concatenate([np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))])
    random = (rng.standard_normal(200_000) * np.exp2(rng.uniform(-12, 9, 200_000))).astype(np.float32)
    special = np.array([0.0, 2.0**-10, 2.0**-9, 2.0**-10 * 1.5, 2.0**-6, 2.0**-7 * 1.75, 448.0, 456.0, 460.0, 464.0,
                        np.nextafter(np.float32(464), np.float32(0)), 1e-30, 1e-45], np.float32)
    subnormal = rng.uniform(0, 2.0**-6, 20_000).astype(np.float32)
    x = np.concatenate([v, ties, near, random, special, subnormal]).astype(np.float32)
    x = np.concatenate([x, -x])
    x = x[np.abs(x) <= 464]  # beyond 464 CUDA's SATFINITE saturates (next test), which torch need not do
    ours, ref = e4m3(x), torch_e4m3(x)
    bad = np.nonzero(ours != ref)[0]
    assert bad.size == 0, [(float(x[i]), hex(ours[i]), hex(ref[i])) for i in bad[:10]]
    assert e4m3(np.array([-0.0], np.float32))[0] == 0x80 and e4m3(np.array([448.0], np.float32))[0] == 0x7E
    assert (e4m3(v) == np.arange(1, 0x7F)).all()  # every value converts to itself


def test_e4m3_saturates_beyond_448_and_canonicalises_nan_as_cuda():
    big = np.array([464.0001, 465, 480, 1e4, 3.4e38, np.inf], np.float32)
    assert (e4m3(big) == 0x7E).all() and (e4m3(-big) == 0xFE).all()
    # (torch's own conversion has given NaN past 464 in some versions and saturates in others: not relied on)
    nans = np.array([np.nan, -np.nan, struct.unpack("<f", b"\x01\x00\xc0\xff")[0]], np.float32)
    assert (e4m3(nans) == 0x7F).all()  # CUDA turns every NaN into the positive one


def reference(w) -> tuple[np.ndarray, np.ndarray]:
    """The GPU's quantisation of a stored weight (cuda_fp8.cu), written from the formula in torch."""
    wb = w.to(torch.bfloat16).to(torch.float32)  # the device copy: f32 / f16 rounded to bf16, nearest even
    amax = torch.nan_to_num(wb.abs(), nan=0.0).amax(dim=1)
    s = torch.where((amax > 0) & torch.isfinite(amax), amax / 448.0, torch.ones_like(amax))
    q = (wb / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    return q.numpy(), s.numpy()


def transformer_tensors(partition: Path) -> dict:
    """The main blocks' GEMM weights as stored, each from the file the index maps it to (a shared-weight Ref2VA
    names FL2VA's shard, which also holds FL2VA's own version of the tensors Ref2VA changed)."""
    tdir = partition / "transformer"
    index = tdir / "model.safetensors.index.json"
    if index.exists():
        where = json.loads(index.read_text())["weight_map"]
    else:
        where = {}
        for f in tdir.glob("*.safetensors"):
            with safe_open(str(f), "pt") as fh:
                where.update({k: f.name for k in fh.keys()})
    out = {}
    for k, f in where.items():
        if k.startswith("blocks.") and k.endswith(".weight") and any(p in k for p in PARTS):
            with safe_open(str(tdir / f), "pt") as fh:
                out[k] = fh.get_tensor(k)
    return out


def check_file(path: Path, partition: Path, name: str) -> None:
    weights = transformer_tensors(partition)
    layers = len({k.split(".")[1] for k in weights})
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
        keys = set(fh.keys())
        assert meta["h3ctl.format"] == FORMAT and meta["h3ctl.precision"] == "fp8"
        assert meta["h3ctl.partition"] == name and len(meta["h3ctl.identity"]) == 64
        int(meta["h3ctl.identity"], 16)
        want = {f"blocks.{i}.{p}.weight" for i in range(layers) for p in PARTS}
        assert keys == want | {k + ".scale" for k in want}
        for k in sorted(want):
            q, s = reference(weights[k])
            got_q = fh.get_tensor(k)
            got_s = fh.get_tensor(k + ".scale")
            assert got_q.dtype == torch.float8_e4m3fn and tuple(got_q.shape) == q.shape, k
            assert got_s.dtype == torch.float32 and tuple(got_s.shape) == s.shape, k
            assert np.array_equal(got_q.view(torch.uint8).numpy(), q), k
            assert np.array_equal(got_s.numpy().view(np.uint32), s.view(np.uint32)), k


def test_quantize_h3tiny_matches_the_formula_byte_for_byte(tmp_path):
    out = tmp_path / "tiny.fp8.safetensors"
    proc = h3cli.run("quantize", EMBEDDED_MODEL, "-o", out, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    assert "quantize: 24/24 weights" in proc.stderr and str(out) in proc.stdout
    check_file(out, EMBEDDED_MODEL / "FL2VA", "FL2VA")
    # Ref2VA's shared-weight transformer: its own file and identity
    ref = quantize(EMBEDDED_MODEL, tmp_path / "ref.fp8.safetensors", ref2va=True, threads=1)
    check_file(ref, EMBEDDED_MODEL / "Ref2VA", "Ref2VA")
    with safe_open(str(out), "pt") as a, safe_open(str(ref), "pt") as b:
        assert a.metadata()["h3ctl.identity"] != b.metadata()["h3ctl.identity"]
    # the same model gives the same bytes, at any thread count
    again = quantize(EMBEDDED_MODEL, tmp_path / "again.safetensors", threads=1)
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(out.read_bytes()).digest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.safetensors", "ref.fp8.safetensors",
                                                          "tiny.fp8.safetensors"]


def test_quantize_f32_checkpoint_rounds_through_bf16_like_the_gpu(tiny_ckpt_f32, tmp_path):
    out = quantize(tiny_ckpt_f32.parent, tmp_path / "f32.safetensors", threads=2)
    check_file(out, tiny_ckpt_f32, "FL2VA")


# ---- refusals --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return quantize(EMBEDDED_MODEL, tmp_path_factory.mktemp("q") / "tiny.safetensors", threads=2)


def test_existing_output_is_kept_without_force(tiny_file, tmp_path):
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"keep me")
    proc = h3cli.run("quantize", EMBEDDED_MODEL, "-o", out)
    h3cli.assert_clean_error(proc, str(out), "already exists", "--force")
    assert out.read_bytes() == b"keep me" and sorted(tmp_path.iterdir()) == [out]
    proc = h3cli.run("quantize", EMBEDDED_MODEL, "-o", out, "--force", "--threads", 1)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == tiny_file.read_bytes() and sorted(tmp_path.iterdir()) == [out]


def test_unwritable_folder_writes_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = h3cli.run("quantize", EMBEDDED_MODEL, "-o", blocker / "out.safetensors")
    h3cli.assert_clean_error(proc, "cannot create a file in its folder")
    if os.geteuid() != 0:  # root writes into read-only folders anyway
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        proc = h3cli.run("quantize", EMBEDDED_MODEL, "-o", ro / "out.safetensors")
        h3cli.assert_clean_error(proc, "cannot create a file in its folder", "ermission denied")
        assert list(ro.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] + (["ro"] if os.geteuid() != 0 else [])
    proc = h3cli.run("quantize", tmp_path / "no-model", "-o", tmp_path / "x.safetensors")
    h3cli.assert_clean_error(proc, "no-model")
    assert not (tmp_path / "x.safetensors").exists()


def rewrite(src: Path, dst: Path, drop: str | None = None, meta: dict | None = None, cast: str | None = None):
    """A copy of a quantised file with one tensor left out, metadata changed or one tensor's dtype changed."""
    with safe_open(str(src), "pt") as fh:
        md = dict(fh.metadata())
        tensors = {k: fh.get_tensor(k) for k in fh.keys() if k != drop}
    if cast:
        tensors[cast] = tensors[cast].to(torch.float16)
    md.update(meta or {})
    save_file(tensors, str(dst), metadata=md)
    return dst


def render_refused(model, qfile, tmp_path, *needles, precision="fp8"):
    out = tmp_path / "out.mp4"
    proc = h3cli.run("render", "-p", "a red circle", "-d", model, "--device", "cpu", "--precision", precision,
                     "--quantized", qfile, "-o", out, "--steps", 2, "-q")
    line = h3cli.assert_clean_error(proc, *needles)
    assert not out.exists()
    return line


def test_bad_files_are_refused_before_any_work(tiny_file, tmp_path):
    first = "blocks.0.attn.qkv_proj.weight"
    cases = {
        "truncated": (lambda p: p.write_bytes(tiny_file.read_bytes()[:-100]), ("truncated",)),
        "format": (lambda p: rewrite(tiny_file, p, meta={"h3ctl.format": "fp8-e4m3-per-tensor/1"}),
                   ("not an h3ctl fp8 weights file", "fp8-e4m3-per-tensor/1")),
        "precision": (lambda p: rewrite(tiny_file, p, meta={"h3ctl.precision": "int8"}), ("precision 'int8'",)),
        "missing": (lambda p: rewrite(tiny_file, p, drop=first + ".scale"), (first + ".scale", "missing")),
        "dtype": (lambda p: rewrite(tiny_file, p, cast=first + ".scale"), (first + ".scale", "F16", "F32 [")),
        "identity": (lambda p: rewrite(tiny_file, p, meta={"h3ctl.identity": "0" * 64}),
                     ("another checkpoint", "h3ctl quantize")),
    }
    for name, (make, needles) in cases.items():
        bad = tmp_path / f"{name}.safetensors"
        make(bad)
        line = render_refused(EMBEDDED_MODEL, bad, tmp_path, str(bad), *needles)
        assert "fp8 runs on the CUDA backend" not in line, name  # the file's reason comes first


def test_a_file_of_another_checkpoint_of_the_same_shapes_is_refused(tiny_ckpt, tmp_path):
    from tests.fixtures import make_checkpoint

    other = make_checkpoint(tmp_path / "other", seed=1)  # same config, other values
    theirs = quantize(other.parent, tmp_path / "other.safetensors", threads=2)
    mine = quantize(tiny_ckpt.parent, tmp_path / "mine.safetensors", threads=2)
    render_refused(tiny_ckpt.parent, theirs, tmp_path, "quantised from another checkpoint", str(theirs))
    with pytest.raises(H3Error, match="another checkpoint"):
        Context(other.parent, device="cpu", precision="fp8", quantized=mine)
    # FL2VA's file for the Ref2VA partition of the same model
    fl2va = quantize(EMBEDDED_MODEL, tmp_path / "fl2va.safetensors", threads=2)
    with pytest.raises(H3Error, match=r"another checkpoint .*FL2VA.*Ref2VA"):
        Context(EMBEDDED_MODEL, ref2va=True, device="cpu", precision="fp8", quantized=fl2va)


def test_cpu_context_with_a_quantized_file_is_refused_with_the_reason(tiny_file, tmp_path):
    with pytest.raises(H3Error, match="fp8 runs on the CUDA backend only"):
        Context(EMBEDDED_MODEL, device="cpu", precision="fp8", quantized=tiny_file)
    with pytest.raises(H3Error, match="needs precision fp8"):
        Context(EMBEDDED_MODEL, device="cpu", quantized=tiny_file)
    render_refused(EMBEDDED_MODEL, tiny_file, tmp_path, "needs precision fp8", precision="int8")
    render_refused(EMBEDDED_MODEL, tmp_path / "none.safetensors", tmp_path, "none.safetensors", "no such file")


def test_cancel_and_bad_arguments_leave_nothing(tmp_path):
    seen = []

    def stop_at_three(done, total):
        seen.append((done, total))
        return done >= 3

    with pytest.raises(H3Error, match="cancel"):
        quantize(EMBEDDED_MODEL, tmp_path / "c.safetensors", progress=stop_at_three)
    assert seen == [(0, 24), (1, 24), (2, 24), (3, 24)] and list(tmp_path.iterdir()) == []

    def boom(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        quantize(EMBEDDED_MODEL, tmp_path / "k.safetensors", progress=boom)
    with pytest.raises(H3Error, match="threads"):
        quantize(EMBEDDED_MODEL, tmp_path / "t.safetensors", threads=-1)
    rc = _lib.lib().h3_quantize(os.fsencode(EMBEDDED_MODEL), 0, _lib.PRECISIONS["int8"], 1,
                                os.fsencode(tmp_path / "i.safetensors"), 0, _lib.H3ProgressFn(), None)
    assert rc < 0 and "only fp8" in _lib.last_error()
    assert list(tmp_path.iterdir()) == []
