"""Speed knobs and presets on the embedded h3-tiny: exact when off, each knob's behaviour, bad input, LoRA merging.

The knobs' arithmetic is checked from outside the engine: the velocity a step used is recovered from two consecutive
latents and the sigma schedule (x_{s+1} = x_s + (sigma_s - sigma_{s+1}) v_s), the render-size path against a
small render resized by a Lanczos-3 written here in numpy, and a LoRA against a checkpoint merged here in numpy.
"""

import ctypes
import json
import math
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from h3ctl import Engine, H3Error, _lib, presets
from h3ctl.engine import EMBEDDED_MODEL
from h3ctl.preview import sigma_schedule, video_shift
from tests.h3cli import assert_clean_error, run as cli

PROMPT = "a red circle moves right on a black background, a high beep"
STEPS = 8  # 7 transformer evaluations
PART = Path(EMBEDDED_MODEL) / "FL2VA"
CFG = json.loads((PART / "transformer" / "config.json").read_text())
LAYERS, HEADS, HEAD_DIM = CFG["num_layers"], CFG["num_attention_heads"], CFG["attention_head_dim"]


@pytest.fixture(scope="module")
def eng():
    with Engine(threads=2) as e:
        yield e


@pytest.fixture(scope="module")
def ref(eng):
    return eng.render(PROMPT, steps=STEPS, seed=3)


def same(a, b):
    return np.array_equal(a.frames, b.frames) and a.audio.tobytes() == b.audio.tobytes()


# ---- exact when off ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("knobs", [{"reuse": 1}, {"core_reuse": 1}, {"layers": LAYERS}, {"token_reduction": False},
                                   {"render_size": "128x128"}, {"cache_threshold": 0.0}, {"preset": "reference"},
                                   {"lora": []}, {"cache_threshold": 1e-12}])
def test_a_knob_off_gives_the_exact_render(eng, ref, knobs):
    # cache_threshold 1e-12 evaluates every step, but through the cache's path (inputs built for its test)
    r = eng.render(PROMPT, steps=STEPS, seed=3, **knobs)
    assert same(r, ref), knobs
    assert r.transformer["evaluations"] == STEPS - 1 and r.transformer["skipped_steps"] == 0


def test_the_default_reports_the_transformer_work(ref):
    w = ref.transformer
    assert w["evaluations"] == w["block_runs"] == STEPS - 1 and w["layers_run"] == LAYERS
    assert w["skipped_steps"] == 0 and w["time_ms"] > 0


# ---- each knob -------------------------------------------------------------------------------------------

def _velocities(eng, **knobs):
    """The video velocity each step used, recovered from consecutive latents."""
    eng.prepare(PROMPT, steps=STEPS, seed=5, **knobs)
    lat = [eng.latents()[0].astype(np.float64)]
    while True:
        left = eng.step()
        lat.append(eng.latents()[0].astype(np.float64))
        if left == 0:
            break
    sig = sigma_schedule(STEPS, video_shift(eng)).astype(np.float64)
    v = [(lat[s + 1] - lat[s]) / (sig[s] - sig[s + 1]) for s in range(len(lat) - 1)]
    return v, sig, eng.transformer_profile()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_reuse_extrapolates_the_velocity_from_the_last_two_evaluations(eng):
    v, sig, prof = _velocities(eng, reuse=3)
    assert prof["evaluations"] == 3 and prof["skipped_steps"] == 4  # steps 0, 3 and 6 (the last) run
    # after one evaluation the velocity is held
    assert _rel(v[1], v[0]) < 1e-4 and _rel(v[2], v[0]) < 1e-4
    for s in (4, 5):  # v = v3 + r (v3 - v0), r = (sigma_s - sigma_3) / (sigma_3 - sigma_0) within [-2, 2]
        r = min(2.0, max(-2.0, (sig[s] - sig[3]) / (sig[3] - sig[0])))
        want = v[3] + r * (v[3] - v[0])
        assert _rel(v[s], want) < 1e-4, s
        assert _rel(v[s], v[3]) > 1e-3  # not merely held
    # evaluated steps are the model's own velocities: the exact render's at step 0
    v_ref, _, _ = _velocities(eng)
    assert _rel(v[0], v_ref[0]) < 1e-6


