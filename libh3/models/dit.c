/*
 * The MiniMax-H3 transformer on CPU: diffusers' MiniMaxH3Transformer3DModel forward in f32, the
 * per-prompt token refiner, the AdaLN precompute of a whole schedule and the denoise step.
 *
 * Data flow of one forward over the packed sequence of L rows (H = hidden, A = heads * head_dim):
 *   x[L,H]  <- text rows (refined once per prompt) | video_patch_proj(video rows) | audio_patch_proj
 *   per block: n = RMSNorm(x)*w1*(1+scale_msa)+shift_msa        (modulation row per (t, modality))
 *              qkv = n Wqkv^T (per-head interleaved q|k|v)  -> per-head RMSNorm q, k -> RoPE
 *              x += gate_msa * (SDPA(q, k, v) Wout^T)
 *              n = RMSNorm(x)*w2*(1+scale_mlp)+shift_mlp
 *              x += gate_mlp * ((SiLU(gate) * up) W2^T),  [gate | up] = n W1^T
 *   out = (RMSNorm(x)*wf*(1+scale)+shift) Whead^T + b     for video and audio rows only
 */
#include "models/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The per-head q/k staging in qkv_task lives on the stack. */
#define DIT_MAX_HEAD_DIM 1024

typedef struct {
    float *norm1, *norm2, *qn, *kn; /* widened to f32 at open */
    h3_mat qkv, out, fc1, fc2;      /* mapped, read in place */
    h3_mat ada;                     /* blocks only: adaln_proj.linear [18H, temb_dim] */
    float *ada_b;
} dit_block;

/* Which (timestep slot, modality) pairs of one forward get modulation rows, and per row which. */
typedef struct {
    int n_t, n_combo, n_fin;
    int32_t *combo_of; /* [n_t * 3] -> combo or -1 */
    int32_t *fin_of;   /* [n_t] -> final-layer row or -1 */
    int32_t *combo_t, *combo_m, *fin_t;
    int32_t *row_combo, *row_fin; /* [L]; row_fin is -1 on text rows */
} dit_plan;

struct h3_dit {
    h3_model *m;
    h3_store *st;
    h3_pool *pool;
    h3_dit_cfg c;
    int A, P, F3; /* attention width, video patch width, 3 * rope frequencies */

    h3_mat cond, te_in, te_out, fin_ada, vout, aout, vproj, aproj;
    float *cond_b, *te_in_b, *te_out_b, *fin_ada_b, *fin_norm, *vout_b, *aout_b, *vproj_b, *aproj_b;
    float *ref_final, *inv_freq;
    dit_block *ref, *blk;
    bool adaln_released;
    uint64_t adaln_weight_bytes;

    /* request */
    h3_dit_layout lay;
    bool has_layout;
    float *rcos, *rsin; /* [L][3F] */
    float *text;        /* refined text rows [n_text][H] */
    bool has_text;
    float *x, *nb, *tmp, *big, *qkv3, *ob, *vo, *ao; /* forward buffers */
    int64_t buf_rows;

