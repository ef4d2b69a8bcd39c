"""Distil a few-step student of h3-tiny (issue #26 part 3): a LoRA on the FL2VA transformer (T2VA and FL2VA share it).

Method: trajectory distillation on the fixed h3 grid (a one-round progressive / "knowledge distillation of the ODE"
scheme). The frozen base model solves the sampling ODE finely (``--substeps`` Euler steps inside every interval of
the 8-evaluation h3 grid: 48 evaluations by default) from fixed noise, for many training prompts of
``train/world.py`` (text-only and anchored on the first, last or both frames); the states at the 9 points of the
8-evaluation grid are kept (they contain the 4- and the 2-evaluation grids: the shifted linear grid nests). The
student (base + LoRA) is trained so that ONE Euler step from a grid point lands on the teacher's state at the next
grid point: its velocity at (x_i, sigma_i) must equal ``(x_{i+1} - x_i) / (sigma_i - sigma_{i+1})``, in MSE, on the
4-evaluation intervals (p4), the second halves of the 8-evaluation intervals (p8: their start points are not on the
4-evaluation grid, so no input gets two targets there) and the 2-evaluation intervals (p2: these share their start
points with 4-evaluation intervals, a compromise the small weight keeps small).

Why this and not consistency or DMD: the sampler libh3 runs (Euler on a named grid, no stochastic re-noising) stays
exactly what the student was trained for, so the LoRA plugs into ``--lora`` with the existing ``h3`` grid; the teacher
pairs are made once (forward only, batched) and the student loss is a plain regression, which trains in the few
minutes of one device call with no discriminator or second network (DMD needs a fake-score model; consistency
training needs many more steps to converge and changes the sampler).

The LoRA targets the six main blocks' attention (to_q, to_k, to_v, to_out.0) and MLP (ff.net.0.proj, ff.net.2),
saved in diffusers names (``transformer.transformer_blocks.N...lora_A/lora_B.weight``, float16, the scale folded into
``lora_B``, metadata ``h3ctl_schedule = h3``), which libh3's ``--lora`` reads (docs/few-step.md).

Every phase keeps to a wall-clock deadline (``--teacher-deadline``, ``--deadline``, ``--eval-deadline``: absolute
epoch seconds): past it the phase stops and the next one runs, so the LoRA and the eval are always written.

    python -m train.distill_fewstep --official python/h3ctl/models/h3-tiny/FL2VA --out OUT --run RUN
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from train import dit_core, vision, world  # noqa: E402
from train.common import Logger, device_of, fast_cuda, lr_at, seed_all  # noqa: E402
from train.models import AUDIO_SHIFT, VIDEO_SHIFT  # noqa: E402

TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
MODES = ("text", "first", "last", "both")
GRID8 = 8  # the teacher's states are kept on the 8-evaluation grid (9 points)
# (start, end) indices on the 9-point grid, per family
INTERVALS = {4: [(0, 2), (2, 4), (4, 6), (6, 8)], 8: [(1, 2), (3, 4), (5, 6), (7, 8)], 2: [(0, 4), (4, 8)]}
MAX_BYTES = 850_000


def shifted(b: np.ndarray, s: float) -> np.ndarray:
    return s * b / (1.0 + (s - 1.0) * b)


def grid_sigmas(evals: int, shift: float) -> np.ndarray:
    """The h3 grid of ``evals`` evaluations (evals + 1 points) in float64: shift(linspace(1, 0, evals + 1))."""
    return shifted(np.linspace(1.0, 0.0, evals + 1), shift)


# ---------------------------------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------------------------------

class LoRALinear(nn.Module):
    """``base(x) + B (A x)``; A [r, in] random (1/sqrt(in)), B [out, r] zero: the student starts as the base."""

    def __init__(self, base: nn.Linear, rank: int, gen: torch.Generator):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.randn(rank, base.in_features, generator=gen) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.enabled = True

    def forward(self, x):
        y = self.base(x)
        if self.enabled:
            y = y + F.linear(F.linear(x, self.A), self.B)
        return y


def add_lora(model, rank: int, seed: int) -> dict:
    """Wrap the TARGETS of every main block; returns {diffusers module name: LoRALinear}."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, block in enumerate(model.transformer_blocks):
        for t in TARGETS:
            *path, last = t.split(".")
            parent = block
            for p in path:
                parent = getattr(parent, p)
            base = getattr(parent, last) if not last.isdigit() else parent[int(last)]
            assert isinstance(base, nn.Linear), (i, t, type(base))
            wrapped = LoRALinear(base, rank, gen)
            if last.isdigit():
                parent[int(last)] = wrapped
            else:
                setattr(parent, last, wrapped)
            out[f"transformer_blocks.{i}.{t}"] = wrapped
    for m in out.values():
        m.base.requires_grad_(False)
    return out


