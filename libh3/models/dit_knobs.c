/*
 * The transformer's speed knobs (h3_request's reuse, core reuse, layers, token reduction, cache
 * threshold; see docs/presets.md): model logic over the backend ops, each exact when off.
 */
#include "models/dit_internal.h"

/* ---- speed knobs ------------------------------------------------------------------------- */

void h3_dit_token_span(int layers, int *first, int *end, int *end_early)
{
    /* the release's span (blocks 4..30 of 50, 4..40 during the first 10 steps), rounded to this depth */
    *first = (4 * layers + 25) / 50;
    *end = (30 * layers + 25) / 50;
    *end_early = (40 * layers + 25) / 50;
}

int h3_dit_knobs_check(const h3_dit_cfg *c, const h3_dit_knobs *k)
{
    if (k->reuse < 0 || k->reuse > 1000)
        return h3_err(H3_E_INVALID, "reuse must be between 0 (off) and 1000, got %d", k->reuse);
    if (k->core_reuse < 0 || k->core_reuse > 1000)
        return h3_err(H3_E_INVALID, "core reuse must be between 0 (off) and 1000, got %d", k->core_reuse);
    if (k->reuse > 1 && k->core_reuse > 1)
        return h3_err(H3_E_INVALID, "reuse %d and core reuse %d cannot be combined: step reuse already skips the "
                                    "transformer calls whose block stack core reuse would skip", k->reuse, k->core_reuse);
    const int min_layers = c->layers < 3 ? c->layers : 3;
    if (k->layers != 0 && (k->layers < min_layers || k->layers > c->layers))
        return h3_err(H3_E_INVALID, "layers %d: this model has %d blocks and runs at least %d (the first two and the last)",
                      k->layers, c->layers, min_layers);
    if (k->layer_policy != H3_LAYERS_GATE && k->layer_policy != H3_LAYERS_UNIFORM)
        return h3_err(H3_E_INVALID, "layer policy must be %d (gate) or %d (uniform), got %d", H3_LAYERS_GATE,
                      H3_LAYERS_UNIFORM, k->layer_policy);
    if (k->token_reduction != 0 && k->token_reduction != 1)
        return h3_err(H3_E_INVALID, "token reduction must be 0 (off) or 1 (on), got %d", k->token_reduction);
    if (!isfinite(k->cache_threshold) || k->cache_threshold < 0 || k->cache_threshold > 100)
        return h3_err(H3_E_INVALID, "cache threshold must be between 0 (off) and 100, got %g", (double)k->cache_threshold);
    if (k->cache_threshold > 0 && k->reuse > 1)
        return h3_err(H3_E_INVALID, "cache threshold %g and reuse %d cannot be combined: both choose which steps skip "
                                    "the transformer", (double)k->cache_threshold, k->reuse);
    return 0;
}

int h3_dit_set_knobs(h3_dit *d, const h3_dit_knobs *k)
{
    if (!d->rq.has_layout) return h3_err(H3_E_INVALID, "transformer: set a layout before the speed knobs");
    if (!k) {
        memset(&d->kn.knobs, 0, sizeof d->kn.knobs);
        return 0;
    }
    int rc = h3_dit_knobs_check(&d->w.c, k);
    if (rc) return rc;
    d->kn.knobs = *k;
    return 0;
}

/*
 * Layer score: mean |value| of a block's two AdaLN gates (slots 2 and 5: gate_msa, gate_mlp) over
 * the (timestep role, modality) rows of the plan at every step of the schedule. A block whose
 * gates are small adds little to the residual stream at the timesteps this request uses. Only the
 * gate rows of adaln_proj are multiplied (a third of the weight), one modality at a time.
 */