def test_reuse_two_runs_every_other_step(eng):
    r = eng.render(PROMPT, steps=STEPS, seed=3, reuse=2)
    assert r.transformer["evaluations"] == 4 and r.transformer["skipped_steps"] == 3  # 0, 2, 4, 6


@pytest.mark.parametrize("k,runs", [(2, 4), (3, 3), (1000, 2)])
def test_core_reuse_runs_the_block_stack_on_its_calls(eng, ref, k, runs):
    r = eng.render(PROMPT, steps=STEPS, seed=3, core_reuse=k)
    w = r.transformer
    assert w["evaluations"] == STEPS - 1 and w["block_runs"] == runs  # call 0, every k-th call, the last step
    assert not same(r, ref)


def test_core_reuse_adds_the_cached_residual(eng):
    """Between full runs the transformer output still follows the input: patch projections and heads run."""
    v, _, prof = _velocities(eng, core_reuse=1000)
    assert prof["block_runs"] == 2
    assert all(_rel(v[s], v[s - 1]) > 1e-4 for s in range(1, len(v)))


@pytest.mark.parametrize("layers,policy,blocks", [(3, "gate", [0, 1, LAYERS - 1]),
                                                  (4, "uniform", [0, 1, 3, 5]),
                                                  (5, "uniform", [0, 1, 2, 4, 5])])
def test_layers_keep_the_first_two_and_the_last(eng, layers, policy, blocks):
    assert LAYERS == 6  # the expected uniform picks below are for h3-tiny's depth
    eng.render(PROMPT, steps=4, seed=3, layers=layers, layer_policy=policy)
    prof = eng.last_transformer_profile
    assert prof["blocks"] == blocks and prof["layers_run"] == layers


def test_gate_policy_ranks_the_middle_blocks(eng):
    eng.render(PROMPT, steps=4, seed=3, layers=4)
    blocks = eng.last_transformer_profile["blocks"]
    assert blocks[:2] == [0, 1] and blocks[-1] == LAYERS - 1 and len(blocks) == 4 and blocks == sorted(blocks)


