"""Stage 2: train the h3-tiny text encoder (Qwen3-VL, from scratch) and DiT jointly with the H3 flow-matching objective.

Objective, exactly as inference uses the model (diffusers ``MiniMaxH3Scheduler`` / ``denoise.py``):

* ``x_sigma = (1 - sigma) * x0 + sigma * eps``; the network predicts the data-ward velocity ``v = x0 - eps``; it is
  conditioned on ``t = 1 - sigma`` per modality (video rows and text rows read the video t, audio rows the audio t);
* sigma distributions follow the serving schedules: a base ``u ~ U(0, 1)`` is pushed through the video shift 12 and the
  audio shift 3 (``s u / (1 + (s - 1) u)``); with probability ``--p-coupled`` both modalities share ``u`` (inference
  walks both schedules on one base grid), otherwise they are drawn independently; with probability ``--p-unshifted``
  the base value is used unshifted (coverage of low sigma, where the last sampling steps land);
* loss = MSE(video velocity) + MSE(audio velocity), per-element means;
* the packed sequence comes from diffusers' ``build_packed_sequence`` / ``build_row_timesteps`` / patchify
  (``train/dit_core.py``), text = ``hidden_states[cond_layer]`` of the Qwen3-VL language model on
  ``tokenizer(prompt, add_special_tokens=False)`` (no chat template), captions mixed 50/50 one-line / Context-IR.

Data: ``--clips`` training-split clips (``world.dataset_item(i, --data-seed, "train")``) rendered and encoded once per
run with the stage-1 VAEs, normalised with ``latent_stats.json``; cached in the run directory. Batches are drawn from
one caption-length bucket at a time (the packed layout depends on the text length; diffusers' forward shares one
layout per batch). EMA weights are kept and are what gets exported. Resumable and time-budgeted.

    python -m train.train_dit --run train/runs/dit --vae-run train/runs/vae --clips 32000 --minutes 7

FL2VA anchors (stage 7, ``--anchor-probs``): each batch is text-only or anchored on the first frame, the last frame or
both (one mode per batch: diffusers' forward shares one layout per batch), drawn with the given probabilities. An
anchored batch is what diffusers' fl2va workflow feeds the DiT: the text encoder sees ``"<Picture k>: "`` + a vision
block per keyframe before the prompt, with the keyframes through Qwen3-VL's vision tower (``train/vision.py``); the
keyframe latents (the clip's own first / last frame through the video VAE's spatial encoder, posterior sampled with
the seed-42 draw, fp16-rounded, normalised: ``data.encode_keyframes`` = ``encode_vae_condition``) are noised to
t = 0.999 and packed before the target rows at rotary time L / L + (5/3)(F-1), timestep max(t_video, 0.999)
(``dit_core.Layout`` / ``condition_rows``); the loss covers only the target rows. ``--init-official`` starts from an
exported official partition (the shipped h3-tiny) and takes its VAEs, statistics and tokenizer; ``--te-train``
chooses which text-encoder weights train (``vision``: only the vision tower, so text-only conditioning is unchanged).

    python -m train.train_dit --run R --init-official python/h3ctl/models/h3-tiny/FL2VA \
        --anchor-probs 0.3,0.25,0.15,0.3 --te-train vision --clips 10000 --minutes 4
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import data, dit_core, vision, world  # noqa: E402
from train import tokenizer as tk  # noqa: E402
from train.common import Budget, Logger, Saver, StepStats, device_of, fast_cuda, load_state  # noqa: E402
from train.common import lr_at, optimizer_step, seed_all  # noqa: E402
from train.models import (  # noqa: E402
    AUDIO_SHIFT,
    COND_LAYER,
    VIDEO_SHIFT,
    build_text_encoder,
    build_transformer,
    init_dit_,
)

NAME = "dit"


def shift_sigma(u: torch.Tensor, s: float) -> torch.Tensor:
    return s * u / (1 + (s - 1) * u)


def sample_sigmas(b: int, device, gen, p_coupled: float, p_unshifted: float, p_high: float = 0.0):
    u_v = torch.rand(b, device=device, generator=gen)
    u_a = torch.where(torch.rand(b, device=device, generator=gen) < p_coupled, u_v,
                      torch.rand(b, device=device, generator=gen))
    raw = torch.rand(b, device=device, generator=gen) < p_unshifted
    s_v = torch.where(raw, u_v, shift_sigma(u_v, VIDEO_SHIFT))
    s_a = torch.where(raw, u_a, shift_sigma(u_a, AUDIO_SHIFT))
    if p_high > 0:  # video sigma uniform in [0.9, 1) for this share (audio keeps its draw)
        high = torch.rand(b, device=device, generator=gen) < p_high
        s_v = torch.where(high, 0.9 + 0.1 * torch.rand(b, device=device, generator=gen), s_v)
    return s_v, s_a


def velocity_errors(pv, pa, v_video, v_audio, x0_video, obj_weight: float = 0.0, obj_thresh: float = 0.25):
    """Per-item MSE of the predicted velocities [B] (video, audio). With ``obj_weight``, video tokens that hold an
    object (far from the clip's median token of ``x0_video``) weigh 1 + obj_weight: where the motion words pay off."""
    if obj_weight > 0:
        tok_dev = (x0_video - x0_video.median(dim=1, keepdim=True).values).pow(2).mean(-1)      # [B, Nv]
        w = 1.0 + obj_weight * (tok_dev > obj_thresh).float()
        err_v = ((pv.float() - v_video).pow(2).mean(-1) * w).sum(1) / w.sum(1)
    else:
        err_v = (pv.float() - v_video).pow(2).mean(dim=(1, 2))
    return err_v, (pa.float() - v_audio).pow(2).mean(dim=(1, 2))


ANCHOR_MODES = ("text", "first", "last", "both")  # index = mode id; world.anchor_names gives the anchors


def _render_one(args):
    i, seed, keyframes = args
    from train import world
    from train.models import FRAMES, HEIGHT, WIDTH

    spec, clip = world.dataset_item(i, seed, "train", WIDTH, HEIGHT, FRAMES)
    kf = None
    if keyframes:  # the clip's first and last frame, and the two as the vision processor resizes them
        from train import vision

        torch.set_num_threads(1)
        kf = np.stack(world.keyframes(clip))
        kf = (kf, vision.resize_keyframes(kf))
    return i, clip.frames, clip.audio, world.caption_line(spec), world.caption_ir(spec), kf


def build_latents(n: int, seed: int, vv, av, stats: dict, device, workers=None, log=print, batch: int = 64,
                  keyframes: bool = False):
    """Render + encode n training clips (rendering overlapped with encoding). Normalised latents on CPU.
    With ``keyframes``, also the conditioning latents of each clip's first and last frame [n, 2, 24, 1, 8, 8] (float32,
    ``data.encode_keyframes``) and the two frames resized for the vision tower [n, 2, 256, 256, 3] uint8."""
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    vmean = torch.tensor(stats["video_mean"]).view(1, -1, 1, 1, 1)
    vstd = torch.tensor(stats["video_std"]).view(1, -1, 1, 1, 1)
    amean = torch.tensor(stats["audio_mean"]).view(1, 1, -1, 1)
    astd = torch.tensor(stats["audio_std"]).view(1, 1, -1, 1)
    video, audio, line, ir = [None] * n, [None] * n, [None] * n, [None] * n
    kf_lat, kf_px = ([None] * n, [None] * n) if keyframes else (None, None)
    t0 = time.time()
    jobs = [(i, seed, keyframes) for i in range(n)]
    pool = mp.get_context("fork").Pool(workers) if workers > 1 else None
    it = pool.imap(_render_one, jobs, chunksize=8) if pool else map(_render_one, jobs)
    buf = []
    autocast = torch.device(device).type == "cuda"

    def flush():
        idx = [b[0] for b in buf]
        zv = data.encode_video(vv, np.stack([b[1] for b in buf]), batch=len(buf), device=device, autocast=autocast)
        za = data.encode_audio(av, np.stack([b[2] for b in buf]), batch=len(buf), device=device)
        zv = ((zv - vmean) / vstd).to(torch.bfloat16)
        za = ((za - amean) / astd).to(torch.bfloat16)
        if keyframes:
            zk = data.encode_keyframes(vv, np.concatenate([b[3][0] for b in buf]), batch=2 * len(buf), device=device)
            zk = zk.view(len(buf), 2, *zk.shape[1:])
        for k, i in enumerate(idx):
            video[i], audio[i] = zv[k], za[k]
            if keyframes:
                kf_lat[i], kf_px[i] = zk[k], torch.from_numpy(buf[k][3][1])
        buf.clear()

    for i, fr, au, ln, irc, kf in it:
        buf.append((i, fr, au, kf))
        line[i], ir[i] = ln, irc
        if len(buf) == batch:
            flush()
        if (i + 1) % 4096 == 0:
            log(f"  encoded {i + 1}/{n} clips, {time.time() - t0:.0f}s")
    if buf:
        flush()
    if pool:
        pool.close()
        pool.join()
    log(f"rendered + encoded {n} clips{' + keyframes' if keyframes else ''} in {time.time() - t0:.0f}s")
    if keyframes:
        return torch.stack(video), torch.stack(audio), line, ir, torch.stack(kf_lat), torch.stack(kf_px)
    return torch.stack(video), torch.stack(audio), line, ir


class Buckets:
    """(item, caption form) pairs grouped by token length; a batch comes from one length."""

    def __init__(self, ids_line: list, ids_ir: list, device, p_ir: float = 0.5):
        self.groups = {}
        pairs = [(i, 0, ids) for i, ids in enumerate(ids_line)] + [(i, 1, ids) for i, ids in enumerate(ids_ir)]
        by_len: dict[int, list] = {}
        for i, form, ids in pairs:
            by_len.setdefault(len(ids), []).append((i, form, ids))
        self.lengths = sorted(by_len)
        self.weights = []
        for L in self.lengths:
            items = by_len[L]
            n_line = sum(1 for _, f, _ in items if f == 0)
            n_ir = len(items) - n_line
            self.groups[L] = (torch.tensor([i for i, _, _ in items], device=device),
                              torch.tensor([ids for _, _, ids in items], device=device, dtype=torch.long))
            # sample a bucket with probability proportional to its pairs, forms weighted to p_ir overall
            self.weights.append(n_line * (1 - p_ir) / max(1, len(ids_line)) + n_ir * p_ir / max(1, len(ids_ir)))
        self.weights = np.asarray(self.weights) / np.sum(self.weights)

    def sample(self, rng: np.random.Generator, batch: int, gen):
        L = int(self.lengths[rng.choice(len(self.lengths), p=self.weights)])
        items, ids = self.groups[L]
        pick = torch.randint(0, len(items), (batch,), device=items.device, generator=gen)
        return L, items[pick], ids[pick]


@torch.no_grad()
def ema_update(ema, model, decay: float):
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm.detach(), 1 - decay)


