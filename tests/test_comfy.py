"""The ComfyUI node pack, tested the way ComfyUI loads and runs nodes.

ComfyUI itself is not installable from the package index (the only `comfyui` there is a yanked 0.0.1 of a
third-party fork), so this follows its documented V1 node contract and its loader: `custom_nodes/<pkg>/__init__.py`
imported through importlib.util.spec_from_file_location, NODE_CLASS_MAPPINGS / NODE_DISPLAY_NAME_MAPPINGS read
from it; each node class instantiated and its FUNCTION called with the graph's inputs as keywords, the outputs a
tuple matching RETURN_TYPES. `comfy.utils` and `comfy.model_management` are fakes put into sys.modules with
ComfyUI's names and semantics (ProgressBar.update_absolute; interrupt_current_processing /
throw_exception_if_processing_interrupted raising InterruptProcessingException).
"""

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import types

import numpy as np
import pytest

from h3ctl.comfy import nodes as comfy_nodes
from tests.h3cli import assert_clean_error, run

PROMPT = "a red circle moves right on a black background, a high beep"


# -- fakes of ComfyUI's modules -------------------------------------------------------------------------------

class FakeComfy:
    def __init__(self):
        self.updates = []
        self.interrupt_when = None  # a predicate asked at each check: True presses Cancel
        self.checks = 0
        comfy = types.ModuleType("comfy")
        utils = types.ModuleType("comfy.utils")
        mm = types.ModuleType("comfy.model_management")
        fake = self

        class ProgressBar:
            def __init__(self, total, node_id=None):
                self.total, self.current = total, 0

            def update_absolute(self, value, total=None, preview=None):
                if total is not None:
                    self.total = total
                self.current = min(value, self.total)
                fake.updates.append((self.current, self.total, preview))

            def update(self, value):
                self.update_absolute(self.current + value)

        class InterruptProcessingException(Exception):
            pass

        state = {"flag": False}

        def interrupt_current_processing(value=True):
            state["flag"] = value

        def processing_interrupted():
            return state["flag"]

        def throw_exception_if_processing_interrupted():
            fake.checks += 1
            if fake.interrupt_when is not None and fake.interrupt_when():
                state["flag"] = True
                fake.interrupt_when = None
            if state["flag"]:
                state["flag"] = False
                raise InterruptProcessingException()

        utils.ProgressBar = ProgressBar
        mm.InterruptProcessingException = InterruptProcessingException
        mm.interrupt_current_processing = interrupt_current_processing
        mm.processing_interrupted = processing_interrupted
        mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
        comfy.utils, comfy.model_management = utils, mm
        self.modules = {"comfy": comfy, "comfy.utils": utils, "comfy.model_management": mm}
        self.Interrupt = InterruptProcessingException

    def install(self, monkeypatch):
        for name, mod in self.modules.items():
            monkeypatch.setitem(sys.modules, name, mod)
        return self


