"""Choosing the device from Python and the CLI, on any machine (CI has no GPU).

* `device="cpu"` is the exact path: the same bytes as before the device option existed, whatever `auto` picks.
* Asking for `cuda` where libh3 cannot use it is one line naming the cause: H3Error from the API, exit 2 with that
  line from the CLI, and nothing written.
* `h3ctl info` reports every backend, with the reason when one is not available.
* Packaging: the optional CUDA build never fails a CPU install, and a CPU install needs nothing new.

The embedded h3-tiny is the model here, so these tests need neither torch nor diffusers.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3ctl import _lib
from h3ctl import transformer as tr
from h3ctl._lib import H3Error
from h3ctl.context import Context
from h3ctl.engine import EMBEDDED_MODEL, Engine
from tests.h3cli import assert_clean_error, run

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle moves right on a black background, a high beep"


def _stable(backends: dict) -> dict:
    """The backends without the GPU's free memory, which moves between two calls."""
    return {k: {f: v for f, v in b.items() if f != "free_bytes"} for k, b in backends.items()}


@pytest.fixture(scope="module")
def backends():
    return _lib.backends()


@pytest.fixture(scope="module")
def no_cuda(backends):
    if backends["cuda"]["available"]:
        pytest.skip("this machine has a usable CUDA backend; the GPU-less behaviour is tested where there is none")
    return backends["cuda"]["reason"]


def _cuda_error() -> str:
    with pytest.raises(H3Error) as e:
        Context(EMBEDDED_MODEL, device="cuda")
    return str(e.value)


def _denoise(ctx, seed=3):
    """A small t2va loop on h3-tiny (2 x 4 x 4 latents, 5 audio latents, 3 grid points) from fixed noise."""
    text_dim = ctx.info()["components"]["transformer"]["config"]["text_dim"]
    pe = tr.noise(seed, 7, (4, text_dim))
    lat = tr.noise(seed, 0, (24, 2, 4, 4))
    aud = tr.noise(seed, 1, (2, 32, 5))
    v, a, evals = tr.denoise(ctx, pe, lat, aud, 3)
    assert evals == 2
    return v, a


# ---- bindings ------------------------------------------------------------------------------------------------------


def test_options_struct_is_the_c_struct():
    """h3_options_default writes sizeof(h3_options) into struct_size: the ctypes mirror must have the same size, or
    h3_init would read device fields past what Python wrote."""
    opts = _lib.H3Options()
    _lib.lib().h3_options_default(ctypes.byref(opts))
    # 40 bytes up to quantized_path, then the single-file component paths and the tokenizer folder (5 pointers)
    assert opts.struct_size == ctypes.sizeof(_lib.H3Options) == 80
    assert (opts.threads, opts.flags, opts.device, opts.device_index, opts.precision, opts.vram_bytes,
            opts.quantized_path) == (0, 0, _lib.H3_DEVICE_AUTO, 0, 0, 0, None)
    assert (opts.transformer_path, opts.text_encoder_path, opts.video_vae_path, opts.audio_vae_path,
            opts.tokenizer_dir) == (None,) * 5
    assert _lib.DEVICES == {"auto": 0, "cpu": 1, "cuda": 2, "metal": 3}  # h3.h H3_DEVICE_*
    assert _lib.PRECISIONS == {"default": 0, "bf16": 0, "fp8": 1, "int8": 2}


def test_info_backend_lines_say_whether_fp8_attention_can_run():
    """h3ctl info's cuda line carries h3_backends_json's fp8_attention answer (its reason when it is false)."""
    from h3ctl.info import backend_lines

    base = {"available": True, "built": True, "device": "cuda (GPU)", "compute_capability": "9.0",
            "memory_bytes": 2**30}
    yes = backend_lines({"cpu": {"available": True}, "cuda": dict(base, fp8_attention=True)})[1]
    assert yes == "cuda: available: cuda (GPU), compute capability 9.0, 1.00 GiB; fp8 attention: yes", yes
    no = backend_lines({"cuda": dict(base, fp8_attention=False, fp8_attention_reason="it runs on cuDNN, and x")})[1]
    assert no.endswith("; fp8 attention: no (it runs on cuDNN, and x)"), no
    assert "fp8 attention" not in backend_lines({"cuda": base})[1]


