"""The CUDA backend's fault paths, on machines without a GPU: stand-ins for the driver (libcuda.so.1), NVRTC and
cuBLASLt (tests/c/fake_cuda/*.c, built here, reached through H3_LIBCUDA / H3_NVRTC_LIB / H3_CUBLASLT_LIB) whose
behaviour the environment picks: a driver too old, no GPU, a GPU below sm_80, out of device memory, a module the
driver will not load, NVRTC missing or failing, and the kernel cache's faults (a corrupt, truncated or foreign
entry; an unwritable folder).

For every fault: one line naming the cause reaches h3_last_error (H3Error) and h3_backends_json; `h3ctl render
--device cuda` exits 2 with exactly that line, no traceback, and writes nothing; `--device auto` renders on the CPU
and says why once; and a CPU render in the same process, after the failure, gives the same bytes as a CPU render in
a process that never saw a GPU. The fake driver's "device" memory is host memory and its kernels are no-ops, so a
render gets as far as the fault; what it computes is not looked at. Each case runs in its own process: the backend
loads its libraries once per process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from h3ctl.context import NVIDIA_DRIVER_SIGNS

ROOT = Path(__file__).resolve().parents[1]
FAKES = ROOT / "tests" / "c" / "fake_cuda"
LIB = ROOT / "python" / "h3ctl" / "libh3_cuda.so"
PROMPT = "a red circle moves right on a black background, a high beep"
RENDER = ["--size", "64x64", "--frames", "22", "--steps", "2", "--threads", "2", "-q"]
MODULES = ["attention", "attn_fp8", "decoders", "fp8", "gemm", "knobs", "layernorm", "rows", "wpack"]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the CUDA backend is built on Linux")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    r = subprocess.run(["make", "-C", str(ROOT), "cuda"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path_factory.mktemp("fake_cuda")
    libs = {}
    for name in ("fake_libcuda", "fake_nvrtc", "fake_cublaslt"):
        so = out / f"{name}.so"
        r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1", "-o", str(so),
                            str(FAKES / f"{name}.c")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        libs[name] = str(so)
    return libs


@pytest.fixture
def env(fakes, tmp_path):
    """The environment of a process that sees the fake GPU (a working one until a case says otherwise)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("H3_FAKE_", "H3_CUDA", "H3CTL_"))}
    e.update(PYTHONPATH=str(ROOT / "python"), H3_LIBCUDA=fakes["fake_libcuda"], H3_NVRTC_LIB=fakes["fake_nvrtc"],
             H3_CUBLASLT_LIB=fakes["fake_cublaslt"], H3_CUDNN_LIB=str(tmp_path / "absent" / "libcudnn.so.9"),
             H3_KERNEL_CACHE=str(tmp_path / "cache"), H3_FAKE_NVRTC_LOG=str(tmp_path / "nvrtc.log"),
             H3_FAKE_CUDA_LOG=str(tmp_path / "cuda.log"))
    return e