def load_like_comfyui(package_dir):
    """ComfyUI's load_custom_node for a folder module."""
    name = os.path.basename(package_dir)
    spec = importlib.util.spec_from_file_location(name, os.path.join(package_dir, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def execute(graph):
    """Run a graph {id: (class_type, inputs)} in the given (topological) order, as ComfyUI's executor does:
    literal inputs as they are, linked inputs [node_id, output_index] from earlier outputs."""
    results = {}
    for node_id, (class_type, inputs) in graph.items():
        cls = comfy_nodes.NODE_CLASS_MAPPINGS[class_type]
        kwargs = {k: (results[v[0]][v[1]] if isinstance(v, list) else v) for k, v in inputs.items()}
        out = getattr(cls(), cls.FUNCTION)(**kwargs)
        assert isinstance(out, tuple) and len(out) == len(cls.RETURN_TYPES)
        results[node_id] = out
    return results


def graph(seed=5, steps=4, width=64, height=64, frames=22, prompt=PROMPT):
    return {
        "1": ("H3ctlLoadModel", {"model_dir": "", "threads": 2}),
        "2": ("H3ctlEncodePrompt", {"model": ["1", 0], "prompt": prompt}),
        "3": ("H3ctlSample", {"model": ["1", 0], "conditioning": ["2", 0], "seed": seed, "steps": steps,
                              "width": width, "height": height, "frames": frames}),
        "4": ("H3ctlDecode", {"model": ["1", 0], "latent": ["3", 0]}),
    }


# -- install and load -------------------------------------------------------------------------------------------

def test_comfy_install_and_load_like_comfyui(tmp_path):
    root = tmp_path / "ComfyUI"
    (root / "custom_nodes").mkdir(parents=True)
    proc = run("comfy-install", root)
    assert proc.returncode == 0, proc.stderr
    pkg = root / "custom_nodes" / "h3ctl_nodes"
    assert proc.stdout.startswith(f"{pkg}: installed")
    assert run("comfy-install", root / "custom_nodes").returncode == 0  # again, into custom_nodes directly: updates

    # ComfyUI's Python may not have h3ctl installed: without site (.pth files unread) the file's path is used
    site = sysconfig.get_paths()["purelib"]
    code = ("import json, sys, importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('h3ctl_nodes', {str(pkg / '__init__.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['h3ctl_nodes'] = m; spec.loader.exec_module(m)\n"
            "print(json.dumps([sorted(m.NODE_CLASS_MAPPINGS), m.NODE_DISPLAY_NAME_MAPPINGS, m.__all__]))")
    env = dict(os.environ, PYTHONPATH=site)
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    names, display, exported = json.loads(out.stdout)
    assert names == sorted(comfy_nodes.NODE_CLASS_MAPPINGS) and set(display) == set(names)
    assert exported == ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]

    module = load_like_comfyui(str(pkg))
    assert module.NODE_CLASS_MAPPINGS is comfy_nodes.NODE_CLASS_MAPPINGS

    # a folder of the same name that h3ctl did not write is kept; bad targets are one line, exit 2
    other = tmp_path / "Other" / "custom_nodes" / "h3ctl_nodes"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("# someone else's\n")
    assert_clean_error(run("comfy-install", tmp_path / "Other"), "not written by h3ctl", "--overwrite")
    assert (other / "__init__.py").read_text() == "# someone else's\n"
    assert run("comfy-install", tmp_path / "Other", "--overwrite").returncode == 0
    assert_clean_error(run("comfy-install", tmp_path / "missing"), "no such folder")
    (tmp_path / "NotComfy").mkdir()
    assert_clean_error(run("comfy-install", tmp_path / "NotComfy"), "has no custom_nodes folder")


def test_node_contract():
    mappings = comfy_nodes.NODE_CLASS_MAPPINGS
    assert set(comfy_nodes.NODE_DISPLAY_NAME_MAPPINGS) == set(mappings)
    builtin = {"KSampler", "VAEDecode", "CLIPTextEncode", "EmptyMiniMaxH3LatentAV", "MiniMaxH3ImageToVideo"}
    assert not builtin & set(mappings)  # ComfyUI drops custom nodes that reuse a built-in name
    produced = set()
    for name, cls in mappings.items():
        spec = cls.INPUT_TYPES()
        assert set(spec) <= {"required", "optional", "hidden"} and "required" in spec
        assert isinstance(cls.RETURN_TYPES, tuple) and all(isinstance(t, str) for t in cls.RETURN_TYPES)
        assert len(cls.RETURN_NAMES) == len(cls.RETURN_TYPES)
        assert callable(getattr(cls, cls.FUNCTION)) and cls.CATEGORY == "h3ctl"
        params = set(cls.__dict__[cls.FUNCTION].__code__.co_varnames[1:cls.__dict__[cls.FUNCTION].__code__.co_argcount])
        assert params == set(spec["required"]) | set(spec.get("optional", {})), name
        for group in ("required", "optional"):
            for inp, decl in spec.get(group, {}).items():
                assert isinstance(decl, tuple) and isinstance(decl[0], str), (name, inp)
                opts = decl[1] if len(decl) > 1 else {}
                if decl[0] == "INT":  # what ComfyUI's validation checks for a widget's value
                    assert opts["min"] <= opts["default"] <= opts["max"], (name, inp)
                    assert (opts["default"] - opts["min"]) % opts.get("step", 1) == 0
        produced |= set(cls.RETURN_TYPES)
    for cls in mappings.values():  # every custom type an input takes is produced by some node
        for decl in cls.INPUT_TYPES()["required"].values():
            if decl[0].startswith("H3CTL_"):
                assert decl[0] in produced
    assert mappings["H3ctlDecode"].RETURN_TYPES == ("IMAGE", "AUDIO", "FLOAT")


# -- running a graph ---------------------------------------------------------------------------------------------

@pytest.fixture()
def fake(monkeypatch):
    return FakeComfy().install(monkeypatch)


def test_graph_runs_with_progress_and_matches_the_engine(fake):
    torch = pytest.importorskip("torch")
    res = execute(graph())
    images, audio, fps = res["4"]
    assert isinstance(images, torch.Tensor) and images.dtype == torch.float32
    assert tuple(images.shape) == (22, 64, 64, 3) and float(images.min()) >= 0 and float(images.max()) <= 1
    assert set(audio) == {"waveform", "sample_rate"} and audio["sample_rate"] == 32000 and fps == 24.0
    assert isinstance(audio["waveform"], torch.Tensor) and tuple(audio["waveform"].shape) == (1, 2, 29600)
    # sampling progress: one update per transformer evaluation, up to the total, in order
    denoise = [(c, t) for c, t, _ in fake.updates if t == 3]
    assert denoise == [(0, 3), (1, 3), (2, 3), (3, 3)]
    decode = [c for c, t, _ in fake.updates if t == 2000]
    assert decode and decode == sorted(decode) and decode[-1] == 2000
    assert fake.checks >= 3 + len(decode)  # the interrupt flag was consulted throughout

    # the same request through the Python API: the nodes decode the very same frames and sound
    eng = res["1"][0].engine
    ref = eng.render(PROMPT, 64, 64, 22, steps=4, seed=5)
    assert np.array_equal(np.round(images.numpy() * 255).astype(np.uint8), ref.frames)
    assert np.array_equal(audio["waveform"].numpy()[0], ref.audio)
    # the encode node filled the prompt cache that sampling then used
    cond = res["2"][0]
    assert cond["tokens"] == len(eng.prompt_tokens()) and cond["embeds"].shape[0] == cond["tokens"]

    # the model is loaded once and cached across runs (ComfyUI re-executes the loader for a new prompt id)
    again = execute({"1": ("H3ctlLoadModel", {"model_dir": "", "threads": 2})})
    assert again["1"][0].engine is eng


@pytest.mark.parametrize("where", ["encode", "sample", "decode"])
def test_interrupt_stops_the_node_and_the_engine_recovers(monkeypatch, where):
    fake = FakeComfy().install(monkeypatch)
    g = graph(steps=3, seed=11)
    first = execute({k: g[k] for k in ("1", "2", "3")})
    fake.updates.clear()
    fake.checks = 0
    fake.interrupt_when = {
        "encode": lambda: fake.checks >= 2,  # inside the text encoder (the first check is at the node's start)
        "sample": lambda: len(fake.updates) >= 2,  # after the first of the 29 denoising steps
        "decode": lambda: bool(fake.updates) and fake.updates[-1][0] >= 1000,  # audio done: in the video decoder
    }[where]
    node = {"encode": "2", "sample": "3", "decode": "4"}[where]
    cls_type, inputs = g[node]
    cls = comfy_nodes.NODE_CLASS_MAPPINGS[cls_type]
    kwargs = {k: (first[v[0]][v[1]] if isinstance(v, list) else v) for k, v in inputs.items()}
    if where == "sample":
        kwargs["steps"] = 30
    with pytest.raises(fake.Interrupt):
        getattr(cls(), cls.FUNCTION)(**kwargs)
    assert fake.interrupt_when is None  # it was pressed during the node
    if where == "encode":
        assert fake.checks == 2
    if where == "sample":
        assert [c for c, t, _ in fake.updates] == [0, 1]  # stopped at the next step, not after 29
    if where == "decode":
        assert fake.updates[-1][0] == 1000  # the audio was decoded, the video decoder stopped
    # after Cancel, the next queued run works on the same loaded engine
    res = execute(graph(steps=2, seed=1))
    assert tuple(res["4"][0].shape) == (22, 64, 64, 3)
    assert res["1"][0].engine is first["1"][0].engine


def test_without_comfy_or_torch_the_nodes_return_numpy(monkeypatch):
    for name in ("comfy", "comfy.utils", "comfy.model_management", "torch"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as outside ComfyUI without torch
    images, audio, fps = execute(graph(steps=2))["4"]
    assert isinstance(images, np.ndarray) and images.shape == (22, 64, 64, 3) and images.dtype == np.float32
    assert isinstance(audio["waveform"], np.ndarray) and audio["waveform"].shape == (1, 2, 29600)


def test_bad_requests_raise_before_any_work(fake):
    with pytest.raises(Exception, match="multiples of 32"):
        execute(graph(width=100))
    with pytest.raises(Exception, match="prompt is empty"):
        execute(graph(prompt="   "))
    assert not [u for u in fake.updates if u[1] != 2000]


def test_live_preview_reaches_the_progress_bar(fake, monkeypatch):
    """Per-step previews go to ProgressBar.update_absolute as ComfyUI's ("JPEG", PIL image, max size) tuple.
    (The map's quality is measured in test_preview; a fixed map stands in for it here.)"""
    from h3ctl import preview

    image = pytest.importorskip("PIL.Image")
    eng = comfy_nodes.load_engine("", 2).engine
    grey = np.zeros((25, 3), np.float32)
    grey[24] = 0.5
    monkeypatch.setattr(eng, "_h3ctl_preview_map", preview.PreviewMap(grey), raising=False)
    g = graph(steps=3)
    g["3"][1]["live_preview"] = True
    execute(g)
    steps = [(c, t) for c, t, _ in fake.updates if t == 2]
    assert steps == [(0, 2), (1, 2), (2, 2)]
    shots = [p for c, t, p in fake.updates if p is not None]
    assert len(shots) == 2
    fmt, img, size = shots[-1]
    assert fmt == "JPEG" and isinstance(img, image.Image) and img.size == (32, 32) and size == 512
    assert np.all(np.asarray(img) == 128)  # the map's mid grey, upscaled from the 4x4 latent frame