def test_backends_json(backends):
    assert backends["cpu"]["available"] is True and backends["cpu"]["kernels"]
    cuda = backends["cuda"]
    assert isinstance(cuda["built"], bool) and isinstance(cuda["available"], bool)
    if not Path(_lib._lib_path()).with_name(_lib._CUDA_LIBNAME).exists():
        # libh3 finds its CUDA backend next to itself; with none there it can claim neither.
        assert not cuda["built"] and not cuda["available"], cuda
    if cuda["available"]:
        assert cuda["built"] and cuda["device"] and cuda["memory_bytes"] > 0
        assert isinstance(cuda["fp8_attention"], bool)
        assert cuda["fp8_attention"] or cuda["fp8_attention_reason"].strip()
    else:
        assert isinstance(cuda["reason"], str) and cuda["reason"].strip() and "\n" not in cuda["reason"]
    # the same answer on a second call
    assert _stable(_lib.backends()) == _stable(backends)


# ---- the API -------------------------------------------------------------------------------------------------------


def test_cpu_is_the_exact_path(backends):
    with Context(EMBEDDED_MODEL, threads=2, device="cpu") as ctx:
        assert ctx.device == "cpu"
        desc = ctx.device_description
        assert desc and "\n" not in desc
        v_cpu, a_cpu = _denoise(ctx)
    with Context(EMBEDDED_MODEL, threads=1) as ctx:  # the default, and another thread count
        auto = ctx.device
        v_auto, a_auto = _denoise(ctx)
    # auto picks CUDA exactly when the backend says it is available (h3.h: built, and a GPU of cc >= 8.0 answers)
    assert auto == ("cuda" if backends["cuda"]["available"] else "cpu")
    if auto == "cpu":
        assert v_cpu.tobytes() == v_auto.tobytes() and a_cpu.tobytes() == a_auto.tobytes()
    assert np.isfinite(v_cpu).all() and np.isfinite(a_cpu).all() and np.abs(v_cpu).max() > 0


def test_cuda_where_there_is_none_is_one_line(no_cuda):
    msg = _cuda_error()
    assert "\n" not in msg and "cuda" in msg.lower() and len(msg) > len("cuda: ") + 10, msg
    with pytest.raises(H3Error) as e:
        Engine(device="cuda")
    assert str(e.value) == msg
    # the failure leaves nothing behind: the CPU path works in the same process, with the same bytes
    with Context(EMBEDDED_MODEL, threads=2, device="cpu") as ctx:
        v1, a1 = _denoise(ctx)
    with Context(EMBEDDED_MODEL, threads=2, device="cpu") as ctx:
        v2, a2 = _denoise(ctx)
    assert v1.tobytes() == v2.tobytes() and a1.tobytes() == a2.tobytes()