    /* prepared schedule */
    int n_steps;
    float *sig[2], *ts[2]; /* [0] video, [1] audio */
    dit_plan plan;
    bool has_plan;
    float *tab_blk, *tab_fin;
    float *tvals;   /* [steps][H3_ROLES] timestep of every role at every step */
    bool per_step;  /* H3_DIT_PRECOMPUTE=0: modulation computed at each step (the slow path) */
    uint64_t table_bytes;
    h3_dit_stats stats;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

const char *h3_dit_part_name(int part)
{
    static const char *names[H3_DIT_PARTS] = {"linear", "attention", "norm_modulate", "qk_norm_rope", "eltwise"};
    return part >= 0 && part < H3_DIT_PARTS ? names[part] : "?";
}

/* Charge the time since *t to a part of the forward's breakdown and restart the clock. */
static void charge(h3_dit *d, int part, double *t)
{
    double n = now_ms();
    d->stats.part_ms[part] += n - *t;
    *t = n;
}

/* ---- weights --------------------------------------------------------------------------- */

static int get_mat(h3_dit *d, h3_mat *m, int64_t rows, int64_t cols, const char *fmt, ...) H3_PRINTF(5, 6);
static int get_mat(h3_dit *d, h3_mat *m, int64_t rows, int64_t cols, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[2] = {rows, cols};
    h3_dtype dt;
    const void *p = h3_store_get_float(d->st, name, 2, shape, &dt);
    if (!p) return -H3_E_SCHEMA;
    m->data = p;
    m->dtype = dt;
    m->rows = rows;
    m->cols = cols;
    return 0;
}

/* A vector (norm weight, bias, frequencies) widened to an owned f32 copy. */
static int get_vec(h3_dit *d, float **out, int64_t n, const char *fmt, ...) H3_PRINTF(4, 5);
static int get_vec(h3_dit *d, float **out, int64_t n, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    h3_dtype dt;
    const void *p = h3_store_get_float(d->st, name, 1, &n, &dt);
    if (!p) return -H3_E_SCHEMA;
    *out = h3_alloc_aligned(sizeof(float) * (size_t)n);
    if (!*out) return -H3_E_NOMEM;
    h3_to_f32(p, dt, *out, n);
    return 0;
}

static int load_block(h3_dit *d, dit_block *b, const char *pfx, int i, bool modulated)
{
    const h3_dit_cfg *c = &d->c;
    int rc;
    if ((rc = get_vec(d, &b->norm1, c->hidden, "%s.%d.norm1.weight", pfx, i)) ||
        (rc = get_vec(d, &b->norm2, c->hidden, "%s.%d.norm2.weight", pfx, i)) ||
        (rc = get_mat(d, &b->qkv, 3LL * d->A, c->hidden, "%s.%d.attn.qkv_proj.weight", pfx, i)) ||
        (rc = get_vec(d, &b->qn, c->head_dim, "%s.%d.attn.q_norm.weight", pfx, i)) ||
        (rc = get_vec(d, &b->kn, c->head_dim, "%s.%d.attn.k_norm.weight", pfx, i)) ||
        (rc = get_mat(d, &b->out, c->hidden, d->A, "%s.%d.attn.out_proj.weight", pfx, i)) ||
        (rc = get_mat(d, &b->fc1, 2LL * c->ffn, c->hidden, "%s.%d.mlp.fc1.weight", pfx, i)) ||
        (rc = get_mat(d, &b->fc2, c->hidden, c->ffn, "%s.%d.mlp.fc2.weight", pfx, i)))
        return rc;
    if (modulated &&
        ((rc = get_mat(d, &b->ada, 18LL * c->hidden, c->temb_dim, "%s.%d.adaln_proj.linear.weight", pfx, i)) ||
         (rc = get_vec(d, &b->ada_b, 18LL * c->hidden, "%s.%d.adaln_proj.linear.bias", pfx, i))))
        return rc;
    return 0;
}

static void free_block(dit_block *b)
{
    h3_free_aligned(b->norm1);
    h3_free_aligned(b->norm2);
    h3_free_aligned(b->qn);
    h3_free_aligned(b->kn);
    h3_free_aligned(b->ada_b);
}

static uint64_t tensor_bytes(const h3_store *s, const char *name)
{
    const h3_tensor *t = h3_store_find(s, name);
    return t ? t->end - t->begin : 0;
}

const h3_dit_cfg *h3_dit_config(const h3_dit *d) { return &d->c; }

int h3_dit_open(h3_model *m, h3_pool *pool, h3_dit **out)
{
    double t0 = now_ms();
    *out = NULL;
    h3_dit *d = h3_calloc(1, sizeof *d);
    if (!d) return -H3_E_NOMEM;
    d->m = m;
    d->pool = pool;
    int rc = h3_dit_cfg_load(m, &d->c);
    if (!rc) rc = h3_model_headers(m, H3_COMP_TRANSFORMER);
    if (rc) {
        free(d);
        return rc;
    }
    d->st = &m->comp[H3_COMP_TRANSFORMER].store;
    const h3_dit_cfg *c = &d->c;
    if (c->head_dim > DIT_MAX_HEAD_DIM) {
        rc = h3_err(H3_E_UNSUPPORTED, "%s: attention_head_dim %d is larger than this engine supports (%d)",
                    m->comp[H3_COMP_TRANSFORMER].config_path, c->head_dim, DIT_MAX_HEAD_DIM);
        free(d);
        return rc;
    }
    d->A = c->heads * c->head_dim;
    d->P = c->video_ch * c->patch[1] * c->patch[2];
    d->F3 = 3 * c->rope_freq;
    d->ref = h3_calloc((size_t)(c->refiner_layers ? c->refiner_layers : 1), sizeof *d->ref);
    d->blk = h3_calloc((size_t)(c->layers ? c->layers : 1), sizeof *d->blk);
    if (!d->ref || !d->blk) rc = -H3_E_NOMEM;
    const int64_t H = c->hidden;
    if (!rc) rc = get_mat(d, &d->cond, H, c->text_dim, "condition_proj.weight");
    if (!rc) rc = get_vec(d, &d->cond_b, H, "condition_proj.bias");
    if (!rc) rc = get_vec(d, &d->ref_final, H, "token_refiner.final_norm.weight");
    if (!rc) rc = get_mat(d, &d->te_in, c->temb_hidden, c->freq_dim, "time_embedder.proj_in.weight");
    if (!rc) rc = get_vec(d, &d->te_in_b, c->temb_hidden, "time_embedder.proj_in.bias");
    if (!rc) rc = get_mat(d, &d->te_out, c->temb_dim, c->temb_hidden, "time_embedder.proj_out.weight");
    if (!rc) rc = get_vec(d, &d->te_out_b, c->temb_dim, "time_embedder.proj_out.bias");
    if (!rc) rc = get_mat(d, &d->fin_ada, 2 * H, c->temb_dim, "final_layer.adaln_proj.linear.weight");
    if (!rc) rc = get_vec(d, &d->fin_ada_b, 2 * H, "final_layer.adaln_proj.linear.bias");
    if (!rc) rc = get_vec(d, &d->fin_norm, H, "final_layer.norm.weight");
    if (!rc) rc = get_mat(d, &d->vout, d->P, H, "final_layer.video_out.weight");
    if (!rc) rc = get_vec(d, &d->vout_b, d->P, "final_layer.video_out.bias");
    if (!rc) rc = get_mat(d, &d->aout, c->audio_ch, H, "final_layer.audio_out.weight");
    if (!rc) rc = get_vec(d, &d->aout_b, c->audio_ch, "final_layer.audio_out.bias");
    if (!rc) rc = get_mat(d, &d->vproj, H, d->P, "video_patch_proj.weight");
    if (!rc) rc = get_vec(d, &d->vproj_b, H, "video_patch_proj.bias");
    if (!rc) rc = get_mat(d, &d->aproj, H, c->audio_ch, "audio_patch_proj.weight");
    if (!rc) rc = get_vec(d, &d->aproj_b, H, "audio_patch_proj.bias");
    if (!rc && c->rope_freq > 0) rc = get_vec(d, &d->inv_freq, c->rope_freq, "rope.inv_freq");
    for (int i = 0; !rc && i < c->refiner_layers; i++) rc = load_block(d, &d->ref[i], "token_refiner.blocks", i, false);
    for (int i = 0; !rc && i < c->layers; i++) rc = load_block(d, &d->blk[i], "blocks", i, true);
    if (rc) { /* the store's message names the tensor, the shard and the shapes */
        h3_dit_close(d);
        return rc;
    }
    for (int i = 0; i < c->layers; i++) {
        char name[96];
        snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.weight", i);
        d->adaln_weight_bytes += tensor_bytes(d->st, name);
        snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.bias", i);
        d->adaln_weight_bytes += tensor_bytes(d->st, name);
    }
    d->adaln_weight_bytes += tensor_bytes(d->st, "final_layer.adaln_proj.linear.weight") +
                             tensor_bytes(d->st, "final_layer.adaln_proj.linear.bias");
    d->stats.open_ms = now_ms() - t0;
    *out = d;
    return 0;
}

static void plan_free(dit_plan *p)
{
    free(p->combo_of);
    free(p->fin_of);
    free(p->combo_t);
    free(p->combo_m);
    free(p->fin_t);
    free(p->row_combo);
    free(p->row_fin);
    memset(p, 0, sizeof *p);
}

static void free_buffers(h3_dit *d)
{
    float **bufs[] = {&d->x, &d->nb, &d->tmp, &d->big, &d->qkv3, &d->ob, &d->vo, &d->ao, &d->rcos, &d->rsin, &d->text};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        h3_free_aligned(*bufs[i]);
        *bufs[i] = NULL;
    }
    d->buf_rows = 0;
    d->has_text = false;
}

