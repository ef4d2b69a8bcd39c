"""Weight traffic of the CUDA stages: the text encoder's layers streamed through pinned buffers and a copy stream (the
same bits as the per-weight path it replaced), the decoders' weights kept on the GPU between calls, the profile's
device peak.

* Text encoder: the streamed path (default) against H3_TEXT_STREAM=0 (each weight uploaded with weight_load, the
  path before streaming), with and without prefetch (two slots / one), with 1 and 4 reader threads, on BF16 (used in
  place on the device) and F32 (rounded to bf16 on the device) checkpoints: every output bit-identical.
* Text encoder: with room on the GPU the first encode keeps the layers it streamed; later encodes read only their
  embedding rows and give the streamed bits (H3_TEXT_KEEP=0 streams every encode).
* Decoders: a second decode in the same context gives the same bytes although the weight files were moved away in
  between (the weights stayed on the GPU; a fresh context then fails to load them, which shows the files are gone).
* The profile on CUDA (Engine.render(profile=True), what `h3ctl render --profile` prints): every phase reports the
  device's peak (at least the CUDA context's own few hundred MiB), and the profiled render gives the same bytes.
"""

from __future__ import annotations

import shutil

import pytest

from tests.gpu.cuda_support import require_libh3_cuda

CUDA = require_libh3_cuda()  # skips this module where libh3 has no usable CUDA backend (CI)

import numpy as np  # noqa: E402

from h3ctl import _lib, text  # noqa: E402
from h3ctl.context import Context  # noqa: E402
from h3ctl.parity import vae_video as PV  # noqa: E402
from h3ctl.parity.vae_audio import audio_decode  # noqa: E402
from tests.gpu import cuda_support as cs  # noqa: E402


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_text_stream_gives_the_weight_load_bits(tmp_path_factory, monkeypatch, dtype):
    cs.require_torch_cuda()  # the fixture model comes from transformers
    from tests import test_text_encoder as TE

    cfg, layer = TE.CONFIGS["wide"]
    model = TE.build_model(cfg, seed=3)
    root = TE.write_checkpoint(model, layer, tmp_path_factory.mktemp(f"stream_{dtype}"), dtype=dtype, nshards=2)
    ids = [TE.random_ids(n, 40 + n) for n in (1, 77, 333)]
    outs = {}
    for label, stream, prefetch, readers in (("weight_load", "0", "1", "1"), ("stream", "1", "1", "8"),
                                             ("stream-1-reader", "1", "1", "1"), ("stream-no-prefetch", "1", "0", "4")):
        monkeypatch.setenv("H3_TEXT_STREAM", stream)
        monkeypatch.setenv("H3_TEXT_PREFETCH", prefetch)  # read at h3_init
        monkeypatch.setenv("H3_TEXT_READERS", readers)
        monkeypatch.setenv("H3_TEXT_KEEP", "0")  # every encode streams (kept layers: the next test)
        with Context(root, threads=4, device="cuda") as ctx:
            text.set_cache_budget(ctx, 0)  # every encode computes
            outs[label] = [text.encode(ctx, i).tobytes() for i in ids]
    for label, got in outs.items():
        assert got == outs["weight_load"], label
    assert all(np.isfinite(np.frombuffer(b, np.float32)).all() for b in outs["stream"])
    print(f"parity: text stream {dtype}: streamed (2 slots, 8 readers; 1 reader; 1 slot) bit-identical to weight_load "
          f"at 1, 77, 333 tokens")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_text_layers_kept_on_the_gpu(tmp_path_factory, monkeypatch, dtype):
    # By default a GPU with room keeps the layers the first encode streamed (h3_text_keep): later encodes read only
    # their prompt's embedding rows and give the streamed bits.
    cs.require_torch_cuda()
    from tests import test_text_encoder as TE

    cfg, layer = TE.CONFIGS["wide"]
    model = TE.build_model(cfg, seed=5)
    hidden = model.config.text_config.hidden_size
    root = TE.write_checkpoint(model, layer, tmp_path_factory.mktemp(f"keep_{dtype}"), dtype=dtype, nshards=2)
    ids = [TE.random_ids(n, 60 + n) for n in (77, 1, 333)]
    monkeypatch.setenv("H3_TEXT_KEEP", "0")
    with Context(root, threads=4, device="cuda") as ctx:
        text.set_cache_budget(ctx, 0)
        want = [text.encode(ctx, i).tobytes() for i in ids]
    monkeypatch.delenv("H3_TEXT_KEEP")  # auto: the H200 has room for these layers
    got, reads = [], []
    with Context(root, threads=4, device="cuda") as ctx:
        text.set_cache_budget(ctx, 0)
        for i in ids:
            got.append(text.encode(ctx, i).tobytes())
            reads.append(text.cache_stats(ctx)["last_bytes_read"])
    assert got == want
    assert reads[0] == TE.expected_bytes(root, layer, len(ids[0]), hidden)
    assert reads[1:] == [TE.expected_bytes(root, 0, len(i), hidden) for i in ids[1:]]
    print(f"parity: text layers kept on the GPU ({dtype}): later encodes read {reads[1:]} bytes (embedding rows only), "
          f"bit-identical to streaming every encode")


