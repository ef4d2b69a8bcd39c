"""Bad model directories and files: one clear line naming the file and the problem, exit 2, no traceback.

Each case copies a good tiny checkpoint, breaks one thing, and runs `h3ctl info` (headers, configs and the
tensor schema) or `h3ctl check` (which also requires every component of a render).
"""

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from tests.h3cli import assert_clean_error, run


def read_st(path: Path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_st(path: Path, header, data: bytes, raw_header: str | None = None):
    text = raw_header if raw_header is not None else json.dumps(header)
    hb = text.encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


def edit_header(path: Path, fn):
    header, data = read_st(path)
    fn(header)
    write_st(path, header, data)


def dit_file(p: Path) -> Path:
    return sorted((p / "transformer").glob("*.safetensors"))[0]


def te_shards(p: Path):
    return sorted((p / "text_encoder").glob("model-*.safetensors"))


def tensors(header):
    return [k for k in header if k != "__metadata__"]


# ---- the breakages -------------------------------------------------------------------------------

def truncated_shard(p):
    f = dit_file(p)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "info", [f.name, "truncated"]


def header_length_past_file(p):
    f = dit_file(p)
    raw = bytearray(f.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) + 100)
    f.write_bytes(bytes(raw))
    return "info", [f.name, "header length", "runs past the end"]


def overlapping_spans(p):
    f = dit_file(p)
    def fn(h):
        a, b = tensors(h)[:2]
        h[b]["data_offsets"] = list(h[a]["data_offsets"])
        h[b]["dtype"], h[b]["shape"] = h[a]["dtype"], h[a]["shape"]
    edit_header(f, fn)
    return "info", [f.name, "overlap"]


def span_out_of_range(p):
    f = p / "audio_vae" / "model.safetensors"
    def fn(h):
        k = tensors(h)[-1]
        b, e = h[k]["data_offsets"]
        h[k]["data_offsets"] = [b + 4096, e + 4096]
    edit_header(f, fn)
    return "info", ["model.safetensors", "runs past the data area"]


def unknown_dtype(p):
    f = p / "video_vae" / "source" / "model.safetensors"
    edit_header(f, lambda h: h[tensors(h)[0]].update(dtype="F33"))
    return "info", ["model.safetensors", "unknown dtype 'F33'"]


def wrong_dtype_known_tensor(p):
    f = dit_file(p)
    edit_header(f, lambda h: h["video_patch_proj.weight"].update(dtype="I32"))
    return "info", [f.name, "video_patch_proj.weight", "is I32, expected a float type"]


def wrong_shape_known_tensor(p):
    f = dit_file(p)
    edit_header(f, lambda h: h["condition_proj.weight"].update(shape=h["condition_proj.weight"]["shape"][::-1]))
    return "info", [f.name, "condition_proj.weight", "has shape", "the config implies"]


def missing_tensor(p):
    f = dit_file(p)
    def fn(h):
        # rename keeps the file well formed; the schema then misses the original name
        h["final_layer.norm.weight_renamed"] = h.pop("final_layer.norm.weight")
    edit_header(f, fn)
    return "info", ["final_layer.norm.weight", "is missing"]


def duplicate_name_in_header(p):
    f = dit_file(p)
    header, data = read_st(f)
    names = tensors(header)
    a, b = names[0], names[1]
    text = json.dumps(header).replace(json.dumps(b) + ":", json.dumps(a) + ":", 1)
    write_st(f, None, data, raw_header=text)
    return "info", [f.name, "appears twice"]


def duplicate_name_across_shards(p):
    shards = te_shards(p)
    (p / "text_encoder" / "model.safetensors.index.json").unlink()
    first = tensors(read_st(shards[0])[0])[0]
    def fn(h):
        k = tensors(h)[0]
        h[first] = h.pop(k)
    edit_header(shards[1], fn)
    return "info", [first, "duplicate name across shards"]


def missing_component(p):
    shutil.rmtree(p / "video_vae")
    return "check", ["video_vae", "is missing"]


def file_instead_of_directory(p):
    return ("info", ["is a file, expected a model directory"], p / "transformer" / "config.json")


def unreadable_shard(p):
    f = p / "audio_vae" / "model.safetensors"
    f.unlink()
    f.mkdir()  # a folder where a file should be: cannot be read as one
    return "info", ["model.safetensors", "not a regular file"]


def dangling_shard_link(p):
    f = te_shards(p)[1]
    f.unlink()
    os.symlink(p / "nowhere.safetensors", f)
    return "info", [f.name, "is missing"]