def test_token_reduction_pools_horizontal_pairs_of_video_tokens(eng, ref):
    r = eng.render(PROMPT, steps=STEPS, seed=3, token_reduction=True)
    info = r.info
    pt, ph, pw = CFG["patch_size"]
    pairs = info["latent_frames"] * (info["latent_height"] // ph) * ((info["latent_width"] // pw) // 2)
    assert eng.last_transformer_profile["reduced_sequence"] == info["sequence"] - pairs
    assert not same(r, ref)


def _lanczos_axis(n_in, n_out):
    ratio = n_in / n_out
    scale = max(1.0, ratio)
    taps = int(math.ceil(3 * scale)) * 2 + 1
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        c = (i + 0.5) * ratio - 0.5
        first = math.floor(c) - taps // 2
        ks = np.arange(first, first + taps)
        x = (ks - c) / scale
        with np.errstate(divide="ignore", invalid="ignore"):
            w = 3 * np.sin(np.pi * x) * np.sin(np.pi * x / 3) / (np.pi * x) ** 2
        w = np.where(np.abs(x) < 1e-12, 1.0, np.where(np.abs(x) >= 3, 0.0, w))
        for k, wk in zip(np.clip(ks, 0, n_in - 1), w / w.sum()):
            m[i, k] += wk
    return m


def test_render_size_is_the_small_render_resized_with_lanczos(eng):
    eng.prepare(PROMPT, 128, 128, 22, steps=4, seed=9, render_size="64x64")
    v0, a0 = eng.latents()
    C, T, h, w = v0.shape
    assert (h, w) == (4, 4)
    # the small canvas starts from the full canvas's noise, area-summed over 2x2 and divided by 2 (unit variance)
    full = np.empty(C * T * 8 * 8, np.float32)
    _lib.check(_lib.lib().h3_noise_fill(9, 0, 0, full.ctypes.data_as(_lib.c_float_p), full.size))
    want = full.reshape(C, T, 4, 2, 4, 2).astype(np.float64).sum((3, 5)) / 2
    assert np.abs(v0 - want).max() < 1e-5
    big = eng.render(PROMPT, 128, 128, 22, steps=4, seed=9, render_size="64x64")
    assert big.frames.shape == (22, 128, 128, 3)
    eng.prepare(PROMPT, 64, 64, 22, steps=4, seed=9, video_noise=v0, audio_noise=a0)
    while eng.step() > 0:
        pass
    small = eng.decode_video_f32()
    my, mx = _lanczos_axis(64, 128), _lanczos_axis(64, 128)
    rows = np.einsum("yi,fijc->fyjc", my, small.astype(np.float64))
    up = np.clip(np.einsum("fyjc,xj->fyxc", rows, mx), 0, 1)
    expect = np.round(up * 255).astype(np.int64)
    assert np.abs(big.frames.astype(np.int64) - expect).max() <= 1
    assert np.mean(big.frames.astype(np.int64) != expect) < 0.01


@pytest.mark.parametrize("size", ["96x96", "64x64"])
def test_render_size_keeps_the_output_shape_and_costs_less(eng, ref, size):
    r = eng.render(PROMPT, steps=STEPS, seed=3, render_size=size)
    assert r.frames.shape == ref.frames.shape and r.audio.shape == ref.audio.shape
    assert r.info["sequence"] < ref.info["sequence"]


def test_cache_threshold_skips_more_steps_as_it_grows(eng):
    evals = []
    for x in (0.02, 0.2, 1.0, 100.0):
        r = eng.render(PROMPT, steps=STEPS, seed=3, cache_threshold=x)
        evals.append(r.transformer["evaluations"])
        assert r.transformer["evaluations"] + r.transformer["skipped_steps"] == STEPS - 1
    assert evals == sorted(evals, reverse=True) and evals[0] > evals[-1]
    assert evals[-1] == 2  # the first and the last step always run


def test_cache_holds_the_last_velocity(eng):
    v, _, prof = _velocities(eng, cache_threshold=100.0)
    assert prof["evaluations"] == 2
    for s in range(1, len(v) - 1):
        assert _rel(v[s], v[0]) < 1e-4


def test_presets_resolve_and_explicit_knobs_win():
    k = presets.resolve("draft", reuse=2)
    assert k["reuse"] == 2 and presets.resolve("reference") == {}
    assert presets.scaled_canvas(1344, 768, 0.5) == (672, 384) and presets.scaled_canvas(128, 128, 0.5) == (64, 64)
    assert presets.scaled_canvas(128, 128, 0.2) is None
    assert presets.parse_lora("a/b.safetensors:0.5") == ("a/b.safetensors", 0.5)
    assert presets.parse_lora("c:/x.safetensors") == ("c:/x.safetensors", 1.0)
    with pytest.raises(H3Error, match="unknown preset 'turbo'"):
        presets.resolve("turbo")


@pytest.mark.parametrize("name,target", [("balanced", 1.5), ("fast", 2.5), ("draft", 4.0)])
def test_presets_cut_the_transformer_work_by_their_targets(eng, name, target):
    """Work = block-stack runs x blocks x rows, proportional to the transformer's GEMM time (attention grows faster
    than the rows, so this understates savings that shrink the sequence). The issue's targets: fast >= 2.5x,
    draft >= 4x less transformer time than reference."""
    def work(r):
        return r.transformer["block_runs"] * r.transformer["layers_run"] * r.info["sequence"]

    full = eng.render(PROMPT, steps=20, seed=3)
    r = eng.render(PROMPT, steps=20, seed=3, preset=name)
    assert r.frames.shape == full.frames.shape and r.audio.shape == full.audio.shape
    assert work(full) >= target * work(r), (name, r.transformer)
    assert presets.PRESETS[name].measured["speedup"] >= target  # what the bench measured in time


def test_presets_command_lists_every_preset():
    proc = cli("presets")
    assert proc.returncode == 0, proc.stderr
    for name in presets.PRESETS:
        assert name in proc.stdout
    assert "SSIM" in proc.stdout and "speed-up" in proc.stdout


# ---- bad input ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("knobs,needles", [
    ({"reuse": 2, "core_reuse": 2}, ["reuse 2 and core reuse 2 cannot be combined"]),
    ({"layers": 2}, ["layers 2", "at least 3"]),
    ({"layers": LAYERS + 1}, [f"has {LAYERS} blocks"]),
    ({"render_size": "256x256"}, ["larger than the output"]),
    ({"render_size": "96x64"}, ["another aspect"]),
    ({"render_size": "48x48"}, ["multiples of 32"]),
    ({"cache_threshold": 0.2, "reuse": 3}, ["cannot be combined"]),
    ({"cache_threshold": -1.0}, ["cache threshold must be"]),
    ({"reuse": -1}, ["reuse must be"]),
    ({"layer_policy": "random"}, ["layer policy must be one of gate, uniform"]),
])
def test_bad_knobs_are_refused_before_any_work(eng, knobs, needles):
    with pytest.raises(H3Error) as e:
        eng.plan(eng.request(PROMPT, steps=STEPS, **knobs))
    for n in needles:
        assert n in str(e.value)