static void drop_schedule(h3_dit *d)
{
    for (int k = 0; k < 2; k++) {
        free(d->sig[k]);
        free(d->ts[k]);
        d->sig[k] = d->ts[k] = NULL;
    }
    plan_free(&d->plan);
    h3_free_aligned(d->tab_blk);
    h3_free_aligned(d->tab_fin);
    free(d->tvals);
    d->tab_blk = d->tab_fin = d->tvals = NULL;
    d->table_bytes = 0;
    d->has_plan = false;
    d->n_steps = 0;
}

void h3_dit_close(h3_dit *d)
{
    if (!d) return;
    drop_schedule(d);
    free_buffers(d);
    h3_dit_layout_free(&d->lay);
    if (d->ref)
        for (int i = 0; i < d->c.refiner_layers; i++) free_block(&d->ref[i]);
    if (d->blk)
        for (int i = 0; i < d->c.layers; i++) free_block(&d->blk[i]);
    free(d->ref);
    free(d->blk);
    float *vecs[] = {d->cond_b, d->te_in_b, d->te_out_b, d->fin_ada_b, d->fin_norm, d->vout_b,
                     d->aout_b, d->vproj_b, d->aproj_b, d->ref_final, d->inv_freq};
    for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++) h3_free_aligned(vecs[i]);
    free(d);
}

/* ---- row-wise kernels ------------------------------------------------------------------ */

typedef struct {
    h3_dit *d;
    const float *x;
    float *y;
    const float *w;
    const float *tab;      /* modulation table of this block / final layer */
    const int32_t *row_mod;/* per row: table entry, or NULL for a plain norm */
    const int64_t *rows;   /* gather: output row k reads input row rows[k] (NULL = identity) */
    int64_t n, ldx, ldy;
    int slot, stride;      /* shift at tab[(entry*stride + slot)*n], 1+scale at slot+1 */
    float eps;
} norm_job;

/* y = RMSNorm(x) * w [* (1 + scale) + shift]. The mean square is accumulated in double; the
   products follow torch's order: (x * rsqrt(ms + eps)) * w, then * (1 + scale) + shift. */
static void norm_task(void *a, int64_t b, int64_t e, int thread)
{
    norm_job *j = a;
    (void)thread;
    const int64_t n = j->n;
    for (int64_t k = b; k < e; k++) {
        int64_t r = j->rows ? j->rows[k] : k;
        const float *x = j->x + r * j->ldx;
        float *y = j->y + k * j->ldy;
        const float inv = (float)(1.0 / sqrt(h3_sumsq(x, n) / (double)n + j->eps));
        if (j->row_mod) {
            const int32_t m = j->row_mod[r];
            const float *shift = j->tab + ((int64_t)m * j->stride + j->slot) * n, *scale = shift + n;
            h3_scale_mod(x, n, inv, j->w, scale, shift, y);
        } else {
            h3_scale_mod(x, n, inv, j->w, NULL, NULL, y);
        }
    }
}

static void run_norm(h3_dit *d, norm_job *j, int64_t rows)
{
    j->d = d;
    h3_parallel_for(d->pool, rows, 8, norm_task, j);
}

typedef struct {
    h3_dit *d;
    const float *qkv;
    float *q, *k, *v;
    const float *qn, *kn, *cos, *sin; /* cos/sin NULL: no RoPE (token refiner) */
} qkv_job;

/* Per row and head: split the interleaved [q | k | v], RMS-normalise q and k with their weights,
   rotate the first 6F dims (rotate-half over 2 x 3F, torch's order of operations) and scatter
   into head-major Q, K, V rows for the attention kernel. */
static void qkv_task(void *a, int64_t b, int64_t e, int thread)
{
    qkv_job *j = a;
    (void)thread;
    const h3_dit *d = j->d;
    const int D = d->c.head_dim, heads = d->c.heads, half = d->F3, A = d->A;
    const float eps = (float)d->c.qk_eps;
    float tmp[2][DIT_MAX_HEAD_DIM];
    for (int64_t r = b; r < e; r++) {
        const float *cs = j->cos ? j->cos + r * half : NULL, *sn = j->sin ? j->sin + r * half : NULL;
        for (int h = 0; h < heads; h++) {
            const float *src = j->qkv + r * 3 * (int64_t)A + (int64_t)h * 3 * D;
            float *dst[2] = {j->q + r * A + (int64_t)h * D, j->k + r * A + (int64_t)h * D};
            const float *w[2] = {j->qn, j->kn};
            for (int s = 0; s < 2; s++) {
                const float *x = src + s * D;
                const float inv = (float)(1.0 / sqrt(h3_sumsq(x, D) / (double)D + eps));
                float *t = cs ? tmp[s] : dst[s];
                h3_scale_mod(x, D, inv, w[s], NULL, NULL, t);
                if (cs) {
                    float *o = dst[s];
                    h3_rope_half(t, cs, sn, half, o);
                    memcpy(o + 2 * half, t + 2 * half, sizeof(float) * (size_t)(D - 2 * half));
                }
            }
            memcpy(j->v + r * A + (int64_t)h * D, src + 2 * D, sizeof(float) * (size_t)D);
        }
    }
}

typedef struct {
    float *x;
    const float *y, *tab;
    const int32_t *row_mod;
    int64_t n;
    int slot;
} gate_job;