def malformed_config_json(p):
    f = p / "transformer" / "config.json"
    f.write_text(f.read_text()[:-5])
    return "info", ["config.json", "malformed JSON", "line"]


def malformed_index_json(p):
    f = p / "text_encoder" / "model.safetensors.index.json"
    f.write_text('{"weight_map": {"a": ')
    return "info", ["model.safetensors.index.json", "malformed JSON"]


def index_names_wrong_shard(p):
    f = p / "text_encoder" / "model.safetensors.index.json"
    idx = json.loads(f.read_text())
    shards = sorted(set(idx["weight_map"].values()))
    name = next(k for k, v in idx["weight_map"].items() if v == shards[0])
    idx["weight_map"][name] = shards[1]
    f.write_text(json.dumps(idx))
    return "info", [name, "is listed in", "but stored in"]


def config_missing_key(p):
    f = p / "transformer" / "config.json"
    cfg = json.loads(f.read_text())
    del cfg["hidden_size"]
    f.write_text(json.dumps(cfg))
    return "info", ["config.json", 'missing integer "hidden_size"']


def config_wrong_type(p):
    f = p / "video_vae" / "config.json"
    cfg = json.loads(f.read_text())
    cfg["latents_std"][3] = -1.0
    f.write_text(json.dumps(cfg))
    return "info", ["config.json", "latents_std", "positive"]


def empty_shard(p):
    f = p / "audio_vae" / "model.safetensors"
    f.write_bytes(b"")
    return "info", ["model.safetensors", "too short"]


def trailing_garbage(p):
    f = p / "video_vae" / "source" / "model.safetensors"
    with open(f, "ab") as fh:
        fh.write(b"\0" * 12)
    return "info", ["model.safetensors", "trailing bytes"]


def diffusers_format_dir(p):
    d = p.parent / "diffusers_layout"
    (d / "vae").mkdir(parents=True)
    (d / "transformer").mkdir()
    (d / "model_index.json").write_text(json.dumps({"_class_name": "MiniMaxH3Pipeline", "vae": ["diffusers", "AutoencoderKLMiniMaxH3"]}))
    return ("info", ["diffusers-format", "official"], d)


def no_such_directory(p):
    return ("info", ["no such directory"], p / "does-not-exist")


def not_a_model_directory(p):
    d = p.parent / "random"
    d.mkdir()
    (d / "notes.txt").write_text("hi")
    return ("info", ["not a MiniMax-H3 model directory", "notes.txt"], d)


CASES = [truncated_shard, header_length_past_file, overlapping_spans, span_out_of_range, unknown_dtype,
         wrong_dtype_known_tensor, wrong_shape_known_tensor, missing_tensor, duplicate_name_in_header,
         duplicate_name_across_shards, missing_component, file_instead_of_directory, unreadable_shard,
         dangling_shard_link, malformed_config_json, malformed_index_json, index_names_wrong_shard,
         config_missing_key, config_wrong_type, empty_shard, trailing_garbage, diffusers_format_dir,
         no_such_directory, not_a_model_directory]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    from tests.fixtures import make_checkpoint

    part = make_checkpoint(tmp_path_factory.mktemp("good"), "tiny", seed=3, dtype="official")
    assert run("check", part.parent).returncode == 0
    return part.parent


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input(case, good, tmp_path):
    root = tmp_path / "model"
    shutil.copytree(good, root, symlinks=True)
    spec = case(root / "FL2VA")
    command, needles = spec[0], spec[1]
    target = spec[2] if len(spec) > 2 else root
    before = sorted(str(q) for q in tmp_path.rglob("*"))
    proc = run(command, "-d", target) if command == "info" else run(command, target)
    assert_clean_error(proc, *needles)
    assert sorted(str(q) for q in tmp_path.rglob("*")) == before  # nothing written


def test_bad_safetensors_file_check(tmp_path):
    f = tmp_path / "x.safetensors"
    f.write_bytes(struct.pack("<Q", 2) + b"{]")
    assert_clean_error(run("check", f), "x.safetensors", "malformed safetensors header")


def test_impossible_memory_estimate_shape(good):
    assert_clean_error(run("info", "-d", good, "--width", "0"), "positive")


# ---- keyframe images (h3ctl render --first-frame / --last-frame) ---------------------------------------------

def _still(tmp, name, size=(64, 48), **kw):
    from PIL import Image

    p = tmp / name
    Image.linear_gradient("L").resize(size).convert("RGB").save(p, **kw)
    return p