@pytest.mark.parametrize("args,needles", [
    (["--reuse", "2", "--core-reuse", "2"], ["cannot be combined"]),
    (["--render-size", "96x64"], ["another aspect"]),
    (["--preset", "turbo"], ["unknown preset 'turbo'"]),
])
def test_bad_knobs_on_the_command_line_are_one_line_and_exit_2(tmp_path, args, needles):
    out = tmp_path / "o.mp4"
    proc = cli("render", "-p", PROMPT, "-o", out, "-q", *args)
    assert_clean_error(proc, *needles)
    assert not out.exists()


# ---- LoRA --------------------------------------------------------------------------------------------------

def _bf16_round(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, round to nearest even (as libh3 rounds)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _read_header(path: Path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), 8 + n, bytearray(raw)


def _weight(header, base, raw, name) -> np.ndarray:
    t = header[name]
    b, e = t["data_offsets"]
    data = bytes(raw[base + b:base + e])
    if t["dtype"] == "F32":
        return np.frombuffer(data, np.float32).reshape(t["shape"]).copy()
    assert t["dtype"] == "BF16", t["dtype"]
    bits = np.frombuffer(data, np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(t["shape"])


# module -> rows of lora_B in the released weight's row order (the LoRA's qkv rows are [q; k; v] stacked)
def _qkv_stacked_to_released(delta):
    A = HEADS * HEAD_DIM
    q, k, v = delta[:A], delta[A:2 * A], delta[2 * A:]
    parts = [t.reshape(HEADS, HEAD_DIM, -1) for t in (q, k, v)]
    return np.stack(parts, axis=1).reshape(3 * A, -1)


LORA_MODULES = ["blocks.0.attn.qkv_proj", "blocks.2.mlp.fc1", "blocks.5.attn.out_proj", "blocks.1.adaln_proj.linear",
                "token_refiner.blocks.0.mlp.fc2", "condition_proj", "final_layer.audio_out"]


def _make_lora(tmp_path: Path, rank=4, seed=0):
    """A ComfyUI-style LoRA (diffusion_model. prefix, lora_down/lora_up, .alpha on one module)."""
    header, base, raw = _read_header(PART / "transformer" / "model.safetensors")
    rng = np.random.default_rng(seed)
    tensors, deltas = {}, {}
    for m in LORA_MODULES:
        w = _weight(header, base, raw, m + ".weight")
        a = (rng.standard_normal((rank, w.shape[1])) * 0.1).astype(np.float32)
        b = (rng.standard_normal((w.shape[0], rank)) * 0.1).astype(np.float32)
        tensors[f"diffusion_model.{m}.lora_down.weight"] = a
        tensors[f"diffusion_model.{m}.lora_up.weight"] = b
        scale = 1.0
        if m == "blocks.2.mlp.fc1":
            tensors[f"diffusion_model.{m}.alpha"] = np.array(2.0, np.float32)
            scale = 2.0 / rank
        deltas[m] = (a, b, scale)
    path = tmp_path / "lora.safetensors"
    save_file(tensors, str(path))
    return path, deltas


def _merged_model(tmp_path: Path, deltas, user_scale: float) -> Path:
    """h3-tiny with the LoRA merged in numpy: W + s * (B A) in f32, rounded back to bf16."""
    root = tmp_path / "merged"
    shutil.copytree(EMBEDDED_MODEL, root)
    f = root / "FL2VA" / "transformer" / "model.safetensors"
    header, base, raw = _read_header(f)
    for m, (a, b, scale) in deltas.items():
        w = _weight(header, base, raw, m + ".weight")
        delta = (b @ a).astype(np.float32)
        if m.endswith("qkv_proj"):
            delta = _qkv_stacked_to_released(delta)
        merged = w + np.float32(user_scale * scale) * delta
        beg, end = header[m + ".weight"]["data_offsets"]
        bf16 = header[m + ".weight"]["dtype"] == "BF16"  # an F32 island stays F32
        raw[base + beg:base + end] = (_bf16_round(merged) if bf16 else merged.astype(np.float32)).tobytes()
    f.write_bytes(bytes(raw))
    return root


def test_lora_matches_the_numpy_merge(eng, tmp_path):
    path, deltas = _make_lora(tmp_path)
    merged = _merged_model(tmp_path, deltas, 0.75)
    ours = eng.render(PROMPT, steps=4, seed=3, lora=[f"{path}:0.75"])
    with Engine(merged, threads=2) as e2:
        want = e2.render(PROMPT, steps=4, seed=3)
    plain = eng.render(PROMPT, steps=4, seed=3)
    d = np.abs(ours.frames.astype(int) - want.frames).max()
    ea = np.linalg.norm(ours.audio - want.audio) / np.linalg.norm(want.audio)
    dp = np.abs(plain.frames.astype(int) - want.frames).max()
    ep = np.linalg.norm(plain.audio - want.audio) / np.linalg.norm(want.audio)
    print(f"lora vs numpy merge: frames max diff {d}, audio rel-L2 {ea:.2e}; plain model: frames max diff {dp}, "
          f"audio rel-L2 {ep:.2e}")
    # a merged bf16 weight may land one bf16 step apart where numpy's and libh3's f32 GEMMs round B A differently
    assert d <= 2 and ea < 1e-3, (d, ea)
    # the LoRA changes the render far beyond the tolerance above, so that comparison can fail
    assert dp > 4 * max(d, 2) and ep > 100 * max(ea, 1e-6)


def test_lora_scale_zero_is_the_plain_model(eng, tmp_path):
    path, _ = _make_lora(tmp_path)
    assert same(eng.render(PROMPT, steps=4, seed=3, lora=[f"{path}:0"]), eng.render(PROMPT, steps=4, seed=3))


def test_lora_in_diffusers_names_matches_the_original_names(eng, tmp_path):
    """The same LoRA written with diffusers' module names (to_q/to_k/to_v, ff.net.0.proj with its halves swapped,
    context_embedder, ...) as diffusers' converter writes them."""
    path, deltas = _make_lora(tmp_path, seed=1)
    A = HEADS * HEAD_DIM
    out = {}
    for m, (a, b, scale) in deltas.items():
        a = a * np.float32(scale)  # fold alpha / rank into lora_A
        if m.startswith("blocks.0.attn.qkv_proj"):
            for i, proj in enumerate(("to_q", "to_k", "to_v")):
                out[f"transformer.transformer_blocks.0.attn.{proj}.lora_A.weight"] = a
                out[f"transformer.transformer_blocks.0.attn.{proj}.lora_B.weight"] = np.ascontiguousarray(b[i * A:(i + 1) * A])
        elif m == "blocks.2.mlp.fc1":
            half = b.shape[0] // 2
            out["transformer.transformer_blocks.2.ff.net.0.proj.lora_A.weight"] = a
            out["transformer.transformer_blocks.2.ff.net.0.proj.lora_B.weight"] = np.concatenate([b[half:], b[:half]])
        else:
            name = {"blocks.5.attn.out_proj": "transformer_blocks.5.attn.to_out.0",
                    "blocks.1.adaln_proj.linear": "transformer_blocks.1.adaln_proj.linear",
                    "token_refiner.blocks.0.mlp.fc2": "token_refiner.refiner_blocks.0.ff.net.2",
                    "condition_proj": "context_embedder", "final_layer.audio_out": "audio_proj_out"}[m]
            out[f"transformer.{name}.lora_A.weight"] = a
            out[f"transformer.{name}.lora_B.weight"] = b
    dpath = tmp_path / "lora_diffusers.safetensors"
    save_file(out, str(dpath))
    a = eng.render(PROMPT, steps=4, seed=3, lora=[str(path)])
    b = eng.render(PROMPT, steps=4, seed=3, lora=[str(dpath)])
    assert np.abs(a.frames.astype(int) - b.frames).max() <= 2
    assert np.linalg.norm(a.audio - b.audio) / np.linalg.norm(a.audio) < 1e-3


def _bad_lora(tmp_path, case):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, CFG["hidden_size"])).astype(np.float32)
    b = rng.standard_normal((CFG["hidden_size"], 4)).astype(np.float32)
    t, needle = {
        "unknown_key": ({"diffusion_model.blocks.0.attn.nonsense.lora_A.weight": a,
                         "diffusion_model.blocks.0.attn.nonsense.lora_B.weight": b}, "blocks.0.attn.nonsense"),
        "wrong_shape": ({"diffusion_model.blocks.0.attn.qkv_proj.lora_A.weight": a,
                         "diffusion_model.blocks.0.attn.qkv_proj.lora_B.weight": b}, "do not fit"),
        "missing_block": ({f"diffusion_model.blocks.{LAYERS}.attn.out_proj.lora_A.weight": a,
                           f"diffusion_model.blocks.{LAYERS}.attn.out_proj.lora_B.weight": b}, "does not have"),
        "missing_half": ({"diffusion_model.blocks.0.attn.out_proj.lora_A.weight": a}, "no lora_B"),
        "not_lora": ({"blocks.0.attn.out_proj.weight": a}, "is not a LoRA weight"),
    }[case]
    path = tmp_path / "bad.safetensors"
    save_file(t, str(path))
    return path, needle


