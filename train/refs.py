"""Ref2VA for h3-tiny (issue #15 item 5): the reference world, the prompts, the packed layout.

A Ref2VA request gives h3-tiny a *picture of the object* (its colour and shape) and, optionally, a *sound clip*
(its pitch); the prompt names neither, only the motion and the background::

    [<Picture 1>: <vision block>] [<Audio 1>: ] "the object in picture 1 moves right on a black background,
    the sound of audio 1"

so the render can only get the colour, the shape and the pitch from the references. Without an audio reference the
prompt says the sound in words (``", a high beep"`` / ``", silent"``), as the text-only captions do.

* Reference image: the object alone on the clip's background, centred (+- 12 px), its size drawn like the clip's,
  at the canvas size (128x128): h3-tiny's Ref2VA ``model_index.json`` sets ``reference_image_short_edge`` 128, so
  libh3 encodes it at that size (16 rows) and the vision tower sees it as the processor resizes it (256x256).
* Reference audio: the object's sound (``world._tone``) mono, ``int(F / 24 * 32000)`` samples (the truncation
  libh3 and diffusers apply), duplicated to stereo, zero-padded by the encoder to whole latents; posterior mode.
* Layout: diffusers' ``build_ref2va_packed_sequence`` (``[text | image rows | audio rows | target audio | target
  video]``, rotary clock L, +1 for the image, +T_a for the audio) and ``build_row_timesteps`` (image rows
  max(t, 0.999), audio rows 1.0).

Scenes are single-object training-split specs; held-out cases (``heldout_ref_cases``) use the held-out specs, whose
colour/shape or motion/sound pairs no training clip shows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import dit_core, world  # noqa: E402

REF_EDGE = 128
AUDIO_REF_PROMPT = "the sound of audio 1"


def ref_prompt(spec: world.Spec, audio_ref: bool) -> str:
    o = spec.objects[0]
    if audio_ref:
        sound = AUDIO_REF_PROMPT
    else:
        sound = "silent" if o.sound == "no sound" else f"a {o.sound}"
    return f"the object in picture 1 {o.motion} on a {spec.background} background, {sound}"


def ref_image(spec: world.Spec, rng: np.random.Generator, size: int = REF_EDGE) -> np.ndarray:
    """The object of a single-object spec alone on its background, uint8 [size, size, 3]."""
    o = spec.objects[0]
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[...] = np.asarray(world.BACKGROUND_RGB[spec.background], dtype=np.uint8)
    side = rng.uniform(*world._SIZE_FRAC) * size
    cx, cy = size / 2 + rng.uniform(-12, 12), size / 2 + rng.uniform(-12, 12)
    world._draw(img, o.shape, np.asarray(world.COLOUR_RGB[o.colour], dtype=np.float32), cx, cy, side / 2)
    return img


def ref_audio(sound: str, frames: int = 22, phase: float = 0.0) -> np.ndarray:
    """The sound alone, mono duplicated to stereo, float32 [2, int(frames / 24 * 32000)]."""
    n = int(frames / world.FPS * world.SAMPLE_RATE)
    t = np.arange(n, dtype=np.float64) / world.SAMPLE_RATE + phase
    # the level of a centred object's sound in a clip (equal-power pan at the centre)
    x = (world._TONE_AMP * world.pan_gains(0.5)[0] * world._tone(sound, t)).astype(np.float32)
    return np.stack([x, x])


def single(spec: world.Spec) -> world.Spec:
    return world.Spec(spec.background, spec.objects[:1])


def ref_item(i: int, seed: int, split: str = "train", frames: int = 22):
    """(spec, target clip, reference image, reference audio or None) of training item i."""
    spec, clip_seed = world.spec_item(i, seed, split)
    spec = single(spec)
    rng = np.random.default_rng(np.random.SeedSequence([0x4852, seed, i]))
    clip = world.make_clip(spec, 128, 128, frames, clip_seed)
    snd = spec.objects[0].sound
    audio = ref_audio(snd, frames, float(rng.uniform(0, 0.25))) if snd != "no sound" else None
    return spec, clip, ref_image(spec, rng), audio


@dataclass(frozen=True)
class RefCase:
    """A held-out Ref2VA request: spec k of ``world.heldout_specs()``; the audio reference when it sounds."""
    spec: world.Spec
    seed: int

    @property
    def audio_ref(self) -> bool:
        return self.spec.objects[0].sound != "no sound"

    @property
    def prompt(self) -> str:
        return ref_prompt(self.spec, self.audio_ref)

    def image(self) -> np.ndarray:
        return ref_image(self.spec, np.random.default_rng(self.seed))

    def audio(self) -> np.ndarray | None:
        return ref_audio(self.spec.objects[0].sound) if self.audio_ref else None


def heldout_ref_cases() -> list:
    """27 held-out requests (one per held-out spec), reference seeds 9000 + k (no training item uses them)."""
    return [RefCase(s, 9000 + k) for k, s in enumerate(world.heldout_specs())]


# ---------------------------------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------------------------------


class RefLayout(dit_core.Layout):
    """The packed layout of one image reference (8x8 latents) and optionally one audio reference (T_a latents), at
    the h3-tiny target shape, with the text tags of the presentation: ``dit_core.Layout``'s attributes (its
    ``row_slot`` 2 marks the image rows, 3 the audio reference rows; ``num_cond_audio_rows``)."""

    def __init__(self, text_tags, audio_ref: bool, device, num_latent_frames=7, latent_hw=8, num_audio=37):
        from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3Ref2VAPrepareLayoutStep

        tags = torch.as_tensor(list(text_tags), dtype=torch.long)
        refs = [SimpleNamespace(kind="image", has_audio=False)]
        audio_lat = []
        if audio_ref:
            refs.append(SimpleNamespace(kind="audio", has_audio=True))
            audio_lat = [torch.zeros(num_audio * dit_core.AUDIO_CHANNELS, 32)]
        cond = [torch.zeros(1, 24, 1, latent_hw, latent_hw)]
        packed = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
            tags, refs, cond, audio_lat, num_latent_frames, latent_hw, latent_hw, num_audio, dit_core.PATCH,
            dit_core.AUDIO_CHANNELS, dit_core.AUDIO_TAG, dit_core.VIDEO_TAG)
        self.anchors = ()
        self._set(packed, int(tags.shape[0]), device)
        self.shape = (num_latent_frames, latent_hw, latent_hw, num_audio)


def audio_ref_rows(z: torch.Tensor) -> torch.Tensor:
    """Normalised audio reference latents [B, 2, 32, T] -> channel-major rows [B, 2T, 32] (never noised)."""
    return dit_core.audio_to_rows(z)


def selftest() -> None:
    """Layout facts against the conditioning page: L text rows, image at clock L (+1), audio at L+1.. (+T_a),
    target from L + 1 + T_a; slots: image rows 2, audio ref rows 3."""
    L = 10
    lay = RefLayout([1] * L, True, "cpu")
    assert lay.num_cond_rows == 16 and lay.num_cond_audio_rows == 74, (lay.num_cond_rows, lay.num_cond_audio_rows)
    assert lay.seq_len == L + 16 + 74 + 74 + 7 * 16
    img = lay.video_indices[:16]
    assert (lay.position_ids[img, 0] == L).all() and (lay.row_slot[img] == 2).all()
    aref = lay.audio_indices[:74]
    assert (lay.row_slot[aref] == 3).all()
    tgt = lay.video_indices[16:]
    assert float(lay.position_ids[tgt, 0].min()) == L + 1 + 37, float(lay.position_ids[tgt, 0].min())
    lay2 = RefLayout([1] * L, False, "cpu")
    assert lay2.num_cond_audio_rows == 0 and float(lay2.position_ids[lay2.video_indices[16:], 0].min()) == L + 1
    print("refs selftest ok")


if __name__ == "__main__":
    selftest()