def kf_missing(tmp):
    return tmp / "nope.png", ["nope.png", "no such file"]


def kf_directory(tmp):
    (tmp / "dir.png").mkdir()
    return tmp / "dir.png", ["dir.png", "is a directory"]


def kf_empty(tmp):
    (tmp / "empty.png").write_bytes(b"")
    return tmp / "empty.png", ["empty.png", "empty"]


def kf_random_bytes(tmp):
    (tmp / "noise.jpg").write_bytes(bytes(range(256)) * 8)
    return tmp / "noise.jpg", ["noise.jpg", "not an image"]


def kf_text(tmp):
    (tmp / "notes.webp").write_text("not a picture\n")
    return tmp / "notes.webp", ["notes.webp", "not an image"]


def kf_truncated_png(tmp):
    p = _still(tmp, "cut.png")
    p.write_bytes(p.read_bytes()[:-40])
    return p, ["cut.png"]


def kf_truncated_jpeg(tmp):
    p = _still(tmp, "cut.jpg", quality=90)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return p, ["cut.jpg", "truncated"]


def kf_truncated_webp(tmp):
    p = _still(tmp, "cut.webp", lossless=True)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return p, ["cut.webp"]


def kf_animated(tmp):
    from PIL import Image

    p = tmp / "anim.gif"
    frames = [Image.new("RGB", (40, 40), c) for c in ("red", "blue")]
    frames[0].save(p, save_all=True, append_images=frames[1:])
    return p, ["anim.gif", "animated"]


def kf_aspect(tmp):
    return _still(tmp, "strip.png", size=(200, 40)), ["strip.png", "200x40", "1:4 to 4:1"]


def kf_too_large(tmp):
    from PIL import Image

    p = tmp / "huge.png"
    Image.new("1", (9000, 8000)).save(p)
    return p, ["huge.png", "9000x8000", "megapixels"]


KF_CASES = [kf_missing, kf_directory, kf_empty, kf_random_bytes, kf_text, kf_truncated_png, kf_truncated_jpeg,
            kf_truncated_webp, kf_animated, kf_aspect, kf_too_large]


@pytest.mark.parametrize("case", KF_CASES, ids=[c.__name__ for c in KF_CASES])
@pytest.mark.parametrize("flag", ["--first-frame", "--last-frame"])
def test_bad_keyframe_image(case, flag, tmp_path):
    image, needles = case(tmp_path)
    out = tmp_path / "out.mp4"
    before = sorted(str(q) for q in tmp_path.rglob("*"))
    proc = run("render", "-p", "a red circle", flag, image, "-o", out, "-q")
    assert_clean_error(proc, flag.strip("-").replace("-", " "), *needles)
    assert sorted(str(q) for q in tmp_path.rglob("*")) == before  # nothing written


def _without(src: Path, dst: Path, component: str, prefix: str) -> Path:
    """A copy of a model whose `component` shards lack every tensor starting with `prefix`."""
    shutil.copytree(src, dst, symlinks=True)
    folder = dst / "FL2VA" / component
    for f in folder.rglob("*.safetensors"):
        header, data = read_st(f)
        kept, blob = {k: v for k, v in header.items() if k == "__metadata__"}, b""
        for k in tensors(header):
            if not k.startswith(prefix):  # repacked: the data area stays gap-free
                b, e = header[k]["data_offsets"]
                kept[k] = {**header[k], "data_offsets": [len(blob), len(blob) + e - b]}
                blob += data[b:e]
        f.unlink()  # a symlinked shard is replaced, never written through
        write_st(f, kept, blob)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        idx = json.loads(index.read_text())
        idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if not k.startswith(prefix)}
        index.write_text(json.dumps(idx))
    return dst


@pytest.mark.parametrize("component,prefix,needle", [("video_vae", "encoder.", "no encoder weights"),
                                                     ("text_encoder", "model.visual.", "no vision tower")])
def test_keyframes_need_encoder_weights(component, prefix, needle, good, tmp_path):
    model = _without(good, tmp_path / "model", component, prefix)
    image = _still(tmp_path, "k.png")
    out = tmp_path / "out.mp4"
    proc = run("render", "-d", model, "-p", "a red circle", "--first-frame", image, "-o", out, "-q",
               "--size", "64x64")
    assert_clean_error(proc, needle)
    assert not out.exists()
    # a text-only render of the same model still works
    assert run("render", "-d", model, "-p", "a red circle", "-o", out, "-q", "--size", "64x64",
               "--steps", "2").returncode == 0
