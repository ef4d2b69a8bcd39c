"""One render split over several ranks (sequence parallelism, docs/multi-gpu.md), on the CPU: h3-tiny through
H3_LOOPBACK_RANKS at the degrees its 6 heads allow, bit-identical to one device, with --profile naming the ranks
and the bytes each all-to-all moved; the `--gpus` launcher's refusals (a degree that does not divide the heads,
more ranks than GPUs, the CPU) and its handling of a rank that dies (the others stopped, one line naming the rank,
no output file), with real `h3ctl render` processes; the oracle fixtures' tiny model at the released 56 heads
rendered whole over 2, 4, 7 and 8 loopback ranks, bit-identical (tests/c/test_sp.c checks the same degrees on the
denoise alone, with the facts the exactness rests on); the NCCL communicator's loader and faults are tests/c/test_nccl.c's; GPU runs are tests/gpu/run_multi_gpu.sh's."""

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h3cli import assert_clean_error, run

PROMPT = "a red circle moves right on a black background, a high beep"

CHILD = r"""
import hashlib, sys, h3ctl
eng = h3ctl.Engine(device="cpu", threads=2)
r = eng.render(sys.argv[1], seed=7, steps=int(sys.argv[2]))
sp = eng.last_transformer_profile.get("sequence_parallel")
print(hashlib.sha256(r.frames.tobytes()).hexdigest(), hashlib.sha256(r.audio.tobytes()).hexdigest(),
      sp["world"] if sp else 1)
"""