def h3ctl(env, *args):
    return subprocess.run([sys.executable, "-m", "h3ctl", *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120)


def error_line(proc) -> str:
    """The CLI's one error line (progress notes may precede it), after checking there is exactly one and no
    traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("h3ctl: error: ")]
    others = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("h3ctl: cuda: compiling")]
    assert len(errors) == 1 and others == errors, proc.stderr
    return errors[0][len("h3ctl: error: "):]


# In one process: the backends' answer, h3_init on the GPU (and, where init works, a render on it), then --device
# auto's choice and note, and a CPU render whose bytes are hashed.
PROBE = r"""
import hashlib, json, sys
from h3ctl import _lib
from h3ctl._lib import H3Error
from h3ctl.context import cpu_fallback_note
from h3ctl.engine import Engine
out = {"cuda": _lib.backends()["cuda"], "init_error": None, "render_error": None}
try:
    eng = Engine(threads=2, device="cuda")
except H3Error as e:
    out["init_error"] = str(e)
else:
    with eng:
        try:
            eng.render(sys.argv[1], 64, 64, 22, steps=2, seed=1)
        except H3Error as e:
            out["render_error"] = str(e)
with Engine(threads=2, device="auto") as eng:
    out["auto"] = eng.device
    out["note"] = cpu_fallback_note("auto", eng.device)
with Engine(threads=2, device="cpu") as eng:
    r = eng.render(sys.argv[1], 64, 64, 22, steps=2, seed=1)
out["cpu"] = hashlib.sha256(r.frames.tobytes() + r.audio.tobytes()).hexdigest()
print(json.dumps(out))
"""


def probe(env) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, PROMPT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def cpu_reference() -> str:
    """The same CPU render in a process that has no CUDA backend at all in view."""
    code = ("import hashlib, sys; from h3ctl.engine import Engine\n"
            "with Engine(threads=2, device='cpu') as eng: r = eng.render(sys.argv[1], 64, 64, 22, steps=2, seed=1)\n"
            "print(hashlib.sha256(r.frames.tobytes() + r.audio.tobytes()).hexdigest())")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("H3_", "H3CTL_"))}
    e.update(PYTHONPATH=str(ROOT / "python"), H3_CUDA_LIB=str(ROOT / "absent" / "libh3_cuda.so"))
    r = subprocess.run([sys.executable, "-c", code, PROMPT], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def missing(env, var, soname):
    path = str(Path(env["H3_KERNEL_CACHE"]).parent / "absent" / soname)
    return {var: path}, path


# ---- faults at h3_init: the backend is not usable, and says why ------------------------------------------------------

INIT_FAULTS = {
    "driver too old": ({"H3_FAKE_CUDA": "old_driver"},
                       "cuda: the NVIDIA driver is too old (it supports CUDA 12.4; the kernels need CUDA 13.0 or newer: "
                       "update the driver)"),
    "no device (cuInit)": ({"H3_FAKE_CUDA": "no_device"}, "cuda: no CUDA-capable GPU found"),
    "no device (count 0)": ({"H3_FAKE_CUDA": "zero_devices"}, "cuda: no CUDA-capable GPU found"),
    "GPU below sm_80": ({"H3_FAKE_CUDA_CC": "75"},
                        "cuda: GPU 0 (Fake GPU sm_75) has compute capability 7.5; libh3 needs 8.0 or newer"),
    "out of device memory": ({"H3_FAKE_CUDA_MEM": str(16 << 20)},
                             "cuda: out of device memory allocating 32.00 MiB for the cuBLASLt workspace (16.00 MiB "
                             "free of 16.00 MiB)"),
}


@pytest.mark.parametrize("fault", list(INIT_FAULTS))
def test_init_fault_is_one_line_and_the_cpu_still_works(env, tmp_path, cpu_reference, fault):
    extra, line = INIT_FAULTS[fault]
    env.update(extra)
    got = probe(env)
    assert got["cuda"]["available"] is False and got["cuda"]["reason"] == line
    assert got["init_error"] == line
    assert got["auto"] == "cpu"
    assert got["note"] == (f"note: this machine has an NVIDIA driver but the render runs on the CPU: {line} "
                           "(`h3ctl info` lists the backends)")
    assert got["cpu"] == cpu_reference
    out = tmp_path / "out"
    out.mkdir()
    assert error_line(h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "cuda", "-o", out / "x.mp4",
                            "--wav", out / "x.wav")) == line
    assert list(out.iterdir()) == []
    assert not (tmp_path / "nvrtc.log").exists()  # nothing was compiled


@pytest.mark.parametrize("var,soname,cause", [
    ("H3_NVRTC_LIB", "libnvrtc.so.13", 'cuda: NVRTC missing (libnvrtc.so.13: {p}: cannot open shared object file: No '
                                       'such file or directory): pip install "h3ctl[cuda]"'),
    ("H3_CUBLASLT_LIB", "libcublasLt.so.13", "cuda: cuBLASLt missing (libcublasLt.so.13: {p}: cannot open shared "
                                             'object file: No such file or directory): pip install "h3ctl[cuda]"'),
])
def test_missing_library_names_it_and_the_pip_command(env, tmp_path, cpu_reference, var, soname, cause):
    extra, path = missing(env, var, soname)
    env.update(extra)
    line = cause.format(p=path)
    got = probe(env)
    assert got["cuda"]["reason"] == line and got["init_error"] == line
    assert got["auto"] == "cpu" and line in got["note"] and got["cpu"] == cpu_reference
    out = tmp_path / "out"
    out.mkdir()
    assert error_line(h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "cuda", "-o", out / "x.mp4")) == line
    assert list(out.iterdir()) == []


def test_no_driver_library(env, tmp_path, cpu_reference):
    extra, path = missing(env, "H3_LIBCUDA", "libcuda.so.1")
    env.update(extra)
    line = (f"cuda: no NVIDIA driver (libcuda.so.1 cannot be loaded: {path}: cannot open shared object file: No such "
            "file or directory): install NVIDIA's driver for this GPU")
    got = probe(env)
    assert got["cuda"]["reason"] == line and got["init_error"] == line
    assert got["auto"] == "cpu" and got["cpu"] == cpu_reference
    # no driver named, none installed: nothing to say about falling back (on a machine with a driver, the reason)
    has_driver = any(os.path.exists(p) for p in NVIDIA_DRIVER_SIGNS)
    assert got["note"] == (f"note: this machine has an NVIDIA driver but the render runs on the CPU: {line} "
                           "(`h3ctl info` lists the backends)" if has_driver else None)


def test_cudnn_asked_for_and_missing(env, tmp_path):
    """H3_CUDA_ATTENTION=cudnn where cuDNN cannot be loaded: h3_init refuses, naming cuDNN and how to get it."""
    env["H3_CUDA_ATTENTION"] = "cudnn"
    got = probe(env)
    line = got["init_error"]
    assert line and line == got["cuda"]["reason"] and "\n" not in line
    assert line.startswith(f"cuda: H3_CUDA_ATTENTION=cudnn, but H3_CUDNN_LIB={env['H3_CUDNN_LIB']}: "), line
    assert got["auto"] == "cpu" and line in got["note"]
    out = tmp_path / "out"
    out.mkdir()
    assert error_line(h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "cuda", "-o", out / "x.mp4")) == line
    assert list(out.iterdir()) == []


def test_auto_render_falls_back_and_says_why_once(env, tmp_path):
    env["H3_FAKE_CUDA"] = "old_driver"
    out = tmp_path / "a.mp4"
    proc = h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "auto", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        "h3ctl: note: this machine has an NVIDIA driver but the render runs on the CPU: cuda: the NVIDIA driver is "
        "too old (it supports CUDA 12.4; the kernels need CUDA 13.0 or newer: update the driver) (`h3ctl info` lists "
        "the backends)"]
    assert out.stat().st_size > 0


# ---- faults after h3_init: the GPU is usable until a kernel module or an allocation fails -----------------------------

RUN_FAULTS = {
    "module load fails": ({"H3_FAKE_CUDA": "module_load"},
                          "cuda: loading the kernels of rows for sm_90: no kernel image is available for execution on "
                          "the device (CUDA_ERROR_NO_BINARY_FOR_GPU)"),
    # NVRTC's two-line log, on one line
    "NVRTC fails": ({"H3_FAKE_NVRTC": "fail"},
                    'cuda: NVRTC could not compile kernels/rows.cu for sm_90: NVRTC_ERROR_COMPILATION rows.cu(1): error: '
                    'the test double of NVRTC refuses to compile 1 error detected in the compilation of "rows.cu".'),
}


@pytest.mark.parametrize("fault", list(RUN_FAULTS))
def test_fault_at_first_kernel_use(env, tmp_path, cpu_reference, fault):
    extra, line = RUN_FAULTS[fault]
    env.update(extra)
    got = probe(env)
    assert got["cuda"]["available"] is True and got["init_error"] is None
    assert got["render_error"] == line
    assert got["auto"] == "cuda" and got["note"] is None  # usable at init: auto takes the GPU
    assert got["cpu"] == cpu_reference
    out = tmp_path / "out"
    out.mkdir()
    for device in ("cuda", "auto"):
        assert error_line(h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", device, "-o", out / "x.mp4",
                                "--wav", out / "x.wav")) == line
    assert list(out.iterdir()) == []
    # a module NVRTC could not compile leaves no entry; one the driver would not load was compiled and kept
    cache = tmp_path / "cache"
    kept = sorted(p.name.rsplit("-", 1)[0] for p in cache.iterdir()) if cache.exists() else []
    assert kept == ([] if "NVRTC" in fault else ["rows"])


def test_out_of_device_memory_while_loading_weights(env, tmp_path, cpu_reference):
    env["H3_FAKE_CUDA_MEM"] = str(60 << 20)  # the cuBLASLt workspace fits, the model does not
    got = probe(env)
    assert got["init_error"] is None
    err = got["render_error"]
    assert err and "\n" not in err
    assert ": cuda: out of device memory allocating 64.00 MiB for weight staging (" in err and "free of 60.00 MiB)" in err
    assert got["cpu"] == cpu_reference
    out = tmp_path / "out"
    out.mkdir()
    assert error_line(h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "cuda", "-o", out / "x.mp4")) == err
    assert list(out.iterdir()) == []


def test_the_fake_gpu_renders(env, tmp_path):
    """The stand-ins are complete enough for a whole render, so the faults above are reached on the real path."""
    out = tmp_path / "a.mp4"
    proc = h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "cuda", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    compiled = (tmp_path / "nvrtc.log").read_text().splitlines()
    assert compiled and all(ln.startswith("compile ") and ln.endswith(" -arch=sm_90") for ln in compiled)


# ---- the kernel cache ------------------------------------------------------------------------------------------------


def warmup(env):
    """`h3ctl warmup` in a fresh process: (modules compiled, modules loaded, stderr lines); its last line says what
    the cache holds now."""
    for f in ("nvrtc.log", "cuda.log"):
        Path(env["H3_FAKE_NVRTC_LOG"]).with_name(f).unlink(missing_ok=True)
    proc = h3ctl(env, "warmup")
    assert proc.returncode == 0, proc.stderr
    from h3ctl.info import kernel_cache_line

    folder = env["H3_KERNEL_CACHE"]
    assert proc.stdout == ("h3ctl: the CUDA kernels are compiled for this GPU; kernel cache: "
                           f"{kernel_cache_line(None if folder == 'off' else folder)}\n")
    nv, cu = Path(env["H3_FAKE_NVRTC_LOG"]), Path(env["H3_FAKE_CUDA_LOG"])
    compiled = [ln.split()[1].removesuffix(".cu") for ln in nv.read_text().splitlines()] if nv.exists() else []
    loaded = cu.read_text().splitlines() if cu.exists() else []
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("h3ctl: cuda: kernels ")]
    return compiled, loaded, lines


def entries(cache: Path) -> dict:
    return {p.name.rsplit("-", 1)[0]: p for p in sorted(cache.glob("*.cubin"))}


def test_cache_is_written_then_used(env, tmp_path):
    cache = tmp_path / "cache"
    compiled, loaded, lines = warmup(env)
    assert compiled == MODULES and loaded == ["load FAKE"] * 9
    assert [ln for ln in lines if "compiling GPU kernels" in ln] == lines and len(lines) == 9
    ent = entries(cache)
    assert sorted(ent) == MODULES and sorted(os.listdir(cache)) == sorted(p.name for p in ent.values())  # no temp file
    for mod, p in ent.items():
        data = p.read_bytes()
        assert data.startswith(b"H3KCUBN1") and f"FAKECUBIN {mod}.cu -arch=sm_90 ".encode() in data
        assert b"module=" + mod.encode() + b" " in data and b"nvrtc=13.0 driver=13000" in data
    compiled, loaded, lines = warmup(env)
    assert compiled == [] and loaded == ["load FAKE"] * 9 and lines == []
    size = sum(p.stat().st_size for p in ent.values())
    assert h3ctl(env, "warmup").stdout.endswith(f"kernel cache: {cache}: 9 entries, {size / 1024:.2f} KiB\n")
    # another GPU architecture is another key: its own entries beside these
    env["H3_FAKE_CUDA_CC"] = "80"
    compiled, _, _ = warmup(env)
    assert compiled == MODULES and len(list(cache.glob("*.cubin"))) == 18


def _flip(data: bytes) -> bytes:
    i = data.index(b"FAKECUBIN") + 3
    return data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1:]


@pytest.mark.parametrize("damage,why", [
    (_flip, "checksum mismatch"),
    (lambda d: d[:-5], "truncated"),
    (lambda d: d[: len(d) // 2], "truncated"),
    (lambda d: b"", "not a kernel cache entry"),
    (lambda d: b"\x7fELF" + d[4:], "not a kernel cache entry"),
])
def test_damaged_entry_is_refused_and_rebuilt(env, tmp_path, damage, why):
    warmup(env)
    rows = entries(tmp_path / "cache")["rows"]
    good = rows.read_bytes()
    rows.write_bytes(damage(good))
    compiled, loaded, lines = warmup(env)
    assert compiled == ["rows"] and loaded == ["load FAKE"] * 9
    assert lines == [f"h3ctl: cuda: kernel cache entry {rows} refused ({why}); rebuilding it",
                     "h3ctl: cuda: compiling GPU kernels for sm_90: rows (21 kernels; once per GPU and version, then "
                     "cached)"]
    assert rows.read_bytes() == good  # rebuilt: the same entry as the first compile wrote
    assert warmup(env)[0] == []


def test_foreign_entry_is_refused(env, tmp_path):
    """A valid entry of another key (another module's, here) under this key's name is refused, not loaded."""
    warmup(env)
    ent = entries(tmp_path / "cache")
    good = ent["rows"].read_bytes()
    shutil.copyfile(ent["gemm"], ent["rows"])
    compiled, _, lines = warmup(env)
    assert compiled == ["rows"]
    assert lines[0] == (f"h3ctl: cuda: kernel cache entry {ent['rows']} refused (built for another source, GPU or "
                        "library version); rebuilding it")
    assert ent["rows"].read_bytes() == good


@pytest.mark.parametrize("how", ["a file in the way", "a folder that cannot be written"])
def test_unwritable_cache_folder_compiles_in_memory_and_warns_once(env, tmp_path, how):
    if how == "a file in the way":
        (tmp_path / "file").write_text("x")
        folder = tmp_path / "file" / "kernels"
        reason = "Not a directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        reason = "Permission denied"
    env["H3_KERNEL_CACHE"] = str(folder)
    compiled, loaded, lines = warmup(env)
    assert compiled == MODULES and loaded == ["load FAKE"] * 9
    warn = [ln for ln in lines if "warning" in ln]
    assert warn == [f"h3ctl: warning: cuda: the kernel cache folder {folder} is not writable ({reason}); kernels are "
                    "compiled in memory for this process only"]
    assert not folder.exists() or list(folder.iterdir()) == []
    last = h3ctl(env, "warmup").stdout
    assert last.endswith(f"kernel cache: {folder} (nothing cached yet)\n" if how == "a file in the way" else
                         f"kernel cache: {folder}: 0 entries, 0 B\n"), last
    # and a render works the same way
    out = tmp_path / "a.mp4"
    proc = h3ctl(env, "render", "-p", PROMPT, *RENDER, "--device", "cuda", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if "not writable" in ln]) == 1 and out.stat().st_size > 0


def test_cache_off_compiles_every_process(env, tmp_path):
    env["H3_KERNEL_CACHE"] = "off"
    assert warmup(env)[0] == MODULES
    assert h3ctl(env, "warmup").stdout.endswith("kernel cache: off (H3_KERNEL_CACHE=off, or no home folder): kernels "
                                                "are compiled in memory by every process\n")
    compiled, _, lines = warmup(env)
    assert compiled == MODULES and not [ln for ln in lines if "warning" in ln or "refused" in ln]


# ---- h3ctl info's CUDA lines -------------------------------------------------------------------------------------------


def test_info_lines_from_the_backends_json(tmp_path):
    from h3ctl.info import backend_lines

    cache = tmp_path / "kernels"
    base = {"built": True, "available": True, "device": "cuda (GPU)", "compute_capability": "9.0",
            "memory_bytes": 2**30, "driver_cuda": "13.0", "kernel_cache": str(cache)}
    yes = dict(base, cudnn_attention=True, cudnn="cuDNN 9.19.0 (/x/libcudnn.so.9)", fp8_weights=True,
               fp8_attention=True)
    assert backend_lines({"cuda": yes})[1:] == [
        "cuda: available: cuda (GPU), compute capability 9.0, 1.00 GiB; fp8 attention: yes",
        "cuda: NVIDIA driver for CUDA 13.0",
        "cuda: bf16 attention: cuDNN (cuDNN 9.19.0 (/x/libcudnn.so.9))",
        "cuda: fp8 weights: yes",
        f"cuda: kernel cache: {cache} (nothing cached yet)"]
    cache.mkdir()
    (cache / "rows-0123456789abcdef.cubin").write_bytes(b"x" * 1000)
    (cache / "gemm-0123456789abcdef.cubin").write_bytes(b"x" * 2072)
    (cache / "gemm-0123456789abcdef.cubin.tmp.77").write_bytes(b"x" * 5000)  # a writer's temporary: not an entry
    no = dict(base, cudnn_attention=False, cudnn="cuDNN missing: pip it", fp8_weights=False,
              fp8_weights_reason="needs 8.9; this one is 8.0", fp8_attention=False, fp8_attention_reason="needs 9.0")
    assert backend_lines({"cuda": no})[1:] == [
        "cuda: available: cuda (GPU), compute capability 9.0, 1.00 GiB; fp8 attention: no (needs 9.0)",
        "cuda: NVIDIA driver for CUDA 13.0",
        "cuda: bf16 attention: libh3's own kernel, not cuDNN (cuDNN missing: pip it)",
        "cuda: fp8 weights: no (needs 8.9; this one is 8.0)",
        f"cuda: kernel cache: {cache}: 2 entries, 3.00 KiB"]
    off = {"built": True, "available": False, "reason": "cuda: no CUDA-capable GPU found", "kernel_cache": None}
    assert backend_lines({"cuda": off})[1:] == [
        "cuda: not available (built): cuda: no CUDA-capable GPU found",
        "cuda: kernel cache: off (H3_KERNEL_CACHE=off, or no home folder): kernels are compiled in memory by every "
        "process"]
    # no CUDA library in this installation: no cache line
    assert backend_lines({"cuda": {"built": False, "available": False, "reason": "r", "kernel_cache": "/k"}})[1:] == [
        "cuda: not available (not built): r"]


@pytest.mark.parametrize("cc", ["90", "86"])
def test_info_prints_the_fake_gpu(env, tmp_path, cc):
    from h3ctl.info import human_bytes

    env["H3_FAKE_CUDA_CC"] = cc
    warmup(env)
    proc = h3ctl(env, "info")
    assert proc.returncode == 0, proc.stderr
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("cuda: ")]
    assert len(lines) == 5, proc.stdout
    # cuDNN is H3_CUDNN_LIB, a missing file here: its reason starts by naming it
    cudnn = f"H3_CUDNN_LIB={env['H3_CUDNN_LIB']}: {env['H3_CUDNN_LIB']}: cannot open shared object file"
    head = (f"cuda: available: cuda (Fake GPU sm_{cc}, sm_{cc}, 80.0 GiB, own attention), compute capability "
            f"{cc[0]}.{cc[1]}, 80.00 GiB; fp8 attention: no (")
    assert lines[0].startswith(head + (f"it runs on cuDNN, and H3_CUDNN_LIB={env['H3_CUDNN_LIB']}: " if cc == "90" else
                                       "cuDNN's fp8 attention needs compute capability 9.0 or newer; this GPU is 8.6)"))
    assert lines[1] == "cuda: NVIDIA driver for CUDA 13.0"
    assert lines[2].startswith(f"cuda: bf16 attention: libh3's own kernel, not cuDNN ({cudnn}")
    assert lines[3] == ("cuda: fp8 weights: yes" if cc == "90" else "cuda: fp8 weights: no (needs a GPU of compute "
                        "capability 8.9 or newer (fp8 tensor cores); this one is 8.6)")
    size = sum(p.stat().st_size for p in (tmp_path / "cache").glob("*.cubin"))
    assert size > 9 * 100 and lines[4] == f"cuda: kernel cache: {tmp_path / 'cache'}: 9 entries, {human_bytes(size)}"
