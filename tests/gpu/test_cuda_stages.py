"""The text encoder and both decoders on CUDA, against transformers / diffusers on the same GPU and against libh3's
f32 CPU path; h3-tiny rendered end to end on CUDA against the CPU render.

With a CUDA context every stage runs on the GPU (h3.h): the text encoder and the video decoder with bf16 weights and
GEMM operands (f32 norms, residuals and outputs), as transformers / diffusers run them from a bf16 pipeline; the
audio decoder in f32, as diffusers keeps it (`_keep_in_fp32_modules`). Bars: rel-L2 <= 1e-2 per stage against
libh3's f32 CPU path, and against the transformers / diffusers bf16 result on the same GPU either <= 1e-2 or, where
that reference is itself farther than 1e-2 / 1.5 from the f32 result, <= 1.5 x its own distance (random-weight text
towers put transformers' bf16 residual stream 0.6-1.0e-2 from f32; libh3 keeps the residual stream, the norms and
the attention output in f32 and lands about twice as close to f32, so the distance between the two bf16 results is
dominated by the reference's own rounding). The end-to-end render >= 30 dB PSNR against the CPU render.
H3_OPT_STAGES_CPU (H3_STAGES_CPU=1) must give the CPU's bits for every stage. Every comparison prints a `parity:`
line with the measured numbers.

Checkpoints: random-weight fixtures in the official layout with the released dtypes, built as the CPU parity tests
build them (tests/test_text_encoder.py, tests/vvae_oracle.py, tests/audio_vae_oracle.py), several geometries with
odd sizes.
"""

from __future__ import annotations

import copy

import pytest

from tests.gpu.cuda_support import require_libh3_cuda

CUDA = require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import numpy as np  # noqa: E402

from h3ctl import _lib  # noqa: E402
from h3ctl.parity import vae_video as PV  # noqa: E402
from h3ctl import text  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.parity.vae_audio import audio_decode  # noqa: E402
from tests.gpu import cuda_support as cs  # noqa: E402

STAGE_TOL = 1e-2
E2E_PSNR = 30.0
PROMPT = "a red circle moves right on a black background, a high beep"


def ref_bar(e_ref_cpu: float) -> float:
    """The bar against a bf16 reference that is e_ref_cpu away from the f32 result (see the module doc)."""
    return max(STAGE_TOL, 1.5 * e_ref_cpu)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


# ---- text encoder ---------------------------------------------------------------------------------------------------


_TE: dict = {}


def text_checkpoint(tmp_path_factory, name):
    """(root, f32 transformers model, conditioning layer) for a text config of tests/test_text_encoder.py, written
    with the released dtype (BF16)."""
    if name not in _TE:
        from tests import test_text_encoder as TE

        cfg, layer = TE.CONFIGS[name]
        model = TE.build_model(cfg, seed=list(TE.CONFIGS).index(name))
        root = TE.write_checkpoint(model, layer, tmp_path_factory.mktemp(f"cuda_te_{name}"), dtype="bf16", nshards=2)
        _TE[name] = (root, model, layer)
    return _TE[name]


def params_bf16(model, device):
    """The model as from_pretrained(torch_dtype=torch.bfloat16) holds it: parameters in bf16 (the checkpoint's BF16
    weights), buffers such as the rotary inv_freq still f32, on `device`."""
    import torch

    m = copy.deepcopy(model)
    for p in m.parameters():
        p.data = p.data.to(torch.bfloat16)
    return m.to(device).eval()


def transformers_hidden(model, ids, layer, device):
    """hidden_states[layer] of the text-only prompt, as diffusers' get_qwen3vl_prompt_embeds takes it, on `device`."""
    import torch

    t = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=device)[None]
    with torch.no_grad():
        out = model.model(input_ids=t, attention_mask=torch.ones_like(t), mm_token_type_ids=torch.zeros_like(t),
                          use_cache=False, output_hidden_states=True)
    return out.hidden_states[layer][0].float().cpu().numpy()


