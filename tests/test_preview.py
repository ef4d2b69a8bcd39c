"""Previews: the x0 estimate, the latent-to-RGB map's quality against the real decoder, its cache, the terminal
encoders (each decoded back and compared with the image), protocol detection, and `render --show`."""

import base64
import json
import os
import re
import shutil
import struct
import zlib

import numpy as np
import pytest

from h3ctl import Engine, H3Error, preview, terminal
from h3ctl.engine import EMBEDDED_MODEL
from tests.h3cli import assert_clean_error, run

# Held-out prompts: none of them is one of preview.CALIBRATION_PROMPTS.
EVAL_PROMPTS = [
    "a green square moves right on a white background, a low hum",
    "a blue circle moves down on a gray background, a high beep",
    "a white square moves left on a black background, a high beep",
    "a yellow circle stays still on a navy background",
]


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """XDG_CACHE_HOME holding h3-tiny's fitted map (fitted once here; subprocesses find it)."""
    home = tmp_path_factory.mktemp("xdg-cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="module")
def eng(cache_home):
    with Engine(threads=2) as e:
        yield e


def psnr(a, b):
    return 10 * np.log10(1.0 / max(np.mean((np.asarray(a, np.float64) - b) ** 2), 1e-12))


def corr(a, b):
    return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


# -- the x0 estimate ----------------------------------------------------------------------------------------

def test_sigma_schedule_matches_the_engine(eng):
    sig = preview.sigma_schedule(20, preview.video_shift(eng))
    assert preview.video_shift(eng) == 12.0  # h3-tiny's model_index.json
    assert len(sig) == 20 and sig[-1] == 0.0 and sig[0] == pytest.approx(1.0)
    assert np.all(np.diff(sig) < 0)
    eng.prepare(EVAL_PROMPTS[0], 64, 64, 22, steps=20, seed=1)
    assert eng.render_info()["steps"] == len(sig) - 1


def test_x0_estimate_is_closer_to_the_result_than_the_noisy_latent(eng):
    """From two consecutive latents and their sigmas: wrong sigmas or a sign error would not converge."""
    steps = 12
    sig = preview.sigma_schedule(steps, preview.video_shift(eng))
    eng.prepare(EVAL_PROMPTS[1], 64, 64, 22, steps=steps, seed=3)
    xs = [eng.latents()[0]]
    while True:
        left = eng.step()
        xs.append(eng.latents()[0])
        if left <= 0:
            break
    assert len(xs) == len(sig)
    final = xs[-1]
    errs_x0, errs_x = [], []
    for i in range(len(xs) - 2):
        x0 = preview.x0_estimate(xs[i], xs[i + 1], float(sig[i]), float(sig[i + 1]))
        errs_x0.append(np.linalg.norm(x0 - final))
        errs_x.append(np.linalg.norm(xs[i + 1] - final))
    assert all(a < 0.6 * b for a, b in zip(errs_x0, errs_x)), (errs_x0, errs_x)
    assert errs_x0[-1] < errs_x0[0]
    # the last step lands on sigma 0: the estimate is the result itself
    assert np.array_equal(preview.x0_estimate(xs[-2], final, float(sig[-2]), 0.0), final)


# -- the map's quality ------------------------------------------------------------------------------------

def test_map_preview_matches_the_decoded_video(eng, capsys):
    """The map applied to the last step's x0 (what the last preview shows) against the real decoded frames,
    averaged over each latent voxel's pixels; and at step 4 of 9, the map's picture of the x0 estimate against
    the decoder's picture of the same latents."""
    from h3ctl.parity.vae_video import decode

    pmap = preview.load_map(eng)
    random_only = preview.fit_map(eng, calibrate=False)
    vae = preview._vae_cfg(eng)
    steps, at = 10, 4
    sig = preview.sigma_schedule(steps, preview.video_shift(eng))
    rows = []
    for k, prompt in enumerate(EVAL_PROMPTS):
        eng.prepare(prompt, 128, 128, 22, steps=steps, seed=k)
        xs = [eng.latents()[0]]
        while eng.step() > 0:
            xs.append(eng.latents()[0])
        xs.append(eng.latents()[0])
        frames = eng.decode_video()
        v = xs[-1]
        T, h, w = v.shape[1:]
        truth = preview.pool_frames(frames / 255.0, T, h, w, vae)
        got = pmap.rgb(v) / 255.0
        flat = np.broadcast_to(truth.mean(axis=(0, 1, 2)), truth.shape)
        x0 = preview.x0_estimate(xs[at - 1], xs[at], float(sig[at - 1]), float(sig[at]))
        _, px = decode(eng._ctx, x0, want_rgb=False)
        mid = preview.pool_frames(px, T, h, w, vae)
        rows.append((psnr(got, truth), corr(got, truth), psnr(flat, truth), psnr(random_only.float_rgb(v), truth),
                     corr(pmap.float_rgb(x0), mid), psnr(pmap.float_rgb(x0), mid)))
    arr = np.array(rows)
    with capsys.disabled():
        print(f"\npreview quality on {len(rows)} held-out h3-tiny renders (128x128, 22 frames, {steps} steps): last "
              f"step PSNR {arr[:, 0].mean():.1f} dB (min {arr[:, 0].min():.1f}), colour correlation "
              f"{arr[:, 1].mean():.3f} (min {arr[:, 1].min():.3f}); a flat mean colour scores "
              f"{arr[:, 2].mean():.1f} dB, "
              f"a map fitted on random latents only {arr[:, 3].mean():.1f} dB; step {at}/{steps - 1}: correlation "
              f"{arr[:, 4].mean():.3f} (min {arr[:, 4].min():.3f}), PSNR {arr[:, 5].mean():.1f} dB")
    assert arr[:, 0].mean() >= 22.0 and arr[:, 0].min() >= 17.0
    assert arr[:, 1].min() >= 0.85
    assert np.all(arr[:, 0] >= arr[:, 2] + 2.0), "the map must beat a flat mean colour on every clip"
    assert arr[:, 0].mean() >= arr[:, 3].mean() + 3.0, "calibration renders must beat random latents alone"
    assert arr[:, 4].min() >= 0.75


# -- the Python API -----------------------------------------------------------------------------------------

def test_engine_render_preview_callback(eng):
    seen = []
    res = eng.render(EVAL_PROMPTS[2], 64, 64, 22, steps=6, seed=2, preview=seen.append, preview_every=2)
    assert len(seen) == 3 and all(s.shape == (7, 4, 4, 3) and s.dtype == np.uint8 for s in seen)  # one-arg callback
    assert np.array_equal(seen[-1], preview.load_map(eng).rgb(eng.latents()[0]))  # the last one: the final latents
    plain = eng.render(EVAL_PROMPTS[2], 64, 64, 22, steps=6, seed=2)
    # previews change nothing in the result
    assert np.array_equal(res.frames, plain.frames) and np.array_equal(res.audio, plain.audio)
    from h3ctl import Cancelled

    with pytest.raises(Cancelled, match="cancelled by the preview callback"):  # an Exception, not a KeyboardInterrupt
        eng.render(EVAL_PROMPTS[2], 64, 64, 22, steps=6, seed=2, preview=lambda rgb, step: step >= 2)
    with pytest.raises(H3Error, match="preview_every"):
        eng.render(EVAL_PROMPTS[2], 64, 64, 22, steps=6, preview=seen.append, preview_every=0)
    again = eng.render(EVAL_PROMPTS[2], 64, 64, 22, steps=6, seed=2)  # the engine is fine after a cancel
    assert np.array_equal(again.frames, plain.frames)


# -- the cache ------------------------------------------------------------------------------------------------

def test_map_cache_and_model_identity(eng, cache_home, tmp_path, monkeypatch):
    first = preview.load_map(eng)
    files = list((cache_home / "h3ctl" / "preview").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"] == first.key

    def no_fit(*a, **k):
        raise AssertionError("the cached map should have been used")

    with Engine(threads=2) as other:  # a new engine on the same model: from the cache file, no fit
        monkeypatch.setattr(preview, "fit_map", no_fit)
        again = preview.load_map(other)
        assert again.source == "cache" and np.allclose(again.matrix, first.matrix, atol=1e-6)
        monkeypatch.undo()

    # a copy whose video decoder config differs in one byte is another model
    copy = tmp_path / "tiny"
    shutil.copytree(EMBEDDED_MODEL, copy)
    cfg = next((copy / "FL2VA" / "video_vae").rglob("*.json"))
    cfg.write_text(cfg.read_text() + " ")
    with Engine(copy, threads=2) as e2:
        assert preview.model_key(e2) != first.key
        # a map shipped with the model wins, and a malformed one is ignored
        shipped = copy / "FL2VA" / preview.MAP_FILENAME
        shipped.write_text(json.dumps({"format": "h3ctl-preview-map", "matrix": first.matrix.tolist()}))
        assert preview.load_map(e2).source == "model"
    fits = []

    def stub_fit(engine, **kw):
        fits.append(engine)
        return preview.PreviewMap(first.matrix.copy())

    monkeypatch.setattr(preview, "fit_map", stub_fit)
    with Engine(copy, threads=2) as e3:
        shipped.write_text("{not json")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
        (tmp_path / "a-file").write_text("x")  # the cache folder cannot be created: fit, keep in memory, go on
        m = preview.load_map(e3)
        assert m.source == "fit" and m.info["cached"] is False and len(fits) == 1
        assert preview.load_map(e3) is m and len(fits) == 1  # one fit per loaded engine

    # a corrupt cache file is refitted and replaced
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    files[0].write_text("{broken")
    with Engine(threads=2) as e4:
        m = preview.load_map(e4)
        assert m.source == "fit" and len(fits) == 2
    assert json.loads(files[0].read_text())["key"] == first.key


# -- terminal encoders, each decoded back -------------------------------------------------------------------

def _img(h=10, w=7, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def read_png(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        n, tag = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body) & 0xFFFFFFFF
        chunks.setdefault(tag, b"")
        chunks[tag] += body
        pos += 12 + n
    w, h, depth, ctype = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, ctype) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert np.all(rows[:, 0] == 0)
    return rows[:, 1:].reshape(h, w, 3)


def test_png_kitty_iterm_payloads_decode_to_the_image():
    img = _img(33, 65)
    big = _img(200, 180, seed=1)
    seq = terminal.kitty(big, 20, 10, image_id=7)
    parts = re.findall(r"\x1b_G([^;]*);([^\x1b]*)\x1b\\", seq)
    assert len(parts) > 1 and all(len(p) <= 4096 for _, p in parts)
    keys = dict(kv.split("=") for kv in parts[0][0].split(","))
    assert keys["a"] == "T" and keys["f"] == "100" and keys["q"] == "2" and keys["i"] == "7"
    assert (keys["c"], keys["r"], keys["m"]) == ("20", "10", "1") and parts[-1][0] == "m=0"
    assert np.array_equal(read_png(base64.b64decode("".join(p for _, p in parts))), big)
    m = re.fullmatch(r"\x1b\]1337;File=([^:]*):([A-Za-z0-9+/=]*)\x07", terminal.iterm(img, 12, 6))
    args = dict(kv.split("=") for kv in m.group(1).split(";"))
    png = base64.b64decode(m.group(2))
    assert args["inline"] == "1" and int(args["size"]) == len(png) and (args["width"], args["height"]) == ("12", "6")
    assert np.array_equal(read_png(png), img)


def read_sixel(seq: str) -> np.ndarray:
    m = re.fullmatch(r'\x1bP0;1;0q"1;1;(\d+);(\d+)(.*)\x1b\\', seq, re.S)
    w, h, body = int(m.group(1)), int(m.group(2)), m.group(3)
    out = np.zeros((h, w, 3), np.int32) - 1
    palette, colour, x, y = {}, None, 0, 0
    for tok in re.finditer(r"#(\d+);2;(\d+);(\d+);(\d+)|#(\d+)|!(\d+)(.)|([?-~])|\$|-", body):
        t = tok.group(0)
        if tok.group(1):
            palette[int(tok.group(1))] = [int(tok.group(k)) for k in (2, 3, 4)]
        elif tok.group(5):
            colour = palette[int(tok.group(5))]
        elif t == "$":
            x = 0
        elif t == "-":
            x, y = 0, y + 6
        else:
            n, ch = (int(tok.group(6)), tok.group(7)) if tok.group(6) else (1, tok.group(8))
            bits = ord(ch) - 63
            for _ in range(n):
                for k in range(6):
                    if bits >> k & 1 and y + k < h:
                        out[y + k, x] = colour
                x += 1
    assert (out >= 0).all(), "every pixel painted"
    return out


def test_sixel_decodes_to_the_quantised_image():
    img = _img(13, 40, seed=2)
    img[:, 10:30] = [200, 40, 40]  # a long run: compressed as !n
    seq = terminal.sixel(img)
    assert "!20" in seq
    want = terminal.cube_rgb(terminal._cube(img)).astype(np.int32) * 100 // 255
    assert np.array_equal(read_sixel(seq), want)
    assert np.abs(terminal.cube_rgb(terminal._cube(img)).astype(int) - img).max() <= 26  # nearest cube level


def test_half_blocks_decode_to_the_image():
    img = _img(9, 6, seed=3)  # odd height: the last row is repeated
    lines = terminal.blocks(img, true_colour=True)
    assert len(lines) == 5
    top = np.zeros((5, 6, 3), int)
    bottom = np.zeros((5, 6, 3), int)
    for y, line in enumerate(lines):
        x, fg, bg = 0, None, None
        for m in re.finditer(r"\x1b\[38;2;(\d+);(\d+);(\d+);48;2;(\d+);(\d+);(\d+)m|\u2580|\x1b\[0m", line):
            if m.group(1):
                fg, bg = [int(m.group(k)) for k in (1, 2, 3)], [int(m.group(k)) for k in (4, 5, 6)]
            elif m.group(0) == "\u2580":
                top[y, x], bottom[y, x] = fg, bg
                x += 1
        assert x == 6
    padded = np.concatenate([img, img[-1:]])
    assert np.array_equal(top, padded[0::2]) and np.array_equal(bottom, padded[1::2])
    cube = terminal.blocks(img, true_colour=False)
    assert "38;5;" in cube[0] and "38;2;" not in cube[0]


class _Tty:
    def isatty(self):
        return True


@pytest.mark.parametrize("env,want", [
    ({"TERM": "xterm-kitty"}, "kitty"),
    ({"TERM": "xterm-256color", "KITTY_WINDOW_ID": "3"}, "kitty"),
    ({"TERM": "xterm-ghostty", "TERM_PROGRAM": "ghostty"}, "kitty"),
    ({"TERM": "xterm-256color", "TERM_PROGRAM": "iTerm.app"}, "iterm"),
    ({"TERM": "xterm-256color", "LC_TERMINAL": "iTerm2"}, "iterm"),
    ({"TERM": "xterm-256color", "TERM_PROGRAM": "WezTerm"}, "iterm"),
    ({"TERM": "foot"}, "sixel"),
    ({"TERM": "mlterm"}, "sixel"),
    ({"TERM": "xterm-256color"}, "blocks"),
    ({"TERM": "xterm-kitty", "TMUX": "/tmp/tmux-0/default,1,0"}, "blocks"),
    ({"TERM": "screen-256color"}, "blocks"),
    ({"TERM": "dumb"}, "none"),
    ({}, "none"),
])
def test_protocol_detection(env, want):
    assert terminal.detect(env, _Tty()) == want
    assert terminal.detect(env, open(os.devnull, "w")) == "none"  # not a terminal: nothing


def test_display_draws_in_place(tmp_path):
    out = tmp_path / "screen"
    with open(out, "w") as f:
        d = terminal.Display("blocks", f, max_cols=16, env={"COLORTERM": "truecolor"})
        d.show(_img(8, 8), "step 1/2")
        d.show(_img(8, 8, seed=5), "step 2/2")
        d.animate(np.stack([_img(8, 8, seed=k) for k in range(3)]), fps=1000, caption="final frames")
        d.close()
    text = out.read_text()
    assert text.count("\x1b7") == 1 and text.count("\x1b8") == 2 * 5 + 1  # reserved once, redrawn 5 times
    assert "step 2/2" in text and "final frames 3/3" in text and d.frames_drawn == 5
    with pytest.raises(ValueError):
        terminal.open_display("vt340", f)


# -- render --show ---------------------------------------------------------------------------------------------

def test_render_show_through_a_pipe(cache_home, eng, tmp_path):
    preview.load_map(eng)  # in the cache: the subprocesses do not fit again
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), COLUMNS="60", LINES="40")
    out = tmp_path / "a.mp4"
    proc = run("render", "-p", EVAL_PROMPTS[0], "--size", "64x64", "--steps", "6", "-o", out, "--show",
               "--preview-protocol", "blocks", "--preview-every", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 1000 and "fitting" not in proc.stderr
    for cap in ("step 2/5", "step 4/5", "step 5/5", "final frames 22/22"):
        assert cap in proc.stdout
    # reserved once; each image and its caption drawn in place (3 previews, 22 final frames); the two decoder
    # phases' captions; the cursor left below
    assert proc.stdout.count("\x1b7") == 1 and "\u2580" in proc.stdout
    assert proc.stdout.count("\x1b8") == 2 * (3 + 22) + 2 + 1
    assert proc.stdout.rstrip().splitlines()[-1].startswith(f"{out}: 22 frames 64x64")

    # auto on a pipe: one line says why there are no previews; the render goes on
    proc = run("render", "-p", EVAL_PROMPTS[0], "--size", "64x64", "--steps", "3", "-o", tmp_path / "b.mp4",
               "--show", env=env)
    assert proc.returncode == 0 and "\x1b" not in proc.stdout
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        "h3ctl: previews off: the output is not a terminal (or TERM is dumb); --preview-protocol forces one"]
    assert_clean_error(run("render", "-p", "x", "--preview-every", "0", "-o", tmp_path / "c.mp4"), "--preview-every")
    assert_clean_error(run("render", "-p", "x", "--preview-protocol", "vt340", "-o", tmp_path / "c.mp4"),
                       "--preview-protocol")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4", "b.mp4"]