@pytest.mark.parametrize("kwargs,needle", [
    ({"device": "gpu"}, "device must be one of auto, cpu, cuda, metal, got 'gpu'"),
    ({"device": None}, "device must be one of"),
    ({"device": "CPU"}, "device must be one of"),
    ({"device_index": -1}, "device_index must be a GPU number >= 0, got -1"),
    ({"device_index": True}, "device_index must be"),
    ({"device_index": 2**31}, "device_index must be"),
    ({"device_index": "0"}, "device_index must be"),
])
def test_bad_device_arguments(kwargs, needle):
    with pytest.raises(H3Error, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Context(EMBEDDED_MODEL, **kwargs)


def test_device_index_accepts_integer_types():
    with Context(EMBEDDED_MODEL, device="cpu", device_index=np.int64(0)) as ctx:
        assert ctx.device == "cpu"


def test_engine_reports_its_device():
    with Engine(threads=2, device="cpu") as eng:
        assert eng.device == "cpu" and eng.device_description
        res = eng.render(PROMPT, 64, 64, 22, steps=2, seed=1)
    assert res.frames.shape == (22, 64, 64, 3) and np.isfinite(res.audio).all()


def test_stages_cpu_flag_on_a_cpu_context_changes_nothing():
    """H3_OPT_STAGES_CPU keeps the text encoder and the decoders on the CPU of a GPU context; on a CPU context they
    are there already: h3_stages_device says "cpu" either way and the render is byte-identical."""
    outs = []
    for flags in (0, _lib.H3_OPT_STAGES_CPU):
        with Context(EMBEDDED_MODEL, threads=2, device="cpu", flags=flags) as ctx:
            assert ctx.stages_device == "cpu"
            outs.append(_denoise(ctx))
    assert outs[0][0].tobytes() == outs[1][0].tobytes() and outs[0][1].tobytes() == outs[1][1].tobytes()


def test_keep_adaln_flag_reaches_libh3():
    """H3_OPT_KEEP_ADALN keeps the adaln_proj weights after the precompute (the profile says so) and changes no
    result; h3.h lets the environment override it, so the variable is cleared for this check."""
    env = {k: os.environ.pop(k) for k in ("H3_DIT_KEEP_ADALN", "H3_DIT_PRECOMPUTE") if k in os.environ}
    try:
        with Context(EMBEDDED_MODEL, threads=2, device="cpu") as ctx:
            v1, a1 = _denoise(ctx)
            released = tr.profile(ctx)["adaln_released"]
        with Context(EMBEDDED_MODEL, threads=2, device="cpu", flags=_lib.H3_OPT_KEEP_ADALN) as ctx:
            v2, a2 = _denoise(ctx)
            kept = not tr.profile(ctx)["adaln_released"]
    finally:
        os.environ.update(env)
    assert released and kept
    assert v1.tobytes() == v2.tobytes() and a1.tobytes() == a2.tobytes()


# ---- the CLI -------------------------------------------------------------------------------------------------------


def test_render_cuda_where_there_is_none(no_cuda, tmp_path):
    out = tmp_path / "x.mp4"
    line = assert_clean_error(run("render", "-p", PROMPT, "--device", "cuda", "-o", out, "--wav", tmp_path / "x.wav",
                                  "-q"), "cuda")
    assert line == f"h3ctl: error: {_cuda_error()}"  # the CLI says exactly what the API says
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,needles", [
    (["--device", "tpu"], ["--device", "invalid choice: 'tpu'"]),
    (["--device-index", "-1"], ["device_index must be a GPU number >= 0, got -1"]),
    (["--device-index", "x"], ["--device-index", "invalid int value"]),
])
def test_render_bad_device_arguments(tmp_path, args, needles):
    assert_clean_error(run("render", "-p", PROMPT, "-o", tmp_path / "x.mp4", "-q", *args), *needles)
    assert list(tmp_path.iterdir()) == []


def test_render_on_cpu_profile_names_the_device(tmp_path):
    out = tmp_path / "a.mp4"
    proc = run("render", "-p", PROMPT, "--size", "64x64", "--frames", "22", "--steps", "2", "--device", "cpu",
               "--threads", "2", "-o", out, "--profile", "-q")
    assert proc.returncode == 0, proc.stderr
    with Context(EMBEDDED_MODEL, threads=2, device="cpu") as ctx:
        desc = ctx.device_description
    assert desc.startswith("cpu")
    # the profile (and its device line) goes to stderr
    device_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("device: ")]
    assert device_lines == [f"device: {desc}; text encoder and decoders on the cpu"], proc.stderr
    assert out.stat().st_size > 0