def set_lora(loras: dict, enabled: bool) -> None:
    for m in loras.values():
        m.enabled = enabled


def lora_state(loras: dict, ema: dict | None = None) -> dict:
    """The safetensors dict in diffusers names, float16 (scale 1: nothing to fold)."""
    sd = {}
    for name, m in loras.items():
        a = (ema[name + ".A"] if ema else m.A).detach().float().cpu()
        b = (ema[name + ".B"] if ema else m.B).detach().float().cpu()
        sd[f"transformer.{name}.lora_A.weight"] = a.to(torch.float16).contiguous()
        sd[f"transformer.{name}.lora_B.weight"] = b.to(torch.float16).contiguous()
    return sd


def save_lora(sd: dict, path: Path, meta: dict) -> int:
    from safetensors.torch import save_file

    save_file(sd, str(path), metadata={k: str(v) for k, v in meta.items()})
    n = path.stat().st_size
    if n > MAX_BYTES:
        raise SystemExit(f"{path}: {n} bytes, over the {MAX_BYTES}-byte budget (lower --rank)")
    return n


@torch.no_grad()
def check_lora_math(model, loras: dict, lay, text, vr, ar, dev) -> float:
    """The wrapped forward with random B against the forward with W + B A merged (the export's math); restores B."""
    saved = {k: m.B.detach().clone() for k, m in loras.items()}
    g = torch.Generator().manual_seed(5)
    for m in loras.values():
        m.B.copy_((torch.randn(m.B.shape, generator=g) * 0.02).to(dev))
    t = torch.full((vr.shape[0],), 0.5, device=dev)
    pv, pa = dit_core.batched_forward(model, vr, ar, text, t, t, lay)
    set_lora(loras, False)
    orig = {k: m.base.weight.detach().clone() for k, m in loras.items()}
    for k, m in loras.items():
        sd = lora_state({k: m})  # the exported float16 halves
        a, b = (sd[f"transformer.{k}.lora_{h}.weight"].float().to(dev) for h in "AB")
        m.base.weight.add_(b @ a)
    qv, qa = dit_core.batched_forward(model, vr, ar, text, t, t, lay)
    for k, m in loras.items():
        m.base.weight.copy_(orig[k])
        m.B.copy_(saved[k])
    set_lora(loras, True)
    ref = max(float(qv.abs().max()), float(qa.abs().max()))
    return max(float((pv - qv).abs().max()), float((pa - qa).abs().max())) / ref


# ---------------------------------------------------------------------------------------------------------------------
# Data: prompts, keyframes, text embeddings, teacher trajectories
# ---------------------------------------------------------------------------------------------------------------------

def _keyframes_of(args):
    i, seed = args
    torch.set_num_threads(1)
    spec, clip = world.dataset_item(i, seed, "train")
    kf = np.stack(world.keyframes(clip))
    return i, world.caption_line(spec), world.caption_ir(spec), kf, vision.resize_keyframes(kf)


def render_keyframes(n: int, seed: int, workers: int):
    jobs = [(i, seed) for i in range(n)]
    if workers > 1:
        with mp.get_context("fork").Pool(workers) as pool:
            res = list(pool.imap(_keyframes_of, jobs, chunksize=8))
    else:
        res = [_keyframes_of(j) for j in jobs]
    return res


class Group:
    """Trajectories that share one packed layout (mode, token length): a batch always comes from one group."""

    def __init__(self, mode: int, lay, text: torch.Tensor, cond: torch.Tensor | None):
        self.mode, self.lay, self.text, self.cond = mode, lay, text, cond
        self.xv = self.xa = None  # [n, 9, 112, 96] / [n, 9, 74, 32] float32, filled by the teacher

    @property
    def n(self) -> int:
        return self.text.shape[0]


