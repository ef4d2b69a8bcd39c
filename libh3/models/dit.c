/*
 * The MiniMax-H3 transformer: diffusers' MiniMaxH3Transformer3DModel forward, the per-prompt
 * token refiner, the AdaLN precompute of a whole schedule and the denoise step. Model logic only:
 * every tensor op goes through the backend table (backend/backend.h), so the same code runs on
 * the CPU (f32, the exact path) and on a GPU (bf16 GEMMs and attention, f32 residual stream).
 *
 * Data flow of one forward over the packed sequence of L rows (H = hidden, A = heads * head_dim):
 *   x[L,H]  <- text rows (refined once per prompt) | video_patch_proj(video rows) | audio_patch_proj
 *   per block: n = RMSNorm(x)*w1*(1+scale_msa)+shift_msa        (modulation row per (t, modality))
 *              qkv = n Wqkv^T (per-head interleaved q|k|v)  -> per-head RMSNorm q, k -> RoPE
 *              x += gate_msa * (SDPA(q, k, v) Wout^T)
 *              n = RMSNorm(x)*w2*(1+scale_mlp)+shift_mlp
 *              x += gate_mlp * ((SiLU(gate) * up) W2^T),  [gate | up] = n W1^T
 *   out = (RMSNorm(x)*wf*(1+scale)+shift) Whead^T + b     for video and audio rows only
 *
 * What lives where: GEMM weights, norm vectors, biases, the RoPE tables, the layout's index
 * arrays, the modulation tables and every activation are backend memory. The timestep embedding
 * (a few rows) and the plans are computed on the host; the adaln_proj weights are brought to the
 * backend one block at a time for the precompute and dropped right after.
 */
#include "models/dit_internal.h"
#include "models/dit_fp8file.h"

#include <stdatomic.h>

static _Atomic uint64_t g_generation; /* see h3_dit_set_layout */


const char *h3_dit_part_name(int part)
{
    static const char *names[H3_DIT_PARTS] = {"linear", "attention", "norm_modulate", "qk_norm_rope", "eltwise"};
    return part >= 0 && part < H3_DIT_PARTS ? names[part] : "?";
}

/* Charge the time since *t to a part of the forward's breakdown and restart the clock. Only on a
   synchronous backend: a GPU's ops return before they run. */
static void charge(h3_dit *d, int part, double *t)
{
    if (!d->time_parts) return;
    double n = now_ms();
    d->stats.part_ms[part] += n - *t;
    *t = n;
}

static void *act_at(const h3_dit *d, void *base, int64_t i) { return (char *)base + (size_t)i * d->esz; }



/* ---- weights --------------------------------------------------------------------------- */

static dit_owned *owned_find(h3_dit *d, const char *name)
{
    for (int i = 0; i < d->n_owned; i++)
        if (strcmp(d->owned[i].name, name) == 0) return &d->owned[i];
    return NULL;
}

/* Let a merged copy go (its handle was freed). */
static void owned_release(h3_dit *d, const char *name)
{
    dit_owned *o = owned_find(d, name);
    if (!o) return;
    h3_free_aligned(o->data);
    *o = d->owned[--d->n_owned];
}

/* Weight `name` as the host holds it: the mapping, or the LoRA-merged copy of it (merged once and
   kept until released, so a weight reloaded by a later schedule is not merged again). */
static int host_mat(h3_dit *d, h3_mat *m, int64_t rows, int64_t cols, const char *name)
{
    int64_t shape[2] = {rows, cols};
    h3_dtype dt;
    const void *p = h3_store_get_float(d->st, name, 2, shape, &dt);
    if (!p) return -H3_E_SCHEMA;
    if (d->lora) {
        dit_owned *o = owned_find(d, name);
        void *merged = NULL;
        h3_dtype mdt = dt;
        if (o) {
            merged = o->data;
            mdt = dt == H3_DT_BF16 ? H3_DT_BF16 : H3_DT_F32;
        } else {
            int rc = h3_lora_merge(d->lora, d->pool, name, p, dt, rows, cols, &merged, &mdt);
            if (rc) return rc;
            if (merged) {
                dit_owned *no = h3_realloc(d->owned, sizeof *no * (size_t)(d->n_owned + 1));
                if (!no) {
                    h3_free_aligned(merged);
                    return -H3_E_NOMEM;
                }
                d->owned = no;
                snprintf(no[d->n_owned].name, sizeof no[d->n_owned].name, "%s", name);
                no[d->n_owned++].data = merged;
            }
        }
        if (merged) {
            p = merged;
            dt = mdt;
        }
    }
    m->data = p;
    m->dtype = dt;
    m->rows = rows;
    m->cols = cols;
    return 0;
}

static int get_mat(h3_dit *d, h3_mat *m, int64_t rows, int64_t cols, const char *fmt, ...) H3_PRINTF(5, 6);
static int get_mat(h3_dit *d, h3_mat *m, int64_t rows, int64_t cols, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return host_mat(d, m, rows, cols, name);
}

/* A GEMM weight on the backend (a view of the mapping on the CPU, a device copy on a GPU). */
static int get_w(h3_dit *d, h3_bw *w, int64_t rows, int64_t cols, const char *fmt, ...) H3_PRINTF(5, 6);
static int get_w(h3_dit *d, h3_bw *w, int64_t rows, int64_t cols, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    h3_mat m;
    int rc = host_mat(d, &m, rows, cols, name);
    if (!rc) rc = d->be->weights->weight_load(d->be, m.data, m.dtype, rows, cols, w);
    if (rc) h3_err_prefix("%s", name);
    /* A backend that made its own copy (a GPU's, int8 on the CPU) no longer reads the mapped
       bytes: let their pages go, so that only the copy stays resident. */
    if (!rc && w->data != m.data) h3_store_release_tensor(d->st, name);
    return rc;
}

static float *host_vec_v(h3_dit *d, int64_t n, const char *fmt, va_list ap)
{
    char name[256];
    vsnprintf(name, sizeof name, fmt, ap);
    h3_dtype dt;
    const void *p = h3_store_get_float(d->st, name, 1, &n, &dt);
    if (!p) return NULL;
    float *out = h3_alloc_aligned(sizeof(float) * (size_t)n);
    if (out) h3_to_f32(p, dt, out, n);
    /* whole-parameter LoRA parts (.diff_b / .set_bias) of this vector */
    if (out && d->lora && h3_lora_merge_vec(d->lora, name, out, n)) {
        h3_free_aligned(out);
        return NULL;
    }
    return out;
}

/* A vector (norm weight, bias, frequencies) widened to an owned host f32 copy. */
static int get_vec(h3_dit *d, float **out, int64_t n, const char *fmt, ...) H3_PRINTF(4, 5);
static int get_vec(h3_dit *d, float **out, int64_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    *out = host_vec_v(d, n, fmt, ap);
    va_end(ap);
    return *out ? 0 : -H3_E_SCHEMA;
}

/* The same vector widened to f32 on the backend. */
static int get_bvec(h3_dit *d, float **out, int64_t n, const char *fmt, ...) H3_PRINTF(4, 5);
static int get_bvec(h3_dit *d, float **out, int64_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    float *host = host_vec_v(d, n, fmt, ap);
    va_end(ap);
    if (!host) return -H3_E_SCHEMA;
    *out = h3_backend_dup(d->be, host, sizeof(float) * (size_t)n);
    h3_free_aligned(host);
    return *out ? 0 : -H3_E_NOMEM;
}

const char *h3_dit_gemm_part(int k)
{
    static const char *const parts[H3_DIT_GEMMS] = {"attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"};
    return k >= 0 && k < H3_DIT_GEMMS ? parts[k] : "?";
}

void h3_dit_gemm_shape(const h3_dit_cfg *c, int k, int64_t *rows, int64_t *cols)
{
    const int64_t H = c->hidden, A = (int64_t)c->heads * c->head_dim, F = c->ffn;
    const int64_t r[H3_DIT_GEMMS] = {3 * A, H, 2 * F, H}, cl[H3_DIT_GEMMS] = {H, A, H, F};
    *rows = k >= 0 && k < H3_DIT_GEMMS ? r[k] : 0;
    *cols = k >= 0 && k < H3_DIT_GEMMS ? cl[k] : 0;
}

/* A main-block GEMM weight from the pre-quantised fp8 file (its stored e4m3 values and scales,
   the device form weight_load would have made under fp8). */
static int get_w_fp8(h3_dit *d, h3_bw *w, int64_t rows, int64_t cols, const char *name)
{
    const uint8_t *q;
    const float *s;
    int rc = h3_fp8file_get(d->fp8file, name, rows, cols, &q, &s);
    if (!rc)
        rc = h3_backend_has(d->be, H3_CAP_FP8_WEIGHTS)
                 ? d->be->weights->weight_load_fp8(d->be, q, s, rows, cols, w)
                 : h3_err(H3_E_UNSUPPORTED, "the %s backend cannot use pre-quantised fp8 weights", d->be->name);
    if (rc) h3_err_prefix("%s", name);
    if (!rc) h3_fp8file_release(d->fp8file, name);
    return rc;
}