/* x += gate * y (gate = modulation slot of the row's entry; NULL table: plain residual). */
static void gate_task(void *a, int64_t b, int64_t e, int thread)
{
    gate_job *j = a;
    (void)thread;
    for (int64_t r = b; r < e; r++) {
        float *x = j->x + r * j->n;
        const float *y = j->y + r * j->n;
        const float *g = j->tab ? j->tab + ((int64_t)j->row_mod[r] * 6 + j->slot) * j->n : NULL;
        h3_gated_add(x, g, y, j->n);
    }
}

/* ---- buffers, layout, RoPE ------------------------------------------------------------- */

static int ensure_buffers(h3_dit *d, int64_t rows)
{
    if (d->buf_rows >= rows) return 0;
    const h3_dit_cfg *c = &d->c;
    const int64_t H = c->hidden, A = d->A, F = c->ffn;
    const int64_t big = 3 * A > 2 * F ? 3 * A : 2 * F, q3 = 3 * A > F ? 3 * A : F;
    float *nx[6] = {0};
    const int64_t w[6] = {H, H, H, big, q3, A};
    for (int i = 0; i < 6; i++) {
        nx[i] = h3_alloc_aligned(sizeof(float) * (size_t)(w[i] * rows));
        if (!nx[i]) {
            for (int k = 0; k < i; k++) h3_free_aligned(nx[k]);
            return -H3_E_NOMEM;
        }
    }
    float **dst[6] = {&d->x, &d->nb, &d->tmp, &d->big, &d->qkv3, &d->ob};
    for (int i = 0; i < 6; i++) {
        h3_free_aligned(*dst[i]);
        *dst[i] = nx[i];
    }
    d->buf_rows = rows;
    return 0;
}

int h3_dit_set_layout(h3_dit *d, const h3_dit_layout *l)
{
    const h3_dit_cfg *c = &d->c;
    bool keep_text = d->has_text && d->has_layout && d->lay.n_text == l->n_text;
    float *text = keep_text ? d->text : NULL;
    if (keep_text) d->text = NULL;
    drop_schedule(d);
    free_buffers(d);
    h3_dit_layout_free(&d->lay);
    d->has_layout = false;
    int rc = h3_dit_layout_copy(&d->lay, l);
    if (!rc) rc = ensure_buffers(d, l->seq);
    if (!rc) {
        d->vo = h3_alloc_aligned(sizeof(float) * (size_t)(l->n_video * d->P + 1));
        d->ao = h3_alloc_aligned(sizeof(float) * (size_t)(l->n_audio * c->audio_ch + 1));
        if (!d->vo || !d->ao) rc = -H3_E_NOMEM;
    }
    if (!rc && d->F3 > 0) {
        /* diffusers MiniMaxH3RotaryPosEmbed: fp64 positions cast to f32, times inv_freq in f32,
           laid out [t | h | w] x F; cos/sin in f32. The table holds 3F columns: the second
           half of torch's cat((freqs, freqs)) repeats them. */
        d->rcos = h3_alloc_aligned(sizeof(float) * (size_t)(l->seq * d->F3));
        d->rsin = h3_alloc_aligned(sizeof(float) * (size_t)(l->seq * d->F3));
        if (!d->rcos || !d->rsin) rc = -H3_E_NOMEM;
        for (int64_t r = 0; !rc && r < l->seq; r++)
            for (int a = 0; a < 3; a++) {
                const float p = (float)l->pos[r * 3 + a];
                for (int f = 0; f < c->rope_freq; f++) {
                    const float ang = p * d->inv_freq[f];
                    d->rcos[r * d->F3 + a * c->rope_freq + f] = cosf(ang);
                    d->rsin[r * d->F3 + a * c->rope_freq + f] = sinf(ang);
                }
            }
    }
    if (rc) {
        h3_free_aligned(text);
        free_buffers(d);
        h3_dit_layout_free(&d->lay);
        return rc;
    }
    d->has_layout = true;
    if (keep_text) {
        d->text = text;
        d->has_text = true;
    }
    return 0;
}

/* ---- one transformer block (shared by the refiner and the main stack) ------------------ */

/* Runs block b over the first `rows` rows of d->x. tab/row_mod: AdaLN table of this block and
   the per-row entry (NULL for the plain refiner block); cos/sin: RoPE (NULL in the refiner). */
