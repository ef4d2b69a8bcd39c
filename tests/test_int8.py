"""int8 block weights on the CPU (h3_options.precision = int8; `--precision int8`).

The transformer's main blocks' four GEMM weights (qkv, out, fc1, fc2) are quantised at load, per output channel:
s = max|w| / 127, q = round(w / s) (ties to even), both in f32; the GEMM multiplies by (float)q * s. What is checked:

* The contract: libh3's int8 forward on a checkpoint equals, bit for bit, libh3's exact f32 forward on the same
  checkpoint with those four weights replaced by their dequantised values (computed here in numpy from the
  specification, not by libh3), and that f32 forward matches diffusers on the dequantised checkpoint (1e-5, the f32
  parity tolerance). So int8 changes nothing but the weights, and changes them exactly as specified.
* How far int8 moves the transformer (random-weight fixtures, against diffusers on the original weights) and the
  trained h3-tiny's renders (PSNR / SSIM of frames, log-spectral distance of audio against the exact render from the
  same noise; the semantic suite on the held-out prompts): printed, and held to bounds.
* Same bits for 1 and 2 threads; the memory estimate counts the int8 bytes; precisions the CPU cannot run are
  refused with one line (exit 2, nothing written).

`python tests/test_int8.py [--prompts 27]` prints the int8 quality table of docs/fp8-and-vram.md (default vs int8
on every held-out prompt).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "python"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from h3ctl import Engine, H3Error  # noqa: E402
from h3ctl import transformer as tr  # noqa: E402
from h3ctl.context import Context  # noqa: E402

GEMM_PARTS = (".attn.qkv_proj.weight", ".attn.out_proj.weight", ".mlp.fc1.weight", ".mlp.fc2.weight")


def is_block_gemm(name: str) -> bool:
    return name.startswith("blocks.") and name.endswith(GEMM_PARTS)


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The specification, in numpy f32: (q int8 [N, K], s f32 [N])."""
    w = np.asarray(w, np.float32)
    m = np.abs(w).max(axis=1)
    s = (m / np.float32(127)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1))
    q = np.where(s[:, None] > 0, np.rint(w / safe[:, None]), 0)
    return np.clip(q, -127, 127).astype(np.int8), s


def dequantize(w: np.ndarray) -> np.ndarray:
    q, s = quantize(w)
    return (q.astype(np.float32) * s[:, None]).astype(np.float32)


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---- the transformer on random-weight fixtures ----------------------------------------------------------------

_FIX: dict = {}


def fixture_pair(tmp_path_factory, name: str, dtype: str):
    """(original checkpoint, the same with dequantised block GEMM weights in f32), built once per session."""
    import torch

    from tests import dit_support as ds

    key = (name, dtype)
    if key not in _FIX:
        model = ds.build_dit(ds.DIT_CONFIGS[name], seed={"tiny": 21, "odd": 22, "wide": 23}[name])
        tensors = ds.official_tensors(model, dtype)
        orig = ds.write_checkpoint(model, tmp_path_factory.mktemp(f"i8_{name}_{dtype}"), tensors=tensors)
        deq = {n: (torch.from_numpy(dequantize(t.float().numpy())) if is_block_gemm(n) else t)
               for n, t in tensors.items()}
        assert sum(is_block_gemm(n) for n in tensors) == 4 * model.config.num_layers
        deq_root = ds.write_checkpoint(model, tmp_path_factory.mktemp(f"i8deq_{name}_{dtype}"), tensors=deq)
        _FIX[key] = (orig, deq_root, ds.read_back(orig), ds.read_back(deq_root))
    return _FIX[key]


def forward(root, kw, precision="default", threads=2):
    np_kw = {k: (v[0] if k.endswith("states") else v).numpy() for k, v in kw.items()}
    with Context(root, threads=threads, device="cpu", precision=precision) as ctx:
        return tr.forward(ctx, **np_kw)