/* A block's four GEMM weights (the bulk of its bytes). */
int dit_load_block_weights(h3_dit *d, dit_block *b, const char *pfx, int i)
{
    /* Reduced precision applies to the main stack only (the refiner runs once per prompt). */
    const bool main_stack = strcmp(pfx, "blocks") == 0;
    const int keep = d->be->weight_precision;
    if (main_stack) d->be->weight_precision = d->precision;
    int rc = 0;
    for (int k = 0; k < H3_DIT_GEMMS && !rc; k++) {
        int64_t rows, cols;
        h3_dit_gemm_shape(&d->c, k, &rows, &cols);
        char name[160];
        snprintf(name, sizeof name, "%s.%d.%s.weight", pfx, i, h3_dit_gemm_part(k));
        /* The file holds exactly the weights weight_load would quantise; the others load as then. */
        if (main_stack && d->fp8file && h3_fp8_weight_shape_ok(rows, cols))
            rc = get_w_fp8(d, dit_gemm(b, k), rows, cols, name);
        else
            rc = get_w(d, dit_gemm(b, k), rows, cols, "%s", name);
    }
    d->be->weight_precision = keep;
    if (!rc) b->loaded = true;
    return rc;
}

static int load_block(h3_dit *d, dit_block *b, const char *pfx, int i, bool modulated, bool weights)
{
    const h3_dit_cfg *c = &d->c;
    int rc;
    if ((rc = get_bvec(d, &b->norm1, c->hidden, "%s.%d.norm1.weight", pfx, i)) ||
        (rc = get_bvec(d, &b->norm2, c->hidden, "%s.%d.norm2.weight", pfx, i)) ||
        (rc = get_bvec(d, &b->qn, c->head_dim, "%s.%d.attn.q_norm.weight", pfx, i)) ||
        (rc = get_bvec(d, &b->kn, c->head_dim, "%s.%d.attn.k_norm.weight", pfx, i)) ||
        (weights && (rc = dit_load_block_weights(d, b, pfx, i))))
        return rc;
    if (modulated &&
        ((rc = get_mat(d, &b->ada, 18LL * c->hidden, c->temb_dim, "%s.%d.adaln_proj.linear.weight", pfx, i)) ||
         (rc = get_vec(d, &b->ada_b, 18LL * c->hidden, "%s.%d.adaln_proj.linear.bias", pfx, i))))
        return rc;
    return 0;
}

void dit_bfree(h3_dit *d, void *p) { d->be->mem->release(d->be, p); }

void dit_wfree(h3_dit *d, h3_bw *w)
{
    if (w->data || w->priv) d->be->weights->weight_free(d->be, w);
}

/* Drop a main-stack block's GEMM weights (and their merged copies): a dropped layer holds none. */
void dit_unload_block_weights(h3_dit *d, int i)
{
    dit_block *b = &d->blk[i];
    for (int k = 0; k < H3_DIT_GEMMS; k++) {
        dit_wfree(d, dit_gemm(b, k));
        char name[112];
        snprintf(name, sizeof name, "blocks.%d.%s.weight", i, h3_dit_gemm_part(k));
        owned_release(d, name);
    }
    b->loaded = false;
}

static void free_block(h3_dit *d, dit_block *b)
{
    dit_bfree(d, b->norm1);
    dit_bfree(d, b->norm2);
    dit_bfree(d, b->qn);
    dit_bfree(d, b->kn);
    dit_wfree(d, &b->qkv);
    dit_wfree(d, &b->out);
    dit_wfree(d, &b->fc1);
    dit_wfree(d, &b->fc2);
    h3_free_aligned(b->ada_b);
}

static uint64_t tensor_bytes(const h3_store *s, const char *name)
{
    const h3_tensor *t = h3_store_find(s, name);
    return t ? t->end - t->begin : 0;
}

const h3_dit_cfg *h3_dit_config(const h3_dit *d) { return &d->c; }
h3_backend *h3_dit_backend(const h3_dit *d) { return d->be; }
uint64_t h3_dit_generation(const h3_dit *d) { return d->generation; }

int h3_dit_open(h3_model *m, h3_pool *pool, h3_backend *be, unsigned flags, h3_dit **out)
{
    return h3_dit_open_ex(m, pool, be, flags, NULL, out);
}

int h3_dit_open_ex(h3_model *m, h3_pool *pool, h3_backend *be, unsigned flags, const h3_dit_open_opts *opts,
                   h3_dit **out)
{
    double t0 = now_ms();
    *out = NULL;
    if (!pool || !be) return h3_err(H3_E_INVALID, "transformer: no worker pool or backend");
    h3_dit *d = h3_calloc(1, sizeof *d);
    if (!d) return -H3_E_NOMEM;
    d->m = m;
    d->pool = pool;
    d->be = be;
    d->flags = flags;
    d->esz = h3_dtype_size(be->act_dtype);
    d->time_parts = h3_backend_has(be, H3_CAP_SYNCHRONOUS);
    int rc = h3_dit_cfg_load(m, &d->c);
    if (!rc) rc = h3_model_headers(m, H3_COMP_TRANSFORMER);
    if (rc) {
        free(d);
        return rc;
    }
    d->st = &m->comp[H3_COMP_TRANSFORMER].store;
    {
        /* A pruned single file: the AdaLN projections take the table's basis width. */
        const h3_tensor *tab = h3_store_find(d->st, "time_embedder.table");
        if (tab && tab->ndim == 2 && tab->shape[0] >= 2 && tab->shape[0] <= (1 << 20) && tab->shape[1] >= 1 &&
            tab->shape[1] <= (1 << 16)) {
            d->curve_grid = (int)tab->shape[0];
            d->c.temb_dim = (int)tab->shape[1];
        }
    }
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
    d->run = h3_calloc((size_t)(c->layers ? c->layers : 1), sizeof *d->run);
    if (!d->ref || !d->blk || !d->run) rc = -H3_E_NOMEM;
    for (int i = 0; i < c->layers; i++) d->run[i] = i;
    d->n_run = c->layers;
    d->lazy_blocks = opts && opts->lazy_blocks;
    d->precision = opts ? opts->precision : H3_PRECISION_DEFAULT;
    d->fp8file = opts && d->precision == H3_PRECISION_FP8 ? opts->fp8file : NULL;
    if (!rc && d->fp8file && opts->n_lora > 0)
        rc = h3_err(H3_E_UNSUPPORTED, "LoRA files cannot be merged into pre-quantised fp8 weights (the file holds "
                    "the weights without them): render without the quantized file to quantise at load");
    if (!rc && opts && opts->n_lora > 0)
        rc = h3_lora_open(m, opts->lora_paths, opts->lora_scales, opts->n_lora, &d->lora);
    const int64_t H = c->hidden;
    if (!rc) rc = get_w(d, &d->cond, H, c->text_dim, "condition_proj.weight");
    if (!rc) rc = get_bvec(d, &d->cond_b, H, "condition_proj.bias");
    if (!rc) rc = get_bvec(d, &d->ref_final, H, "token_refiner.final_norm.weight");
    if (!rc && d->curve_grid) {
        const int64_t sh[2] = {d->curve_grid, c->temb_dim};
        h3_dtype dt;
        const void *p = h3_store_get_float(d->st, "time_embedder.table", 2, sh, &dt);
        if (!p) rc = -H3_E_SCHEMA;
        else if (!(d->curve = h3_alloc_aligned(sizeof(float) * (size_t)(sh[0] * sh[1])))) rc = -H3_E_NOMEM;
        else h3_to_f32(p, dt, d->curve, sh[0] * sh[1]);
    }
    if (!rc && !d->curve_grid) rc = get_mat(d, &d->te_in, c->temb_hidden, c->freq_dim, "time_embedder.proj_in.weight");
    if (!rc && !d->curve_grid) rc = get_vec(d, &d->te_in_b, c->temb_hidden, "time_embedder.proj_in.bias");
    if (!rc && !d->curve_grid) rc = get_mat(d, &d->te_out, c->temb_dim, c->temb_hidden, "time_embedder.proj_out.weight");
    if (!rc && !d->curve_grid) rc = get_vec(d, &d->te_out_b, c->temb_dim, "time_embedder.proj_out.bias");
    if (!rc) rc = get_mat(d, &d->fin_ada, 2 * H, c->temb_dim, "final_layer.adaln_proj.linear.weight");
    if (!rc) rc = get_vec(d, &d->fin_ada_b, 2 * H, "final_layer.adaln_proj.linear.bias");
    if (!rc) rc = get_bvec(d, &d->fin_norm, H, "final_layer.norm.weight");
    if (!rc) rc = get_w(d, &d->vout, d->P, H, "final_layer.video_out.weight");
    if (!rc) rc = get_bvec(d, &d->vout_b, d->P, "final_layer.video_out.bias");
    if (!rc) rc = get_w(d, &d->aout, c->audio_ch, H, "final_layer.audio_out.weight");
    if (!rc) rc = get_bvec(d, &d->aout_b, c->audio_ch, "final_layer.audio_out.bias");
    if (!rc) rc = get_w(d, &d->vproj, H, d->P, "video_patch_proj.weight");
    if (!rc) rc = get_bvec(d, &d->vproj_b, H, "video_patch_proj.bias");
    if (!rc) rc = get_w(d, &d->aproj, H, c->audio_ch, "audio_patch_proj.weight");
    if (!rc) rc = get_bvec(d, &d->aproj_b, H, "audio_patch_proj.bias");
    if (!rc && c->rope_freq > 0) rc = get_vec(d, &d->inv_freq, c->rope_freq, "rope.inv_freq");
    for (int i = 0; !rc && i < c->refiner_layers; i++)
        rc = load_block(d, &d->ref[i], "token_refiner.blocks", i, false, true);
    /* Which blocks' GEMM weights stream (the budget counts what is held by then), then the blocks:
       resident ones load their weights now (unless lazy), streamed ones make their host copy. */
    if (!rc) rc = dit_stream_plan(d, opts ? opts->vram_bytes : 0, !(opts && opts->no_stream_pack));
    for (int i = 0; !rc && i < c->layers; i++) {
        const bool streamed = d->blk[i].streamed;
        rc = load_block(d, &d->blk[i], "blocks", i, true, !d->lazy_blocks && !streamed && !d->blk[i].loaded);
        if (!rc && streamed && !d->lazy_blocks && !d->blk[i].loaded) rc = dit_stream_stage(d, i);
    }
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

static void plan_free_host(dit_plan *p)
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

static void plan_free(h3_dit *d, dit_plan *p)
{
    dit_bfree(d, p->d_row_combo);
    dit_bfree(d, p->d_row_fin);
    p->d_row_combo = p->d_row_fin = NULL;
    plan_free_host(p);
}

static void free_buffers(h3_dit *d)
{
    void **bufs[] = {&d->x, &d->nb, &d->tmp, &d->big, &d->qkv3, &d->ob, &d->vo, &d->ao};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        dit_bfree(d, *bufs[i]);
        *bufs[i] = NULL;
    }
    float **fb[] = {&d->rcos, &d->rsin, &d->text};
    for (size_t i = 0; i < sizeof fb / sizeof *fb; i++) {
        dit_bfree(d, *fb[i]);
        *fb[i] = NULL;
    }
    int64_t **ib[] = {&d->d_text_idx, &d->d_video_idx, &d->d_audio_idx};
    for (size_t i = 0; i < sizeof ib / sizeof *ib; i++) {
        dit_bfree(d, *ib[i]);
        *ib[i] = NULL;
    }
    d->buf_rows = 0;
    d->has_text = false;
}