@pytest.mark.parametrize("case", ["unknown_key", "wrong_shape", "missing_block", "missing_half", "not_lora"])
def test_bad_lora_is_refused_before_any_work(eng, tmp_path, case):
    path, needle = _bad_lora(tmp_path, case)
    with pytest.raises(H3Error) as e:
        eng.plan(eng.request(PROMPT, steps=STEPS, lora=[str(path)]))
    assert "bad.safetensors" in str(e.value) and needle in str(e.value)
    with pytest.raises(H3Error):
        eng.plan(eng.request(PROMPT, steps=STEPS, lora=[str(tmp_path / "missing.safetensors")]))


def test_bad_lora_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    path, needle = _bad_lora(tmp_path, "wrong_shape")
    out = tmp_path / "o.mp4"
    proc = cli("render", "-p", PROMPT, "-o", out, "-q", "--lora", f"{path}:0.5")
    assert_clean_error(proc, "bad.safetensors", needle)
    assert not out.exists()


def test_request_struct_matches_the_header():
    """New h3_request fields sit at the end, so callers built against the older struct keep working."""
    header = (Path(__file__).resolve().parent.parent / "libh3" / "h3.h").read_text()
    body = header[header.index("typedef struct h3_request {"):header.index("} h3_request;")]
    for name, _ in _lib.H3Request._fields_:
        assert name in body, name
    # The binding ends where the header does (a field appended to one and not the other fails here).
    last = re.findall(r"(\w+)\s*;", re.sub(r"/\*.*?\*/", "", body, flags=re.S))[-1]
    assert _lib.H3Request._fields_[-1][0] == last and ctypes.sizeof(_lib.H3Request) > 64