static int run_block(h3_dit *d, const dit_block *b, int64_t rows, const float *tab, const int32_t *row_mod,
                     const float *cos, const float *sin)
{
    const h3_dit_cfg *c = &d->c;
    const int64_t H = c->hidden, A = d->A, F = c->ffn;
    int rc;
    double t = now_ms();
    norm_job nj = {.x = d->x, .y = d->nb, .w = b->norm1, .tab = tab, .row_mod = row_mod, .n = H, .ldx = H,
                   .ldy = H, .slot = 0, .stride = 6, .eps = (float)c->norm_eps};
    run_norm(d, &nj, rows);
    charge(d, H3_DIT_PART_NORM, &t);
    if ((rc = h3_linear(d->pool, d->nb, rows, H, &b->qkv, NULL, d->big, 3 * A))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    float *Q = d->qkv3, *K = Q + rows * A, *V = K + rows * A;
    qkv_job qj = {d, d->big, Q, K, V, b->qn, b->kn, cos, sin};
    h3_parallel_for(d->pool, rows, 4, qkv_task, &qj);
    charge(d, H3_DIT_PART_QKV, &t);
    if ((rc = h3_attention(d->pool, Q, A, K, A, V, A, rows, rows, c->heads, c->heads, c->head_dim,
                           1.0f / sqrtf((float)c->head_dim), false, d->ob, A)))
        return rc;
    charge(d, H3_DIT_PART_ATTENTION, &t);
    if ((rc = h3_linear(d->pool, d->ob, rows, A, &b->out, NULL, d->tmp, H))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    gate_job gj = {d->x, d->tmp, tab, row_mod, H, 2};
    h3_parallel_for(d->pool, rows, 8, gate_task, &gj);
    charge(d, H3_DIT_PART_ELTWISE, &t);
    nj.w = b->norm2;
    nj.slot = 3;
    run_norm(d, &nj, rows);
    charge(d, H3_DIT_PART_NORM, &t);
    if ((rc = h3_linear(d->pool, d->nb, rows, H, &b->fc1, NULL, d->big, 2 * F))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    /* fc1 rows are [gate | up] (diffusers' SwiGLU with its halves swapped). */
    h3_swiglu(d->pool, d->big, 2 * F, d->big + F, 2 * F, d->qkv3, F, rows, F);
    charge(d, H3_DIT_PART_ELTWISE, &t);
    if ((rc = h3_linear(d->pool, d->qkv3, rows, F, &b->fc2, NULL, d->tmp, H))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    gj.slot = 5;
    h3_parallel_for(d->pool, rows, 8, gate_task, &gj);
    charge(d, H3_DIT_PART_ELTWISE, &t);
    return 0;
}

int h3_dit_set_text(h3_dit *d, const float *text_states, int64_t n)
{
    if (!d->has_layout) return h3_err(H3_E_INVALID, "transformer: set a layout before the text");
    if (n != d->lay.n_text)
        return h3_err(H3_E_INVALID, "transformer: %lld text rows, but the layout has %lld", (long long)n,
                      (long long)d->lay.n_text);
    double t0 = now_ms();
    const h3_dit_cfg *c = &d->c;
    const int64_t H = c->hidden;
    int rc;
    if (!d->text) {
        d->text = h3_alloc_aligned(sizeof(float) * (size_t)(n * H));
        if (!d->text) return -H3_E_NOMEM;
    }
    d->has_text = false;
    /* The refiner's time is not part of any forward's breakdown. */
    double saved[H3_DIT_PARTS];
    memcpy(saved, d->stats.part_ms, sizeof saved);
    if ((rc = h3_linear(d->pool, text_states, n, c->text_dim, &d->cond, d->cond_b, d->x, H))) return rc;
    for (int i = 0; i < c->refiner_layers; i++)
        if ((rc = run_block(d, &d->ref[i], n, NULL, NULL, NULL, NULL))) return rc;
    norm_job nj = {.x = d->x, .y = d->text, .w = d->ref_final, .n = H, .ldx = H, .ldy = H, .eps = (float)c->final_eps};
    run_norm(d, &nj, n);
    memcpy(d->stats.part_ms, saved, sizeof saved);
    d->has_text = true;
    d->stats.refine_ms = now_ms() - t0;
    return 0;
}

/* ---- modulation plans and tables ------------------------------------------------------- */

static int plan_build(dit_plan *p, const h3_dit_layout *l, const int32_t *row_t, int n_t)
{
    memset(p, 0, sizeof *p);
    p->n_t = n_t;
    p->combo_of = h3_malloc(sizeof(int32_t) * (size_t)n_t * H3_TAGS);
    p->fin_of = h3_malloc(sizeof(int32_t) * (size_t)n_t);
    p->combo_t = h3_malloc(sizeof(int32_t) * (size_t)n_t * H3_TAGS);
    p->combo_m = h3_malloc(sizeof(int32_t) * (size_t)n_t * H3_TAGS);
    p->fin_t = h3_malloc(sizeof(int32_t) * (size_t)n_t);
    p->row_combo = h3_malloc(sizeof(int32_t) * (size_t)l->seq);
    p->row_fin = h3_malloc(sizeof(int32_t) * (size_t)l->seq);
    if (!p->combo_of || !p->fin_of || !p->combo_t || !p->combo_m || !p->fin_t || !p->row_combo || !p->row_fin) {
        plan_free(p);
        return -H3_E_NOMEM;
    }
    for (int i = 0; i < n_t * H3_TAGS; i++) p->combo_of[i] = -1;
    for (int i = 0; i < n_t; i++) p->fin_of[i] = -1;
    for (int64_t r = 0; r < l->seq; r++) {
        int32_t t = row_t[r];
        if (t < 0 || t >= n_t) {
            plan_free(p);
            return h3_err(H3_E_INVALID, "forward: timestep_indices[%lld] = %d, but there are %d timesteps",
                          (long long)r, t, n_t);
        }
        int key = t * H3_TAGS + l->tags[r];
        if (p->combo_of[key] < 0) {
            p->combo_t[p->n_combo] = t;
            p->combo_m[p->n_combo] = l->tags[r];
            p->combo_of[key] = p->n_combo++;
        }
        p->row_combo[r] = p->combo_of[key];
        p->row_fin[r] = -1;
    }
    /* The final layer's table has no modality axis; only video and audio rows reach the heads. */
    for (int pass = 0; pass < 2; pass++) {
        const int64_t *idx = pass ? l->audio_idx : l->video_idx;
        int64_t n = pass ? l->n_audio : l->n_video;
        for (int64_t i = 0; i < n; i++) {
            int32_t t = row_t[idx[i]];
            if (p->fin_of[t] < 0) {
                p->fin_t[p->n_fin] = t;
                p->fin_of[t] = p->n_fin++;
            }
            p->row_fin[idx[i]] = p->fin_of[t];
        }
    }
    return 0;
}

/*
 * The timestep embedding as diffusers computes it: Timesteps(flip_sin_to_cos=True, shift 0) in
 * f32 -> proj_in -> SiLU -> proj_out, then the SiLU every AdaLN projection applies (at f32).
 */
static int time_embed(h3_dit *d, const float *t, int64_t M, float *out)
{
    const h3_dit_cfg *c = &d->c;
    const int half = c->freq_dim / 2;
    float *sin_emb = h3_alloc_aligned(sizeof(float) * (size_t)(M * c->freq_dim));
    float *h = h3_alloc_aligned(sizeof(float) * (size_t)(M * c->temb_hidden));
    if (!sin_emb || !h) {
        h3_free_aligned(sin_emb);
        h3_free_aligned(h);
        return -H3_E_NOMEM;
    }
    const float neg_log = (float)-log(10000.0);
    for (int64_t m = 0; m < M; m++)
        for (int i = 0; i < half; i++) {
            float expo = neg_log * (float)i;
            expo = expo / (float)half;
            const float arg = t[m] * expf(expo);
            sin_emb[m * c->freq_dim + i] = cosf(arg);
            sin_emb[m * c->freq_dim + half + i] = sinf(arg);
        }
    int rc = h3_linear(d->pool, sin_emb, M, c->freq_dim, &d->te_in, d->te_in_b, h, c->temb_hidden);
    for (int64_t i = 0; !rc && i < M * c->temb_hidden; i++) h[i] = h3_silu(h[i]);
    if (!rc) rc = h3_linear(d->pool, h, M, c->temb_hidden, &d->te_out, d->te_out_b, out, c->temb_dim);
    for (int64_t i = 0; !rc && i < M * c->temb_dim; i++) out[i] = h3_silu(out[i]);
    h3_free_aligned(sin_emb);
    h3_free_aligned(h);
    return rc;
}

/*
 * Modulation tables for n_sets forwards (the steps of a schedule) sharing one plan:
 * t_values[s * n_t + t]. blk: [set][layer][combo][6][H] with slots 1 and 4 holding 1 + scale;
 * fin: [set][fin][2][H] = shift, 1 + scale. Each adaln_proj weight is read once for all sets
 * (one GEMM per block and modality with M = sets x combos), so the precompute streams the
 * weights exactly once.
 */
static int compute_tables(h3_dit *d, const dit_plan *p, const float *t_values, int n_sets, float *blk, float *fin,
                          bool release)
{
    const h3_dit_cfg *c = &d->c;
    const int64_t H = c->hidden, E = c->temb_dim, L = c->layers, nc = p->n_combo, nf = p->n_fin;
    const int64_t M = (int64_t)n_sets * p->n_t;
    float *tv = h3_malloc(sizeof(float) * (size_t)M);
    float *emb = h3_alloc_aligned(sizeof(float) * (size_t)(M * E));
    int64_t maxrows = (int64_t)n_sets * (nc > nf ? nc : nf);
    float *X = h3_alloc_aligned(sizeof(float) * (size_t)(maxrows * E));
    float *Y = h3_alloc_aligned(sizeof(float) * (size_t)(maxrows * 6 * H));
    int rc = (!tv || !emb || !X || !Y) ? -H3_E_NOMEM : 0;
    if (!rc) {
        memcpy(tv, t_values, sizeof(float) * (size_t)M);
        rc = time_embed(d, tv, M, emb);
    }
    for (int64_t b = 0; !rc && b < L; b++) {
        const dit_block *bk = &d->blk[b];
        const size_t wsz = h3_dtype_size(bk->ada.dtype);
        for (int m = 0; !rc && m < H3_TAGS; m++) {
            int64_t rows = 0;
            for (int s = 0; s < n_sets; s++)
                for (int64_t k = 0; k < nc; k++)
                    if (p->combo_m[k] == m) memcpy(X + (rows++) * E, emb + ((int64_t)s * p->n_t + p->combo_t[k]) * E, sizeof(float) * (size_t)E);
            if (!rows) continue;
            h3_mat W = {(const char *)bk->ada.data + (size_t)m * 6 * H * E * wsz, bk->ada.dtype, 6 * H, E};
            if ((rc = h3_linear(d->pool, X, rows, E, &W, bk->ada_b + m * 6 * H, Y, 6 * H))) break;
            rows = 0;
            for (int s = 0; s < n_sets; s++)
                for (int64_t k = 0; k < nc; k++) {
                    if (p->combo_m[k] != m) continue;
                    float *dst = blk + (((int64_t)s * L + b) * nc + k) * 6 * H;
                    const float *src = Y + (rows++) * 6 * H;
                    for (int64_t i = 0; i < 6 * H; i++) {
                        int slot = (int)(i / H);
                        dst[i] = (slot == 1 || slot == 4) ? 1.0f + src[i] : src[i];
                    }
                }
        }
        if (!rc && release) {
            char name[96];
            snprintf(name, sizeof name, "blocks.%lld.adaln_proj.linear.weight", (long long)b);
            h3_store_release_tensor(d->st, name);
            snprintf(name, sizeof name, "blocks.%lld.adaln_proj.linear.bias", (long long)b);
            h3_store_release_tensor(d->st, name);
        }
    }
    if (!rc && nf) {
        int64_t rows = 0;
        for (int s = 0; s < n_sets; s++)
            for (int64_t k = 0; k < nf; k++)
                memcpy(X + (rows++) * E, emb + ((int64_t)s * p->n_t + p->fin_t[k]) * E, sizeof(float) * (size_t)E);
        rc = h3_linear(d->pool, X, rows, E, &d->fin_ada, d->fin_ada_b, Y, 2 * H);
        for (int64_t r = 0; !rc && r < rows; r++) {
            float *dst = fin + r * 2 * H;
            const float *src = Y + r * 2 * H;
            for (int64_t i = 0; i < H; i++) {
                dst[i] = src[i];
                dst[H + i] = 1.0f + src[H + i];
            }
        }
        if (!rc && release) {
            h3_store_release_tensor(d->st, "final_layer.adaln_proj.linear.weight");
            h3_store_release_tensor(d->st, "final_layer.adaln_proj.linear.bias");
        }
    }
    free(tv);
    h3_free_aligned(emb);
    h3_free_aligned(X);
    h3_free_aligned(Y);
    return rc;
}

/* The f32 copies of the adaln biases go with the weights on release; a later forward with
   explicit timesteps maps them again. */
static int ensure_ada_bias(h3_dit *d)
{
    const int64_t H = d->c.hidden;
    int rc = 0;
    for (int b = 0; !rc && b < d->c.layers; b++)
        if (!d->blk[b].ada_b) rc = get_vec(d, &d->blk[b].ada_b, 18 * H, "blocks.%d.adaln_proj.linear.bias", b);
    if (!rc && !d->fin_ada_b) rc = get_vec(d, &d->fin_ada_b, 2 * H, "final_layer.adaln_proj.linear.bias");
    return rc;
}

static void release_ada_bias(h3_dit *d)
{
    for (int b = 0; b < d->c.layers; b++) {
        h3_free_aligned(d->blk[b].ada_b);
        d->blk[b].ada_b = NULL;
    }
    h3_free_aligned(d->fin_ada_b);
    d->fin_ada_b = NULL;
}

/* ---- the forward ----------------------------------------------------------------------- */

typedef struct {
    float *x;
    const float *src;
    const int64_t *idx;
    int64_t n;
} scatter_job;

static void scatter_task(void *a, int64_t b, int64_t e, int thread)
{
    scatter_job *j = a;
    (void)thread;
    for (int64_t i = b; i < e; i++) memcpy(j->x + j->idx[i] * j->n, j->src + i * j->n, sizeof(float) * (size_t)j->n);
}

static int forward(h3_dit *d, const dit_plan *p, const float *tab_blk, const float *tab_fin, const float *video_rows,
                   const float *audio_rows, float *video_out, float *audio_out)
{
    const double t0 = now_ms();
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    const int64_t H = c->hidden, L = l->seq;
    int rc;
    /* Rows no index names stay zero (diffusers scatters into a zero buffer). */
    if (l->n_text + l->n_video + l->n_audio < L) memset(d->x, 0, sizeof(float) * (size_t)(L * H));
    scatter_job sj = {d->x, d->text, l->text_idx, H};
    h3_parallel_for(d->pool, l->n_text, 16, scatter_task, &sj);
    if (l->n_video) {
        if ((rc = h3_linear(d->pool, video_rows, l->n_video, d->P, &d->vproj, d->vproj_b, d->tmp, H))) return rc;
        sj = (scatter_job){d->x, d->tmp, l->video_idx, H};
        h3_parallel_for(d->pool, l->n_video, 16, scatter_task, &sj);
    }
    if (l->n_audio) {
        if ((rc = h3_linear(d->pool, audio_rows, l->n_audio, c->audio_ch, &d->aproj, d->aproj_b, d->tmp, H))) return rc;
        sj = (scatter_job){d->x, d->tmp, l->audio_idx, H};
        h3_parallel_for(d->pool, l->n_audio, 16, scatter_task, &sj);
    }
    const int64_t blk_stride = (int64_t)p->n_combo * 6 * H;
    for (int b = 0; b < c->layers; b++)
        if ((rc = run_block(d, &d->blk[b], L, tab_blk + b * blk_stride, p->row_combo, d->rcos, d->rsin))) return rc;
    /* Final norm + heads on the output rows only (diffusers runs both heads over every row and
       selects afterwards; the selected values are the same). */
    norm_job nj = {.x = d->x, .y = d->nb, .w = d->fin_norm, .tab = tab_fin, .row_mod = p->row_fin, .n = H, .ldx = H,
                   .ldy = H, .slot = 0, .stride = 2, .eps = (float)c->final_eps};
    if (l->n_video) {
        nj.rows = l->video_idx;
        run_norm(d, &nj, l->n_video);
        if ((rc = h3_linear(d->pool, d->nb, l->n_video, H, &d->vout, d->vout_b, video_out, d->P))) return rc;
    }
    if (l->n_audio) {
        nj.rows = l->audio_idx;
        run_norm(d, &nj, l->n_audio);
        if ((rc = h3_linear(d->pool, d->nb, l->n_audio, H, &d->aout, d->aout_b, audio_out, c->audio_ch))) return rc;
    }
    const double ms = now_ms() - t0;
    h3_dit_stats *s = &d->stats;
    s->forward_ms_last = ms;
    s->forward_ms_total += ms;
    if (!s->forwards || ms < s->forward_ms_min) s->forward_ms_min = ms;
    s->forwards++;
    return 0;
}

int h3_dit_forward_t(h3_dit *d, const float *t_values, int n_t, const int32_t *row_t, const float *video_rows,
                     const float *audio_rows, float *video_out, float *audio_out)
{
    if (!d->has_layout || !d->has_text)
        return h3_err(H3_E_INVALID, "transformer: the forward needs a layout and its text first");
    if (n_t < 1 || n_t > 1 << 20) return h3_err(H3_E_INVALID, "forward: %d timesteps", n_t);
    for (int i = 0; i < n_t; i++)
        if (!isfinite(t_values[i]))
            return h3_err(H3_E_INVALID, "forward: timestep[%d] is not finite", i);
    dit_plan p;
    int rc = plan_build(&p, &d->lay, row_t, n_t);
    if (rc) return rc;
    const int64_t H = d->c.hidden;
    float *blk = h3_alloc_aligned(sizeof(float) * (size_t)((int64_t)d->c.layers * p.n_combo * 6 * H + 1));
    float *fin = h3_alloc_aligned(sizeof(float) * (size_t)((int64_t)p.n_fin * 2 * H + 1));
    rc = (!blk || !fin) ? -H3_E_NOMEM : ensure_ada_bias(d);
    if (!rc) rc = compute_tables(d, &p, t_values, 1, blk, fin, false);
    if (!rc) rc = forward(d, &p, blk, fin, video_rows, audio_rows, video_out, audio_out);
    h3_free_aligned(blk);
    h3_free_aligned(fin);
    plan_free(&p);
    return rc;
}

/* ---- schedule and step ----------------------------------------------------------------- */

int h3_dit_prepare_schedule(h3_dit *d, int steps, double shift_video, double shift_audio, bool release_adaln)
{
    if (!d->has_layout) return h3_err(H3_E_INVALID, "transformer: set a layout before preparing a schedule");
    const double t0 = now_ms();
    drop_schedule(d);
    /* Forward timings are per prepared request. */
    d->stats.forwards = 0;
    d->stats.forward_ms_min = d->stats.forward_ms_last = d->stats.forward_ms_total = 0;
    memset(d->stats.part_ms, 0, sizeof d->stats.part_ms);
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    int rc = 0, n[2] = {0, 0};
    const double shift[2] = {shift_video, shift_audio};
    for (int k = 0; k < 2 && !rc; k++) {
        d->sig[k] = h3_malloc(sizeof(float) * (size_t)(steps > 2 ? steps : 2));
        d->ts[k] = h3_malloc(sizeof(float) * (size_t)(steps > 2 ? steps : 2));
        if (!d->sig[k] || !d->ts[k]) rc = -H3_E_NOMEM;
        if (!rc && (n[k] = h3_sched_sigmas(steps, shift[k], d->sig[k])) < 0) rc = n[k];
        if (!rc) h3_sched_timesteps(d->sig[k], n[k], d->ts[k]);
    }
    /* diffusers zips the two timestep lists and steps the video list: with unequal lengths (a
       shift collapsing grid points) its loop would run out of audio sigmas. Refuse instead. */
    if (!rc && n[0] != n[1])
        rc = h3_err(H3_E_INVALID,
                    "schedule: %d steps give %d video sigmas (shift %g) but %d audio sigmas (shift %g); "
                    "the two schedules must have the same length",
                    steps, n[0], shift_video, n[1], shift_audio);
    int32_t *row_t = rc ? NULL : h3_malloc(sizeof(int32_t) * (size_t)l->seq);
    if (!rc && !row_t) rc = -H3_E_NOMEM;
    for (int64_t r = 0; !rc && r < l->seq; r++) row_t[r] = l->role[r];
    if (!rc) rc = plan_build(&d->plan, l, row_t, H3_ROLES);
    free(row_t);
    const int evals = n[0] - 1;
    /* H3_DIT_PRECOMPUTE=0 keeps diffusers' structure: the modulation of a step is computed from
       the adaln_proj weights when the step runs, and nothing is released. */
    const char *pre = getenv("H3_DIT_PRECOMPUTE");
    d->per_step = pre && strcmp(pre, "0") == 0;
    const int sets = d->per_step ? 1 : evals;
    if (!rc) {
        const int64_t H = c->hidden;
        uint64_t blk_n = (uint64_t)sets * c->layers * d->plan.n_combo * 6 * H;
        uint64_t fin_n = (uint64_t)sets * d->plan.n_fin * 2 * H;
        d->tab_blk = h3_alloc_aligned(sizeof(float) * (size_t)(blk_n + 1));
        d->tab_fin = h3_alloc_aligned(sizeof(float) * (size_t)(fin_n + 1));
        d->tvals = h3_malloc(sizeof(float) * (size_t)evals * H3_ROLES);
        if (!d->tab_blk || !d->tab_fin || !d->tvals) rc = -H3_E_NOMEM;
        d->table_bytes = (blk_n + fin_n) * sizeof(float);
    }
    float *tv = d->tvals;
    for (int s = 0; !rc && s < evals; s++) {
        /* build_row_timesteps: conditioning video rows at max(t, 0.999), reference audio at 1. */
        const float t = d->ts[0][s];
        tv[s * H3_ROLES + H3_ROLE_VIDEO] = t;
        tv[s * H3_ROLES + H3_ROLE_AUDIO] = d->ts[1][s];
        tv[s * H3_ROLES + H3_ROLE_COND_VIDEO] = (float)((double)t > H3_KEYFRAME_NOISE_AUG ? (double)t : H3_KEYFRAME_NOISE_AUG);
        tv[s * H3_ROLES + H3_ROLE_COND_AUDIO] = 1.0f;
    }
    if (d->per_step) release_adaln = false;
    if (!rc) rc = ensure_ada_bias(d);
    if (!rc && !d->per_step) rc = compute_tables(d, &d->plan, tv, evals, d->tab_blk, d->tab_fin, release_adaln);
    if (rc) {
        drop_schedule(d);
        return rc;
    }
    if (release_adaln) {
        release_ada_bias(d);
        d->adaln_released = true;
    }
    d->n_steps = evals;
    d->has_plan = true;
    d->stats.prepare_ms = now_ms() - t0;
    return evals;
}

int h3_dit_num_steps(const h3_dit *d) { return d->has_plan ? d->n_steps : 0; }

const float *h3_dit_sigmas(const h3_dit *d, int modality_audio) { return d->has_plan ? d->sig[modality_audio ? 1 : 0] : NULL; }

int h3_dit_step(h3_dit *d, int i, float *video_rows, float *audio_rows)
{
    if (!d->has_plan) return h3_err(H3_E_INVALID, "transformer: no schedule prepared");
    if (!d->has_text) return h3_err(H3_E_INVALID, "transformer: no text set for this layout");
    if (i < 0 || i >= d->n_steps)
        return h3_err(H3_E_INVALID, "transformer: step %d is outside the schedule of %d steps", i, d->n_steps);
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    const int64_t H = c->hidden;
    const int set = d->per_step ? 0 : i;
    const float *blk = d->tab_blk + (int64_t)set * c->layers * d->plan.n_combo * 6 * H;
    const float *fin = d->tab_fin + (int64_t)set * d->plan.n_fin * 2 * H;
    int rc = 0;
    if (d->per_step) {
        rc = ensure_ada_bias(d);
        if (!rc) rc = compute_tables(d, &d->plan, d->tvals + (int64_t)i * H3_ROLES, 1, d->tab_blk, d->tab_fin, false);
    }
    if (!rc) rc = forward(d, &d->plan, blk, fin, video_rows, audio_rows, d->vo, d->ao);
    if (rc) return rc;
    /* Euler on the generated rows only; conditioning rows ride through unchanged. */
    const int64_t P = d->P, Ca = c->audio_ch;
    h3_sched_euler(video_rows + l->n_cond_video * P, d->vo + l->n_cond_video * P, (l->n_video - l->n_cond_video) * P,
                   d->ts[0][i], d->sig[0][i], d->sig[0][i + 1]);
    h3_sched_euler(audio_rows + l->n_cond_audio * Ca, d->ao + l->n_cond_audio * Ca,
                   (l->n_audio - l->n_cond_audio) * Ca, d->ts[1][i], d->sig[1][i], d->sig[1][i + 1]);
    return d->n_steps - i - 1;
}

void h3_dit_adaln_bytes(const h3_dit *d, uint64_t *weights, uint64_t *tables, bool *released)
{
    if (weights) *weights = d->adaln_weight_bytes;
    if (tables) *tables = d->table_bytes;
    if (released) *released = d->adaln_released;
}

void h3_dit_get_stats(const h3_dit *d, h3_dit_stats *s) { *s = d->stats; }