def test_info_reports_backends(backends):
    proc = run("info", "-d", EMBEDDED_MODEL, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert _stable(info["backends"]) == _stable(backends)
    assert info["device"]["name"] == ("cuda" if backends["cuda"]["available"] else "cpu")
    assert info["device"]["description"]
    text = run("info", "-d", EMBEDDED_MODEL, "--device", "cpu")
    assert text.returncode == 0, text.stderr
    assert "cpu: available, kernels " + backends["cpu"]["kernels"] in text.stdout
    with Context(EMBEDDED_MODEL, device="cpu") as ctx:
        desc = ctx.device_description
    assert f"The transformer runs on: {desc}; the text encoder and the decoders on the cpu." in text.stdout
    cuda = backends["cuda"]
    if cuda["available"]:
        assert f"cuda: available: {cuda['device']}" in text.stdout
    else:
        built = "built" if cuda["built"] else "not built"
        assert f"cuda: not available ({built}): {cuda['reason']}" in text.stdout, text.stdout


def test_info_and_parity_refuse_cuda_where_there_is_none(no_cuda, tmp_path):
    msg = _cuda_error()
    assert assert_clean_error(run("info", "-d", EMBEDDED_MODEL, "--device", "cuda")) == f"h3ctl: error: {msg}"
    with Context(EMBEDDED_MODEL, device="cpu") as ctx:
        text_dim = ctx.info()["components"]["transformer"]["config"]["text_dim"]
    from safetensors.numpy import save_file

    save_file({"prompt_embeds": tr.noise(1, 7, (1, 4, text_dim)), "latents": tr.noise(1, 0, (1, 24, 2, 4, 4)),
               "audio_latents": tr.noise(1, 1, (2, 32, 5)), "num_inference_steps": np.array([3], np.int64)},
              str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    base = ["parity", "denoise", "--model", EMBEDDED_MODEL, "--inputs", tmp_path / "in.safetensors", "--out", out,
            "--threads", "2"]
    assert assert_clean_error(run(*base, "--device", "cuda")) == f"h3ctl: error: {msg}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors"]
    # --device cpu gives what the API gives
    proc = run(*base, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    from safetensors.numpy import load_file

    got = load_file(str(out))
    with Context(EMBEDDED_MODEL, threads=2, device="cpu") as ctx:
        v, a, _ = tr.denoise(ctx, tr.noise(1, 7, (4, text_dim)), tr.noise(1, 0, (24, 2, 4, 4)),
                             tr.noise(1, 1, (2, 32, 5)), 3)
    assert got["latents"][0].tobytes() == v.tobytes() and got["audio_latents"].tobytes() == a.tobytes()


# ---- packaging -----------------------------------------------------------------------------------------------------


def _hatch_build():
    import importlib.util

    spec = importlib.util.spec_from_file_location("h3_hatch_build", ROOT / "hatch_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_cxx(folder: Path, name: str = "g++") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cxx = folder / name
    cxx.write_text("#!/bin/sh\nexit 0\n")
    cxx.chmod(0o755)
    return cxx


def test_cuda_build_plan(tmp_path):
    """Linux with any C++ compiler builds the CUDA backend (no nvcc, no CUDA header); H3_CUDA=0 skips it, H3_CUDA=1
    requires it; macOS and Windows never build it."""
    hb = _hatch_build()
    bin_ = tmp_path / "bin"
    gxx = _fake_cxx(bin_, "g++")
    clang = _fake_cxx(tmp_path / "clang-only", "clang++")
    path = str(bin_)
    linux = "linux"
    assert hb.cuda_plan({"PATH": path}, platform=linux)[:2] == ("optional", str(gxx))
    assert hb.cuda_plan({"PATH": str(clang.parent)}, platform=linux)[:2] == ("optional", str(clang))
    assert hb.cuda_plan({"PATH": path, "H3_CUDA": "1"}, platform=linux)[:2] == ("required", str(gxx))
    assert hb.cuda_plan({"PATH": path, "H3_CUDA": "0"}, platform=linux)[0] == "off"
    # $CUDA_CXX, then $CXX, name the compiler (a name through PATH, or a path)
    assert hb.cuda_plan({"PATH": path, "CXX": str(clang)}, platform=linux)[:2] == ("optional", str(clang))
    assert hb.cuda_plan({"PATH": str(clang.parent), "CUDA_CXX": "clang++", "CXX": str(gxx)},
                        platform=linux)[:2] == ("optional", str(clang))
    mode, cxx, why = hb.cuda_plan({"PATH": path, "CXX": str(tmp_path / "missing-c++")}, platform=linux)
    assert (mode, cxx) == ("off", None) and "missing-c++ is not an executable" in why
    # no compiler at all: off (optional) or the reason (required)
    empty = str(tmp_path / "empty")
    mode, cxx, why = hb.cuda_plan({"PATH": empty}, platform=linux)
    assert (mode, cxx) == ("off", None) and why.startswith("no C++ compiler found") and "g++" in why
    mode, cxx, why = hb.cuda_plan({"PATH": empty, "H3_CUDA": "1"}, platform=linux)
    assert (mode, cxx) == ("required", None) and why.startswith("H3_CUDA=1 but no C++ compiler found")
    # nvcc and CUDA_HOME play no part
    _fake_cxx(tmp_path / "cuda" / "bin", "nvcc")
    assert hb.cuda_plan({"PATH": str(tmp_path / "cuda" / "bin"), "CUDA_HOME": str(tmp_path / "cuda")},
                        platform=linux)[0] == "off"
    for plat in ("darwin", "win32"):
        mode, cxx, why = hb.cuda_plan({"PATH": path}, platform=plat)
        assert (mode, cxx) == ("off", None) and "Linux only" in why
        mode, cxx, why = hb.cuda_plan({"PATH": path, "H3_CUDA": "1"}, platform=plat)
        assert (mode, cxx) == ("required", None) and "H3_CUDA=1 but" in why
    with pytest.raises(ValueError, match="H3_CUDA must be 0"):
        hb.cuda_plan({"H3_CUDA": "yes"})


def test_cpu_only_install_on_a_gpu_machine_says_so(tmp_path):
    hb = _hatch_build()
    warnings = []
    never = lambda *a, **k: pytest.fail("make must not run without a C++ compiler")  # noqa: E731
    env = {"PATH": str(tmp_path / "nowhere")}
    assert hb.build_cuda(str(tmp_path), env, run=never, warn=warnings.append, driver_present=lambda: True,
                         platform="linux") is False
    assert len(warnings) == 1 and "NVIDIA driver" in warnings[0] and "CPU only" in warnings[0]
    assert "no C++ compiler found" in warnings[0]
    warnings.clear()
    assert hb.build_cuda(str(tmp_path), env, run=never, warn=warnings.append, driver_present=lambda: False,
                         platform="linux") is False
    assert warnings == []  # a machine without a driver installs quietly, as before
    assert hb.build_cuda(str(tmp_path), dict(env, H3_CUDA="0"), run=never, warn=warnings.append,
                         driver_present=lambda: True, platform="linux") is False
    assert warnings == []  # H3_CUDA=0 asked for exactly this
    # macOS: never built, never a make call
    assert hb.build_cuda(str(tmp_path), {"PATH": str(_fake_cxx(tmp_path / "bin").parent)}, run=never,
                         warn=warnings.append, driver_present=lambda: False, platform="darwin") is False
    assert warnings == []
    with pytest.raises(RuntimeError, match="Linux only"):
        hb.build_cuda(str(tmp_path), {"H3_CUDA": "1"}, run=never, platform="darwin")


def test_optional_cuda_build_failure_is_a_warning(tmp_path):
    hb = _hatch_build()
    root = tmp_path / "src"  # a stand-in tree: build_cuda removes stale output there, never in the checkout
    stale = root / hb.CUDA_LIB
    stale.parent.mkdir(parents=True)
    gxx = _fake_cxx(tmp_path / "bin")
    calls, warnings = [], []

    def failing_make(cmd, env=None, **kw):
        calls.append((cmd, env))
        return subprocess.CompletedProcess(cmd, 2, "", "cuda_backend.cpp:12: error: expected ';'\n")

    stale.write_bytes(b"old backend")
    env = {"PATH": str(gxx.parent)}
    assert hb.build_cuda(str(root), env, run=failing_make, warn=warnings.append, platform="linux") is False
    assert calls and calls[0][0] == ["make", "-C", str(root), "cuda", f"CUDA_CXX={gxx}"]
    assert not any(k in calls[0][1] for k in ("NVCC", "CUDA_HOME"))  # nothing of a CUDA toolkit is asked for
    assert len(warnings) == 1 and "expected ';'" in warnings[0] and "H3_CUDA" in warnings[0]
    assert "CPU only" in warnings[0]
    assert not stale.exists()  # a failed build ships no (stale) backend

    stale.write_bytes(b"old backend")
    with pytest.raises(RuntimeError, match="H3_CUDA=1"):
        hb.build_cuda(str(root), dict(env, H3_CUDA="1"), run=failing_make, warn=warnings.append, platform="linux")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        hb.build_cuda(str(root), {"H3_CUDA": "1", "PATH": str(tmp_path / "nowhere")}, run=failing_make,
                      platform="linux")
    # H3_CUDA=0: no make call, and no backend left over from an earlier build
    calls.clear()
    assert hb.build_cuda(str(root), dict(env, H3_CUDA="0"), run=failing_make, platform="linux") is False
    assert not calls and not stale.exists()

    # an editable install runs from the tree: it keeps a backend left there, and says so
    stale.write_bytes(b"old backend")
    warnings.clear()
    assert hb.build_cuda(str(root), env, run=failing_make, warn=warnings.append, remove_stale=False,
                         platform="linux") is False
    assert stale.read_bytes() == b"old backend"
    assert len(warnings) == 2 and "left from an earlier build" in warnings[0], warnings
    warnings.clear()

    def good_make(cmd, env=None, **kw):
        stale.write_bytes(b"new backend")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    assert hb.build_cuda(str(root), env, run=good_make, warn=warnings.append, platform="linux") is True
    assert stale.read_bytes() == b"new backend" and not warnings


def test_cuda_backend_builds_with_the_plain_compiler():
    """The real `make cuda` through the install hook's decision on this machine: the C++ compiler only, PATH without
    any nvcc, no CUDA_HOME. In the checkout (incremental, as the editable install runs it; a failure keeps what is
    there)."""
    hb = _hatch_build()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "NVCC", "H3_CUDA")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not os.path.exists(os.path.join(p, "nvcc")))
    if not sys.platform.startswith("linux") or hb.cuda_plan(env)[0] == "off":
        pytest.skip("not Linux, or no C++ compiler on this machine")
    warnings = []
    assert hb.build_cuda(str(ROOT), env, warn=warnings.append, remove_stale=False) is True, warnings
    lib = ROOT / hb.CUDA_LIB
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert {"h3_backend_cuda_create", "h3_backend_cuda_abi"} <= {ln.split()[-1] for ln in syms.splitlines()}
    # nothing of NVIDIA is linked: the driver, NVRTC and cuBLASLt are opened at run time
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "NEEDED" in needed
    assert not any(x in needed for x in ("libcuda", "libcudart", "libnvrtc", "libcublas", "libcudnn")), needed


def test_cpu_install_stays_light():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        pytest.skip("tomllib needs Python 3.11")
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert proj["project"]["dependencies"] == ["numpy", "safetensors", "rich", "imageio-ffmpeg"]
    # nothing from NVIDIA unless asked for (the `cuda` extra), and the build needs hatchling only: nothing fetched
    assert proj["build-system"]["requires"] == ["hatchling>=1.24"]
    linux = "; sys_platform == 'linux'"  # NVIDIA's wheels exist for Linux only: elsewhere the extras still install
    assert sorted(proj["project"]["optional-dependencies"]["cuda"]) == [
        "nvidia-cublas==13.*" + linux, "nvidia-cuda-nvrtc==13.0.*" + linux, "nvidia-cudnn-cu13==9.*" + linux]
    assert "nvidia-cuda-nvrtc==13.0.*" + linux in proj["project"]["optional-dependencies"]["test"]
    hook = (ROOT / "hatch_build.py").read_text()
    assert not any(w in hook for w in ("pip", "urllib", "http", "download")), "the build hook must fetch nothing"
    assert "python/h3ctl/libh3_cuda.so" in proj["tool"]["hatch"]["build"]["targets"]["wheel"]["artifacts"]
    # Choosing a device and asking for the backends imports nothing heavy.
    code = ("import sys; from h3ctl import Engine, _lib; _lib.backends(); Engine(device='cpu').close(); "
            "heavy = [m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules]; "
            "assert not heavy, heavy")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_fp8_attention_where_it_cannot_run_is_refused_before_any_work(tmp_path):
    """fp8 attention (H3_OPT_FP8_ATTENTION) is cuDNN's fp8 SDPA: a CPU context refuses it at h3_init with the reason,
    whether it comes from the Engine, the environment (H3_FP8_ATTENTION=1) or the CLI, which writes nothing."""
    with pytest.raises(H3Error, match="fp8 attention runs on the CUDA backend only"):
        Engine(device="cpu", fp8_attention=True)
    env = dict(os.environ, H3_FP8_ATTENTION="1", PYTHONPATH=str(ROOT / "python"))
    code = "from h3ctl import Engine\ntry:\n    Engine(device='cpu')\nexcept Exception as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "fp8 attention runs on the CUDA backend only" in proc.stdout, (proc.stdout, proc.stderr)
    out = tmp_path / "x.mp4"
    assert_clean_error(run("render", "-p", PROMPT, "--device", "cpu", "--fp8-attention", "-o", out, "-q"),
                       "fp8 attention runs on the CUDA backend only")
    assert not list(tmp_path.iterdir())


def test_fp8_decoder_where_it_cannot_run_is_refused_before_any_work(tmp_path):
    """The fp8 video decoder (H3_OPT_FP8_DECODER) needs CUDA's fp8 GEMMs: a CPU context refuses it at h3_init with the
    reason, from the Engine, the environment (H3_FP8_DECODER=1) or the CLI, which writes nothing."""
    with pytest.raises(H3Error, match="the fp8 video decoder runs on the CUDA backend only"):
        Engine(device="cpu", fp8_decoder=True)
    env = dict(os.environ, H3_FP8_DECODER="1", PYTHONPATH=str(ROOT / "python"))
    code = "from h3ctl import Engine\ntry:\n    Engine(device='cpu')\nexcept Exception as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "the fp8 video decoder runs on the CUDA backend only (this context runs on the CPU)" in proc.stdout, (
        proc.stdout, proc.stderr)
    out = tmp_path / "x.mp4"
    assert_clean_error(run("render", "-p", PROMPT, "--device", "cpu", "--fp8-decoder", "-o", out, "-q"),
                       "the fp8 video decoder runs on the CUDA backend only")
    assert not list(tmp_path.iterdir())


