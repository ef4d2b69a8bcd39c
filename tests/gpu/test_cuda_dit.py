"""libh3's transformer and sampler on CUDA against diffusers in bf16 on the same GPU, and against libh3's f32 CPU path.

The CUDA backend keeps GEMM weights in bf16 and feeds GEMMs and attention bf16 activations with f32 accumulation
(libh3/backend/backend.h), which is what diffusers does with the bf16 checkpoint; the CPU path is exact f32. So the
bars are bf16-sized: rel-L2 <= 1e-2 per forward and <= 2e-2 after the 20-point loop, against both references. Every
comparison prints a `parity:` line with the measured numbers.

Checkpoints: the three oracle geometries of tests/fixtures ("tiny", "odd", "wide"), written in the official layout
with the released dtypes (BF16, F32 islands) and read back through diffusers' converter, as tests/test_dit.py does.
"""

from __future__ import annotations

import pytest

from tests.gpu.cuda_support import require_libh3_cuda

CUDA = require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import numpy as np  # noqa: E402

from h3ctl import transformer as tr  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from tests.gpu import cuda_support as cs  # noqa: E402

SEEDS = {"tiny": 11, "odd": 12, "wide": 13}
# (n_text, T, H, W, Ta, anchors, shuffle): a t2va layout, an fl2va one with both anchors in shuffled row order, and
# one of 507 rows, past any attention or GEMM tile, with odd counts everywhere.
LAYOUTS = [(7, 3, 4, 6, 7, (), False), (9, 2, 6, 2, 5, ("first", "last"), True), (13, 7, 12, 20, 37, (), False)]
FORWARD_TOL = 1e-2
DENOISE_TOL = 2e-2

_CKPTS: dict = {}


def checkpoint(tmp_path_factory, name):
    """(root, f32 reference model holding the BF16-rounded weights) for a fixture geometry, built once."""
    if name not in _CKPTS:
        from tests import dit_support as ds

        model = ds.build_dit(ds.DIT_CONFIGS[name], seed=SEEDS[name])
        root = ds.write_checkpoint(model, tmp_path_factory.mktemp(f"cuda_dit_{name}"), "official")
        _CKPTS[name] = (root, ds.read_back(root))
    return _CKPTS[name]


def test_backend_reports_a_usable_gpu():
    assert CUDA["built"] and CUDA["device"] and CUDA["memory_bytes"] > 0
    major = int(str(CUDA["compute_capability"]).split(".")[0])
    assert major >= 8  # h3.h: the CUDA backend needs compute capability 8.0 or newer


@pytest.mark.parametrize("name", ["tiny", "odd", "wide"])
def test_forward_matches_diffusers_bf16_and_cpu(tmp_path_factory, name):
    torch = cs.require_torch_cuda()
    root, ref = checkpoint(tmp_path_factory, name)
    dev = cs.torch_device()
    bf = cs.diffusers_bf16(ref, dev)
    cs.check_dtypes_match_official(bf)
    with Context(root, threads=8, device="cuda") as gpu, Context(root, threads=8, device="cpu") as cpu:
        assert gpu.device == "cuda" and cpu.device == "cpu"
        for k, (n_text, T, H, W, Ta, anchors, shuffle) in enumerate(LAYOUTS):
            tags = torch.tensor([1, 1, 0, 0, 0, 0, 1, 1, 1]) if anchors else None
            kw = cs.forward_inputs(ref, n_text, T, H, W, Ta, seed=k, anchors=anchors, text_tags=tags, shuffle=shuffle)
            dv, da = cs.run_diffusers(bf, kw, dev)
            gv, ga = cs.run_libh3(gpu, kw)
            cv, ca = cs.run_libh3(cpu, kw)
            assert np.isfinite(gv).all() and np.isfinite(ga).all()
            e = {"diffusers": (cs.rel_l2(gv, dv), cs.rel_l2(ga, da)), "cpu": (cs.rel_l2(gv, cv), cs.rel_l2(ga, ca)),
                 "bf16_vs_f32": (cs.rel_l2(dv, cv), cs.rel_l2(da, ca))}
            L = kw["position_ids"].shape[0]
            print(f"parity: dit cuda {name} L={L}: vs diffusers bf16 sample {e['diffusers'][0]:.2e} audio "
                  f"{e['diffusers'][1]:.2e}; vs libh3 cpu f32 sample {e['cpu'][0]:.2e} audio {e['cpu'][1]:.2e} "
                  f"(tol {FORWARD_TOL:g}); diffusers bf16 vs libh3 cpu f32: {e['bf16_vs_f32'][0]:.2e} / "
                  f"{e['bf16_vs_f32'][1]:.2e}")
            assert max(e["diffusers"]) <= FORWARD_TOL and max(e["cpu"]) <= FORWARD_TOL, (name, L, e)


