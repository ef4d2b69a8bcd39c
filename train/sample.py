"""Render prompts with h3-tiny through diffusers, as the MiniMax-H3 modular pipeline does, and score them.

The loop is ``modular_pipelines/minimax_h3`` step by step, with the pipeline's own helpers: tokenizer(prompt,
add_special_tokens=False) -> Qwen3-VL ``hidden_states[cond_layer]`` -> ``build_packed_sequence`` -> video noise
``[1, 24, 7, 8, 8]`` then audio noise ``[74, 32]`` from one generator (PrepareLatents order) -> two
``MiniMaxH3Scheduler`` (shift 12 video, 3 audio), ``set_timesteps(steps)`` -> per step ``build_row_timesteps`` and one
``transformer(...)`` forward, ``scheduler.step`` per modality -> un-patchify, de-normalise, ``vae.decode`` (ImageNet
un-normalise, clamp) and ``audio_vae.decode`` with the stereo sides as two batch items. Only the two pipeline
properties that h3-tiny changes differ: ``text_encoder_layer`` (the checkpoint's ``minimax_h3_conditioning_layer``,
3, instead of 50) and the 5-15 s duration window (h3-tiny renders 22 frames = 0.92 s).

Note the scheduler's step convention: ``num_inference_steps=20`` is a 20-point sigma grid with the terminal 0, i.e.
19 transformer evaluations (the h3.c engine's ``--steps 20`` makes 20 evaluations on a 21-point grid).

FL2VA (``generate(..., keyframes=[...], anchors=("first", "last"))``): the fl2va workflow of the same pipeline.
The text is diffusers' FL2VA presentation through ``get_qwen3vl_prompt_embeds`` (``train/vision.py``: ``"<Picture
k>: "`` + vision block per keyframe, then the prompt; Qwen3-VL's published image processor); each keyframe goes
through diffusers' own ``encode_vae_condition`` (seed 42 posterior draw, fp16 round, normalisation); then from the
request generator one conditioning draw per keyframe (packed order), the video noise, the audio noise; the conditions
are noised with ``scheduler.scale_noise(z, 0.999, eps)`` and packed before the target rows; the layout is
``build_packed_sequence(..., keyframe_anchors)``, the row timesteps give the conditioning rows max(t, 0.999), and only
the target rows are stepped.

Sets: ``heldout`` / ``train`` (text-only, as before) and ``anchored`` (``world.heldout_anchor_cases``: held-out prompts
with the first, last or both frames of a reference clip; ``evaluate.check_anchored``).

    python -m train.sample --dit-run train/runs/dit --vae-run train/runs/vae --out train/runs/samples --eval
    python -m train.sample --official python/h3ctl/models/h3-tiny/FL2VA --out /tmp/s --eval
    python -m train.sample --official python/h3ctl/models/h3-tiny/FL2VA --dit-run R --out /tmp/s \
        --sets anchored,heldout          # a stage-7 run's EMA weights over the official partition (its VAEs)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import data, dit_core, evaluate, vision, world  # noqa: E402
from train import tokenizer as tk  # noqa: E402
from train.models import AUDIO_SHIFT, COND_LAYER, VIDEO_SHIFT  # noqa: E402


class Models:
    def __init__(self, transformer, text_encoder, video_vae, audio_vae, tokenizer_json, cond_layer):
        self.transformer, self.text_encoder = transformer, text_encoder
        self.video_vae, self.audio_vae = video_vae, audio_vae
        self.tokenizer = tk.load(tokenizer_json)
        self.cond_layer = int(cond_layer)

    def to(self, device, dit_dtype=torch.float32):
        self.transformer.to(device)
        if dit_dtype != torch.float32:  # released numerics: BF16 blocks, F32 islands (diffusers _keep_in_fp32_modules)
            keep = self.transformer._keep_in_fp32_modules
            for name, mod in self.transformer.named_modules():
                if mod is self.transformer or any(k in name.split(".")[0] for k in keep):
                    continue
                if len(list(mod.children())) == 0:
                    mod.to(dit_dtype)
        self.text_encoder.to(device, dtype=dit_dtype)  # released text encoder: BF16
        for m in (self.video_vae, self.audio_vae):
            m.to(device)
        self.device = torch.device(device)
        return self


def load_from_runs(dit_run: Path, vae_run: Path, ema: bool = True) -> Models:
    from train.common import load_weights
    from train.latent_stats import load_vaes
    from train.models import build_text_encoder, build_transformer

    tok_json = (Path(dit_run) / "tokenizer.json").read_text()
    stats = json.loads((Path(dit_run) / "latent_stats.json").read_text())
    dit, te = build_transformer(), build_text_encoder(tok_json)
    sfx = "_ema" if ema else ""
    dit.load_state_dict(load_weights(dit_run, "dit", "transformer" + sfx))
    te.load_state_dict(load_weights(dit_run, "dit", "text_encoder" + sfx))
    vv, av = load_vaes(vae_run, "cpu", stats)
    for m in (dit, te):
        m.eval().requires_grad_(False)
    return Models(dit, te, vv, av, tok_json, COND_LAYER)


def load_official(partition_dir: Path, dit_run: Path | None = None, ema: bool = True,
                  video_vae_weights: Path | None = None) -> Models:
    """An official partition; with ``dit_run``, its transformer and text encoder replaced by the run's (EMA) weights
    (a stage-7 fine-tune keeps the partition's VAEs, statistics and tokenizer); with ``video_vae_weights``, its video
    VAE's weights replaced by a diffusers-layout state dict (stage 8's fine-tuned decoder)."""
    from tests.fixtures.official import conditioning_layer, read_official_to_diffusers

    m = read_official_to_diffusers(partition_dir)
    if video_vae_weights is not None:
        from safetensors.torch import load_file

        vv = m["video_vae"]
        dt = next(vv.parameters()).dtype
        # the decoder side only (stage 8 trains post_quant_conv + decoder); the encoder stays the partition's
        missing, unexpected = vv.load_state_dict({k: v.to(dt) for k, v in load_file(str(video_vae_weights)).items()},
                                                 strict=False)
        if unexpected or any(k.startswith(("decoder.", "post_quant_conv.")) for k in missing):
            raise SystemExit(f"{video_vae_weights}: not a video VAE decoder state dict")
    if dit_run is not None:
        from train.common import load_weights

        sfx = "_ema" if ema else ""
        m["transformer"].load_state_dict(load_weights(Path(dit_run), "dit", "transformer" + sfx))
        m["text_encoder"].load_state_dict(load_weights(Path(dit_run), "dit", "text_encoder" + sfx))
    for k in ("transformer", "text_encoder", "video_vae", "audio_vae"):
        m[k].eval().requires_grad_(False)
    return Models(m["transformer"], m["text_encoder"], m["video_vae"], m["audio_vae"], m["tokenizer_json"],
                  conditioning_layer(m["text_encoder"]))


@torch.no_grad()
def generate(models: Models, prompt: str, steps: int = 20, seed: int = 42, return_latents: bool = False,
             keyframes: list | None = None, anchors: tuple = ()):
    """-> (frames uint8 [22, 128, 128, 3], audio float32 [2, 29600]). ``keyframes``: uint8 [128, 128, 3] images in
    packed order with ``anchors`` naming the end each one anchors ("first" / "last"): the fl2va workflow."""
    from diffusers import MiniMaxH3Scheduler

    dev = models.device
    keyframes = list(keyframes or [])
    if len(keyframes) != len(anchors):
        raise ValueError("one anchor name per keyframe")
    te_dtype = next(models.text_encoder.parameters()).dtype
    if keyframes:
        text, tags, ids = vision.diffusers_prompt_embeds(models.text_encoder, models.tokenizer, prompt, keyframes,
                                                         models.cond_layer, device=dev, dtype=te_dtype)
        lay = dit_core.Layout(len(ids), dev, anchors=tuple(anchors), text_tags=tags)
    else:
        ids = models.tokenizer.encode(prompt, add_special_tokens=False).ids
        if not ids:  # an empty prompt becomes the single pad token (as h3.c does)
            ids = [models.tokenizer.token_to_id("<|endoftext|>")]
        input_ids = torch.tensor([ids], device=dev)
        text = dit_core.encode_text(models.text_encoder, input_ids, models.cond_layer).to(te_dtype)
        lay = dit_core.Layout(len(ids), dev)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    sched_v, sched_a = MiniMaxH3Scheduler(shift=VIDEO_SHIFT), MiniMaxH3Scheduler(shift=AUDIO_SHIFT)
    cond_rows = []
    if keyframes:
        from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

        vae = models.video_vae
        conds = [encode_vae_condition(vae, torch.from_numpy(np.ascontiguousarray(k)).to(dev).permute(2, 0, 1)[
            None, :, None], data.IMAGENET_MEAN, data.IMAGENET_STD, 42) for k in keyframes]
        for c in conds:  # one draw per condition, in packed order, before the target noise
            eps = torch.randn(c.shape, generator=gen, device=dev, dtype=torch.float32)
            noised = sched_v.scale_noise(c.to(dev), dit_core.KEYFRAME_NOISE_AUG, eps)
            cond_rows.append(dit_core.patchify(noised)[0])
    n_cond = sum(r.shape[0] for r in cond_rows)
    assert n_cond == lay.num_cond_rows
    noise_v = torch.randn((1, 24, *lay.shape[:3]), generator=gen, device=dev, dtype=torch.float32)
    latents = torch.cat(cond_rows + [dit_core.patchify(noise_v)[0]])           # [n_cond + 112, 96]
    audio = torch.randn((lay.shape[3] * 2, 32), generator=gen, device=dev, dtype=torch.float32)
    sched_v.set_timesteps(steps, device=dev)
    sched_a.set_timesteps(steps, device=dev)
    for i, t in enumerate(sched_v.timesteps):
        u, idx = lay.row_timesteps(float(t), float(sched_a.timesteps[i]))
        pv, pa = models.transformer(hidden_states=latents[None], audio_hidden_states=audio[None],
                                    encoder_hidden_states=text, timestep=u, timestep_indices=idx,
                                    return_dict=False, **lay.kwargs())
        latents[n_cond:] = sched_v.step(pv[0, n_cond:].float(), t, latents[n_cond:], return_dict=False)[0]
        audio = sched_a.step(pa[0].float(), sched_a.timesteps[i], audio, return_dict=False)[0]
    latents = latents[n_cond:]
    zv = dit_core.unpatchify(latents[None])
    za = dit_core.rows_to_audio(audio[None])[0]                               # [2, 32, 37]
    vcfg, acfg = models.video_vae.config, models.audio_vae.config
    zv = zv * torch.tensor(vcfg.latents_std, device=dev).view(1, -1, 1, 1, 1) + torch.tensor(
        vcfg.latents_mean, device=dev).view(1, -1, 1, 1, 1)
    video = models.video_vae.decode(zv, return_dict=False)[0]
    video = data.imagenet_denormalize(video.float()).clamp(0, 1)[0]           # [3, 22, 128, 128]
    frames = (video.permute(1, 2, 3, 0) * 255).round().to(torch.uint8).cpu().numpy()
    za = za * torch.tensor(acfg.latents_std, device=dev).view(1, -1, 1) + torch.tensor(
        acfg.latents_mean, device=dev).view(1, -1, 1)
    wav = models.audio_vae.decode(za, return_dict=False)[0].float()[:, 0].cpu().numpy()   # [2, S]
    if return_latents:
        return frames, wav, (latents, audio)
    return frames, wav


def contact_sheet(rows: list, path: Path, frames_idx=(0, 5, 10, 15, 21)) -> None:
    from PIL import Image

    H, W = rows[0].shape[1:3]
    sheet = np.zeros((len(rows) * H, len(frames_idx) * W, 3), np.uint8)
    for r, fr in enumerate(rows):
        for c, f in enumerate(frames_idx):
            sheet[r * H:(r + 1) * H, c * W:(c + 1) * W] = fr[f]
    Image.fromarray(sheet).save(path)


def write_wav(path: Path, audio: np.ndarray, sr: int = world.SAMPLE_RATE) -> None:
    import wave

    pcm = (np.clip(audio.T, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def prompt_set(name: str, n: int):
    """[(spec, prompt text, anchor case or None)]: held-out single-object specs (both caption forms alternating),
    training specs, or the anchored held-out cases (``world.heldout_anchor_cases``)."""
    if name == "anchored":
        return [(c.spec, c.prompt, c) for c in world.heldout_anchor_cases(min(n, len(world.heldout_specs())))]
    if name == "heldout":
        specs = world.heldout_specs()
    else:
        specs = [s for s in world.iter_specs(4 * n + 50, seed=999, split="train") if len(s.objects) == 1]
    out = []
    for k, s in enumerate(specs[:n]):
        out.append((s, world.caption_line(s) if k % 2 == 0 else world.caption_ir(s), None))
    return out


@torch.no_grad()
def vae_roundtrip(models: Models, frames: np.ndarray) -> np.ndarray:
    """The video VAE's reconstruction of a rendered clip (posterior mean): the ceiling of any anchor PSNR."""
    dev = models.device
    x = data.imagenet_normalize(data.frames_to_pixels(torch.from_numpy(frames[None]).to(dev)))
    z = models.video_vae.encode(x).latent_dist.mean
    video = data.imagenet_denormalize(models.video_vae.decode(z, return_dict=False)[0].float()).clamp(0, 1)[0]
    return (video.permute(1, 2, 3, 0) * 255).round().to(torch.uint8).cpu().numpy()