/* The speed knobs' buffers: they belong to one prepared schedule. */
static void free_knob_state(h3_dit *d)
{
    void **bufs[] = {(void **)&d->vel[0][0], (void **)&d->vel[0][1], (void **)&d->vel[1][0], (void **)&d->vel[1][1],
                     (void **)&d->mod_cur,   (void **)&d->mod_prev,  (void **)&d->core_delta, (void **)&d->d_pairs,
                     (void **)&d->red_cos,   (void **)&d->red_sin,   (void **)&d->d_red_combo, (void **)&d->snap,
                     (void **)&d->red_base};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        dit_bfree(d, *bufs[i]);
        *bufs[i] = NULL;
    }
    d->n_vel = 0;
    d->has_mod_prev = false;
    d->cache_acc = 0;
    d->core_calls = 0;
    d->red_rows = 0;
}

static void drop_pdd(h3_dit *d)
{
    for (int m = 0; m < 2; m++) {
        for (int s = 0; s < d->pdd_n; s++) {
            if (d->pdd_w[m]) dit_wfree(d, &d->pdd_w[m][s]);
            if (d->pdd_b[m]) dit_bfree(d, d->pdd_b[m][s]);
            if (d->pdd_host[m]) h3_free_aligned(d->pdd_host[m][s]);
        }
        free(d->pdd_w[m]);
        free(d->pdd_b[m]);
        free(d->pdd_host[m]);
        d->pdd_w[m] = NULL;
        d->pdd_b[m] = NULL;
        d->pdd_host[m] = NULL;
    }
    d->pdd_n = 0;
}

/* The PDD heads of every step of the prepared grids: each step's weighted mean of the bank's
   interval heads (lora.h), made a backend weight. The host copies stay: a CPU weight may be a
   view of them. */
static int build_pdd(h3_dit *d, int evals)
{
    const int64_t H = d->c.hidden, rows[2] = {d->P, d->c.audio_ch};
    int rc = 0;
    for (int m = 0; m < 2 && !rc; m++) {
        d->pdd_w[m] = h3_calloc((size_t)evals, sizeof **d->pdd_w);
        d->pdd_b[m] = h3_calloc((size_t)evals, sizeof **d->pdd_b);
        d->pdd_host[m] = h3_calloc((size_t)evals, sizeof **d->pdd_host);
        if (!d->pdd_w[m] || !d->pdd_b[m] || !d->pdd_host[m]) rc = -H3_E_NOMEM;
    }
    if (!rc) d->pdd_n = evals;
    for (int s = 0; s < evals && !rc; s++)
        for (int m = 0; m < 2 && !rc; m++) {
            float *host = h3_alloc_aligned(sizeof(float) * (size_t)(rows[m] * H + rows[m]));
            if (!host) {
                rc = -H3_E_NOMEM;
                break;
            }
            d->pdd_host[m][s] = host;
            rc = h3_lora_pdd_head(d->lora, m, d->sig[m][s], d->sig[m][s + 1], host, host + rows[m] * H);
            if (!rc) rc = d->be->weights->weight_load(d->be, host, H3_DT_F32, rows[m], H, &d->pdd_w[m][s]);
            if (!rc && !(d->pdd_b[m][s] = h3_backend_dup(d->be, host + rows[m] * H, sizeof(float) * (size_t)rows[m])))
                rc = -H3_E_NOMEM;
        }
    return rc;
}

static void drop_schedule(h3_dit *d)
{
    drop_pdd(d);
    free_knob_state(d);
    for (int k = 0; k < 2; k++) {
        free(d->sig[k]);
        free(d->ts[k]);
        d->sig[k] = d->ts[k] = NULL;
    }
    plan_free(d, &d->plan);
    dit_bfree(d, d->tab_blk);
    dit_bfree(d, d->tab_fin);
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
    dit_stream_close(d);
    if (d->ref)
        for (int i = 0; i < d->c.refiner_layers; i++) free_block(d, &d->ref[i]);
    if (d->blk)
        for (int i = 0; i < d->c.layers; i++) free_block(d, &d->blk[i]);
    free(d->ref);
    free(d->blk);
    free(d->run);
    h3_bw *ws[] = {&d->cond, &d->vout, &d->aout, &d->vproj, &d->aproj};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) dit_wfree(d, ws[i]);
    /* after every handle made from them is gone */
    for (int i = 0; i < d->n_owned; i++) h3_free_aligned(d->owned[i].data);
    free(d->owned);
    h3_lora_free(d->lora);
    float *bv[] = {d->cond_b, d->fin_norm, d->vout_b, d->aout_b, d->vproj_b, d->aproj_b, d->ref_final};
    for (size_t i = 0; i < sizeof bv / sizeof *bv; i++) dit_bfree(d, bv[i]);
    float *hv[] = {d->te_in_b, d->te_out_b, d->fin_ada_b, d->inv_freq, d->curve};
    for (size_t i = 0; i < sizeof hv / sizeof *hv; i++) h3_free_aligned(hv[i]);
    free(d);
}

/* ---- buffers, layout, RoPE ------------------------------------------------------------- */