def test_forward_is_deterministic_on_cuda(tmp_path_factory):
    """backend.h: every op of every backend gives the same bits for the same inputs on every run."""
    cs.require_torch_cuda()  # for the inputs only
    root, ref = checkpoint(tmp_path_factory, "wide")
    kw = cs.forward_inputs(ref, 13, 7, 12, 20, 37, seed=4)
    outs = []
    for _ in range(2):
        with Context(root, device="cuda") as ctx:
            v, a = cs.run_libh3(ctx, kw)
            v2, a2 = cs.run_libh3(ctx, kw)  # and twice on one context
            outs += [v.tobytes() + a.tobytes(), v2.tobytes() + a2.tobytes()]
    assert len(set(outs)) == 1


@pytest.mark.parametrize("name", ["tiny", "odd", "wide"])
def test_denoise_20_points_matches_diffusers_bf16_and_cpu(tmp_path_factory, name):
    torch = cs.require_torch_cuda()
    root, ref = checkpoint(tmp_path_factory, name)
    dev = cs.torch_device()
    bf = cs.diffusers_bf16(ref, dev)
    g = torch.Generator().manual_seed(5)
    n_text, T, H, W, Ta, steps = 6, 3, 8, 6, 9, 20
    pe = cs.bf16_round(torch.randn(1, n_text, ref.config.text_dim, generator=g))
    lat = torch.randn(1, 24, T, H, W, generator=g)
    aud = torch.randn(2, 32, Ta, generator=g)
    el, ea = cs.diffusers_denoise(bf, pe, lat, aud, steps, dev)
    el, ea = el[0].numpy(), ea.numpy()
    res = {}
    for device in ("cuda", "cpu"):
        with Context(root, threads=8, device=device) as ctx:
            ol, oa, evals = tr.denoise(ctx, pe[0].numpy(), lat[0].numpy(), aud.numpy(), steps)
            prof = tr.profile(ctx)
        assert evals == steps - 1 == prof["forwards"]
        assert np.isfinite(ol).all() and np.isfinite(oa).all()
        res[device] = (ol, oa)
    gl, ga = res["cuda"]
    cl, ca = res["cpu"]
    e_d = (cs.rel_l2(gl, el), cs.rel_l2(ga, ea))
    e_c = (cs.rel_l2(gl, cl), cs.rel_l2(ga, ca))
    print(f"parity: denoise cuda {name} {steps} grid points: vs diffusers bf16 latents {e_d[0]:.2e} audio "
          f"{e_d[1]:.2e}; vs libh3 cpu f32 latents {e_c[0]:.2e} audio {e_c[1]:.2e} (tol {DENOISE_TOL:g}); diffusers "
          f"bf16 vs libh3 cpu f32: {cs.rel_l2(el, cl):.2e} / {cs.rel_l2(ea, ca):.2e}")
    assert max(e_d) <= DENOISE_TOL and max(e_c) <= DENOISE_TOL, (name, e_d, e_c)