static int score_layers(h3_dit *d, const dit_plan *p, const float *t_values, int n_sets, double *score)
{
    const h3_dit_cfg *c = &d->w.c;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    const int64_t H = c->hidden, E = c->temb_dim, nc = p->n_combo;
    const int64_t M = (int64_t)n_sets * p->n_t, maxrows = (int64_t)n_sets * nc;
    float *emb = h3_alloc_aligned(sizeof(float) * (size_t)(M * E));
    float *X = h3_alloc_aligned(sizeof(float) * (size_t)(maxrows * E));
    float *Y = h3_alloc_aligned(sizeof(float) * (size_t)(maxrows * H));
    float *Xd = be->mem->alloc(be, sizeof(float) * (size_t)(maxrows * E + 1));
    float *Yd = be->mem->alloc(be, sizeof(float) * (size_t)(maxrows * H + 1));
    float *bd = be->mem->alloc(be, sizeof(float) * (size_t)H);
    int rc = (!emb || !X || !Y || !Xd || !Yd || !bd) ? -H3_E_NOMEM : 0;
    if (!rc) rc = dit_time_embed(d, t_values, M, emb);
    for (int b = 0; !rc && b < c->layers; b++) {
        const dit_block *bk = &d->w.blk[b];
        const size_t wsz = h3_dtype_size(bk->ada.dtype);
        double sum = 0;
        int64_t count = 0;
        for (int m = 0; !rc && m < H3_TAGS; m++) {
            int64_t rows = 0;
            for (int s = 0; s < n_sets; s++)
                for (int64_t k = 0; k < nc; k++)
                    if (p->combo_m[k] == m)
                        memcpy(X + (rows++) * E, emb + ((int64_t)s * p->n_t + p->combo_t[k]) * E, sizeof(float) * (size_t)E);
            if (!rows) continue;
            rc = be->mem->upload(be, Xd, X, sizeof(float) * (size_t)(rows * E));
            static const int gate_slots[2] = {2, 5};
            for (int g = 0; g < 2 && !rc; g++) {
                const int64_t row0 = ((int64_t)m * 6 + gate_slots[g]) * H;
                h3_bw W = {0};
                const h3_bt xb = f32(Xd, rows, E, E), yb = f32(Yd, rows, H, H);
                rc = be->weights->weight_load(be, (const char *)bk->ada.data + (size_t)(row0 * E) * wsz, bk->ada.dtype,
                                              H, E, &W);
                if (!rc) rc = be->mem->upload(be, bd, bk->ada_b + row0, sizeof(float) * (size_t)H);
                if (!rc) rc = o->linear(be, &xb, &W, bd, &yb);
                if (!rc) rc = be->mem->download(be, Y, Yd, sizeof(float) * (size_t)(rows * H));
                dit_wfree(d, &W);
                for (int64_t i = 0; !rc && i < rows * H; i++) sum += fabs((double)Y[i]);
                count += rows * H;
            }
        }
        score[b] = count ? sum / (double)count : 0;
    }
    h3_free_aligned(emb);
    h3_free_aligned(X);
    h3_free_aligned(Y);
    dit_bfree(d, Xd);
    dit_bfree(d, Yd);
    dit_bfree(d, bd);
    return rc;
}

/* The run list for knobs.layers: the first two blocks, the last, and the rest chosen by policy. */
static int select_layers(h3_dit *d, const float *t_values, int n_sets, bool release)
{
    const int L = d->w.c.layers, M = d->kn.knobs.layers;
    if (M <= 0 || M >= L) {
        dit_run_all_blocks(d);
        return 0;
    }
    bool *keep = h3_calloc((size_t)L, sizeof *keep);
    double *score = h3_calloc((size_t)L, sizeof *score);
    int rc = keep && score ? 0 : -H3_E_NOMEM;
    const int fixed = L < 3 ? L : 3, want = M - fixed;
    if (!rc) {
        keep[0] = true;
        if (L > 1) keep[1] = true;
        keep[L - 1] = true;
    }
    if (!rc && want > 0 && d->kn.knobs.layer_policy == H3_LAYERS_UNIFORM) {
        /* the centres of `want` equal slices of blocks 2 .. L-2 (distinct: each slice is >= 1 block) */
        for (int j = 0; j < want; j++) keep[2 + (int)(((int64_t)(2 * j + 1) * (L - 3)) / (2 * want))] = true;
    } else if (!rc && want > 0) {
        rc = score_layers(d, &d->sc.plan, t_values, n_sets, score);
        for (int j = 0; !rc && j < want; j++) {
            int best = -1;
            for (int b = 2; b < L - 1; b++)
                if (!keep[b] && (best < 0 || score[b] > score[best])) best = b; /* ties: the earlier block */
            keep[best] = true;
        }
    }
    if (!rc) {
        d->kn.n_run = 0;
        for (int b = 0; b < L; b++) {
            if (keep[b]) {
                d->kn.run[d->kn.n_run++] = b;
            } else if (release) {
                /* a dropped block's adaln_proj is never read again for this schedule */
                char name[96];
                snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.weight", b);
                h3_store_release_tensor(d->st, name);
            }
        }
    }
    free(keep);
    free(score);
    return rc;
}