def _move_weights(folder):
    moved = []
    for f in sorted(folder.rglob("*.safetensors")):
        f.rename(f.with_name(f.name + ".away"))
        moved.append(f)
    assert moved
    return moved


def test_video_decoder_keeps_its_weights(tmp_path_factory, tmp_path):
    from tests import vvae_oracle as O

    src = O.write_video_vae(O.build_video_vae("tiny", seed=0), tmp_path_factory.mktemp("keep_vv"))
    root = tmp_path / "vv"
    shutil.copytree(src, root)
    lat = np.random.default_rng(3).standard_normal((24, 7, 4, 6)).astype(np.float32)
    with Context(root, device="cuda") as ctx:
        rgb1, px1 = PV.decode(ctx, lat)
        _move_weights(root)
        rgb2, px2 = PV.decode(ctx, lat)  # no weight file left: only the kept device copies can decode this
    assert rgb2.tobytes() == rgb1.tobytes() and px2.tobytes() == px1.tobytes()
    with pytest.raises(_lib.H3Error):
        with Context(root, device="cuda") as fresh:
            PV.decode(fresh, lat)
    print("parity: video decoder weights kept on the GPU: second decode bit-identical with the files moved away")


def test_audio_decoder_keeps_its_weights(tmp_path_factory, tmp_path):
    from tests.audio_vae_oracle import build_audio_vae, latents_for, write_audio_vae

    model = build_audio_vae("tiny")
    src = write_audio_vae(model, tmp_path_factory.mktemp("keep_av"))
    root = tmp_path / "av"
    shutil.copytree(src, root)
    lat = latents_for(model, 13, seed=13)
    with Context(root, device="cuda") as ctx:
        a = audio_decode(ctx, lat)
        _move_weights(root)
        b = audio_decode(ctx, lat)
    assert a.tobytes() == b.tobytes() and np.isfinite(a).all()
    with pytest.raises(_lib.H3Error):
        with Context(root, device="cuda") as fresh:
            audio_decode(fresh, lat)
    print("parity: audio decoder weights kept on the GPU: second decode bit-identical with the files moved away")


def test_profile_reports_device_peaks():
    from h3ctl import Engine

    prompt = "a red circle moves right on a black background, a high beep"
    with Engine(threads=8, device="cuda") as eng:
        assert eng.device_memory_peak() > 0
        r = eng.render(prompt, 64, 64, steps=4, seed=7, profile=True)
        plain = eng.render(prompt, 64, 64, steps=4, seed=7)
    assert [row["phase"] for row in r.profile] == ["encode prompt", "load transformer", "denoise", "decode audio",
                                                   "decode video"]
    for row in r.profile:
        assert row["wall_s"] > 0 and row["peak_device_bytes"] > 64 << 20, row
    assert plain.frames.tobytes() == r.frames.tobytes() and plain.audio.tobytes() == r.audio.tobytes()
    print("parity: profile on cuda: " + ", ".join(f"{row['phase']} {row['wall_s'] * 1e3:.0f} ms / "
                                                   f"{row['peak_device_bytes'] / 2**20:.0f} MiB" for row in r.profile))