@pytest.fixture(autouse=True, scope="module")
def _torch_threads():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# "official": the release's dtypes, bf16 block weights
@pytest.mark.parametrize("name,dtype", [("tiny", "f32"), ("odd", "official"), ("wide", "f32")])
def test_int8_forward_is_the_f32_forward_over_dequantised_weights(tmp_path_factory, name, dtype):
    from tests.test_dit import packed_inputs, run_ref

    orig, deq, ref, ref_deq = fixture_pair(tmp_path_factory, name, dtype)
    kw = packed_inputs(ref, 7, 7, 8, 6, 9, seed=3)
    v8, a8 = forward(orig, kw, "int8")
    vd, ad = forward(deq, kw, "default")
    # the contract, end to end: the same bits
    assert np.array_equal(v8, vd) and np.array_equal(a8, ad)
    # and that forward is diffusers' forward over the dequantised weights
    rv, ra = run_ref(ref_deq, kw)
    e_deq = max(rel_l2(v8, rv), rel_l2(a8, ra))
    # how far int8 moves the forward from the original weights
    r0v, r0a = run_ref(ref, kw)
    e_v, e_a = rel_l2(v8, r0v), rel_l2(a8, r0a)
    print(f"int8: {name} {dtype}: vs diffusers on dequantised weights {e_deq:.2e}; vs the original weights "
          f"video {e_v:.2e} audio {e_a:.2e}")
    assert e_deq <= 1e-5
    assert e_v <= 2e-2 and e_a <= 2e-2


def test_int8_same_bits_for_any_thread_count(tmp_path_factory):
    from tests.test_dit import packed_inputs

    orig, _, ref, _ = fixture_pair(tmp_path_factory, "odd", "official")
    kw = packed_inputs(ref, 19, 7, 8, 6, 9, seed=5)  # 19 text rows: more than the few-rows GEMM path's 6
    v1, a1 = forward(orig, kw, "int8", threads=1)
    v2, a2 = forward(orig, kw, "int8", threads=2)
    assert np.array_equal(v1, v2) and np.array_equal(a1, a2)


def test_int8_denoise_loop_close_to_exact(tmp_path_factory):
    """A 5-point denoise loop (4 forwards, Euler steps between) stays near the exact loop."""
    orig, deq, ref, _ = fixture_pair(tmp_path_factory, "tiny", "f32")
    rng = np.random.default_rng(4)
    cfg = ref.config
    pe = rng.standard_normal((9, cfg.text_dim)).astype(np.float32)
    lat = rng.standard_normal((cfg.in_channels, 7, 8, 8)).astype(np.float32)
    aud = rng.standard_normal((2, cfg.audio_in_channels, 11)).astype(np.float32)
    out = {}
    for root, prec in ((orig, "default"), (orig, "int8"), (deq, "default")):
        with Context(root, threads=2, device="cpu", precision=prec) as ctx:
            out[(str(root), prec)] = tr.denoise(ctx, pe, lat, aud, 5)[:2]
    v0, a0 = out[(str(orig), "default")]
    v8, a8 = out[(str(orig), "int8")]
    vd, ad = out[(str(deq), "default")]
    assert np.array_equal(v8, vd) and np.array_equal(a8, ad)
    ev, ea = rel_l2(v8, v0), rel_l2(a8, a0)
    print(f"int8: 5-point denoise loop vs exact: video {ev:.2e} audio {ea:.2e}")
    assert ev <= 2e-2 and ea <= 2e-2