static int ensure_buffers(h3_dit *d, int64_t rows)
{
    if (d->buf_rows >= rows) return 0;
    const h3_dit_cfg *c = &d->c;
    const int64_t H = c->hidden, A = d->A, F = c->ffn;
    const int64_t big = 3 * A > 2 * F ? 3 * A : 2 * F, q3 = 3 * A > F ? 3 * A : F;
    /* x and tmp hold the f32 residual stream and the GEMM outputs added to it; the others feed
       GEMMs or attention and use the backend's activation dtype. */
    void *nx[6] = {0};
    const size_t bytes[6] = {sizeof(float) * (size_t)(H * rows), d->esz * (size_t)(H * rows),
                             sizeof(float) * (size_t)(H * rows), d->esz * (size_t)(big * rows),
                             d->esz * (size_t)(q3 * rows),       d->esz * (size_t)(A * rows)};
    for (int i = 0; i < 6; i++) {
        nx[i] = d->be->mem->alloc(d->be, bytes[i]);
        if (!nx[i]) {
            for (int k = 0; k < i; k++) dit_bfree(d, nx[k]);
            return -H3_E_NOMEM;
        }
    }
    void **dst[6] = {&d->x, &d->nb, &d->tmp, &d->big, &d->qkv3, &d->ob};
    for (int i = 0; i < 6; i++) {
        dit_bfree(d, *dst[i]);
        *dst[i] = nx[i];
    }
    d->buf_rows = rows;
    return 0;
}

/* RoPE cos/sin rows [n][3F] for (t, h, w) positions pos [n][3]. diffusers MiniMaxH3RotaryPosEmbed:
   fp64 positions cast to f32, times inv_freq in f32, laid out [t | h | w] x F; cos/sin in f32. The
   table holds 3F columns: the second half of torch's cat((freqs, freqs)) repeats them. */
void dit_rope_rows(const h3_dit *d, const double *pos, int64_t n, float *hc, float *hs)
{
    const int F = d->c.rope_freq;
    for (int64_t r = 0; r < n; r++)
        for (int a = 0; a < 3; a++) {
            const float p = (float)pos[r * 3 + a];
            for (int f = 0; f < F; f++) {
                const float ang = p * d->inv_freq[f];
                hc[r * d->F3 + a * F + f] = cosf(ang);
                hs[r * d->F3 + a * F + f] = sinf(ang);
            }
        }
}

void dit_run_all_blocks(h3_dit *d)
{
    for (int i = 0; i < d->c.layers; i++) d->run[i] = i;
    d->n_run = d->c.layers;
}

/* Exactly the blocks of the run list hold their GEMM weights: missing ones load (a lazy open, or a
   block an earlier schedule dropped), dropped ones let theirs go. */
int dit_ensure_run_blocks(h3_dit *d)
{
    const int L = d->c.layers;
    bool *keep = h3_calloc((size_t)(L ? L : 1), sizeof *keep);
    if (!keep) return -H3_E_NOMEM;
    for (int k = 0; k < d->n_run; k++) keep[d->run[k]] = true;
    int rc = 0;
    for (int b = 0; b < L && !rc; b++) {
        if (keep[b] && !d->blk[b].loaded)
            rc = d->blk[b].streamed ? dit_stream_stage(d, b) : dit_load_block_weights(d, &d->blk[b], "blocks", b);
        else if (!keep[b] && d->blk[b].loaded)
            d->blk[b].streamed ? dit_stream_unstage(d, b) : dit_unload_block_weights(d, b);
    }
    free(keep);
    return rc;
}

