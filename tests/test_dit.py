"""libh3's transformer and sampler against diffusers 0.42.1 (the oracle).

Tiny random DiTs (tests/dit_support.py) are written in the official layout and read back through diffusers' own
converter, so every comparison is "official checkpoint -> libh3" vs "official checkpoint -> diffusers".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch  # noqa: E402  (test extra)
import diffusers  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from h3ctl import transformer as tr  # noqa: E402
from h3ctl._lib import H3Error  # noqa: E402
from h3ctl.context import Context  # noqa: E402

from tests import dit_support as ds  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _torch_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and the machine is shared
    yield
    torch.set_num_threads(old)


_CKPTS: dict = {}


def checkpoint(tmp_path_factory, name: str, dtype: str):
    """(root, diffusers reference) for a tiny config, built once per session."""
    key = (name, dtype)
    if key not in _CKPTS:
        model = ds.build_dit(ds.DIT_CONFIGS[name], seed={"tiny": 11, "odd": 12, "wide": 13}[name])
        root = ds.write_checkpoint(model, tmp_path_factory.mktemp(f"dit_{name}_{dtype}"), dtype)
        _CKPTS[key] = (root, ds.read_back(root))
    return _CKPTS[key]


def packed_inputs(ref, n_text, T, H, W, Ta, seed=0, anchors=(), text_tags=None, shuffle=False):
    """diffusers forward kwargs (batch 1) for a t2va/fl2va layout with three distinct timesteps."""
    pos, tags, vidx, aidx, tidx, ncv, _ = ds.t2va_layout(ref, n_text, T, H, W, Ta, text_tags, anchors)
    L = pos.shape[0]
    if shuffle:  # any row order: the forward must only follow the indices
        perm = torch.randperm(L, generator=torch.Generator().manual_seed(seed + 7))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(L)
        pos, tags = pos[perm], tags[perm]
        vidx, aidx, tidx = inv[vidx], inv[aidx], inv[tidx]
    g = torch.Generator().manual_seed(seed)
    P = ref.config.in_channels * ref.config.patch_size[1] * ref.config.patch_size[2]
    ts = torch.tensor([0.05, 0.5, 0.999], dtype=torch.float32)
    tsi = torch.ones(L, dtype=torch.long)
    tsi[aidx] = 0
    tsi[vidx[:ncv]] = 2
    return dict(
        hidden_states=torch.randn(1, vidx.numel(), P, generator=g),
        audio_hidden_states=torch.randn(1, aidx.numel(), ref.config.audio_in_channels, generator=g),
        encoder_hidden_states=torch.randn(1, n_text, ref.config.text_dim, generator=g),
        timestep=ts, timestep_indices=tsi, token_tags=tags, position_ids=pos, video_indices=vidx,
        audio_indices=aidx, text_indices=tidx)


def run_ref(ref, kw):
    with torch.no_grad():
        v, a = ref(**kw, return_dict=False)
    return v[0].numpy(), a[0].numpy()


def run_h3(root, kw, threads=2):
    np_kw = {k: (v[0] if k.endswith("states") else v).numpy() for k, v in kw.items()}
    with Context(root, threads=threads) as ctx:
        return tr.forward(ctx, **np_kw)


# ---- schedule ------------------------------------------------------------------------------------------------------


def test_schedule_bit_exact():
    from diffusers import MiniMaxH3Scheduler

    for shift in (12.0, 3.0, 1.0, 0.25, 3.7, 7.123456789, 100.0):
        sched = MiniMaxH3Scheduler(shift=shift)
        for steps in list(range(2, 130)) + [199, 256, 500, 1000, 1001]:
            sched.set_timesteps(steps)
            sig, ts = tr.sigma_schedule(steps, shift)
            np.testing.assert_array_equal(sig, sched.sigmas.numpy(), err_msg=f"steps={steps} shift={shift}")
            np.testing.assert_array_equal(ts, sched.timesteps.numpy(), err_msg=f"steps={steps} shift={shift}")


def test_schedule_rejects_bad_arguments():
    for steps, shift in ((1, 12.0), (0, 3.0), (20, 0.0), (20, -1.0), (20, float("nan"))):
        with pytest.raises(H3Error, match="schedule"):
            tr.sigma_schedule(steps, shift)


def test_schedule_documents_step_count():
    # steps counts sigma grid points including the terminal 0: 20 -> 19 model evaluations (h3.c: 20 -> 20).
    sig, ts = tr.sigma_schedule(20, 12.0)
    assert len(sig) == 20 and len(ts) == 19 and sig[0] == 1.0 and sig[-1] == 0.0


# ---- noise ---------------------------------------------------------------------------------------------------------


def test_noise_is_counter_based():
    a = tr.noise(42, 0, (4, 1000))
    b = tr.noise(42, 0, (4000,))
    np.testing.assert_array_equal(a.reshape(-1), b)
    # any element on its own
    np.testing.assert_array_equal(tr.noise(42, 0, (7,), offset=1234), b[1234:1241])
    assert not np.array_equal(tr.noise(42, 1, (4000,)), b)  # streams differ
    assert not np.array_equal(tr.noise(43, 0, (4000,)), b)  # seeds differ
    big = tr.noise(7, 0, (200_000,))
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1) < 0.01
    assert np.isfinite(big).all() and np.abs(big).max() < 7


# ---- layout --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("geom", [(6, 2, 2, 2, 3), (5, 7, 4, 6, 11), (13, 17, 30, 54, 93), (1, 22, 16, 48, 37)])
@pytest.mark.parametrize("anchors", [(), ("first",), ("first", "last"), ("last",)])
def test_layout_bit_exact(tmp_path_factory, geom, anchors):
    root, ref = checkpoint(tmp_path_factory, "tiny", "f32")
    n_text, T, H, W, Ta = geom
    tags = np.ones(n_text, np.uint8)
    tags[n_text // 2:] = 0 if anchors else 1  # vision-span rows carry the video tag
    exp = ds.t2va_layout(ref, n_text, T, H, W, Ta, torch.from_numpy(tags.astype(np.int64)), anchors)
    with Context(root) as ctx:
        got = tr.packed_layout(ctx, n_text, T, H, W, Ta, text_tags=tags, anchors=anchors)
    for name, e in zip(("position_ids", "token_tags", "video_indices", "audio_indices", "text_indices"), exp):
        np.testing.assert_array_equal(got[name], e.numpy(), err_msg=name)


# ---- forward -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "odd", "wide"])
def test_forward_f32(tmp_path_factory, name):
    root, ref = checkpoint(tmp_path_factory, name, "f32")
    for kw in (packed_inputs(ref, 5, 3, 4, 6, 7, seed=1),
               packed_inputs(ref, 9, 2, 6, 2, 5, seed=2, anchors=("first", "last"), shuffle=True,
                             text_tags=torch.tensor([1, 1, 0, 0, 0, 0, 1, 1, 1]))):
        ev, ea = run_ref(ref, kw)
        v, a = run_h3(root, kw)
        print(f"parity: dit {name} f32: sample rel-L2 {ds.rel_l2(v, ev):.2e}, audio_sample {ds.rel_l2(a, ea):.2e} (tol 1e-5)")
        assert ds.rel_l2(v, ev) <= 1e-5 and ds.rel_l2(a, ea) <= 1e-5, (ds.rel_l2(v, ev), ds.rel_l2(a, ea))


@pytest.mark.parametrize("name", ["tiny", "odd", "wide"])
def test_forward_bf16_weights(tmp_path_factory, name):
    root, ref = checkpoint(tmp_path_factory, name, "official")  # ref holds the BF16 values upcast to f32
    kw = packed_inputs(ref, 7, 3, 4, 4, 6, seed=3)
    ev, ea = run_ref(ref, kw)
    v, a = run_h3(root, kw)
    print(f"parity: dit {name} bf16: sample rel-L2 {ds.rel_l2(v, ev):.2e}, audio_sample {ds.rel_l2(a, ea):.2e} (tol 1e-4)")
    assert ds.rel_l2(v, ev) <= 1e-4 and ds.rel_l2(a, ea) <= 1e-4, (ds.rel_l2(v, ev), ds.rel_l2(a, ea))


def test_forward_shared_fixture_checkpoint(tiny_ckpt):
    """The complete official layout the shared fixtures write (every component, released dtypes, root tokenizer)."""
    ref = ds.read_back(tiny_ckpt)
    kw = packed_inputs(ref, 6, 3, 4, 6, 5, seed=9)
    ev, ea = run_ref(ref, kw)
    v, a = run_h3(tiny_ckpt.parent, kw)
    assert ds.rel_l2(v, ev) <= 1e-4 and ds.rel_l2(a, ea) <= 1e-4, (ds.rel_l2(v, ev), ds.rel_l2(a, ea))


def test_forward_deterministic_across_threads_and_runs(tmp_path_factory):
    root, ref = checkpoint(tmp_path_factory, "wide", "official")
    kw = packed_inputs(ref, 11, 3, 8, 6, 9, seed=4)
    v1, a1 = run_h3(root, kw, threads=1)
    v2, a2 = run_h3(root, kw, threads=2)
    v3, a3 = run_h3(root, kw, threads=2)
    assert v1.tobytes() == v2.tobytes() == v3.tobytes()
    assert a1.tobytes() == a2.tobytes() == a3.tobytes()


# ---- denoise -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,dtype,steps", [("tiny", "official", 4), ("odd", "f32", 20), ("wide", "official", 5)])
def test_denoise_matches_diffusers_loop(tmp_path_factory, name, dtype, steps):
    root, ref = checkpoint(tmp_path_factory, name, dtype)
    g = torch.Generator().manual_seed(5)
    n_text, T, H, W, Ta = 6, 3, 4, 6, 7
    pe = torch.randn(1, n_text, ref.config.text_dim, generator=g)
    lat = torch.randn(1, 24, T, H, W, generator=g)
    aud = torch.randn(2, 32, Ta, generator=g)
    el, ea = ds.diffusers_denoise(ref, pe, lat, aud, steps)
    with Context(root, threads=2) as ctx:
        ol, oa, evals = tr.denoise(ctx, pe[0].numpy(), lat[0].numpy(), aud.numpy(), steps)
        prof = tr.profile(ctx)
    assert evals == steps - 1 == prof["steps"] == prof["forwards"]
    print(f"parity: denoise {name} {dtype} {steps} grid points: latents rel-L2 {ds.rel_l2(ol, el[0].numpy()):.2e}, "
          f"audio {ds.rel_l2(oa, ea.numpy()):.2e} (tol 1e-4)")
    assert ds.rel_l2(ol, el[0].numpy()) <= 1e-4 and ds.rel_l2(oa, ea.numpy()) <= 1e-4


def test_denoise_deterministic_and_releases_adaln(tmp_path_factory):
    root, ref = checkpoint(tmp_path_factory, "odd", "official")
    pe = tr.noise(1, 5, (4, ref.config.text_dim))
    lat = tr.noise(9, 0, (24, 2, 4, 4))
    aud = tr.noise(9, 1, (2, 32, 5))
    outs = []
    for threads in (1, 2, 2):
        with Context(root, threads=threads) as ctx:
            ol, oa, _ = tr.denoise(ctx, pe, lat, aud, 6)
            outs.append(ol.tobytes() + oa.tobytes())
            prof = tr.profile(ctx)
            mem = ctx.memory_estimate(64, 64, 22, 4)
    assert outs[0] == outs[1] == outs[2]
    # The released bytes are the adaln_proj tensors of the file, the same figure `h3ctl info` estimates.
    from safetensors import safe_open

    with safe_open(str(Path(root) / "FL2VA/transformer/model.safetensors"), "pt") as f:
        adaln = sum(f.get_tensor(k).nbytes for k in f.keys() if "adaln_proj" in k)
    assert prof["adaln_released"] and prof["adaln_weight_bytes"] == adaln == mem["phases"]["adaln_weights_released"]
    cfg = ref.config
    evals = 5
    assert prof["adaln_table_bytes"] == evals * (3 * 6 * cfg.hidden_size * cfg.num_layers + 2 * 2 * cfg.hidden_size) * 4


# ---- the CLI stage, the reference path, bad input -------------------------------------------------------------------


def _cli(args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python")
    env.pop("H3CTL_LIB", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "h3ctl", *args], capture_output=True, text=True, env=env, timeout=120)


def _save(path, kw):
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v.numpy()) for k, v in kw.items()}, str(path))


@pytest.mark.parametrize("no_simd", ["0", "1"])
def test_parity_stage_dit(tmp_path_factory, tmp_path, no_simd):
    root, ref = checkpoint(tmp_path_factory, "odd", "official")
    kw = packed_inputs(ref, 5, 2, 4, 6, 4, seed=6)
    _save(tmp_path / "in.safetensors", kw)
    r = _cli(["parity", "dit", "--model", str(root), "--inputs", str(tmp_path / "in.safetensors"),
              "--out", str(tmp_path / "out.safetensors"), "--threads", "2"], {"H3_NO_SIMD": no_simd})
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file

    out = load_file(str(tmp_path / "out.safetensors"))
    ev, ea = run_ref(ref, kw)
    assert out["sample"].shape == (1,) + ev.shape and out["audio_sample"].shape == (1,) + ea.shape
    assert ds.rel_l2(out["sample"][0], ev) <= 1e-4 and ds.rel_l2(out["audio_sample"][0], ea) <= 1e-4


@pytest.mark.parametrize("precompute", ["1", "0"])
def test_parity_stage_denoise(tmp_path_factory, tmp_path, precompute):
    """The denoise stage; H3_DIT_PRECOMPUTE=0 is the slow path (modulation from the weights at every step)."""
    root, ref = checkpoint(tmp_path_factory, "wide", "official")
    g = torch.Generator().manual_seed(8)
    pe = torch.randn(1, 4, ref.config.text_dim, generator=g)
    lat = torch.randn(1, 24, 2, 4, 4, generator=g)
    aud = torch.randn(2, 32, 5, generator=g)
    _save(tmp_path / "in.safetensors", {"prompt_embeds": pe, "latents": lat, "audio_latents": aud,
                                        "num_inference_steps": torch.tensor([4])})
    r = _cli(["parity", "denoise", "--model", str(root), "--inputs", str(tmp_path / "in.safetensors"),
              "--out", str(tmp_path / "out.safetensors"), "--threads", "2"], {"H3_DIT_PRECOMPUTE": precompute})
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file

    out = load_file(str(tmp_path / "out.safetensors"))
    el, ea = ds.diffusers_denoise(ref, pe, lat, aud, 4)
    assert ds.rel_l2(out["latents"], el.numpy()) <= 1e-4 and ds.rel_l2(out["audio_latents"], ea.numpy()) <= 1e-4


def test_parity_stage_schedule(tmp_path):
    from safetensors.numpy import load_file, save_file

    save_file({"num_inference_steps": np.array([20], np.int64), "shift": np.array([12.0], np.float64)},
              str(tmp_path / "in.safetensors"))
    r = _cli(["parity", "schedule", "--inputs", str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "o.st")])
    assert r.returncode == 0, r.stderr
    out = load_file(str(tmp_path / "o.st"))
    sig, ts = tr.sigma_schedule(20, 12.0)
    np.testing.assert_array_equal(out["sigmas"], sig)
    np.testing.assert_array_equal(out["timesteps"], ts)


@pytest.mark.parametrize("breakage", ["missing_tensor", "wrong_shape", "bad_index", "bad_width"])
def test_parity_stage_dit_bad_input(tmp_path_factory, tmp_path, breakage):
    root, ref = checkpoint(tmp_path_factory, "tiny", "f32")
    kw = packed_inputs(ref, 3, 2, 2, 2, 2, seed=7)
    if breakage == "missing_tensor":
        del kw["timestep_indices"]
    elif breakage == "wrong_shape":
        kw["position_ids"] = kw["position_ids"][:, :2].contiguous()
    elif breakage == "bad_index":
        kw["audio_indices"] = kw["audio_indices"].clone()
        kw["audio_indices"][0] = kw["video_indices"][0]
    else:
        kw["hidden_states"] = kw["hidden_states"][..., :-1].contiguous()
    _save(tmp_path / "in.safetensors", kw)
    out = tmp_path / "out.safetensors"
    r = _cli(["parity", "dit", "--model", str(root), "--inputs", str(tmp_path / "in.safetensors"), "--out", str(out)])
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("h3ctl: error:"), r.stderr
    assert not out.exists() and not list(tmp_path.glob("out.safetensors*"))


def test_checkpoint_with_a_wrong_shape_names_the_tensor(tmp_path_factory, tmp_path):
    _, ref = checkpoint(tmp_path_factory, "tiny", "f32")
    tensors = ds.official_tensors(ref, "official")
    tensors["blocks.1.mlp.fc2.weight"] = tensors["blocks.1.mlp.fc2.weight"][:, :-1].contiguous()
    root = ds.write_checkpoint(ref, tmp_path, tensors=tensors)
    kw = packed_inputs(ref, 3, 2, 2, 2, 2)
    with pytest.raises(H3Error, match=r"blocks\.1\.mlp\.fc2\.weight.*shape \[64, 127\], .*\[64, 128\]"):
        run_h3(root, kw)
    del tensors["blocks.1.mlp.fc2.weight"]
    root = ds.write_checkpoint(ref, tmp_path / "missing", tensors=tensors)
    with pytest.raises(H3Error, match=r"'blocks\.1\.mlp\.fc2\.weight' is missing"):
        run_h3(root, kw)


def test_bench_peaks_report_rates_and_reject_bad_arguments(tiny_ckpt):
    """The benchmark's ceilings: the FMA peak is a positive rate no GEMM exceeds, bad repeats name the problem."""
    from h3ctl import _lib

    lib = _lib.lib()
    with Context(tiny_ckpt.parent, threads=1) as ctx:
        # A busy machine only lowers a measured rate, so the best of a few FMA timings stands for the peak (one
        # timing alone, slowed by a neighbour, read below an undisturbed GEMM).
        fma = max(lib.h3_bench_fma_peak(ctx.ptr, 1) for _ in range(5))
        gemm = lib.h3_bench_gemm(ctx.ptr, 256, 256, 256, 2)
        assert 0 < gemm < 1.2 * fma, (gemm, fma)   # the margin covers clock drift between the two timings
        assert lib.h3_bench_fma_peak(ctx.ptr, 0) < 0 and "repeats 0" in _lib.last_error()
        assert lib.h3_bench_gemm(ctx.ptr, 0, 8, 8, 1) < 0 and "bad GEMM size" in _lib.last_error()