def test_memory_estimate_counts_int8_bytes(tmp_path_factory):
    from safetensors import safe_open

    orig, _, _, _ = fixture_pair(tmp_path_factory, "odd", "official")
    stored = resident = 0
    path = next((Path(orig) / "FL2VA" / "transformer").glob("*.safetensors"))
    with safe_open(str(path), "pt") as f:
        for n in f.keys():
            if is_block_gemm(n):
                t = f.get_tensor(n)
                stored += t.numel() * t.element_size()
                rows, cols = t.shape
                resident += -(-rows * 4 // 64) * 64 + rows * cols  # scales padded to 64 bytes, then the values
    with Context(orig, device="cpu") as c0, Context(orig, device="cpu", precision="int8") as c8:
        e0 = c0.memory_estimate(128, 128, 22, 16)["phases"]
        e8 = c8.memory_estimate(128, 128, 22, 16)["phases"]
    assert "block_gemm_weights" not in e0
    assert e8["block_gemm_weights"] == {"precision": "int8", "stored": stored, "resident": resident}
    for phase in ("denoise_precomputed_adaln", "denoise_without_precompute"):
        assert e0[phase]["weights"] - e8[phase]["weights"] == stored - resident
    assert resident < 0.6 * stored  # bf16 weights: about half


# ---- precisions the CPU cannot run ---------------------------------------------------------------------------


def test_precision_refused_where_the_device_cannot_run_it(tmp_path):
    from h3ctl.engine import default_model_dir
    from tests.h3cli import assert_clean_error, run

    with pytest.raises(H3Error, match="fp8 runs on the CUDA backend only"):
        Engine(threads=1, device="cpu", precision="fp8")
    with pytest.raises(H3Error, match="precision must be one of"):
        Context(default_model_dir(), device="cpu", precision="int4")
    out = tmp_path / "x.mp4"
    line = assert_clean_error(run("render", "-p", "a red circle", "--device", "cpu", "--precision", "fp8", "-o", out,
                                  "-q"), "fp8", "CPU")
    print(f"int8: {line}")
    assert not out.exists() and not list(tmp_path.iterdir())
    assert_clean_error(run("render", "-p", "a red circle", "--precision", "int4", "-o", out, "-q"), "--precision")
    assert not out.exists()


def test_cli_render_and_info_with_int8(tmp_path):
    from tests.h3cli import run

    out = tmp_path / "a.mp4"
    p = run("render", "-p", "a blue square moves left, a low hum", "--precision", "int8", "--device", "cpu",
            "--steps", "4", "--threads", "2", "-o", out, "-q")
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size > 1000
    from h3ctl.engine import default_model_dir

    p = run("info", "-d", default_model_dir(), "--precision", "int8", "--device", "cpu", "--json")
    assert p.returncode == 0, p.stderr
    bg = json.loads(p.stdout)["memory_estimate"]["phases"]["block_gemm_weights"]
    assert bg["precision"] == "int8" and bg["resident"] < 0.6 * bg["stored"]


# ---- h3-tiny: renders and the semantic suite --------------------------------------------------------------------


def renders(precision: str, n_prompts: int, threads: int = 2):
    """(frames, audio) of the first n held-out prompts at 20 steps, seeds 42 + k (semantic_run's renders)."""
    from tests import semantic_run as S
    from train import world

    with Engine(threads=threads, device="cpu", precision=precision) as eng:
        return [S.libh3_render(eng, spec.caption, 20, 42 + k)
                for k, spec in enumerate(world.heldout_specs()[:n_prompts])]


def quality(exact, int8):
    """PSNR and SSIM of the frames, log-spectral distance of the audio, int8 against the exact render, per prompt."""
    from tests import quality as Q

    return ([Q.psnr(q[0], d[0]) for d, q in zip(exact, int8)], [Q.ssim(q[0], d[0]) for d, q in zip(exact, int8)],
            [Q.log_spectral_distance(q[1], d[1]) for d, q in zip(exact, int8)])


def semantic(results):
    from train import evaluate, world

    return evaluate.summarize([evaluate.check(spec, f, a) for spec, (f, a) in zip(world.heldout_specs(), results)])


def test_h3tiny_int8_render_quality_and_semantic_suite():
    """The semantic suite on all held-out prompts with int8; the frames and audio of the first 9 against the exact
    render from the same noise (`python tests/test_int8.py` measures all of them)."""
    int8 = renders("int8", 27)
    exact = renders("default", 9)
    ps, ss, ls = quality(exact, int8)
    s8 = semantic(int8)
    print(f"int8: h3-tiny vs the exact render, {len(exact)} held-out prompts: PSNR min {min(ps):.1f} mean "
          f"{np.mean(ps):.1f} dB, SSIM min {min(ss):.4f} mean {np.mean(ss):.4f}, audio LSD max {max(ls):.2f} mean "
          f"{np.mean(ls):.2f} dB; semantic ({len(int8)} prompts) {s8['passed']}/{s8['total']} = "
          f"{100 * s8['pass_rate']:.1f} %")
    assert min(ps) >= 35.0 and min(ss) >= 0.98 and max(ls) <= 1.0
    assert s8["pass_rate"] >= 0.90, s8["per_check"]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="default vs int8 on h3-tiny's held-out prompts (a markdown table)")
    ap.add_argument("--prompts", type=int, default=27)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    exact, int8 = renders("default", args.prompts, args.threads), renders("int8", args.prompts, args.threads)
    ps, ss, ls = quality(exact, int8)
    s0, s8 = semantic(exact), semantic(int8)
    n = len(exact)
    print(f"h3-tiny, 128x128x22, 20 steps, exact preset, {args.threads} threads, {n} held-out prompts "
          f"(seeds 42..{41 + n}); against the default render from the same noise\n")
    print("| weights | PSNR dB (mean / min) | SSIM (mean / min) | audio LSD dB (mean / max) | semantic |")
    print("|---|---|---|---|---|")
    print(f"| default (exact) | exact | 1.000 | 0.00 | {100 * s0['pass_rate']:.1f} % ({s0['passed']}/{s0['total']}) |")
    finite = [p for p in ps if math.isfinite(p)]
    print(f"| int8 | {np.mean(finite):.1f} / {min(finite):.1f} | {np.mean(ss):.4f} / {min(ss):.4f} | "
          f"{np.mean(ls):.2f} / {max(ls):.2f} | {100 * s8['pass_rate']:.1f} % ({s8['passed']}/{s8['total']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