/* Token reduction's reduced sequence for the layout: generated video tokens (t, i, j) and
   (t, i, j + 1) with j even become one row; every other row (text, audio, conditioning, an odd last
   column) stays a row of its own. */
static int build_reduction(h3_dit *d)
{
    const h3_dit_cfg *c = &d->w.c;
    const h3_dit_layout *l = &d->rq.lay;
    const int64_t L = l->seq, H = c->hidden;
    const int64_t Hp = c->patch[1] ? l->lat_h / c->patch[1] : 0, Wp = c->patch[2] ? l->lat_w / c->patch[2] : 0;
    const int64_t n_gen = l->n_video - l->n_cond_video;
    if (Wp < 2 || Hp < 1 || l->lat_t < 1 || n_gen != (int64_t)l->lat_t * Hp * Wp) return 0; /* nothing to pool */
    int64_t *partner = h3_malloc(sizeof(int64_t) * (size_t)L);
    int64_t *pairs = h3_malloc(sizeof(int64_t) * 2 * (size_t)L);
    int32_t *combo = h3_malloc(sizeof(int32_t) * (size_t)L);
    double *pos = h3_malloc(sizeof(double) * 3 * (size_t)L);
    float *hc = h3_alloc_aligned(sizeof(float) * (size_t)(L * (d->w.F3 ? d->w.F3 : 1)));
    float *hs = h3_alloc_aligned(sizeof(float) * (size_t)(L * (d->w.F3 ? d->w.F3 : 1)));
    int rc = partner && pairs && combo && pos && hc && hs ? 0 : -H3_E_NOMEM;
    for (int64_t r = 0; !rc && r < L; r++) partner[r] = -1;
    for (int64_t g = 0; !rc && g < n_gen; g++) {
        const int64_t j = g % Wp;
        if (j % 2 || j + 1 >= Wp) continue;
        const int64_t r0 = l->video_idx[l->n_cond_video + g], r1 = l->video_idx[l->n_cond_video + g + 1];
        partner[r0] = r1;
        partner[r1] = -2; /* consumed by its pair */
    }
    int64_t n = 0;
    for (int64_t r = 0; !rc && r < L; r++) {
        if (partner[r] == -2) continue;
        const int64_t p1 = partner[r];
        pairs[2 * n] = r;
        pairs[2 * n + 1] = p1;
        combo[n] = d->sc.plan.row_combo[r]; /* a pair shares its (role, modality), so its table row */
        for (int a = 0; a < 3; a++)
            pos[n * 3 + a] = p1 >= 0 ? (l->pos[r * 3 + a] + l->pos[p1 * 3 + a]) * 0.5 : l->pos[r * 3 + a];
        n++;
    }
    if (!rc && d->w.F3 > 0) dit_rope_rows(d, pos, n, hc, hs);
    if (!rc) {
        h3_backend *be = d->be;
        d->kn.red_rows = n;
        d->kn.d_pairs = h3_backend_dup(be, pairs, sizeof(int64_t) * 2 * (size_t)n);
        d->kn.d_red_combo = h3_backend_dup(be, combo, sizeof(int32_t) * (size_t)n);
        d->kn.red_cos = d->w.F3 ? h3_backend_dup(be, hc, sizeof(float) * (size_t)(n * d->w.F3)) : NULL;
        d->kn.red_sin = d->w.F3 ? h3_backend_dup(be, hs, sizeof(float) * (size_t)(n * d->w.F3)) : NULL;
        d->kn.snap = be->mem->alloc(be, sizeof(float) * (size_t)(L * H));
        d->kn.red_base = be->mem->alloc(be, sizeof(float) * (size_t)(n * H));
        if (!d->kn.d_pairs || !d->kn.d_red_combo || (d->w.F3 && (!d->kn.red_cos || !d->kn.red_sin)) || !d->kn.snap ||
            !d->kn.red_base)
            rc = -H3_E_NOMEM;
    }
    h3_dit_token_span(c->layers, &d->kn.tr_first, &d->kn.tr_end, &d->kn.tr_end_early);
    free(partner);
    free(pairs);
    free(combo);
    free(pos);
    h3_free_aligned(hc);
    h3_free_aligned(hs);
    return rc;
}