def parse_probs(text: str) -> np.ndarray:
    p = np.asarray([float(x) for x in text.split(",")], dtype=np.float64)
    if p.shape != (4,) or (p < 0).any() or p.sum() <= 0:
        raise argparse.ArgumentTypeError("--anchor-probs takes 4 non-negative numbers: text,first,last,both")
    return p / p.sum()


def load_official_init(official: Path):
    """(transformer, text encoder, video VAE, audio VAE, tokenizer json, latent stats) of an official partition."""
    from tests.fixtures.official import read_official_to_diffusers

    m = read_official_to_diffusers(official)
    vv, av = m["video_vae"], m["audio_vae"]
    stats = {"video_mean": list(vv.config.latents_mean), "video_std": list(vv.config.latents_std),
             "audio_mean": list(av.config.latents_mean), "audio_std": list(av.config.latents_std)}
    return m["transformer"], m["text_encoder"], vv, av, m["tokenizer_json"], stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="train/runs/dit")
    ap.add_argument("--vae-run", default="train/runs/vae")
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--clips", type=int, default=32000)
    ap.add_argument("--data-seed", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=300, help="linear LR warm-up steps")
    ap.add_argument("--te-lr-mult", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--p-ir", type=float, default=0.5)
    ap.add_argument("--p-coupled", type=float, default=0.75)
    ap.add_argument("--p-unshifted", type=float, default=0.3)
    ap.add_argument("--obj-weight", type=float, default=0.0,
                    help="extra loss weight on video tokens that hold an object (token far from the clip's median "
                         "token): where the motion words pay off; 0 = plain MSE")
    ap.add_argument("--obj-thresh", type=float, default=0.25)
    ap.add_argument("--p-high", type=float, default=0.0,
                    help="share of samples whose video sigma is uniform in [0.9, 1): the band where only the "
                         "caption can say which way an object moves")
    ap.add_argument("--anchor-probs", type=parse_probs, default=parse_probs("1,0,0,0"),
                    help="probabilities of a batch being text-only, first-frame, last-frame, first+last anchored")
    ap.add_argument("--te-train", choices=("all", "vision", "none"), default="all",
                    help="text-encoder weights that train: all, only the vision tower, or none")
    ap.add_argument("--init-official", default=None,
                    help="official partition dir (e.g. python/h3ctl/models/h3-tiny/FL2VA) to start from when the run "
                         "dir has no checkpoint; its VAEs, latent statistics and tokenizer are used (--vae-run unused)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--save-every", type=float, default=120.0)
    ap.add_argument("--init-from", default=None, help="dir with ema-transformer*/ema-text_encoder safetensors "
                    "(train.export --transport) to start from when the run dir has no checkpoint")
    ap.add_argument("--no-cache", action="store_true", help="do not keep the encoded latents in the run dir")
    ap.add_argument("--deadline", type=float, default=None,
                    help="absolute wall-clock time (epoch seconds) at which to stop and save, whatever the budget")
    args = ap.parse_args(argv)

    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    log = Logger(run / f"{NAME}.log")
    dev = device_of(args.device)
    cuda = dev.type == "cuda"
    fast_cuda(dev, cudnn_benchmark=False)
    seed_all(args.seed)
    probs = args.anchor_probs
    anchored = bool(probs[1:].sum() > 0)

    # Tokenizer (deterministic; kept in the run dir) and latent statistics (stage 1, or the official partition).
    official = None
    tok_path = run / "tokenizer.json"
    if args.init_official:
        official = load_official_init(Path(args.init_official))
        if not tok_path.exists():
            tok_path.write_text(official[4])
        stats = official[5]
    else:
        if not tok_path.exists():
            tok_path.write_text(tk.build_tokenizer_json())
        stats = json.loads((Path(args.vae_run) / "latent_stats.json").read_text())
    tok_json = tok_path.read_text()
    tokenizer = tk.load(tok_json)
    (run / "latent_stats.json").write_text(json.dumps(stats, indent=1))

    # Models.
    torch.manual_seed(args.seed)
    te = build_text_encoder(tok_json)
    dit = build_transformer()
    init_dit_(dit)
    if args.te_train != "all":
        te.requires_grad_(False)
        if args.te_train == "vision":
            te.model.visual.requires_grad_(True)
    te.to(dev).train()
    dit.to(dev).train()
    te_ema, dit_ema = copy.deepcopy(te).eval().requires_grad_(False), copy.deepcopy(dit).eval().requires_grad_(False)
    te_params = [p for p in te.parameters() if p.requires_grad]
    groups = [{"params": list(dit.parameters()), "lr_mult": 1.0}]
    if te_params:
        groups.append({"params": te_params, "lr_mult": args.te_lr_mult})
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99), weight_decay=args.weight_decay,
                            fused=cuda)
    mods = {"transformer": dit, "text_encoder": te, "transformer_ema": dit_ema, "text_encoder_ema": te_ema}
    meta = load_state(run, NAME, mods, opt)
    if meta is None and official is not None:
        for src, targets in ((official[0], (dit, dit_ema)), (official[1], (te, te_ema))):
            sd = {k: v.float() for k, v in src.state_dict().items()}
            for t in targets:
                t.load_state_dict(sd)
        log(f"[{NAME}] initialised from the official partition {args.init_official}")
    elif meta is None and args.init_from:
        # warm restart from transported EMA weights (official dtypes): weights only, fresh optimizer / schedule
        from train.common import load_weights

        for mod_name, targets in (("transformer", (dit, dit_ema)), ("text_encoder", (te, te_ema))):
            sd = {k: v.float() for k, v in load_weights(Path(args.init_from), "ema", mod_name).items()}
            for t in targets:
                t.load_state_dict(sd)
        log(f"[{NAME}] initialised from {args.init_from}")
    meta = meta or {"step": 0, "elapsed": 0.0}
    n_dit = sum(p.numel() for p in dit.parameters())
    n_te = sum(p.numel() for p in te.parameters())
    log(f"[{NAME}] device {dev} DiT {n_dit:,} params, text encoder {n_te:,} ({sum(p.numel() for p in te_params):,} "
        f"trained: {args.te_train}); anchor probs text/first/last/both {probs.round(3).tolist()}; "
        f"resume step {meta['step']}")

    # Data: rendered + encoded once per run (cached).
    cache = run / f"latents-{args.clips}-{args.data_seed}{'-kf' if anchored else ''}.pt"
    if cache.exists():
        loaded = torch.load(cache, weights_only=False)
        log(f"loaded cached latents {cache}")
    else:
        if official is not None:
            vv, av = official[2].to(dev).eval(), official[3].to(dev).eval()
        else:
            from train.latent_stats import load_vaes

            vv, av = load_vaes(Path(args.vae_run), dev)
        loaded = build_latents(args.clips, args.data_seed, vv, av, stats, dev, args.workers, log, keyframes=anchored)
        del vv, av
        if not args.no_cache:
            torch.save(loaded, cache)
    official = None
    zv, za, lines, irs = loaded[:4]
    log(f"latents video {tuple(zv.shape)} std {float(zv.float().std()):.3f}, audio {tuple(za.shape)} "
        f"std {float(za.float().std()):.3f}")
    zv, za = zv.to(dev), za.to(dev)
    if anchored:
        kf_lat, kf_px = loaded[4].to(dev), loaded[5].to(dev)       # [N, 2, 24, 1, 8, 8] f32, [N, 2, 256, 256, 3] u8
        log(f"keyframe latents {tuple(kf_lat.shape)} std {float(kf_lat.std()):.3f}, vision pixels "
            f"{tuple(kf_px.shape)}")
        enc = vision.TextEncoder(te, COND_LAYER, tuple(kf_px.shape[2:4]))
        pres = vision.Presentation(tokenizer, vision.tokens_per_image(*kf_px.shape[2:4]))
        # the batched keyframe path against transformers' own forward, on this machine's versions
        ids0 = tokenizer.encode(lines[0], add_special_tokens=False).ids
        chk_ids = torch.tensor([pres(ids0, 2)[0]] * 2, device=dev)
        chk_px = vision.pixel_values(kf_px[:2].reshape(-1, *kf_px.shape[2:]))
        te_mode = te.training
        te.eval()
        err = enc.check(chk_ids, chk_px, 2)
        te.train(te_mode)
        log(f"keyframe text encoder: batched vs transformers forward max err {err:.2e} -> "
            f"{'batched' if enc.batched else 'FALLBACK to the per-image reference path (slow)'}")
    del loaded
    ids_line = [e.ids for e in tokenizer.encode_batch(lines, add_special_tokens=False)]
    ids_ir = [e.ids for e in tokenizer.encode_batch(irs, add_special_tokens=False)]
    buckets = Buckets(ids_line, ids_ir, dev, args.p_ir)
    log(f"caption lengths {buckets.lengths[0]}..{buckets.lengths[-1]} in {len(buckets.lengths)} buckets")
    layouts = dit_core.LayoutCache(dev)

    rng = np.random.default_rng(args.seed + 7919 * meta["step"])
    gen = torch.Generator(device=dev).manual_seed(args.seed + meta["step"])
    budget = Budget(args.minutes * 60, args.max_steps, meta["elapsed"], meta["step"],
                    deadline=args.deadline)
    stats, saver = StepStats(100), Saver(run, NAME, mods, opt, args.save_every)
    B = args.batch
    all_params = [p for g in groups for p in g["params"]]
    te_grad = args.te_train == "all"
    while not budget.done():
        mode = int(rng.choice(4, p=probs)) if anchored else 0
        anchors = world.anchor_names(ANCHOR_MODES[mode])
        L, items, ids = buckets.sample(rng, B, gen)
        x0_v = dit_core.patchify(zv[items].float())             # [B, 112, 96]
        x0_a = dit_core.audio_to_rows(za[items].float())        # [B, 74, 32]
        s_v, s_a = sample_sigmas(B, dev, gen, args.p_coupled, args.p_unshifted, args.p_high)
        e_v = torch.randn(x0_v.shape, device=dev, generator=gen)
        e_a = torch.randn(x0_a.shape, device=dev, generator=gen)
        xs_v = (1 - s_v)[:, None, None] * x0_v + s_v[:, None, None] * e_v
        xs_a = (1 - s_a)[:, None, None] * x0_a + s_a[:, None, None] * e_a
        if anchors:
            which = [0, 1] if mode == 3 else [mode - 1]              # keyframe 0 = first frame, 1 = last frame
            zk = kf_lat[items][:, which]                             # [B, K, 24, 1, 8, 8]
            cond = dit_core.condition_rows(zk, torch.randn(zk.shape, device=dev, generator=gen))
            xs_v = torch.cat([cond, xs_v], dim=1)
            prefix, ptags = pres.prefix(len(which))
            ids = torch.cat([torch.tensor(prefix, device=dev).expand(B, -1), ids], dim=1)
            lay = layouts[(ids.shape[1], anchors, tuple(ptags + [vision.TEXT_TAG] * L))]
            px = vision.pixel_values(kf_px[items][:, which].reshape(-1, *kf_px.shape[2:]))
        else:
            lay, px = layouts[L], None
        lr = lr_at(args.lr, budget.fraction, budget.step, warmup=args.warmup)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            with torch.set_grad_enabled(te_grad or (bool(anchors) and args.te_train == "vision")):
                text = enc(ids, px, len(anchors)) if anchored else dit_core.encode_text(te, ids, COND_LAYER)
            pv, pa = dit_core.batched_forward(dit, xs_v, xs_a, text, 1 - s_v, 1 - s_a, lay)
        pv = pv[:, lay.num_cond_rows:]                             # the loss covers the target rows only
        err_v, err_a = velocity_errors(pv, pa, x0_v - e_v, x0_a - e_a, x0_v, args.obj_weight, args.obj_thresh)
        loss = err_v.mean() + err_a.mean()
        gn = optimizer_step(opt, loss, all_params, lr)
        budget.step += 1
        decay = min(args.ema, (1 + budget.step) / (10 + budget.step))
        ema_update(dit_ema, dit, decay)
        ema_update(te_ema, te, decay)
        low = (s_v < 0.6).float()
        onehot = torch.zeros(4, device=dev)
        onehot[mode] = 1.0
        a = stats.add(budget.step, [loss, err_v.mean(), err_a.mean(), (err_v * low).sum(), low.sum(), gn,
                                    *(onehot * err_v.mean().detach()), *onehot])
        if a is not None:
            m = a.mean(0).tolist()
            low_v = float(a[:, 3].sum() / a[:, 4].sum().clamp_min(1))
            per_mode = " ".join(f"{ANCHOR_MODES[k]} {float(a[:, 6 + k].sum() / a[:, 10 + k].sum()):.4f}"
                                for k in range(4) if float(a[:, 10 + k].sum()) > 0)
            log(f"[{NAME}] step {budget.step} t {budget.elapsed:.0f}s lr {lr:.2e} loss {m[0]:.4f} video {m[1]:.4f} "
                f"(sigma<0.6: {low_v:.4f}; {per_mode}) audio {m[2]:.4f} gnorm {m[5]:.2f} "
                f"{stats.sec_per_step:.3f}s/step")
        saver.maybe(budget)
    saver.save(budget, args={k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(args).items()},
               dit_params=n_dit, text_encoder_params=n_te, samples_seen=budget.step * B)
    log(f"[{NAME}] done: {budget.step} steps, {budget.elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