@pytest.mark.parametrize("name", ["gqa", "odd", "wide"])
def test_text_encoder_matches_transformers_bf16_and_cpu(tmp_path_factory, name):
    torch = cs.require_torch_cuda()
    from tests import test_text_encoder as TE

    root, model, layer = text_checkpoint(tmp_path_factory, name)
    dev = cs.torch_device()
    bf = params_bf16(model, dev)
    with Context(root, threads=8, device="cuda") as gpu, Context(root, threads=8, device="cpu") as cpu:
        for i, n in enumerate((1, 7, 64, 333)):
            ids = TE.random_ids(n, 1000 + 17 * i + n)
            g, c = text.encode(gpu, ids), text.encode(cpu, ids)
            ref = transformers_hidden(bf, ids, layer, dev)
            assert g.shape == c.shape == ref.shape and np.isfinite(g).all()
            e_t, e_c, e_tc = cs.rel_l2(g, ref), cs.rel_l2(g, c), cs.rel_l2(ref, c)
            print(f"parity: text cuda {name} {n} tokens: vs transformers bf16 {e_t:.2e} (tol {ref_bar(e_tc):.2g}), "
                  f"vs libh3 cpu f32 {e_c:.2e} (tol {STAGE_TOL:g}); transformers bf16 vs libh3 cpu f32 {e_tc:.2e}")
            assert e_t <= ref_bar(e_tc) and e_c <= STAGE_TOL, (name, n, e_t, e_c, e_tc)
            assert g.tobytes() != c.tobytes()  # it did run on the GPU (bf16 GEMMs cannot give the f32 bits)
            assert text.encode(gpu, ids).tobytes() == g.tobytes()  # prompt cache, same bits


def test_text_encoder_deterministic_and_cache_unchanged(tmp_path_factory):
    cs.require_torch_cuda()  # the fixture model comes from transformers
    from tests import test_text_encoder as TE

    root, _, _ = text_checkpoint(tmp_path_factory, "wide")
    ids = TE.random_ids(77, 5)
    outs = []
    for _ in range(2):
        with Context(root, device="cuda") as ctx:
            text.set_cache_budget(ctx, 0)  # every encode computes
            outs += [text.encode(ctx, ids).tobytes(), text.encode(ctx, ids).tobytes()]
            text.set_cache_budget(ctx, 1 << 30)
            text.encode(ctx, ids)
            text.encode(ctx, ids)
            stats = text.cache_stats(ctx)
            assert stats["hits"] >= 1 and stats["misses"] >= 3
    assert len(set(outs)) == 1


# ---- video decoder --------------------------------------------------------------------------------------------------


_VV: dict = {}


def video_checkpoint(tmp_path_factory, name):
    if name not in _VV:
        from tests import vvae_oracle as O

        vae = O.build_video_vae(name, seed={"tiny": 0, "odd": 1}[name])
        _VV[name] = (O.write_video_vae(vae, tmp_path_factory.mktemp(f"cuda_vv_{name}")), vae)
    return _VV[name]