@torch.no_grad()
def build_groups(models, n_text: int, res: list, draws: int, seed: int, dev, log) -> list:
    """Layout groups of text-only prompts (``n_text`` training specs) and anchored clips (``res``, from
    :func:`render_keyframes`: modes first / last / both in turn), with their text embeddings and fixed noised
    keyframe rows."""
    tok = models.tokenizer
    te = models.text_encoder
    cond_layer = models.cond_layer
    # prompt id lists per (mode, presentation length): [(ids, tags, keyframe latents or None, pixels or None)]
    buckets: dict = {}
    specs = list(world.iter_specs(n_text, seed=seed, split="train"))
    for k, s in enumerate(specs):
        cap = world.caption_line(s) if k % 2 == 0 else world.caption_ir(s)
        ids = tok.encode(cap, add_special_tokens=False).ids
        buckets.setdefault((0, len(ids)), []).append((ids, None, None, None))
    if res:
        t0 = time.time()
        kf = np.concatenate([r[3] for r in res])                          # [2n, 128, 128, 3]
        lat = models_keyframe_latents(models, kf, dev)
        zk = lat.view(len(res), 2, *lat.shape[1:])                         # [n, 2, 24, 1, 8, 8]
        px = torch.from_numpy(np.stack([r[4] for r in res]))               # [n, 2, 256, 256, 3] uint8
        log(f"{len(res)} anchored clips: keyframes encoded in {time.time() - t0:.1f}s")
        pres = vision.Presentation(tok, vision.tokens_per_image(*px.shape[2:4]))
        for k, r in enumerate(res):
            mode = 1 + k % 3
            which = [0, 1] if mode == 3 else [mode - 1]
            cap = r[1] if (k // 3) % 2 == 0 else r[2]
            ids, tags = pres(tok.encode(cap, add_special_tokens=False).ids, len(which))
            buckets.setdefault((mode, len(ids)), []).append((ids, tags, zk[k, which], px[k, which]))
        enc = vision.TextEncoder(te, cond_layer, tuple(px.shape[2:4]))
        key = max((k for k in buckets if k[0]), key=lambda k: k[0])
        it = buckets[key][:2]
        err = enc.check(torch.tensor([x[0] for x in it], device=dev),
                        vision.pixel_values(torch.stack([x[3] for x in it]).reshape(-1, *px.shape[2:]).to(dev)),
                        it[0][3].shape[0])
        log(f"keyframe text encoder: batched vs transformers max err {err:.2e} -> "
            f"{'batched' if enc.batched else 'reference path'}")
    else:
        enc = None
    layouts = dit_core.LayoutCache(dev)
    gen = torch.Generator(device=dev).manual_seed(seed + 2)
    groups = []
    # a seeded order, so that a teacher deadline drops a random share of every mode, not the last modes
    keys = sorted(buckets)
    keys = [keys[i] for i in np.random.default_rng(seed).permutation(len(keys))]
    for (mode, L) in keys:
        items = buckets[(mode, L)]
        anchors = world.anchor_names(MODES[mode])
        lay = layouts[(L, anchors, tuple(items[0][1]))] if mode else layouts[L]
        texts, conds = [], []
        for s in range(0, len(items), 256):
            chunk = items[s:s + 256]
            ids = torch.tensor([x[0] for x in chunk], device=dev)
            if mode:
                pix = vision.pixel_values(torch.stack([x[3] for x in chunk]).reshape(-1, *chunk[0][3].shape[1:]).to(dev))
                texts.append(enc(ids, pix, len(anchors)).float())
                zk = torch.stack([x[2] for x in chunk]).to(dev)               # [b, K, 24, 1, 8, 8]
                conds.append(zk)
            else:
                texts.append(dit_core.encode_text(te, ids, cond_layer).float())
        text = torch.cat(texts).repeat(draws, 1, 1)
        cond = None
        if mode:
            zk = torch.cat(conds).repeat(draws, 1, 1, 1, 1, 1)
            cond = dit_core.condition_rows(zk, torch.randn(zk.shape, device=dev, generator=gen))
        groups.append(Group(mode, lay, text, cond))
    return groups


@torch.no_grad()
def models_keyframe_latents(models, kf_u8: np.ndarray, dev) -> torch.Tensor:
    from train import data

    return data.encode_keyframes(models.video_vae, kf_u8, batch=256, device=dev)


@torch.no_grad()
def teacher(model, groups: list, substeps: int, seed: int, dev, deadline: float, chunk: int, log) -> list:
    """Fill every group's states on the 9-point grid by Euler on the fine grid (8 * substeps evaluations) from fixed
    noise; groups not reached by the deadline are dropped."""
    n_fine = GRID8 * substeps
    sv = torch.tensor(grid_sigmas(n_fine, VIDEO_SHIFT), dtype=torch.float32)
    sa = torch.tensor(grid_sigmas(n_fine, AUDIO_SHIFT), dtype=torch.float32)
    gen = torch.Generator(device=dev).manual_seed(seed + 3)
    done, t0, evals = [], time.time(), 0
    for g in groups:
        if time.time() >= deadline and done:  # at least one group, so that a LoRA is always written
            log(f"teacher: deadline reached, {len(done)} of {len(groups)} groups")
            break
        nc = g.lay.num_cond_rows
        xs_v, xs_a = [], []
        for s in range(0, g.n, chunk):
            b = min(chunk, g.n - s)
            x_v = torch.randn((b, 112, 96), device=dev, generator=gen)
            x_a = torch.randn((b, 74, 32), device=dev, generator=gen)
            text = g.text[s:s + b]
            cond = g.cond[s:s + b] if g.cond is not None else None
            keep_v, keep_a = [x_v.clone()], [x_a.clone()]
            for j in range(n_fine):
                tv = torch.full((b,), float(1 - sv[j]), device=dev)
                ta = torch.full((b,), float(1 - sa[j]), device=dev)
                inp = torch.cat([cond, x_v], 1) if cond is not None else x_v
                pv, pa = dit_core.batched_forward(model, inp, x_a, text, tv, ta, g.lay)
                x_v = x_v + float(sv[j] - sv[j + 1]) * pv[:, nc:].float()
                x_a = x_a + float(sa[j] - sa[j + 1]) * pa.float()
                evals += 1
                if (j + 1) % substeps == 0:
                    keep_v.append(x_v.clone())
                    keep_a.append(x_a.clone())
            xs_v.append(torch.stack(keep_v, 1))
            xs_a.append(torch.stack(keep_a, 1))
        g.xv, g.xa = torch.cat(xs_v), torch.cat(xs_a)
        done.append(g)
    n = sum(g.n for g in done)
    log(f"teacher: {n} trajectories in {len(done)} groups, {n_fine} evaluations each ({evals} batched forwards), "
        f"{time.time() - t0:.1f}s")
    return done


# ---------------------------------------------------------------------------------------------------------------------
# Student training
# ---------------------------------------------------------------------------------------------------------------------

def train_student(model, loras: dict, groups: list, args, dev, deadline: float, log, mid=None) -> tuple[dict, dict]:
    """AdamW on the LoRA halves with an EMA; ``mid(ema, step)`` is called once, half-way through the time budget (an
    earlier snapshot to fall back on)."""
    cuda = dev.type == "cuda"
    params = [p for m in loras.values() for p in (m.A, m.B)]
    names = [f"{k}.{h}" for k in loras for h in "AB"]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0, fused=cuda)
    ema = {n: p.detach().clone() for n, p in zip(names, params)}
    sv9 = torch.tensor(grid_sigmas(GRID8, VIDEO_SHIFT), dtype=torch.float32, device=dev)
    sa9 = torch.tensor(grid_sigmas(GRID8, AUDIO_SHIFT), dtype=torch.float32, device=dev)
    fam_p = np.array([args.p4, args.p8, args.p2], np.float64)
    fam_p /= fam_p.sum()
    table = [iv for fam, p in zip((4, 8, 2), fam_p) for iv in INTERVALS[fam] if p > 0]
    w = torch.tensor([p / len(INTERVALS[fam]) for fam, p in zip((4, 8, 2), fam_p) for _ in INTERVALS[fam] if p > 0],
                     device=dev)
    j0s = torch.tensor([a for a, _ in table], device=dev)
    j1s = torch.tensor([b for _, b in table], device=dev)
    sizes = np.array([g.n for g in groups], np.float64)
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 4)
    t0 = time.time()
    seconds = args.train_seconds
    step, hist = 0, []
    per_fam = {f: [0.0, 0] for f in ("4", "8", "2")}
    fam_of = torch.tensor([{4: 0, 8: 1, 2: 2}[fam] for fam, p in zip((4, 8, 2), fam_p) for _ in INTERVALS[fam]
                           if p > 0], device=dev)
    half = min(seconds, deadline - t0) / 2
    while True:
        el = time.time() - t0
        if el >= seconds or time.time() >= deadline or (args.max_steps and step >= args.max_steps):
            break
        if mid is not None and el >= half and step > 0:
            mid(ema, step)
            mid = None
        g = groups[int(rng.choice(len(groups), p=sizes / sizes.sum()))]
        B = min(args.batch, g.n)
        idx = torch.randperm(g.n, device=dev, generator=gen)[:B]
        k = torch.multinomial(w, B, replacement=True, generator=gen)
        j0, j1 = j0s[k], j1s[k]
        x_v, y_v = g.xv[idx, j0], g.xv[idx, j1]
        x_a, y_a = g.xa[idx, j0], g.xa[idx, j1]
        dv = (sv9[j0] - sv9[j1])[:, None, None]
        da = (sa9[j0] - sa9[j1])[:, None, None]
        tgt_v, tgt_a = (y_v - x_v) / dv, (y_a - x_a) / da
        inp = torch.cat([g.cond[idx], x_v], 1) if g.cond is not None else x_v
        lr = lr_at(args.lr, min(1.0, el / seconds), step, warmup=args.warmup)
        for grp in opt.param_groups:
            grp["lr"] = lr
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bool(cuda and args.amp)):
            pv, pa = dit_core.batched_forward(model, inp, x_a, g.text[idx], 1 - sv9[j0], 1 - sa9[j0], g.lay)
        pv = pv[:, g.lay.num_cond_rows:].float()
        e_v = (pv - tgt_v).pow(2).mean((1, 2))
        e_a = (pa.float() - tgt_a).pow(2).mean((1, 2))
        loss = e_v.mean() + e_a.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for n, p in zip(names, params):
                ema[n].lerp_(p.detach(), 1 - decay)
        if step % 50 == 0 or step == 1:
            with torch.no_grad():
                fam = fam_of[k]
                err = (e_v + e_a).detach()
                for f, key in enumerate(("4", "8", "2")):
                    m = fam == f
                    if bool(m.any()):
                        per_fam[key][0] += float(err[m].mean())
                        per_fam[key][1] += 1
            hist.append((step, float(loss.detach()), float(gn)))
        if step % args.log_every == 0 or step == 1:
            fams = " ".join(f"{f}-eval {v[0] / max(1, v[1]):.4f}" for f, v in per_fam.items() if v[1])
            log(f"step {step} t {time.time() - t0:.0f}s lr {lr:.2e} loss {float(loss):.4f} ({fams}) gnorm {float(gn):.2f}")
            per_fam = {f: [0.0, 0] for f in ("4", "8", "2")}
    log(f"done: {step} steps in {time.time() - t0:.0f}s")
    return ema, {"steps": step, "seconds": time.time() - t0, "loss_curve": hist[:: max(1, len(hist) // 40)]}


@torch.no_grad()
def velocity_error(model, loras, groups, dev, n_max: int = 64, lora_on: bool | None = None) -> dict:
    """Mean squared velocity error against the teacher's interval targets, per family, base vs student (a held-back
    measure on the training trajectories: how much of the 4-step discretisation error the LoRA removed)."""
    sv9 = torch.tensor(grid_sigmas(GRID8, VIDEO_SHIFT), dtype=torch.float32, device=dev)
    sa9 = torch.tensor(grid_sigmas(GRID8, AUDIO_SHIFT), dtype=torch.float32, device=dev)
    out = {}
    families = dict(INTERVALS, all8=[(j, j + 1) for j in range(GRID8)])  # all8: every step of an 8-evaluation run
    for use in ((False, True) if lora_on is None else (lora_on,)):
        set_lora(loras, use)
        for fam, ivs in families.items():
            tot, cnt = 0.0, 0
            for g in groups[:: max(1, len(groups) // 8)]:
                b = min(n_max, g.n)
                for j0, j1 in ivs:
                    x_v, y_v, x_a, y_a = g.xv[:b, j0], g.xv[:b, j1], g.xa[:b, j0], g.xa[:b, j1]
                    inp = torch.cat([g.cond[:b], x_v], 1) if g.cond is not None else x_v
                    tv = torch.full((b,), float(1 - sv9[j0]), device=dev)
                    ta = torch.full((b,), float(1 - sa9[j0]), device=dev)
                    pv, pa = dit_core.batched_forward(model, inp, x_a, g.text[:b], tv, ta, g.lay)
                    tgt_v = (y_v - x_v) / float(sv9[j0] - sv9[j1])
                    tgt_a = (y_a - x_a) / float(sa9[j0] - sa9[j1])
                    tot += float((pv[:, g.lay.num_cond_rows:] - tgt_v).pow(2).mean() + (pa - tgt_a).pow(2).mean())
                    cnt += 1
            out[f"{'student' if use else 'base'}_{fam}"] = tot / max(1, cnt)
    set_lora(loras, True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official", default="python/h3ctl/models/h3-tiny/FL2VA")
    ap.add_argument("--run", default="train/runs/distill")
    ap.add_argument("--out", default="train/runs/distill/out")
    ap.add_argument("--prompts", type=int, default=4000, help="text-only training prompts")
    ap.add_argument("--anchored", type=int, default=3000, help="anchored training clips (first / last / both)")
    ap.add_argument("--draws", type=int, default=1, help="noise draws per prompt")
    ap.add_argument("--substeps", type=int, default=6, help="teacher Euler steps per 8-evaluation interval")
    ap.add_argument("--chunk", type=int, default=512, help="teacher batch")
    ap.add_argument("--rank", type=int, default=12)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--p4", type=float, default=0.7)
    ap.add_argument("--p8", type=float, default=0.2)
    ap.add_argument("--p2", type=float, default=0.1)
    ap.add_argument("--amp", type=int, default=1, help="bf16 autocast for the student's training forward (CUDA)")
    ap.add_argument("--train-seconds", type=float, default=200.0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--teacher-deadline", type=float, default=None, help="epoch s: stop adding teacher groups")
    ap.add_argument("--deadline", type=float, default=None, help="epoch s: stop training")
    ap.add_argument("--eval-deadline", type=float, default=None, help="epoch s: stop evaluating")
    ap.add_argument("--eval-n", type=int, default=27)
    ap.add_argument("--eval-evals", default="4,2,8", help="student evaluations to check with diffusers' sampling")
    ap.add_argument("--eval-sets", default="heldout,anchored")
    ap.add_argument("--base-eval", default="", help="evaluation counts to check the base model at too")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--data-seed", type=int, default=2600)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--device", default=None)
    ap.add_argument("--log-every", type=int, default=250)
    args = ap.parse_args(argv)
    T0 = time.time()
    far = T0 + 1e9
    teacher_deadline = args.teacher_deadline or far
    deadline = args.deadline or far
    eval_deadline = args.eval_deadline or far

    run, out = Path(args.run), Path(args.out)
    run.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log = Logger(run / "distill.log")
    dev = device_of(args.device)
    fast_cuda(dev, cudnn_benchmark=False)
    seed_all(args.seed)
    from train import sample

    t1 = time.time()
    res = render_keyframes(args.anchored, args.data_seed + 1, args.workers) if args.anchored else []
    log(f"{len(res)} anchored training clips rendered in {time.time() - t1:.1f}s")
    models = sample.load_official(Path(args.official))
    models.to(dev)
    model = models.transformer
    log(f"device {dev}; {args.official} loaded ({time.time() - T0:.1f}s)")

    groups = build_groups(models, args.prompts, res, args.draws, args.data_seed, dev, log)
    del res
    log(f"{sum(g.n for g in groups)} trajectories to solve in {len(groups)} layout groups "
        f"(modes {[sum(g.n for g in groups if g.mode == m) for m in range(4)]}) ({time.time() - T0:.1f}s)")
    groups = teacher(model, groups, args.substeps, args.seed, dev, teacher_deadline, args.chunk, log)
    if not groups:
        raise SystemExit("teacher: no trajectory before the deadline")

    loras = add_lora(model, args.rank, args.seed)
    for m in loras.values():
        m.to(dev)
    g0 = groups[-1]
    b = min(2, g0.n)
    inp = torch.cat([g0.cond[:b], g0.xv[:b, 0]], 1) if g0.cond is not None else g0.xv[:b, 0]
    err = check_lora_math(model, loras, g0.lay, g0.text[:b], inp, g0.xa[:b, 0], dev)
    log(f"LoRA forward vs merged W + B A (float16 halves): rel err {err:.2e}")
    if not err < 1e-3:
        raise SystemExit("the LoRA wrapper does not compute what the export merges")
    n_params = sum(m.A.numel() + m.B.numel() for m in loras.values())
    log(f"LoRA rank {args.rank} on {len(loras)} modules: {n_params:,} parameters ({2 * n_params:,} bytes in f16) "
        f"({time.time() - T0:.1f}s)")

    model.train()
    base_meta = {"h3ctl_schedule": "h3", "rank": args.rank, "targets": ",".join(TARGETS)}

    def mid(ema_now, step):
        n = save_lora(lora_state(loras, ema_now), out / "h3-tiny-fast-mid.safetensors", dict(base_meta, train_steps=step))
        log(f"step {step}: wrote h3-tiny-fast-mid.safetensors ({n} bytes, EMA half-way)")

    ema, stats = train_student(model, loras, groups, args, dev, deadline, log, mid)
    model.eval()
    meta = {"h3ctl_schedule": "h3", "h3ctl_student": "h3-tiny few-step (trajectory distillation)",
            "base_model": "h3-tiny FL2VA transformer", "rank": args.rank, "targets": ",".join(TARGETS),
            "train_steps": stats["steps"], "teacher_evaluations": GRID8 * args.substeps,
            "families_p4_p8_p2": f"{args.p4},{args.p8},{args.p2}"}
    nbytes = save_lora(lora_state(loras, ema), out / "h3-tiny-fast.safetensors", meta)
    save_lora(lora_state(loras), out / "h3-tiny-fast-raw.safetensors", meta)
    log(f"wrote h3-tiny-fast.safetensors ({nbytes} bytes, EMA) and the raw weights ({time.time() - T0:.1f}s)")

    # the EMA weights into the wrappers for the checks
    with torch.no_grad():
        for k, m in loras.items():
            m.A.copy_(ema[k + ".A"])
            m.B.copy_(ema[k + ".B"])
    report = {"args": vars(args), "train": stats, "lora_bytes": nbytes, "lora_params": n_params,
              "trajectories": sum(g.n for g in groups), "groups": len(groups)}
    report["velocity_mse"] = velocity_error(model, loras, groups, dev)
    # libh3 merges W + B A and rounds a BF16 checkpoint's weight back to BF16: the same measure with that merge
    with torch.no_grad():
        orig = {k: m.base.weight.detach().clone() for k, m in loras.items()}
        for k, m in loras.items():
            m.base.weight.copy_((m.base.weight + m.B @ m.A).to(torch.bfloat16).float())
        merged = velocity_error(model, loras, groups, dev, lora_on=False)
        report["velocity_mse"].update({"student_bf16_merged_" + k.split("_")[1]: v for k, v in merged.items()})
        for k, m in loras.items():
            m.base.weight.copy_(orig[k])
        del orig
    log(f"velocity MSE against the teacher's intervals: {json.dumps({k: round(v, 5) for k, v in report['velocity_mse'].items()})}")
    del groups
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # diffusers' sampling (train/sample.py) with the student, then the base, while time is left
    report["eval"] = {}
    runs = [("student", int(e)) for e in args.eval_evals.split(",") if e] + \
           [("base", int(e)) for e in args.base_eval.split(",") if e]
    last, prev_ev = 0.0, 0  # seconds the previous eval run took (a run is not started when it would end past the deadline)
    for who, ev in runs:
        if time.time() + last * (ev + 2) / (prev_ev + 2 if last else 1) >= eval_deadline:
            log(f"eval: no time left before the deadline for {who} {ev}")
            break
        set_lora(loras, who == "student")
        t1 = time.time()
        rep = sample.run(models, run / f"eval-{who}-{ev}", tuple(args.eval_sets.split(",")), args.eval_n,
                         steps=ev + 1, seed=42, log=log)
        report["eval"][f"{who}_{ev}"] = {s: rep[s]["summary"] for s in rep}
        last, prev_ev = time.time() - t1, ev
        log(f"eval {who} {ev} evaluations: " + ", ".join(f"{s} {rep[s]['summary']['pass_rate']:.3f}" for s in rep)
            + f" ({last:.1f}s)")
        (out / "distill.json").write_text(json.dumps(report, indent=1, default=float))
    set_lora(loras, True)
    report["total_s"] = time.time() - T0
    (out / "distill.json").write_text(json.dumps(report, indent=1, default=float))
    log(f"all done in {time.time() - T0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