def _render_hash(ranks: int | None, steps: int = 6) -> tuple[str, str, int]:
    env = {k: v for k, v in os.environ.items() if k != "H3_LOOPBACK_RANKS"}
    if ranks:
        env["H3_LOOPBACK_RANKS"] = str(ranks)
    p = subprocess.run([sys.executable, "-c", CHILD, PROMPT, str(steps)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    v, a, w = p.stdout.split()
    return v, a, int(w)


def test_loopback_render_is_bit_identical():
    one = _render_hash(None)
    assert one[2] == 1
    for ranks in (1, 2, 3, 6):  # 1: the split path with one rank (its exchanges empty)
        v, a, w = _render_hash(ranks)
        assert w == ranks, "the render did not run split"
        assert (v, a) == one[:2], f"{ranks} loopback ranks: frames/audio differ from one device"


CHILD_MODEL = r"""
import hashlib, sys, h3ctl
eng = h3ctl.Engine(sys.argv[1], device="cpu", threads=2)
r = eng.render("a red circle", seed=7, steps=4, width=64, height=64, frames=9)
sp = eng.last_transformer_profile.get("sequence_parallel")
print(hashlib.sha256(r.frames.tobytes()).hexdigest(), hashlib.sha256(r.audio.tobytes()).hexdigest(),
      sp["world"] if sp else 1)
"""


def test_loopback_56_heads_oracle_checkpoint(tmp_path):
    """The released head count: the oracle fixtures' tiny model with 56 heads of 24, rendered whole (text encoder,
    transformer, both decoders) over 2, 4, 7 and 8 loopback ranks: the same bytes as one device."""
    import copy

    from tests.fixtures import official as fx

    cfg = copy.deepcopy(fx.TINY_CONFIGS["tiny"])
    cfg["transformer"].update(num_attention_heads=56, attention_head_dim=24)
    fx.TINY_CONFIGS["sp56"] = cfg
    try:
        part = fx.make_checkpoint(tmp_path / "sp56", "sp56")
    finally:
        del fx.TINY_CONFIGS["sp56"]
    got = {}
    for ranks in (0, 2, 4, 7, 8):
        env = {**os.environ, "H3_LOOPBACK_RANKS": str(ranks)}
        p = subprocess.run([sys.executable, "-c", CHILD_MODEL, str(part)], capture_output=True, text=True, env=env,
                           timeout=600)
        assert p.returncode == 0, p.stderr
        v, a, w = p.stdout.split()
        assert int(w) == (ranks or 1)
        got[ranks] = (v, a)
    assert all(got[r] == got[0] for r in got), got
    p = subprocess.run([sys.executable, "-c", CHILD_MODEL, str(part)], capture_output=True, text=True,
                       env={**os.environ, "H3_LOOPBACK_RANKS": "3"}, timeout=600)
    assert p.returncode != 0 and "ranks that do: 1, 2, 4, 7, 8, 14, 28, 56" in p.stderr


def test_loopback_profile_names_ranks_and_bytes(tmp_path):
    out = tmp_path / "a.mp4"
    p = run("render", "-p", PROMPT, "--device", "cpu", "--steps", "4", "-o", out, "--profile", "-q",
            env={**os.environ, "H3_LOOPBACK_RANKS": "2"})
    assert p.returncode == 0, p.stderr
    assert out.is_file() and out.stat().st_size > 1000
    err = p.stderr
    assert "sequence parallel: loopback, 2 ranks over" in err
    # h3-tiny: 6 heads of 64, so each rank holds 3 heads (192 values per row); its slice's q, k and v of the
    # other rank's heads go out (3 x rows x 192 x 4 bytes), and the other slice's rows of its heads' output
    lines = [ln for ln in err.splitlines() if "loopback rank" in ln]
    assert len(lines) == 2 and "loopback rank 0 of 2: rows 0-" in lines[0] and "loopback rank 1 of 2" in lines[1]
    r0_end = int(lines[0].split("rows 0-")[1].split(";")[0])
    rows0 = r0_end + 1
    kib = 3 * rows0 * 192 * 4 / 1024
    assert f"sent {kib:.2f} KiB (q/k/v)" in lines[0], lines[0]


def test_loopback_bad_degree(tmp_path):
    out = tmp_path / "a.mp4"
    p = run("render", "-p", PROMPT, "--device", "cpu", "--steps", "2", "-o", out,
            env={**os.environ, "H3_LOOPBACK_RANKS": "4"})
    assert_clean_error(p, "4 ranks do not divide the model's 6 attention heads (ranks that do: 1, 2, 3, 6)")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    p = run("render", "-p", PROMPT, "--device", "cpu", "--steps", "2", "-o", out,
            env={**os.environ, "H3_LOOPBACK_RANKS": "two"})
    assert_clean_error(p, "H3_LOOPBACK_RANKS must be a whole number of ranks from 1 to 64")
    assert not out.exists()


def test_gpus_refusals(tmp_path):
    from h3ctl import launch
    from h3ctl._lib import H3Error

    out = tmp_path / "a.mp4"
    assert_clean_error(run("render", "-p", PROMPT, "--gpus", "4", "-o", out),
                       "--gpus 4: 4 ranks do not divide the model's 6 attention heads (ranks that do: 1, 2, 3, 6)")
    assert_clean_error(run("render", "-p", PROMPT, "--gpus", "0", "-o", out), "--gpus must be a whole number")
    assert_clean_error(run("render", "-p", PROMPT, "--gpus", "65", "-o", out), "from 1 to 64")
    assert_clean_error(run("render", "-p", PROMPT, "--gpus", "2", "--device", "cpu", "-o", out),
                       "--gpus 2 runs one process per GPU; --device cpu cannot")
    n = launch.gpu_count()
    for k in [k for k in (2, 3, 6) if k > n][:1]:  # the smallest degree of h3-tiny past this machine's GPUs
        assert_clean_error(run("render", "-p", PROMPT, "--gpus", k, "-o", out),
                           f"--gpus {k}: more ranks than GPUs (this machine shows {n})")
    with pytest.raises(H3Error, match=r"--gpus 2: more ranks than GPUs \(this machine shows 1\)"):
        launch.check(2, 56, 1, "cuda")
    with pytest.raises(H3Error, match=r"ranks that do: 1, 2, 4, 7, 8, 14, 28, 56"):
        launch.check(3, 56, 8, "cuda")
    launch.check(8, 56, 8, "cuda")  # the released model's head count on an 8-GPU machine
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert launch.strip_gpus(["render", "--gpus", "2", "-p", "x", "--gpus=4", "-o", "y"]) == \
        ["render", "-p", "x", "-o", "y"]


def test_world_size_on_cpu_is_refused(tmp_path):
    out = tmp_path / "a.mp4"
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    p = run("render", "-p", PROMPT, "--device", "cpu", "--steps", "2", "-o", out, env=env)
    assert_clean_error(p, "WORLD_SIZE=2 needs H3_RENDEZVOUS")
    env["H3_RENDEZVOUS"] = str(tmp_path / "id")
    p = run("render", "-p", PROMPT, "--device", "cpu", "--steps", "2", "-o", out, env=env)
    assert_clean_error(p, "WORLD_SIZE=2: ranks of several processes run on GPUs through NCCL")
    env["RANK"] = "2"
    p = run("render", "-p", PROMPT, "--device", "cpu", "--steps", "2", "-o", out, env=env)
    assert_clean_error(p, "RANK=2 is not a rank of WORLD_SIZE=2")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_launcher_stops_the_others_when_a_rank_dies(tmp_path):
    from h3ctl import launch

    # rank 0 would sleep a minute; rank 1 says why and exits 3: the launcher stops rank 0 and names rank 1
    cmds = [[sys.executable, "-c", "import time; time.sleep(60)"],
            [sys.executable, "-c", "import sys; print('h3ctl: error: out of device memory', file=sys.stderr); "
                                   "sys.exit(3)"]]
    t0 = time.monotonic()
    rc, msg = launch.run_ranks(cmds, [dict(os.environ)] * 2, tmp_path, grace_s=5)
    assert rc == 3 and time.monotonic() - t0 < 30
    assert msg == ("rank 1 of 2 failed (exit 3): h3ctl: error: out of device memory; the other ranks were stopped, "
                   "nothing was written")
    # a rank killed by a signal
    cmds = [[sys.executable, "-c", "import time; time.sleep(60)"],
            [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]]
    rc, msg = launch.run_ranks(cmds, [dict(os.environ)] * 2, tmp_path, grace_s=5)
    assert rc == 1 and msg.startswith("rank 1 of 2 failed (killed by signal 9)")
    # all succeed
    ok = [[sys.executable, "-c", "pass"]] * 3
    assert launch.run_ranks(ok, [dict(os.environ)] * 3, tmp_path) == (0, "")


def test_a_rank_dying_mid_render_leaves_no_file(tmp_path):
    """Rank 0 is a real CPU render writing an MP4; rank 1 dies early: rank 0 gets SIGTERM before it publishes, and
    neither the file nor a temporary of it is left."""
    from h3ctl import launch

    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "a.mp4"
    env0 = {k: v for k, v in os.environ.items() if k not in launch.RANK_VARS}
    cmds = [[sys.executable, "-m", "h3ctl", "render", "-p", PROMPT, "--device", "cpu", "--steps", "40",
             "--preset", "reference", "--size", "256x256", "-o", str(out),
             "-q"],
            [sys.executable, "-c", "import sys, time; time.sleep(1.5); print('h3ctl: error: rank lost', "
                                   "file=sys.stderr); sys.exit(1)"]]
    rc, msg = launch.run_ranks(cmds, [env0, env0], tmp_path, grace_s=20, rank0_stderr=subprocess.DEVNULL)
    assert rc == 1 and "rank 1 of 2 failed (exit 1): h3ctl: error: rank lost" in msg
    assert not out.exists() and list(outdir.iterdir()) == []


def test_a_rank_other_than_0_decodes_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Rank 1 of 2 (as the launcher starts it): the transformer's share runs, the decoders do not, no file is written
    and nothing is printed. The rank is faked in-process (on the CPU the library refuses WORLD_SIZE itself, checked
    above), so the render runs on one device."""
    from h3ctl import cli, engine, launch

    decodes = []
    real_run = engine.Engine.run

    def run(self, req, **kw):
        decodes.append(kw.get("decode", "uint8"))
        return real_run(self, req, **kw)

    monkeypatch.setattr(launch, "rank", lambda: (1, 2))
    monkeypatch.setattr(engine.Engine, "run", run)
    out = tmp_path / "a.mp4"
    assert cli.main(["render", "-p", PROMPT, "--device", "cpu", "--steps", "3", "-o", str(out), "--wav",
                     str(tmp_path / "a.wav"), "-q"]) == 0
    assert decodes == [None]
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""
