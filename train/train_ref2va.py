"""Stage 9 (issue #15 item 5): h3-tiny's Ref2VA transformer, a fine-tune of the shipped FL2VA transformer's attention.

What trains (``--train``): the attention of the six transformer blocks (q/k/v/out projections and the q/k RMS norms),
optionally also the token refiner's attention and the MLPs of the last two blocks, so the Ref2VA partition ships just
those tensors and borrows every other tensor, and the text encoder, the VAEs and the tokenizer, from FL2VA (the
shared-weight partition form libh3 opens). The text encoder is frozen: it is shared.

Each batch is a Ref2VA request of one kind (diffusers' forward shares one layout per batch): an image reference alone
(the prompt says the sound in words) or an image reference and an audio reference (the prompt says "the sound of
audio 1"), laid out by ``train/refs.py`` (diffusers' ``build_ref2va_packed_sequence`` / ``build_row_timesteps``):
the image latent (the keyframe encoding: sampled posterior with the seed-42 draw, fp16-rounded, normalised) noised to
t = 0.999 at max(t, 0.999), the audio latent (posterior mode, normalised) clean at t = 1. The objective is stage 2's
flow matching on the target rows only.

    python -m train.train_ref2va --run R --official python/h3ctl/models/h3-tiny/FL2VA --clips 10000 --minutes 5 \
        --out OUT      # -> OUT/ref2va-attn.safetensors (EMA trained weights, diffusers names, BF16)
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from train import data, dit_core, refs, vision  # noqa: E402
from train import tokenizer as tk  # noqa: E402
from train.common import Budget, Logger, StepStats, device_of, fast_cuda, lr_at, optimizer_step, seed_all  # noqa
from train.models import COND_LAYER  # noqa: E402
from train.train_dit import load_official_init, sample_sigmas, velocity_errors  # noqa: E402

NAME = "ref2va"
REF_AUDIO_PAD = 800  # the audio VAE's hop: encode zero-pads to whole latents


def _render(args):
    i, seed = args
    torch.set_num_threads(1)
    spec, clip, img, aud = refs.ref_item(i, seed)
    px = vision.resize_keyframes(img[None])[0]
    return (i, clip.frames, clip.audio, img, px, aud, refs.ref_prompt(spec, False),
            refs.ref_prompt(spec, True) if aud is not None else None)


def pad_audio(a: np.ndarray) -> np.ndarray:
    n = a.shape[-1]
    return np.pad(a, ((0, 0), (0, (-n) % REF_AUDIO_PAD)))


def build_data(n, seed, vv, av, stats, device, workers, log, batch=64):
    vmean = torch.tensor(stats["video_mean"]).view(1, -1, 1, 1, 1)
    vstd = torch.tensor(stats["video_std"]).view(1, -1, 1, 1, 1)
    amean = torch.tensor(stats["audio_mean"]).view(1, 1, -1, 1)
    astd = torch.tensor(stats["audio_std"]).view(1, 1, -1, 1)
    D = {k: [None] * n for k in ("zv", "za", "zi", "zr", "px", "p_text", "p_audio")}
    t0 = time.time()
    pool = mp.get_context("fork").Pool(workers) if workers > 1 else None
    jobs = [(i, seed) for i in range(n)]
    it = pool.imap(_render, jobs, chunksize=8) if pool else map(_render, jobs)
    buf = []
    autocast = torch.device(device).type == "cuda"

    def flush():
        zv = data.encode_video(vv, np.stack([b[1] for b in buf]), batch=len(buf), device=device, autocast=autocast)
        za = data.encode_audio(av, np.stack([b[2] for b in buf]), batch=len(buf), device=device)
        zi = data.encode_keyframes(vv, np.stack([b[3] for b in buf]), batch=len(buf), device=device)
        snd = [k for k, b in enumerate(buf) if b[5] is not None]
        zr = data.encode_audio(av, np.stack([pad_audio(buf[k][5]) for k in snd]), batch=len(snd),
                               device=device) if snd else None
        for k, b in enumerate(buf):
            i = b[0]
            D["zv"][i] = ((zv[k:k + 1] - vmean) / vstd)[0].to(torch.bfloat16)
            D["za"][i] = ((za[k:k + 1] - amean) / astd)[0].to(torch.bfloat16)
            D["zi"][i] = zi[k]
            D["px"][i] = torch.from_numpy(b[4])
            D["p_text"][i], D["p_audio"][i] = b[6], b[7]
        for j, k in enumerate(snd):
            D["zr"][buf[k][0]] = ((zr[j:j + 1] - amean) / astd)[0]
        buf.clear()

    for item in it:
        buf.append(item)
        if len(buf) == batch:
            flush()
    if buf:
        flush()
    if pool:
        pool.close()
        pool.join()
    log(f"rendered + encoded {n} Ref2VA items in {time.time() - t0:.0f}s")
    zr0 = torch.zeros_like(next(z for z in D["zr"] if z is not None))
    D["has_audio"] = torch.tensor([z is not None for z in D["zr"]])
    D["zr"] = [z if z is not None else zr0 for z in D["zr"]]
    for k in ("zv", "za", "zi", "zr", "px"):
        D[k] = torch.stack(D[k])
    return D


class Buckets:
    """Items grouped by prompt token length, one table per request kind (image only / image + audio)."""

    def __init__(self, ids: list, device):
        by_len = {}
        for i, x in enumerate(ids):
            if x is not None:
                by_len.setdefault(len(x), []).append(i)
        self.lengths = sorted(by_len)
        self.groups = {L: (torch.tensor(by_len[L], device=device),
                           torch.tensor([ids[i] for i in by_len[L]], device=device, dtype=torch.long))
                       for L in self.lengths}
        w = np.asarray([len(by_len[L]) for L in self.lengths], dtype=np.float64)
        self.weights = w / w.sum()

    def sample(self, rng, batch, gen):
        L = int(self.lengths[rng.choice(len(self.lengths), p=self.weights)])
        items, ids = self.groups[L]
        pick = torch.randint(0, len(items), (batch,), device=items.device, generator=gen)
        return items[pick], ids[pick]


TRAIN_SETS = {
    # the attention of the six blocks (4.7 MB)
    "attn": re.compile(r"^transformer_blocks\.\d+\.attn\."),
    # + the token refiner's attention (it turns the reference picture's vision rows into conditioning) and the MLPs
    #   of the last two blocks (8.5 MB)
    "attn+refiner+mlp45": re.compile(r"^(transformer_blocks\.\d+\.attn\.|token_refiner\.refiner_blocks\.\d+\.attn\."
                                     r"|transformer_blocks\.[45]\.ff\.)"),
}


def trained_params(dit, which: str = "attn") -> dict:
    return {n: p for n, p in dit.named_parameters() if TRAIN_SETS[which].match(n)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="train/runs/ref2va")
    ap.add_argument("--official", default="python/h3ctl/models/h3-tiny/FL2VA")
    ap.add_argument("--out", default=None, help="where ref2va-attn.safetensors goes (default: the run dir)")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--deadline", type=float, default=None)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--clips", type=int, default=10000)
    ap.add_argument("--data-seed", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--p-audio", type=float, default=0.6, help="share of batches with an audio reference")
    ap.add_argument("--p-coupled", type=float, default=0.75)
    ap.add_argument("--p-unshifted", type=float, default=0.3)
    ap.add_argument("--p-high", type=float, default=0.25)
    ap.add_argument("--obj-weight", type=float, default=4.0)
    ap.add_argument("--obj-thresh", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--train", choices=sorted(TRAIN_SETS), default="attn", help="which weights train")
    ap.add_argument("--init", default=None, help="a ref2va-attn.safetensors to start from (a second call)")
    args = ap.parse_args(argv)

    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else run
    out.mkdir(parents=True, exist_ok=True)
    log = Logger(run / f"{NAME}.log")
    dev = device_of(args.device)
    cuda = dev.type == "cuda"
    fast_cuda(dev, cudnn_benchmark=False)
    seed_all(args.seed)

    dit, te, vv, av, tok_json, stats = load_official_init(Path(args.official))
    tokenizer = tk.load(tok_json)
    dit = dit.float().to(dev).train()
    te = te.float().to(dev).eval().requires_grad_(False)
    dit.requires_grad_(False)
    if args.init:
        from safetensors.torch import load_file

        got = dit.load_state_dict({k: v.float() for k, v in load_file(args.init).items()}, strict=False)
        if got.unexpected_keys:
            raise SystemExit(f"{args.init}: unexpected tensors {got.unexpected_keys[:3]}")
        log(f"[{NAME}] attention initialised from {args.init}")
    train_p = trained_params(dit, args.train)
    for p in train_p.values():
        p.requires_grad_(True)
    ema = copy.deepcopy(dit).eval().requires_grad_(False)
    ema_p = trained_params(ema, args.train)
    opt = torch.optim.AdamW(list(train_p.values()), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0, fused=cuda)
    log(f"[{NAME}] device {dev}; training {sum(p.numel() for p in train_p.values()):,} parameters ({args.train}) of "
        f"{sum(p.numel() for p in dit.parameters()):,}")

    D = build_data(args.clips, args.data_seed, vv.float().to(dev).eval(), av.float().to(dev).eval(), stats, dev,
                   args.workers or max(1, (os.cpu_count() or 2) - 1), log)
    del vv, av
    zv, za, zi, zr = D["zv"].to(dev), D["za"].to(dev), D["zi"].to(dev), D["zr"].to(dev)
    px = D["px"].to(dev)
    log(f"video {tuple(zv.shape)} audio {tuple(za.shape)} image refs {tuple(zi.shape)} std {float(zi.std()):.3f} "
        f"audio refs {tuple(zr.shape)} ({int(D['has_audio'].sum())} sounding) std {float(zr.std()):.3f}")

    enc = vision.TextEncoder(te, COND_LAYER, tuple(px.shape[1:3]))
    pres = vision.Presentation(tokenizer, vision.tokens_per_image(*px.shape[1:3]))
    pic_ids, pic_tags = pres.prefix(1)
    aud_ids = tokenizer.encode("<Audio 1>: ", add_special_tokens=False).ids
    prefixes = {False: (pic_ids, pic_tags), True: (pic_ids + aud_ids, pic_tags + [vision.TEXT_TAG] * len(aud_ids))}
    enc_ids = lambda texts: [None if t is None else e.ids for t, e in  # noqa: E731
                             zip(texts, tokenizer.encode_batch([t or "" for t in texts], add_special_tokens=False))]
    buckets = {False: Buckets(enc_ids(D["p_text"]), dev), True: Buckets(enc_ids(D["p_audio"]), dev)}
    log(f"prompt lengths: image-only {buckets[False].lengths}, image+audio {buckets[True].lengths}")
    with torch.no_grad():  # the batched vision path against transformers' own forward
        ids0 = torch.tensor([pic_ids + buckets[False].groups[buckets[False].lengths[0]][1][0].tolist()] * 2,
                            device=dev)
        log(f"text encoder: batched vs transformers max err {enc.check(ids0, vision.pixel_values(px[:2]), 1):.2e}")
    layouts = {}

    rng = np.random.default_rng(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    budget = Budget(args.minutes * 60, args.max_steps, 0.0, 0, deadline=args.deadline)
    stats_, B = StepStats(100), args.batch
    params = list(train_p.values())
    while not budget.done():
        with_audio = bool(rng.random() < args.p_audio)
        items, pids = buckets[with_audio].sample(rng, B, gen)
        pre_ids, pre_tags = prefixes[with_audio]
        ids = torch.cat([torch.tensor(pre_ids, device=dev).expand(B, -1), pids], dim=1)
        key = (ids.shape[1], with_audio)
        if key not in layouts:
            layouts[key] = refs.RefLayout(pre_tags + [vision.TEXT_TAG] * pids.shape[1], with_audio, dev)
        lay = layouts[key]
        x0_v = dit_core.patchify(zv[items].float())
        x0_a = dit_core.audio_to_rows(za[items].float())
        s_v, s_a = sample_sigmas(B, dev, gen, args.p_coupled, args.p_unshifted, args.p_high)
        e_v = torch.randn(x0_v.shape, device=dev, generator=gen)
        e_a = torch.randn(x0_a.shape, device=dev, generator=gen)
        xs_v = (1 - s_v)[:, None, None] * x0_v + s_v[:, None, None] * e_v
        xs_a = (1 - s_a)[:, None, None] * x0_a + s_a[:, None, None] * e_a
        zk = zi[items][:, None]
        xs_v = torch.cat([dit_core.condition_rows(zk, torch.randn(zk.shape, device=dev, generator=gen)), xs_v], 1)
        if with_audio:
            xs_a = torch.cat([refs.audio_ref_rows(zr[items]), xs_a], dim=1)
        lr = lr_at(args.lr, budget.fraction, budget.step, warmup=args.warmup)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            with torch.no_grad():
                text = enc(ids, vision.pixel_values(px[items]), 1)
            pv, pa = dit_core.batched_forward(dit, xs_v, xs_a, text, 1 - s_v, 1 - s_a, lay)
        pv, pa = pv[:, lay.num_cond_rows:], pa[:, lay.num_cond_audio_rows:]
        err_v, err_a = velocity_errors(pv, pa, x0_v - e_v, x0_a - e_a, x0_v, args.obj_weight, args.obj_thresh)
        loss = err_v.mean() + err_a.mean()
        gn = optimizer_step(opt, loss, params, lr)
        budget.step += 1
        decay = min(args.ema, (1 + budget.step) / (10 + budget.step))
        with torch.no_grad():
            for n, p in train_p.items():
                ema_p[n].lerp_(p.detach(), 1 - decay)
        a = stats_.add(budget.step, [loss, err_v.mean(), err_a.mean(), gn, err_a.mean() * with_audio,
                                     torch.tensor(float(with_audio), device=dev)])
        if a is not None:
            m = a.mean(0).tolist()
            na = float(a[:, 5].sum())
            log(f"[{NAME}] step {budget.step} t {budget.elapsed:.0f}s lr {lr:.2e} loss {m[0]:.4f} video {m[1]:.4f} "
                f"audio {m[2]:.4f} (with audio ref {float(a[:, 4].sum()) / max(na, 1):.4f}) gnorm {m[3]:.2f} "
                f"{stats_.sec_per_step:.3f}s/step")
    from safetensors.torch import save_file

    sd = {n: p.detach().to(torch.bfloat16).cpu().contiguous() for n, p in ema_p.items()}
    save_file(sd, str(out / "ref2va-attn.safetensors"), metadata={"steps": str(budget.step),
                                                                    "seconds": f"{budget.elapsed:.0f}"})
    log(f"[{NAME}] done: {budget.step} steps, {budget.elapsed:.0f}s -> {out / 'ref2va-attn.safetensors'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