def test_precision_the_backend_cannot_run_is_refused_at_init():
    """fp8 weights need the CUDA backend (compute capability 8.9+): on a CPU context h3_init refuses them with the
    reason, before any work; an unknown precision is refused by the binding and by h3_init."""
    from h3ctl.context import Context
    from h3ctl.engine import default_model_dir

    with pytest.raises(H3Error, match="precision fp8 runs on the CUDA backend only"):
        Context(default_model_dir(), device="cpu", precision="fp8")
    with pytest.raises(H3Error, match="precision must be one of default, bf16, fp8, int8"):
        Context(default_model_dir(), device="cpu", precision="fp16")
    opts = _lib.H3Options()
    _lib.lib().h3_options_default(ctypes.byref(opts))
    opts.device = _lib.H3_DEVICE_CPU
    opts.precision = 7
    assert not _lib.lib().h3_init(str(default_model_dir()).encode(), ctypes.byref(opts))
    assert "precision must be 0 (default), 1 (fp8) or 2 (int8), got 7" in _lib.last_error()


def test_auto_on_the_cpu_of_a_gpu_machine_says_why_once(tmp_path):
    """--device auto that lands on the CPU where an NVIDIA driver is present: one line with the CUDA backend's reason;
    nothing on a machine without a driver, for an explicit --device cpu, or when the GPU is used."""
    from h3ctl.context import cpu_fallback_note

    sign = tmp_path / "version"
    sign.write_text("NVRM version: 580\n")
    missing = {"cpu": {"available": True}, "cuda": {"built": False, "available": False,
                                                    "reason": "cuda: the CUDA backend is not built in this installation"}}
    note = cpu_fallback_note("auto", "cpu", signs=(str(sign),), backends=missing)
    assert note and "NVIDIA driver" in note and "not built in this installation" in note and "\n" not in note
    assert cpu_fallback_note("auto", "cpu", signs=(str(tmp_path / "none"),), backends=missing) is None
    assert cpu_fallback_note("cpu", "cpu", signs=(str(sign),), backends=missing) is None
    assert cpu_fallback_note("auto", "cuda", signs=(str(sign),), backends=missing) is None
    usable = {"cuda": {"built": True, "available": True}}
    assert cpu_fallback_note("auto", "cpu", signs=(str(sign),), backends=usable) is None
    # this machine's own answer is one line or nothing, and the engine reports the device by name
    with Engine(threads=1) as eng:
        assert eng.device == "cpu"
        line = cpu_fallback_note("auto", eng.device)
        assert line is None or "\n" not in line