/* Everything the knobs need before the tables are computed: the run list (and the blocks' weights
   to match), the reduced sequence, the velocity history and the caches' buffers. */
int dit_apply_knobs(h3_dit *d, const float *t_values, int evals, bool release)
{
    const h3_dit_knobs *k = &d->kn.knobs;
    const h3_dit_layout *l = &d->rq.lay;
    h3_backend *be = d->be;
    const int64_t H = d->w.c.hidden, L = l->seq;
    /* A backend without the knobs' ops (one still being written) refuses the knob, not the render. */
    static const h3_op reuse_ops[] = {H3_OP_extrapolate}, core_ops[] = {H3_OP_extrapolate, H3_OP_sub},
                       tr_ops[] = {H3_OP_extrapolate, H3_OP_pool_pairs, H3_OP_unpool_pairs},
                       cache_ops[] = {H3_OP_abs_diff_sum};
    const struct {
        bool used;
        const h3_op *ops;
        int n;
        const char *knob;
    } need[] = {{k->reuse > 1, reuse_ops, 1, "step reuse"},
                {k->core_reuse > 1, core_ops, 2, "core reuse"},
                {k->token_reduction != 0, tr_ops, 3, "token reduction"},
                {k->cache_threshold > 0, cache_ops, 1, "the step cache"}};
    for (size_t i = 0; i < sizeof need / sizeof *need; i++) {
        int nrc = need[i].used ? h3_backend_need(be, need[i].ops, need[i].n, need[i].knob) : 0;
        if (nrc) return nrc;
    }
    int rc = select_layers(d, t_values, evals, release);
    if (!rc) rc = dit_ensure_run_blocks(d);
    if (!rc && k->token_reduction) rc = build_reduction(d);
    if (!rc && (k->reuse > 1 || k->cache_threshold > 0)) {
        const size_t bytes[2] = {sizeof(float) * (size_t)(l->n_video * d->w.P + 1),
                                 sizeof(float) * (size_t)(l->n_audio * d->w.c.audio_ch + 1)};
        for (int m = 0; m < 2 && !rc; m++)
            for (int s = 0; s < 2 && !rc; s++)
                if (!(d->kn.vel[m][s] = be->mem->alloc(be, bytes[m]))) rc = -H3_E_NOMEM;
    }
    if (!rc && k->cache_threshold > 0) {
        d->kn.mod_cur = be->mem->alloc(be, sizeof(float) * (size_t)(L * H));
        d->kn.mod_prev = be->mem->alloc(be, sizeof(float) * (size_t)(L * H));
        if (!d->kn.mod_cur || !d->kn.mod_prev) rc = -H3_E_NOMEM;
    }
    if (!rc && k->core_reuse > 1 && !(d->kn.core_delta = be->mem->alloc(be, sizeof(float) * (size_t)(L * H))))
        rc = -H3_E_NOMEM;
    return rc;
}