def diffusers_video_sample(vae_bf16, lat, tile, overlap, untiled, device):
    """vae.decode() of the de-normalised latents on `device` (bf16 decoder blocks, diffusers' f32 islands)."""
    import torch

    from tests import vvae_oracle as O

    mean = torch.tensor(vae_bf16.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae_bf16.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    z = torch.from_numpy(lat).to(device)[None] * std + mean
    with O.tiling(vae_bf16, tile, overlap, untiled), torch.no_grad():
        return vae_bf16.decode(z, return_dict=False)[0][0].float().cpu().numpy()


# (geometry, T, h, w, tile, overlap, untiled): one tile; one window untiled; blended tiles over 3 temporal windows
# (the carry and the strips on the device); the odd geometry with its slack spread over the overlaps.
VIDEO_CASES = [("tiny", 7, 4, 6, 0, 0, False), ("tiny", 12, 6, 10, 0, 0, True), ("tiny", 17, 6, 10, 64, 32, False),
               ("tiny", 9, 10, 6, 64, 32, False), ("odd", 12, 5, 7, 48, 16, False)]


@pytest.mark.parametrize("case", VIDEO_CASES, ids=[f"{c[0]}-T{c[1]}-{c[2]}x{c[3]}-t{c[4]}" for c in VIDEO_CASES])
def test_video_decoder_matches_diffusers_bf16_and_cpu(tmp_path_factory, case):
    cs.require_torch_cuda()
    name, T, h, w, tile, overlap, untiled = case
    root, vae = video_checkpoint(tmp_path_factory, name)
    dev = cs.torch_device()
    bf = cs.diffusers_bf16(vae, dev)
    lat = np.random.default_rng(100 + T + h).standard_normal((vae.config.latent_channels, T, h, w), dtype=np.float32)
    ref = diffusers_video_sample(bf, lat, tile, overlap, untiled, dev)
    kw = dict(tile_px=tile, overlap_px=overlap, untiled=untiled)
    out = {}
    for device in ("cuda", "cpu"):
        with Context(root, threads=8, device=device) as ctx:
            _, sample = PV.decode(ctx, lat, raw=True, want_rgb=False, **kw)
            rgb, _ = PV.decode(ctx, lat, want_pixels=False, **kw)
            out[device] = (sample, rgb)
    (gs, grgb), (cs_, crgb) = out["cuda"], out["cpu"]
    assert gs.shape == cs_.shape == ref.shape and np.isfinite(gs).all()
    e_d, e_c, e_dc = cs.rel_l2(gs, ref), cs.rel_l2(gs, cs_), cs.rel_l2(ref, cs_)
    p = psnr(grgb, crgb)
    print(f"parity: video_decode cuda {name} T={T} {h * 16}x{w * 16} tile={tile or 'cfg'} untiled={untiled}: sample vs "
          f"diffusers bf16 {e_d:.2e} (tol {ref_bar(e_dc):.2g}), vs libh3 cpu f32 {e_c:.2e} (tol {STAGE_TOL:g}); "
          f"diffusers bf16 vs cpu {e_dc:.2e}; uint8 frames vs cpu PSNR {p:.1f} dB")
    assert e_d <= ref_bar(e_dc) and e_c <= STAGE_TOL, (case, e_d, e_c, e_dc)
    # the uint8 frames are the processor's rounding of the GPU's own floats
    with Context(root, device="cuda") as ctx:
        rgb2, px = PV.decode(ctx, lat, **kw)
    assert rgb2.tobytes() == grgb.tobytes()  # deterministic
    assert np.array_equal(rgb2, np.round(np.clip(px, 0, 1) * 255).astype(np.uint8))


# ---- audio decoder --------------------------------------------------------------------------------------------------


_AV: dict = {}


def audio_checkpoint(tmp_path_factory, name):
    if name not in _AV:
        from tests.audio_vae_oracle import build_audio_vae, write_audio_vae

        model = build_audio_vae(name)
        _AV[name] = (write_audio_vae(model, tmp_path_factory.mktemp(f"cuda_av_{name}")), model)
    return _AV[name]


def diffusers_audio(model, lat, device):
    """MiniMaxH3AudioDecodeStep's arithmetic on `device`: latents * std + mean, decode of both sides -> [2, samples].
    The model as a bf16 pipeline holds it: diffusers pins the decoder to f32."""
    import torch

    m = cs.diffusers_bf16(model, device)
    mean = torch.tensor(m.config.latents_mean, device=device).view(1, -1, 1)
    std = torch.tensor(m.config.latents_std, device=device).view(1, -1, 1)
    z = torch.from_numpy(lat).to(device) * std + mean
    with torch.no_grad():
        out = m.decode(z, return_dict=False)[0]
    return out.float().cpu().numpy().reshape(2, -1)


AUDIO_CASES = [("tiny", 1), ("tiny", 93), ("odd", 22), ("weird", 13)]


@pytest.mark.parametrize("name,frames", AUDIO_CASES, ids=[f"{n}-Ta{f}" for n, f in AUDIO_CASES])
def test_audio_decoder_matches_diffusers_and_cpu(tmp_path_factory, name, frames):
    cs.require_torch_cuda()
    from tests.audio_vae_oracle import latents_for

    root, model = audio_checkpoint(tmp_path_factory, name)
    lat = latents_for(model, frames, seed=frames)
    ref = diffusers_audio(model, lat, cs.torch_device())
    with Context(root, threads=8, device="cuda") as gpu, Context(root, threads=8, device="cpu") as cpu:
        g, c = audio_decode(gpu, lat), audio_decode(cpu, lat)
        again = audio_decode(gpu, lat)
    assert g.shape == c.shape == ref.shape and np.isfinite(g).all()
    e_d, e_c, e_dc = cs.rel_l2(g, ref), cs.rel_l2(g, c), cs.rel_l2(ref, c)
    print(f"parity: audio_decode cuda {name} Ta={frames}: vs diffusers (f32 decoder on the GPU) {e_d:.2e}, vs libh3 "
          f"cpu f32 {e_c:.2e} (tol {STAGE_TOL:g}); diffusers gpu vs cpu {e_dc:.2e}")
    assert e_d <= ref_bar(e_dc) and e_c <= STAGE_TOL, (name, frames, e_d, e_c, e_dc)
    assert again.tobytes() == g.tobytes()


# ---- H3_OPT_STAGES_CPU: the exact path stays selectable ----------------------------------------------------------


def test_stages_cpu_flag_gives_the_cpu_bits(tmp_path_factory, monkeypatch):
    cs.require_torch_cuda()
    from tests import test_text_encoder as TE
    from tests.audio_vae_oracle import latents_for

    te_root, _, _ = text_checkpoint(tmp_path_factory, "gqa")
    vv_root, vae = video_checkpoint(tmp_path_factory, "tiny")
    av_root, amodel = audio_checkpoint(tmp_path_factory, "odd")
    ids = TE.random_ids(33, 3)
    lat = np.random.default_rng(4).standard_normal((vae.config.latent_channels, 7, 4, 6), dtype=np.float32)
    alat = latents_for(amodel, 22, seed=2)

    def run(device, flags=0):
        with Context(te_root, threads=4, device=device, flags=flags) as ctx:
            where = ctx.stages_device
            t = text.encode(ctx, ids)
        with Context(vv_root, threads=4, device=device, flags=flags) as ctx:
            v = PV.decode(ctx, lat)[0]
        with Context(av_root, threads=4, device=device, flags=flags) as ctx:
            a = audio_decode(ctx, alat)
        return where, (t.tobytes(), v.tobytes(), a.tobytes())

    monkeypatch.delenv("H3_STAGES_CPU", raising=False)
    where, cpu = run("cpu")
    assert where == "cpu"
    assert run("cuda", _lib.H3_OPT_STAGES_CPU) == ("cpu", cpu)
    monkeypatch.setenv("H3_STAGES_CPU", "1")  # the environment override h3_init reads
    assert run("cuda") == ("cpu", cpu)
    monkeypatch.setenv("H3_STAGES_CPU", "0")
    where, gpu = run("cuda", _lib.H3_OPT_STAGES_CPU)  # 0 clears the flag: the GPU again
    assert where == "cuda" and all(g != c for g, c in zip(gpu, cpu))
    print("parity: H3_OPT_STAGES_CPU on cuda: text, video and audio bit-identical to the cpu path")


# ---- h3-tiny end to end ---------------------------------------------------------------------------------------------


def test_h3tiny_end_to_end_on_cuda(monkeypatch):
    """Every stage on the GPU (text encoder, transformer and sampler, both decoders) against the CPU render of the
    same request: PSNR of the frames >= 30 dB, reported next to a render with only the transformer on the GPU."""
    from h3ctl import Engine

    renders = {}
    for label, env in (("cpu", None), ("cuda", "0"), ("cuda-transformer-only", "1")):
        monkeypatch.setenv("H3_STAGES_CPU", env or "0")
        with Engine(threads=8, device="cpu" if label == "cpu" else "cuda") as eng:
            res = eng.render(PROMPT, seed=42)
            renders[label] = (res.frames, res.audio)
            if label == "cuda":
                again = eng.render(PROMPT, seed=42)  # the prompt is cached now; the same bytes
                assert again.frames.tobytes() == res.frames.tobytes() and again.audio.tobytes() == res.audio.tobytes()
    fc, ac = renders["cpu"]
    for label in ("cuda", "cuda-transformer-only"):
        f, a = renders[label]
        assert f.shape == fc.shape and a.shape == ac.shape and np.isfinite(a).all()
        print(f"parity: h3-tiny e2e {label} vs cpu ({fc.shape[0]} frames {fc.shape[2]}x{fc.shape[1]}, 20 steps): "
              f"frames PSNR {psnr(f, fc):.1f} dB, audio rel-L2 {cs.rel_l2(a, ac):.2e}")
    assert psnr(renders["cuda"][0], fc) >= E2E_PSNR