int h3_dit_set_layout(h3_dit *d, const h3_dit_layout *l)
{
    const h3_dit_cfg *c = &d->c;
    h3_backend *be = d->be;
    /* Unique across transformers: a render must notice when its transformer was replaced by one
       reopened for another LoRA set, not only when its layout was replaced. */
    d->generation = atomic_fetch_add(&g_generation, 1) + 1;
    /* a new request starts exact: knobs are set per prepared schedule */
    memset(&d->knobs, 0, sizeof d->knobs);
    dit_run_all_blocks(d);
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
        d->vo = be->mem->alloc(be, sizeof(float) * (size_t)(l->n_video * d->P + 1));
        d->ao = be->mem->alloc(be, sizeof(float) * (size_t)(l->n_audio * c->audio_ch + 1));
        d->d_text_idx = h3_backend_dup(be, l->text_idx, sizeof(int64_t) * (size_t)l->n_text);
        d->d_video_idx = h3_backend_dup(be, l->video_idx, sizeof(int64_t) * (size_t)l->n_video);
        d->d_audio_idx = h3_backend_dup(be, l->audio_idx, sizeof(int64_t) * (size_t)l->n_audio);
        if (!d->vo || !d->ao || !d->d_text_idx || !d->d_video_idx || !d->d_audio_idx) rc = -H3_E_NOMEM;
    }
    if (!rc && d->F3 > 0) {
        /* Built on the host, then uploaded. */
        const size_t n = (size_t)(l->seq * d->F3);
        float *hc = h3_alloc_aligned(sizeof(float) * n), *hs = h3_alloc_aligned(sizeof(float) * n);
        if (!hc || !hs) rc = -H3_E_NOMEM;
        if (!rc) dit_rope_rows(d, l->pos, l->seq, hc, hs);
        if (!rc) {
            d->rcos = h3_backend_dup(be, hc, sizeof(float) * n);
            d->rsin = h3_backend_dup(be, hs, sizeof(float) * n);
            if (!d->rcos || !d->rsin) rc = -H3_E_NOMEM;
        }
        h3_free_aligned(hc);
        h3_free_aligned(hs);
    }
    if (rc) {
        dit_bfree(d, text);
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

/* x += gate * y, then out = the modulated norm of x: one backend pass where it fuses the two. */
static int add_then_norm(h3_dit *d, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                         const h3_bmod *mod, const h3_bt *out)
{
    const h3_backend_ops *o = d->be->ops;
    const float eps = (float)d->c.norm_eps;
    if (h3_backend_supports(d->be, H3_OP_gated_add_norm)) return o->gated_add_norm(d->be, x, y, gate, w, mod, eps, out);
    int rc = o->gated_add(d->be, x, y, gate);
    return rc ? rc : o->norm_mod(d->be, x, NULL, w, mod, eps, out);
}

/* Runs block b over the first `rows` rows of d->x. tab/row_mod: AdaLN table of this block and
   the per-row entry (NULL for the plain refiner block); cos/sin: RoPE (NULL in the refiner).
   The last residual add may be left to the next block, which folds it into its first norm
   (run_stack: the same sums, one pass over the residual stream less): `defer` leaves d->tmp
   unadded; `pending` says the previous block did, with its table prev_tab (same row entries). */
static int run_block(h3_dit *d, const dit_block *b, int64_t rows, const float *tab, const int32_t *row_mod,
                     const float *cos, const float *sin, bool pending, const float *prev_tab, bool defer)
{
    const h3_dit_cfg *c = &d->c;
    const h3_backend_ops *o = d->be->ops;
    h3_backend *be = d->be;
    const int64_t H = c->hidden, A = d->A, F = c->ffn;
    int rc;
    double t = now_ms();
    const h3_bt x = f32(d->x, rows, H, H), tmp = f32(d->tmp, rows, H, H), nb = act(d, d->nb, rows, H, H);
    h3_bmod mod = {tab, row_mod, 6, 0};
    if (pending) {
        const h3_bmod prev = {prev_tab, row_mod, 6, 5};
        rc = add_then_norm(d, &x, &tmp, &prev, b->norm1, &mod, &nb);
    } else {
        rc = o->norm_mod(be, &x, NULL, b->norm1, &mod, (float)c->norm_eps, &nb);
    }
    if (rc) return rc;
    charge(d, H3_DIT_PART_NORM, &t);
    const h3_bt qkv = act(d, d->big, rows, 3 * A, 3 * A);
    if ((rc = o->linear(be, &nb, &b->qkv, NULL, &qkv))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    const h3_bt Q = act(d, d->qkv3, rows, A, A), K = act(d, act_at(d, d->qkv3, rows * A), rows, A, A),
                V = act(d, act_at(d, d->qkv3, 2 * rows * A), rows, A, A);
    /* The fused projection's rows hold per head [q | k | v]: q, k and v are views of them at
       offsets 0, D and 2D, with heads 3D apart. */
    const int64_t D = c->head_dim;
    const h3_bt ki = act(d, act_at(d, d->big, D), rows, 3 * A - D, 3 * A),
                vi = act(d, act_at(d, d->big, 2 * D), rows, 3 * A - 2 * D, 3 * A);
    if ((rc = o->qk_norm_rope(be, &qkv, &ki, &vi, 3 * c->head_dim, b->qn, b->kn, cos, sin, c->heads, c->heads,
                              c->head_dim, cos ? d->F3 : 0, (float)c->qk_eps, &Q, &K, &V)))
        return rc;
    charge(d, H3_DIT_PART_QKV, &t);
    const h3_bt ob = act(d, d->ob, rows, A, A);
    /* fp8 attention (H3_OPT_FP8_ATTENTION) in the main blocks only: they have an AdaLN table, the
       refiner's blocks do not. */
    be->attn_precision = tab && (d->flags & H3_OPT_FP8_ATTENTION) ? H3_PRECISION_FP8 : H3_PRECISION_DEFAULT;
    rc = o->attention(be, &Q, &K, &V, c->heads, c->heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), false, &ob);
    be->attn_precision = H3_PRECISION_DEFAULT;
    if (rc) return rc;
    charge(d, H3_DIT_PART_ATTENTION, &t);
    if ((rc = o->linear(be, &ob, &b->out, NULL, &tmp))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    const h3_bmod gate1 = {tab, row_mod, 6, 2};
    mod.slot = 3;
    if ((rc = add_then_norm(d, &x, &tmp, &gate1, b->norm2, &mod, &nb))) return rc;
    charge(d, H3_DIT_PART_NORM, &t);
    const h3_bt gu = act(d, d->big, rows, 2 * F, 2 * F);
    if ((rc = o->linear(be, &nb, &b->fc1, NULL, &gu))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    /* fc1 rows are [gate | up] (diffusers' SwiGLU with its halves swapped). */
    const h3_bt gate = act(d, d->big, rows, F, 2 * F), up = act(d, act_at(d, d->big, F), rows, F, 2 * F),
                hid = act(d, d->qkv3, rows, F, F);
    if ((rc = o->swiglu(be, &gate, &up, &hid))) return rc;
    charge(d, H3_DIT_PART_ELTWISE, &t);
    if ((rc = o->linear(be, &hid, &b->fc2, NULL, &tmp))) return rc;
    charge(d, H3_DIT_PART_LINEAR, &t);
    if (defer) return 0;
    mod.slot = 5;
    if ((rc = o->gated_add(be, &x, &tmp, &mod))) return rc;
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
    h3_backend *be = d->be;
    const int64_t H = c->hidden;
    int rc;
    if (!d->text) {
        d->text = be->mem->alloc(be, sizeof(float) * (size_t)(n * H + 1));
        if (!d->text) return -H3_E_NOMEM;
    }
    d->has_text = false;
    float *in = h3_backend_dup(be, text_states, sizeof(float) * (size_t)(n * c->text_dim));
    if (!in) return -H3_E_NOMEM;
    /* The refiner's time is not part of any forward's breakdown. */
    double saved[H3_DIT_PARTS];
    memcpy(saved, d->stats.part_ms, sizeof saved);
    const h3_bt X = f32(in, n, c->text_dim, c->text_dim), x = f32(d->x, n, H, H), txt = f32(d->text, n, H, H);
    rc = be->ops->linear(be, &X, &d->cond, d->cond_b, &x);
    for (int i = 0; !rc && i < c->refiner_layers; i++)
        rc = run_block(d, &d->ref[i], n, NULL, NULL, NULL, NULL, false, NULL, false);
    if (!rc) rc = be->ops->norm_mod(be, &x, NULL, d->ref_final, NULL, (float)c->final_eps, &txt);
    if (!rc) rc = be->mem->sync(be);
    dit_bfree(d, in);
    memcpy(d->stats.part_ms, saved, sizeof saved);
    if (rc) return rc;
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
        plan_free_host(p);
        return -H3_E_NOMEM;
    }
    for (int i = 0; i < n_t * H3_TAGS; i++) p->combo_of[i] = -1;
    for (int i = 0; i < n_t; i++) p->fin_of[i] = -1;
    for (int64_t r = 0; r < l->seq; r++) {
        int32_t t = row_t[r];
        if (t < 0 || t >= n_t) {
            plan_free_host(p);
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
int dit_time_embed(h3_dit *d, const float *t, int64_t M, float *out)
{
    const h3_dit_cfg *c = &d->c;
    if (d->curve) {
        /* Pruned form: linear interpolation of the table at t clamped to [0, 1] (the SiLU is in it). */
        const int64_t G = d->curve_grid, E = c->temb_dim;
        for (int64_t m = 0; m < M; m++) {
            const float tc = t[m] < 0.0f ? 0.0f : t[m] > 1.0f ? 1.0f : t[m];
            const float pos = tc * (float)(G - 1);
            int64_t lo = (int64_t)floorf(pos);
            if (lo > G - 2) lo = G - 2;
            const float w = pos - (float)lo;
            const float *a = d->curve + lo * E, *b = a + E;
            for (int64_t e = 0; e < E; e++) out[m * E + e] = a[e] + w * (b[e] - a[e]);
        }
        return 0;
    }
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
    int rc = h3_host_linear(d->pool, sin_emb, M, c->freq_dim, &d->te_in, d->te_in_b, h, c->temb_hidden);
    for (int64_t i = 0; !rc && i < M * c->temb_hidden; i++) h[i] = h3_silu(h[i]);
    if (!rc) rc = h3_host_linear(d->pool, h, M, c->temb_hidden, &d->te_out, d->te_out_b, out, c->temb_dim);
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
/*
 * Modulation tables for n_sets forwards (the steps of a schedule) sharing one plan:
 * t_values[s * n_t + t]. blk: [set][layer][combo][6][H] with slots 1 and 4 holding 1 + scale;
 * fin: [set][fin][2][H] = shift, 1 + scale (both backend memory). Each adaln_proj weight is
 * brought to the backend once for all sets (one GEMM per block and modality with M = sets x
 * combos) and let go right after, so the precompute streams the weights exactly once and a GPU
 * never holds more than one block's adaln_proj.
 */
static int compute_tables(h3_dit *d, const dit_plan *p, const float *t_values, int n_sets, float *blk, float *fin,
                          bool release)
{
    const h3_dit_cfg *c = &d->c;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    /* tables for the blocks a forward runs, in its order (all blocks unless layers are dropped) */
    const int64_t H = c->hidden, E = c->temb_dim, L = d->n_run, nc = p->n_combo, nf = p->n_fin;
    const int64_t M = (int64_t)n_sets * p->n_t;
    float *tv = h3_malloc(sizeof(float) * (size_t)M);
    float *emb = h3_alloc_aligned(sizeof(float) * (size_t)(M * E));
    int64_t maxrows = (int64_t)n_sets * (nc > nf ? nc : nf);
    float *X = h3_alloc_aligned(sizeof(float) * (size_t)(maxrows * E));
    float *Y = h3_alloc_aligned(sizeof(float) * (size_t)(maxrows * 6 * H));
    float *Xd = be->mem->alloc(be, sizeof(float) * (size_t)(maxrows * E + 1));
    float *Yd = be->mem->alloc(be, sizeof(float) * (size_t)(maxrows * 6 * H + 1));
    float *bd = be->mem->alloc(be, sizeof(float) * (size_t)(6 * H));
    int rc = (!tv || !emb || !X || !Y || !Xd || !Yd || !bd) ? -H3_E_NOMEM : 0;
    if (!rc) {
        memcpy(tv, t_values, sizeof(float) * (size_t)M);
        rc = dit_time_embed(d, tv, M, emb);
    }
    for (int64_t b = 0; !rc && b < L; b++) {
        const dit_block *bk = &d->blk[d->run[b]];
        const size_t wsz = h3_dtype_size(bk->ada.dtype);
        for (int m = 0; !rc && m < H3_TAGS; m++) {
            int64_t rows = 0;
            for (int s = 0; s < n_sets; s++)
                for (int64_t k = 0; k < nc; k++)
                    if (p->combo_m[k] == m) memcpy(X + (rows++) * E, emb + ((int64_t)s * p->n_t + p->combo_t[k]) * E, sizeof(float) * (size_t)E);
            if (!rows) continue;
            h3_bw W = {0};
            const h3_bt xb = f32(Xd, rows, E, E), yb = f32(Yd, rows, 6 * H, 6 * H);
            rc = be->weights->weight_load(be, (const char *)bk->ada.data + (size_t)m * 6 * H * E * wsz, bk->ada.dtype,
                                          6 * H, E, &W);
            if (!rc) rc = be->mem->upload(be, Xd, X, sizeof(float) * (size_t)(rows * E));
            if (!rc) rc = be->mem->upload(be, bd, bk->ada_b + m * 6 * H, sizeof(float) * (size_t)(6 * H));
            if (!rc) rc = o->linear(be, &xb, &W, bd, &yb);
            if (!rc) rc = be->mem->download(be, Y, Yd, sizeof(float) * (size_t)(rows * 6 * H));
            dit_wfree(d, &W);
            if (rc) break;
            rows = 0;
            for (int s = 0; s < n_sets && !rc; s++)
                for (int64_t k = 0; k < nc && !rc; k++) {
                    if (p->combo_m[k] != m) continue;
                    float *src = Y + (rows++) * 6 * H;
                    for (int64_t i = 0; i < 6 * H; i++) {
                        int slot = (int)(i / H);
                        if (slot == 1 || slot == 4) src[i] = 1.0f + src[i];
                    }
                    rc = be->mem->upload(be, blk + (((int64_t)s * L + b) * nc + k) * 6 * H, src,
                                   sizeof(float) * (size_t)(6 * H));
                }
        }
        if (!rc && release) {
            char name[96];
            snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.weight", d->run[b]);
            h3_store_release_tensor(d->st, name);
            snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.bias", d->run[b]);
            h3_store_release_tensor(d->st, name);
        }
    }
    if (!rc && nf) {
        int64_t rows = 0;
        for (int s = 0; s < n_sets; s++)
            for (int64_t k = 0; k < nf; k++)
                memcpy(X + (rows++) * E, emb + ((int64_t)s * p->n_t + p->fin_t[k]) * E, sizeof(float) * (size_t)E);
        h3_bw W = {0};
        const h3_bt xb = f32(Xd, rows, E, E), yb = f32(Yd, rows, 2 * H, 2 * H);
        rc = be->weights->weight_load(be, d->fin_ada.data, d->fin_ada.dtype, 2 * H, E, &W);
        if (!rc) rc = be->mem->upload(be, Xd, X, sizeof(float) * (size_t)(rows * E));
        if (!rc) rc = be->mem->upload(be, bd, d->fin_ada_b, sizeof(float) * (size_t)(2 * H));
        if (!rc) rc = o->linear(be, &xb, &W, bd, &yb);
        if (!rc) rc = be->mem->download(be, Y, Yd, sizeof(float) * (size_t)(rows * 2 * H));
        dit_wfree(d, &W);
        for (int64_t r = 0; !rc && r < rows; r++)
            for (int64_t i = 0; i < H; i++) Y[r * 2 * H + H + i] = 1.0f + Y[r * 2 * H + H + i];
        if (!rc) rc = be->mem->upload(be, fin, Y, sizeof(float) * (size_t)(rows * 2 * H));
        if (!rc && release) {
            h3_store_release_tensor(d->st, "final_layer.adaln_proj.linear.weight");
            h3_store_release_tensor(d->st, "final_layer.adaln_proj.linear.bias");
        }
    }
    if (!rc) rc = be->mem->sync(be);
    free(tv);
    h3_free_aligned(emb);
    h3_free_aligned(X);
    h3_free_aligned(Y);
    dit_bfree(d, Xd);
    dit_bfree(d, Yd);
    dit_bfree(d, bd);
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

/* The plan's per-row entries on the backend, for the norm and gate kernels. */
static int plan_upload(h3_dit *d, dit_plan *p)
{
    const size_t n = sizeof(int32_t) * (size_t)d->lay.seq;
    p->d_row_combo = h3_backend_dup(d->be, p->row_combo, n);
    p->d_row_fin = h3_backend_dup(d->be, p->row_fin, n);
    return p->d_row_combo && p->d_row_fin ? 0 : -H3_E_NOMEM;
}

/* ---- the forward ----------------------------------------------------------------------- */

/* A forward's input rows: x <- refined text | video_patch_proj(video) | audio_patch_proj(audio). */
static int forward_inputs(h3_dit *d, const float *video_rows, const float *audio_rows)
{
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    const int64_t H = c->hidden, L = l->seq;
    int rc = 0;
    const h3_bt x = f32(d->x, L, H, H);
    /* Rows no index names stay zero (diffusers scatters into a zero buffer). */
    if (l->n_text + l->n_video + l->n_audio < L && (rc = be->mem->zero(be, d->x, sizeof(float) * (size_t)(L * H))))
        return rc;
    const h3_bt text = f32(d->text, l->n_text, H, H);
    if (l->n_text && (rc = o->scatter_rows(be, &text, d->d_text_idx, &x))) return rc;
    if (l->n_video) {
        const h3_bt in = f32((void *)video_rows, l->n_video, d->P, d->P), tmp = f32(d->tmp, l->n_video, H, H);
        if ((rc = o->linear(be, &in, &d->vproj, d->vproj_b, &tmp)) || (rc = o->scatter_rows(be, &tmp, d->d_video_idx, &x)))
            return rc;
    }
    if (l->n_audio) {
        const h3_bt in = f32((void *)audio_rows, l->n_audio, c->audio_ch, c->audio_ch), tmp = f32(d->tmp, l->n_audio, H, H);
        if ((rc = o->linear(be, &in, &d->aproj, d->aproj_b, &tmp)) || (rc = o->scatter_rows(be, &tmp, d->d_audio_idx, &x)))
            return rc;
    }
    return 0;
}

/* Token reduction, entering the reduced span: snapshot the full state, pool it into the first
   red_rows rows of x, and keep the pooled entry state as the baseline of the restore. */
static int enter_reduced(h3_dit *d)
{
    h3_backend *be = d->be;
    const int64_t H = d->c.hidden, L = d->lay.seq, Lr = d->red_rows;
    const h3_bt full = f32(d->snap, L, H, H), red = f32(d->x, Lr, H, H);
    int rc = be->ops->extrapolate(be, d->snap, d->x, NULL, L * H, 0.0f);
    if (!rc) rc = be->ops->pool_pairs(be, &full, d->d_pairs, &red);
    if (!rc) rc = be->ops->extrapolate(be, d->red_base, d->x, NULL, Lr * H, 0.0f);
    return rc;
}

/* Leaving it: every full row becomes its entry state plus its pair's change (single rows take the
   reduced result itself), then x holds the full sequence again. */
static int leave_reduced(h3_dit *d)
{
    h3_backend *be = d->be;
    const int64_t H = d->c.hidden, L = d->lay.seq, Lr = d->red_rows;
    const h3_bt full = f32(d->snap, L, H, H), red = f32(d->x, Lr, H, H), base = f32(d->red_base, Lr, H, H);
    int rc = be->ops->unpool_pairs(be, &red, &base, d->d_pairs, &full);
    if (!rc) rc = be->ops->extrapolate(be, d->x, d->snap, NULL, L * H, 0.0f);
    return rc;
}

/* The block stack over x: the blocks of the run list with their tables (in run-list order), the
   blocks of token reduction's span on the reduced sequence. step < 0: outside a schedule (no
   reduction). */
static int run_stack(h3_dit *d, const dit_plan *p, const float *tab_blk, int step)
{
    const int64_t H = d->c.hidden, L = d->lay.seq, stride = (int64_t)p->n_combo * 6 * H;
    const bool reduce = d->red_rows > 0 && step >= 0;
    const int end = step >= 0 && step < 10 ? d->tr_end_early : d->tr_end;
    bool in = false, pending = false;
    int rc = 0, j = 0;
    /* Streamed blocks: a pass over them in run order (their slots fill ahead of their turn). */
    if (d->n_streamed > 0) {
        int *seq = h3_malloc(sizeof *seq * (size_t)(d->n_run ? d->n_run : 1)), n = 0;
        if (!seq) return -H3_E_NOMEM;
        for (int k = 0; k < d->n_run; k++)
            if (d->blk[d->run[k]].streamed) seq[n++] = d->run[k];
        rc = n ? dit_stream_begin(d, seq, n) : 0;
        free(seq);
    }
    for (int k = 0; k < d->n_run && !rc; k++) {
        const int b = d->run[k];
        const bool streamed = d->blk[b].streamed;
        dit_block view;
        const dit_block *blk = &d->blk[b];
        if (streamed) {
            if ((rc = dit_stream_acquire(d, j, b, &view))) break;
            blk = &view;
        }
        const bool want = reduce && b >= d->tr_first && b < end;
        if (want != in) {
            rc = want ? enter_reduced(d) : leave_reduced(d);
            in = want;
        }
        /* The next block runs on the same rows: it takes this block's last residual add. */
        const int nb = k + 1 < d->n_run ? d->run[k + 1] : -1;
        const bool defer = nb >= 0 && (reduce && nb >= d->tr_first && nb < end) == want;
        const float *prev = k > 0 ? tab_blk + (k - 1) * stride : NULL;
        if (!rc)
            rc = in ? run_block(d, blk, d->red_rows, tab_blk + k * stride, d->d_red_combo, d->red_cos, d->red_sin,
                                pending, prev, defer)
                    : run_block(d, blk, L, tab_blk + k * stride, p->d_row_combo, d->rcos, d->rsin, pending, prev,
                                defer);
        if (!rc && streamed) rc = dit_stream_release(d, j++);
        pending = defer;
    }
    if (!rc && in) rc = leave_reduced(d);
    return rc;
}

/* What one forward does with the block stack (core reuse). */
enum { CORE_PLAIN, CORE_SAVE, CORE_REUSE };

/*
 * One forward; inputs and outputs are backend memory. inputs_ready: x already holds this step's
 * input rows (the step cache built them for its test). step: the schedule step (-1 outside one),
 * for token reduction's span. core: CORE_SAVE runs the stack and keeps h_out - h_in, CORE_REUSE
 * adds that residual instead of running the stack.
 */
static int forward(h3_dit *d, const dit_plan *p, const float *tab_blk, const float *tab_fin, const float *video_rows,
                   const float *audio_rows, float *video_out, float *audio_out, bool inputs_ready, int step,
                   int core)
{
    const double t0 = now_ms();
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    const int64_t H = c->hidden, L = l->seq;
    int rc = 0;
    const h3_bt x = f32(d->x, L, H, H);
    if (!inputs_ready && (rc = forward_inputs(d, video_rows, audio_rows))) return rc;
    if (core == CORE_REUSE) {
        const h3_bmod none = {0};
        const h3_bt delta = f32(d->core_delta, L, H, H);
        if ((rc = o->gated_add(be, &x, &delta, &none))) return rc;
    } else {
        if (core == CORE_SAVE && (rc = o->extrapolate(be, d->core_delta, d->x, NULL, L * H, 0.0f))) return rc;
        /* The block stack is timed on its own (a wait before and after it): benchmarks compare it
           with one block of other engines, without the patch projections and heads. */
        if ((rc = be->mem->sync(be))) return rc;
        const double tb = now_ms();
        if ((rc = run_stack(d, p, tab_blk, step))) return rc;
        if ((rc = be->mem->sync(be))) return rc;
        const double stack_ms = now_ms() - tb;
        if (!d->stats.block_runs || stack_ms < d->stats.stack_ms_min) d->stats.stack_ms_min = stack_ms;
        d->stats.stack_ms_total += stack_ms;
        if (core == CORE_SAVE && (rc = o->sub(be, d->core_delta, d->x, d->core_delta, L * H))) return rc;
        d->stats.block_runs++;
    }
    /* Final norm + heads on the output rows only (diffusers runs both heads over every row and
       selects afterwards; the selected values are the same). */
    const h3_bmod fm = {tab_fin, p->d_row_fin, 2, 0};
    /* a PDD LoRA's heads of this step (h3_dit_forward_t's explicit timesteps keep the model's) */
    const bool pdd = d->pdd_n > 0 && step >= 0 && step < d->pdd_n;
    if (l->n_video) {
        const h3_bt nb = act(d, d->nb, l->n_video, H, H), out = f32(video_out, l->n_video, d->P, d->P);
        if ((rc = o->norm_mod(be, &x, d->d_video_idx, d->fin_norm, &fm, (float)c->final_eps, &nb)) ||
            (rc = o->linear(be, &nb, pdd ? &d->pdd_w[0][step] : &d->vout, pdd ? d->pdd_b[0][step] : d->vout_b, &out)))
            return rc;
    }
    if (l->n_audio) {
        const h3_bt nb = act(d, d->nb, l->n_audio, H, H), out = f32(audio_out, l->n_audio, c->audio_ch, c->audio_ch);
        if ((rc = o->norm_mod(be, &x, d->d_audio_idx, d->fin_norm, &fm, (float)c->final_eps, &nb)) ||
            (rc = o->linear(be, &nb, pdd ? &d->pdd_w[1][step] : &d->aout, pdd ? d->pdd_b[1][step] : d->aout_b, &out)))
            return rc;
    }
    /* One wait per forward: the timings below are the device's, and a fault surfaces here. */
    if ((rc = be->mem->sync(be))) return rc;
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
    h3_backend *be = d->be;
    const h3_dit_layout *l = &d->lay;
    const int64_t H = d->c.hidden, Ca = d->c.audio_ch;
    const size_t vbytes = sizeof(float) * (size_t)(l->n_video * d->P), abytes = sizeof(float) * (size_t)(l->n_audio * Ca);
    float *blk = be->mem->alloc(be, sizeof(float) * (size_t)((int64_t)d->c.layers * p.n_combo * 6 * H + 1));
    float *fin = be->mem->alloc(be, sizeof(float) * (size_t)((int64_t)p.n_fin * 2 * H + 1));
    float *vin = l->n_video ? h3_backend_dup(be, video_rows, vbytes) : NULL;
    float *ain = l->n_audio ? h3_backend_dup(be, audio_rows, abytes) : NULL;
    rc = (!blk || !fin || (l->n_video && !vin) || (l->n_audio && !ain)) ? -H3_E_NOMEM : plan_upload(d, &p);
    /* explicit timesteps run the whole model, whatever a previous schedule dropped */
    dit_run_all_blocks(d);
    if (!rc) rc = dit_ensure_run_blocks(d);
    if (!rc) rc = ensure_ada_bias(d);
    if (!rc) rc = compute_tables(d, &p, t_values, 1, blk, fin, false);
    if (!rc) rc = forward(d, &p, blk, fin, vin, ain, d->vo, d->ao, false, -1, CORE_PLAIN);
    if (!rc && l->n_video) rc = be->mem->download(be, video_out, d->vo, vbytes);
    if (!rc && l->n_audio) rc = be->mem->download(be, audio_out, d->ao, abytes);
    dit_bfree(d, blk);
    dit_bfree(d, fin);
    dit_bfree(d, vin);
    dit_bfree(d, ain);
    plan_free(d, &p);
    return rc;
}

/* ---- schedule and step ----------------------------------------------------------------- */

int h3_dit_prepare_schedule(h3_dit *d, int steps, double shift_video, double shift_audio, bool release_adaln)
{
    if (steps < 2 || steps > 100000) return h3_sched_sigmas(steps, shift_video, NULL); /* its message */
    float *sv = h3_malloc(sizeof(float) * (size_t)steps), *sa = h3_malloc(sizeof(float) * (size_t)steps);
    int n[2] = {0, 0}, rc = sv && sa ? 0 : -H3_E_NOMEM;
    if (!rc && (n[0] = h3_sched_sigmas(steps, shift_video, sv)) < 0) rc = n[0];
    if (!rc && (n[1] = h3_sched_sigmas(steps, shift_audio, sa)) < 0) rc = n[1];
    /* diffusers zips the two timestep lists and steps the video list: with unequal lengths (a
       shift collapsing grid points) its loop would run out of audio sigmas. Refuse instead. */
    if (!rc && n[0] != n[1])
        rc = h3_err(H3_E_INVALID,
                    "schedule: %d steps give %d video sigmas (shift %g) but %d audio sigmas (shift %g); "
                    "the two schedules must have the same length",
                    steps, n[0], shift_video, n[1], shift_audio);
    if (!rc) rc = h3_dit_prepare_sigmas(d, sv, sa, n[0], release_adaln);
    free(sv);
    free(sa);
    return rc;
}

int h3_dit_prepare_sigmas(h3_dit *d, const float *sigmas_video, const float *sigmas_audio, int n_sigmas,
                          bool release_adaln)
{
    if (!d->has_layout) return h3_err(H3_E_INVALID, "transformer: set a layout before preparing a schedule");
    int rc = h3_sched_check(sigmas_video, n_sigmas, "video");
    if (!rc) rc = h3_sched_check(sigmas_audio, n_sigmas, "audio");
    if (rc) return rc;
    const double t0 = now_ms();
    drop_schedule(d);
    /* Forward timings are per prepared request. */
    d->stats.forwards = 0;
    d->stats.forward_ms_min = d->stats.forward_ms_last = d->stats.forward_ms_total = 0;
    memset(d->stats.part_ms, 0, sizeof d->stats.part_ms);
    d->stats.block_runs = d->stats.skipped_steps = 0;
    d->stats.stack_ms_min = d->stats.stack_ms_total = 0;
    d->stats.transformer_ms = 0;
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    int n[2] = {n_sigmas, n_sigmas};
    const float *given[2] = {sigmas_video, sigmas_audio};
    for (int k = 0; k < 2 && !rc; k++) {
        d->sig[k] = h3_malloc(sizeof(float) * (size_t)n_sigmas);
        d->ts[k] = h3_malloc(sizeof(float) * (size_t)n_sigmas);
        if (!d->sig[k] || !d->ts[k]) rc = -H3_E_NOMEM;
        if (!rc) memcpy(d->sig[k], given[k], sizeof(float) * (size_t)n_sigmas);
        if (!rc) h3_sched_timesteps(d->sig[k], n[k], d->ts[k]);
    }
    int32_t *row_t = rc ? NULL : h3_malloc(sizeof(int32_t) * (size_t)l->seq);
    if (!rc && !row_t) rc = -H3_E_NOMEM;
    for (int64_t r = 0; !rc && r < l->seq; r++) row_t[r] = l->role[r];
    if (!rc) rc = plan_build(&d->plan, l, row_t, H3_ROLES);
    free(row_t);
    if (!rc) rc = plan_upload(d, &d->plan);
    const int evals = n[0] - 1;
    /* H3_OPT_DIT_PER_STEP keeps diffusers' structure: the modulation of a step is computed from
       the adaln_proj weights when the step runs, and nothing is released. */
    d->per_step = (d->flags & H3_OPT_DIT_PER_STEP) != 0;
    const int sets = d->per_step ? 1 : evals;
    if (!rc && !(d->tvals = h3_malloc(sizeof(float) * (size_t)evals * H3_ROLES))) rc = -H3_E_NOMEM;
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
    /* The speed knobs decide which blocks run (only those get tables) and set up their caches. */
    if (!rc) rc = dit_apply_knobs(d, tv, evals, release_adaln);
    if (!rc) {
        const int64_t H = c->hidden;
        uint64_t blk_n = (uint64_t)sets * d->n_run * d->plan.n_combo * 6 * H;
        uint64_t fin_n = (uint64_t)sets * d->plan.n_fin * 2 * H;
        d->tab_blk = d->be->mem->alloc(d->be, sizeof(float) * (size_t)(blk_n + 1));
        d->tab_fin = d->be->mem->alloc(d->be, sizeof(float) * (size_t)(fin_n + 1));
        if (!d->tab_blk || !d->tab_fin) rc = -H3_E_NOMEM;
        d->table_bytes = (blk_n + fin_n) * sizeof(float);
    }
    if (!rc && !d->per_step) rc = compute_tables(d, &d->plan, tv, evals, d->tab_blk, d->tab_fin, release_adaln);
    if (!rc && h3_lora_pdd_intervals(d->lora)) rc = build_pdd(d, evals);
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
    d->stats.layers_run = d->n_run;
    d->stats.prepare_ms = now_ms() - t0;
    return evals;
}

int h3_dit_num_steps(const h3_dit *d) { return d->has_plan ? d->n_steps : 0; }

const int *h3_dit_blocks_run(const h3_dit *d, int *n, int64_t *reduced_rows)
{
    *n = d->n_run;
    if (reduced_rows) *reduced_rows = d->red_rows;
    return d->run;
}

const float *h3_dit_sigmas(const h3_dit *d, int modality_audio) { return d->has_plan ? d->sig[modality_audio ? 1 : 0] : NULL; }

/* The step cache's test: the relative L1 change of the first block's modulated input since the
   previous step, added to what has accumulated since the last evaluation. x holds this step's input
   rows afterwards. */
static int cache_test(h3_dit *d, const float *blk, const float *video_rows, const float *audio_rows)
{
    h3_backend *be = d->be;
    const int64_t H = d->c.hidden, L = d->lay.seq;
    int rc = forward_inputs(d, video_rows, audio_rows);
    const h3_bt x = f32(d->x, L, H, H), y = f32(d->mod_cur, L, H, H);
    const h3_bmod mod = {blk, d->plan.d_row_combo, 6, 0};
    if (!rc) rc = be->ops->norm_mod(be, &x, NULL, d->blk[d->run[0]].norm1, &mod, (float)d->c.norm_eps, &y);
    if (!rc && d->has_mod_prev) {
        double diff, ref;
        rc = be->ops->abs_diff_sum(be, d->mod_cur, d->mod_prev, L * H, &diff, &ref);
        if (!rc) d->cache_acc += ref > 0 ? diff / ref : 0;
    }
    float *t = d->mod_prev;
    d->mod_prev = d->mod_cur;
    d->mod_cur = t;
    d->has_mod_prev = true;
    return rc;
}

int h3_dit_step(h3_dit *d, int i, float *video_rows, float *audio_rows)
{
    if (!d->has_plan) return h3_err(H3_E_INVALID, "transformer: no schedule prepared");
    if (!d->has_text) return h3_err(H3_E_INVALID, "transformer: no text set for this layout");
    if (i < 0 || i >= d->n_steps)
        return h3_err(H3_E_INVALID, "transformer: step %d is outside the schedule of %d steps", i, d->n_steps);
    const double t_step = now_ms();
    const h3_dit_cfg *c = &d->c;
    const h3_dit_layout *l = &d->lay;
    h3_backend *be = d->be;
    const int64_t H = c->hidden;
    const int set = d->per_step ? 0 : i;
    const float *blk = d->tab_blk + (int64_t)set * d->n_run * d->plan.n_combo * 6 * H;
    const float *fin = d->tab_fin + (int64_t)set * d->plan.n_fin * 2 * H;
    const h3_dit_knobs *k = &d->knobs;
    const int last = d->n_steps - 1;
    const bool history = k->reuse > 1 || k->cache_threshold > 0;
    int rc = 0;
    if (d->per_step) {
        rc = ensure_ada_bias(d);
        if (!rc) rc = compute_tables(d, &d->plan, d->tvals + (int64_t)i * H3_ROLES, 1, d->tab_blk, d->tab_fin, false);
    }
    /* Which steps run the transformer: all, unless step reuse or the step cache skips some (the
       first and the last always run). */
    bool eval = true, ready = false;
    if (!rc && k->reuse > 1) {
        eval = i == 0 || i == last || i % k->reuse == 0;
    } else if (!rc && k->cache_threshold > 0) {
        rc = cache_test(d, blk, video_rows, audio_rows);
        ready = true;
        eval = i == 0 || i == last || d->n_vel == 0 || d->cache_acc >= k->cache_threshold;
        if (eval) d->cache_acc = 0;
    }
    if (rc) return rc;
    const int64_t P = d->P, Ca = c->audio_ch;
    const float *vo = d->vo, *ao = d->ao;
    if (eval) {
        int core = CORE_PLAIN;
        if (k->core_reuse > 1)
            core = d->core_calls == 0 || i == last || d->core_calls % k->core_reuse == 0 ? CORE_SAVE : CORE_REUSE;
        float *vout = d->vo, *aout = d->ao;
        if (history) { /* the oldest velocity's buffers take the new one */
            vout = d->vel[0][1];
            aout = d->vel[1][1];
        }
        rc = forward(d, &d->plan, blk, fin, video_rows, audio_rows, vout, aout, ready, i, core);
        if (rc) return rc;
        d->core_calls++;
        if (history) {
            for (int m = 0; m < 2; m++) {
                float *t = d->vel[m][1];
                d->vel[m][1] = d->vel[m][0];
                d->vel[m][0] = t;
                d->vel_sig[m][1] = d->vel_sig[m][0];
                d->vel_sig[m][0] = d->sig[m][i];
            }
            if (d->n_vel < 2) d->n_vel++;
        }
        vo = vout;
        ao = aout;
    } else if (k->reuse > 1 && d->n_vel >= 2) {
        /* v = v1 + r (v1 - v0), r = (sigma - sigma1) / (sigma1 - sigma0) per modality, within [-2, 2] */
        const int64_t n[2] = {l->n_video * P, l->n_audio * Ca};
        float *out[2] = {d->vo, d->ao};
        for (int m = 0; m < 2 && !rc; m++) {
            const double s1 = d->vel_sig[m][0], s0 = d->vel_sig[m][1], den = s1 - s0;
            double r = den != 0 ? ((double)d->sig[m][i] - s1) / den : 0.0;
            r = r < -2 ? -2 : r > 2 ? 2 : r;
            rc = be->ops->extrapolate(be, out[m], d->vel[m][0], d->vel[m][1], n[m], (float)r);
        }
        if (rc) return rc;
        d->stats.skipped_steps++;
    } else {
        /* after a single evaluation, and in the step cache: hold the last velocity */
        vo = d->vel[0][0];
        ao = d->vel[1][0];
        d->stats.skipped_steps++;
    }
    /* Euler on the generated rows only; conditioning rows ride through unchanged. */
    if ((rc = be->ops->euler(be, video_rows + l->n_cond_video * P, vo + l->n_cond_video * P,
                             (l->n_video - l->n_cond_video) * P, d->ts[0][i], d->sig[0][i], d->sig[0][i + 1])) ||
        (rc = be->ops->euler(be, audio_rows + l->n_cond_audio * Ca, ao + l->n_cond_audio * Ca,
                             (l->n_audio - l->n_cond_audio) * Ca, d->ts[1][i], d->sig[1][i], d->sig[1][i + 1])))
        return rc;
    d->stats.transformer_ms += now_ms() - t_step;
    return d->n_steps - i - 1;
}

void h3_dit_adaln_bytes(const h3_dit *d, uint64_t *weights, uint64_t *tables, bool *released)
{
    if (weights) *weights = d->adaln_weight_bytes;
    if (tables) *tables = d->table_bytes;
    if (released) *released = d->adaln_released;
}

void h3_dit_get_stats(const h3_dit *d, h3_dit_stats *s) { *s = d->stats; }