def run(models: Models, out: Path, sets=("heldout", "train"), n: int = 27, steps: int = 20, seed: int = 42,
        sheet_rows: int = 9, log=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    keep_frames, keep_audio, keep_prompts = [], [], []
    for set_name in sets:
        results = []
        rows = []
        t0 = time.time()
        for k, (spec, prompt, case) in enumerate(prompt_set(set_name, n)):
            if case is None:
                frames, wav = generate(models, prompt, steps=steps, seed=seed + k)
                r = evaluate.check(spec, frames, wav)
            else:
                ref = case.clip()
                kfs = [ref.frames[0] if a == "first" else ref.frames[-1] for a in case.anchors]
                frames, wav = generate(models, prompt, steps=steps, seed=seed + k, keyframes=kfs,
                                       anchors=case.anchors)
                r = evaluate.check_anchored(spec, frames, wav, ref.frames, case.anchors,
                                            ceiling_frames=vae_roundtrip(models, ref.frames))
                r["mode"] = case.mode
            r["prompt"] = prompt
            results.append(r)
            if len(rows) < sheet_rows:
                rows.append(frames)
            if set_name in ("heldout", "anchored") and k < 6:
                keep_frames.append(frames)
            keep_audio.append(wav.astype(np.float16))
            keep_prompts.append(f"{set_name}: {prompt}")
        summ = evaluate.summarize(results)
        extra = ""
        if set_name == "anchored":
            summ["anchor"] = evaluate.summarize(results, evaluate.is_anchor_check)
            summ["text"] = evaluate.summarize(results, lambda c: not evaluate.is_anchor_check(c))
            summ["by_mode"] = {m: evaluate.summarize([r for r in results if r["mode"] == m])["pass_rate"]
                               for m in world.ANCHOR_MODES if any(r["mode"] == m for r in results)}
            # mean anchor PSNR against the video VAE's own ceiling (its reconstruction of the reference frame)
            summ["psnr"] = {f"{a}{suffix}": float(np.mean(v)) for a in ("first", "last") for suffix in ("", "_ceiling")
                            if (v := [r["measures"][f"{a}_psnr{suffix}"] for r in results
                                      if f"{a}_psnr{suffix}" in r["measures"]])}
            extra = (f"; anchor checks {summ['anchor']['pass_rate']:.3f}, text checks {summ['text']['pass_rate']:.3f},"
                     f" by mode {json.dumps({m: round(v, 3) for m, v in summ['by_mode'].items()})}, mean PSNR (VAE "
                     f"ceiling) {json.dumps({k: round(v, 1) for k, v in summ['psnr'].items()})}")
        log(f"[sample] {set_name}: {summ['per_check']} pass rate {summ['pass_rate']:.3f}{extra} "
            f"({time.time() - t0:.1f}s for {len(results)} clips)")
        for r in results:
            fails = [k for k, v in r["checks"].items() if not v]
            if fails:
                log(f"   FAIL {fails}: {r['prompt'].splitlines()[0]} :: {json.dumps(r['measures'])[:300]}")
        report[set_name] = {"summary": summ, "results": results}
        contact_sheet(rows, out / f"sheet_{set_name}.png")
    if keep_frames:
        np.savez_compressed(out / "samples.npz", frames=np.stack(keep_frames), audio=np.stack(keep_audio),
                            prompts=np.array(keep_prompts))
    (out / "eval.json").write_text(json.dumps(report, indent=1, default=float))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dit-run", default="train/runs/dit")
    ap.add_argument("--vae-run", default="train/runs/vae")
    ap.add_argument("--official", default=None, help="load an exported official partition dir instead; with "
                    "--over-run, only its VAEs / tokenizer and the run's transformer + text encoder")
    ap.add_argument("--video-vae-weights", default=None, help="with --official: a diffusers-layout video VAE state "
                    "dict (safetensors) over the partition's (stage 8)")
    ap.add_argument("--over-run", action="store_true", help="with --official: the --dit-run weights over it")
    ap.add_argument("--out", default="train/runs/samples")
    ap.add_argument("--sets", default="heldout,train")
    ap.add_argument("--n", type=int, default=27)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--bf16", action="store_true", help="DiT blocks in BF16 (the released numerics)")
    ap.add_argument("--raw", action="store_true", help="use the raw (non-EMA) weights")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt", default=None, help="render one prompt to --out (png + wav) and exit")
    args = ap.parse_args(argv)
    from train.common import device_of

    dev = device_of(args.device)
    if args.official:
        models = load_official(Path(args.official), Path(args.dit_run) if args.over_run else None, ema=not args.raw,
                               video_vae_weights=Path(args.video_vae_weights) if args.video_vae_weights else None)
    else:
        models = load_from_runs(Path(args.dit_run), Path(args.vae_run), ema=not args.raw)
    models.to(dev, torch.bfloat16 if args.bf16 else torch.float32)
    out = Path(args.out)
    if args.prompt:
        out.mkdir(parents=True, exist_ok=True)
        frames, wav = generate(models, args.prompt, args.steps, args.seed)
        contact_sheet([frames], out / "prompt.png")
        write_wav(out / "prompt.wav", wav)
        return 0
    run(models, out, tuple(args.sets.split(",")), args.n, args.steps, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
