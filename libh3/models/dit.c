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
#include "core/singlefile.h"

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

/* charge() for the exec that times the forward's parts (one device, or rank 0 of a group). */
static void echarge(h3_dit *d, const dit_exec *e, int part, double *t)
{
    if (e->timed) charge(d, part, t);
}

dit_exec dit_exec_local(h3_dit *d)
{
    dit_exec e = {d->be, d->rq.x, d->rq.nb, d->rq.tmp, d->rq.big, d->rq.qkv3, d->rq.ob, 0, true, NULL};
    return e;
}

static void *act_at(const h3_dit *d, void *base, int64_t i) { return (char *)base + (size_t)i * d->esz; }



/* ---- weights --------------------------------------------------------------------------- */

static dit_owned *owned_find(h3_dit *d, const char *name)
{
    for (int i = 0; i < d->w.n_owned; i++)
        if (strcmp(d->w.owned[i].name, name) == 0) return &d->w.owned[i];
    return NULL;
}

/* Let a merged copy go (its handle was freed). */
static void owned_release(h3_dit *d, const char *name)
{
    dit_owned *o = owned_find(d, name);
    if (!o) return;
    h3_free_aligned(o->data);
    *o = d->w.owned[--d->w.n_owned];
}

/* Weight `name` as the host holds it: the mapping, or the LoRA-merged copy of it (merged once and
   kept until released, so a weight reloaded by a later schedule is not merged again). */
static int host_mat(h3_dit *d, h3_mat *m, int64_t rows, int64_t cols, const char *name)
{
    int64_t shape[2] = {rows, cols};
    h3_dtype dt;
    const void *p = h3_store_get_float(d->st, name, 2, shape, &dt);
    if (!p) return -H3_E_SCHEMA;
    if (d->w.lora) {
        dit_owned *o = owned_find(d, name);
        void *merged = NULL;
        h3_dtype mdt = dt;
        if (o) {
            merged = o->data;
            mdt = dt == H3_DT_BF16 ? H3_DT_BF16 : H3_DT_F32;
        } else {
            int rc = h3_lora_merge(d->w.lora, d->pool, name, p, dt, rows, cols, &merged, &mdt);
            if (rc) return rc;
            if (merged) {
                dit_owned *no = h3_realloc(d->w.owned, sizeof *no * (size_t)(d->w.n_owned + 1));
                if (!no) {
                    h3_free_aligned(merged);
                    return -H3_E_NOMEM;
                }
                d->w.owned = no;
                snprintf(no[d->w.n_owned].name, sizeof no[d->w.n_owned].name, "%s", name);
                no[d->w.n_owned++].data = merged;
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
    /* A single file's quantised layer, computed from its stored codes where the backend can. */
    h3_sf_qw q;
    int rc = h3_sf_qweight(d->st, name, rows, cols, &q);
    if (rc < 0) return rc;
    /* A LoRA merges into widened weights: the layers left unwritten are widened now (once, all of them). */
    if (rc > 0 && d->w.lora && !q.widened && (rc = h3_sf_widen(d->st))) return rc;
    if (rc > 0 && !d->w.lora) {
        if (q.dtype == H3_DT_I8 && h3_backend_has(d->be, H3_CAP_I8_WEIGHTS))
            rc = d->be->weight_load_i8(d->be, q.q, q.scale, q.group, rows, cols, w);
        else if (q.dtype == H3_DT_F8_E4M3 && h3_backend_has(d->be, H3_CAP_FP8_WEIGHTS) &&
                 d->be->compute_capability >= 89 && h3_fp8_weight_shape_ok(rows, cols))
            rc = d->be->weights->weight_load_fp8(d->be, q.q, q.scale, rows, cols, w);
        else if (!q.widened)
            rc = h3_err(H3_E_UNSUPPORTED, "the %s backend cannot compute on the stored %s codes", d->be->name,
                        h3_dtype_name(q.dtype));
        else
            rc = 1; /* the widened form below */
        if (rc <= 0) {
            if (rc) h3_err_prefix("%s", name);
            return rc;
        }
    }
    h3_mat m;
    rc = host_mat(d, &m, rows, cols, name);
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
    if (out && d->w.lora && h3_lora_merge_vec(d->w.lora, name, out, n)) {
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

bool h3_dit_gemm_weight(const char *name)
{
    static const char *const whole[] = {"condition_proj.weight", "final_layer.video_out.weight",
                                        "final_layer.audio_out.weight", "video_patch_proj.weight",
                                        "audio_patch_proj.weight"};
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++)
        if (strcmp(name, whole[i]) == 0) return true;
    static const char *const pfx[] = {"blocks.", "token_refiner.blocks."};
    for (size_t p = 0; p < sizeof pfx / sizeof *pfx; p++) {
        const size_t l = strlen(pfx[p]);
        if (strncmp(name, pfx[p], l) != 0) continue;
        char *end;
        strtol(name + l, &end, 10);
        if (end == name + l || *end != '.') return false;
        char part[64];
        for (int k = 0; k < H3_DIT_GEMMS; k++) {
            snprintf(part, sizeof part, "%s.weight", h3_dit_gemm_part(k));
            if (strcmp(end + 1, part) == 0) return true;
        }
    }
    return false;
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
    int rc = h3_fp8file_get(d->w.fp8file, name, rows, cols, &q, &s);
    if (!rc)
        rc = h3_backend_has(d->be, H3_CAP_FP8_WEIGHTS)
                 ? d->be->weights->weight_load_fp8(d->be, q, s, rows, cols, w)
                 : h3_err(H3_E_UNSUPPORTED, "the %s backend cannot use pre-quantised fp8 weights", d->be->name);
    if (rc) h3_err_prefix("%s", name);
    if (!rc) h3_fp8file_release(d->w.fp8file, name);
    return rc;
}

/* A block's four GEMM weights (the bulk of its bytes). */
int dit_load_block_weights(h3_dit *d, dit_block *b, const char *pfx, int i)
{
    /* Reduced precision applies to the main stack only (the refiner runs once per prompt). */
    const bool main_stack = strcmp(pfx, "blocks") == 0;
    const int keep = d->be->weight_precision;
    if (main_stack) d->be->weight_precision = d->w.precision;
    int rc = 0;
    for (int k = 0; k < H3_DIT_GEMMS && !rc; k++) {
        int64_t rows, cols;
        h3_dit_gemm_shape(&d->w.c, k, &rows, &cols);
        char name[160];
        snprintf(name, sizeof name, "%s.%d.%s.weight", pfx, i, h3_dit_gemm_part(k));
        /* The file holds exactly the weights weight_load would quantise; the others load as then. */
        if (main_stack && d->w.fp8file && h3_fp8_weight_shape_ok(rows, cols))
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
    const h3_dit_cfg *c = &d->w.c;
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
    dit_block *b = &d->w.blk[i];
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

const h3_dit_cfg *h3_dit_config(const h3_dit *d) { return &d->w.c; }
h3_backend *h3_dit_backend(const h3_dit *d) { return d->be; }
uint64_t h3_dit_generation(const h3_dit *d) { return d->rq.generation; }

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
    int rc = h3_dit_cfg_load(m, &d->w.c);
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
            d->w.curve_grid = (int)tab->shape[0];
            d->w.c.temb_dim = (int)tab->shape[1];
        }
    }
    const h3_dit_cfg *c = &d->w.c;
    if (c->head_dim > DIT_MAX_HEAD_DIM) {
        rc = h3_err(H3_E_UNSUPPORTED, "%s: attention_head_dim %d is larger than this engine supports (%d)",
                    m->comp[H3_COMP_TRANSFORMER].config_path, c->head_dim, DIT_MAX_HEAD_DIM);
        free(d);
        return rc;
    }
    d->w.A = c->heads * c->head_dim;
    d->w.P = c->video_ch * c->patch[1] * c->patch[2];
    d->w.F3 = 3 * c->rope_freq;
    d->w.ref = h3_calloc((size_t)(c->refiner_layers ? c->refiner_layers : 1), sizeof *d->w.ref);
    d->w.blk = h3_calloc((size_t)(c->layers ? c->layers : 1), sizeof *d->w.blk);
    d->kn.run = h3_calloc((size_t)(c->layers ? c->layers : 1), sizeof *d->kn.run);
    if (!d->w.ref || !d->w.blk || !d->kn.run) rc = -H3_E_NOMEM;
    for (int i = 0; i < c->layers; i++) d->kn.run[i] = i;
    d->kn.n_run = c->layers;
    d->w.lazy_blocks = opts && opts->lazy_blocks;
    d->w.precision = opts ? opts->precision : H3_PRECISION_DEFAULT;
    d->w.fp8file = opts && d->w.precision == H3_PRECISION_FP8 ? opts->fp8file : NULL;
    if (!rc && d->w.fp8file && opts->n_lora > 0)
        rc = h3_err(H3_E_UNSUPPORTED, "LoRA files cannot be merged into pre-quantised fp8 weights (the file holds "
                    "the weights without them): render without the quantized file to quantise at load");
    if (!rc && opts && opts->n_lora > 0)
        rc = h3_lora_open(m, opts->lora_paths, opts->lora_scales, opts->n_lora, &d->w.lora);
    const int64_t H = c->hidden;
    if (!rc) rc = get_w(d, &d->w.cond, H, c->text_dim, "condition_proj.weight");
    if (!rc) rc = get_bvec(d, &d->w.cond_b, H, "condition_proj.bias");
    if (!rc) rc = get_bvec(d, &d->w.ref_final, H, "token_refiner.final_norm.weight");
    if (!rc && d->w.curve_grid) {
        const int64_t sh[2] = {d->w.curve_grid, c->temb_dim};
        h3_dtype dt;
        const void *p = h3_store_get_float(d->st, "time_embedder.table", 2, sh, &dt);
        if (!p) rc = -H3_E_SCHEMA;
        else if (!(d->w.curve = h3_alloc_aligned(sizeof(float) * (size_t)(sh[0] * sh[1])))) rc = -H3_E_NOMEM;
        else h3_to_f32(p, dt, d->w.curve, sh[0] * sh[1]);
    }
    if (!rc && !d->w.curve_grid)
        rc = get_mat(d, &d->w.te_in, c->temb_hidden, c->freq_dim, "time_embedder.proj_in.weight");
    if (!rc && !d->w.curve_grid) rc = get_vec(d, &d->w.te_in_b, c->temb_hidden, "time_embedder.proj_in.bias");
    if (!rc && !d->w.curve_grid)
        rc = get_mat(d, &d->w.te_out, c->temb_dim, c->temb_hidden, "time_embedder.proj_out.weight");
    if (!rc && !d->w.curve_grid) rc = get_vec(d, &d->w.te_out_b, c->temb_dim, "time_embedder.proj_out.bias");
    if (!rc) rc = get_mat(d, &d->w.fin_ada, 2 * H, c->temb_dim, "final_layer.adaln_proj.linear.weight");
    if (!rc) rc = get_vec(d, &d->w.fin_ada_b, 2 * H, "final_layer.adaln_proj.linear.bias");
    if (!rc) rc = get_bvec(d, &d->w.fin_norm, H, "final_layer.norm.weight");
    if (!rc) rc = get_w(d, &d->w.vout, d->w.P, H, "final_layer.video_out.weight");
    if (!rc) rc = get_bvec(d, &d->w.vout_b, d->w.P, "final_layer.video_out.bias");
    if (!rc) rc = get_w(d, &d->w.aout, c->audio_ch, H, "final_layer.audio_out.weight");
    if (!rc) rc = get_bvec(d, &d->w.aout_b, c->audio_ch, "final_layer.audio_out.bias");
    if (!rc) rc = get_w(d, &d->w.vproj, H, d->w.P, "video_patch_proj.weight");
    if (!rc) rc = get_bvec(d, &d->w.vproj_b, H, "video_patch_proj.bias");
    if (!rc) rc = get_w(d, &d->w.aproj, H, c->audio_ch, "audio_patch_proj.weight");
    if (!rc) rc = get_bvec(d, &d->w.aproj_b, H, "audio_patch_proj.bias");
    if (!rc && c->rope_freq > 0) rc = get_vec(d, &d->w.inv_freq, c->rope_freq, "rope.inv_freq");
    for (int i = 0; !rc && i < c->refiner_layers; i++)
        rc = load_block(d, &d->w.ref[i], "token_refiner.blocks", i, false, true);
    /* Which blocks' GEMM weights stream (the budget counts what is held by then), then the blocks:
       resident ones load their weights now (unless lazy), streamed ones make their host copy. */
    if (!rc) rc = dit_stream_plan(d, opts ? opts->vram_bytes : 0, !(opts && opts->no_stream_pack));
    for (int i = 0; !rc && i < c->layers; i++) {
        const bool streamed = d->w.blk[i].streamed;
        rc = load_block(d, &d->w.blk[i], "blocks", i, true, !d->w.lazy_blocks && !streamed && !d->w.blk[i].loaded);
        if (!rc && streamed && !d->w.lazy_blocks && !d->w.blk[i].loaded) rc = dit_stream_stage(d, i);
    }
    if (rc) { /* the store's message names the tensor, the shard and the shapes */
        h3_dit_close(d);
        return rc;
    }
    for (int i = 0; i < c->layers; i++) {
        char name[96];
        snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.weight", i);
        d->w.adaln_weight_bytes += tensor_bytes(d->st, name);
        snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.bias", i);
        d->w.adaln_weight_bytes += tensor_bytes(d->st, name);
    }
    d->w.adaln_weight_bytes += tensor_bytes(d->st, "final_layer.adaln_proj.linear.weight") +
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
    void **bufs[] = {&d->rq.x, &d->rq.nb, &d->rq.tmp, &d->rq.big, &d->rq.qkv3, &d->rq.ob, &d->rq.vo, &d->rq.ao};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        dit_bfree(d, *bufs[i]);
        *bufs[i] = NULL;
    }
    float **fb[] = {&d->rq.rcos, &d->rq.rsin, &d->rq.text};
    for (size_t i = 0; i < sizeof fb / sizeof *fb; i++) {
        dit_bfree(d, *fb[i]);
        *fb[i] = NULL;
    }
    int64_t **ib[] = {&d->rq.d_text_idx, &d->rq.d_video_idx, &d->rq.d_audio_idx};
    for (size_t i = 0; i < sizeof ib / sizeof *ib; i++) {
        dit_bfree(d, *ib[i]);
        *ib[i] = NULL;
    }
    d->rq.buf_rows = 0;
    d->rq.has_text = false;
}

/* The speed knobs' buffers: they belong to one prepared schedule. */
static void free_knob_state(h3_dit *d)
{
    void **bufs[] = {(void **)&d->kn.vel[0][0],  (void **)&d->kn.vel[0][1], (void **)&d->kn.vel[1][0],
                     (void **)&d->kn.vel[1][1],  (void **)&d->kn.mod_cur,   (void **)&d->kn.mod_prev,
                     (void **)&d->kn.core_delta, (void **)&d->kn.d_pairs,   (void **)&d->kn.red_cos,
                     (void **)&d->kn.red_sin,    (void **)&d->kn.d_red_combo, (void **)&d->kn.snap,
                     (void **)&d->kn.red_base};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        dit_bfree(d, *bufs[i]);
        *bufs[i] = NULL;
    }
    d->kn.n_vel = 0;
    d->kn.has_mod_prev = false;
    d->kn.cache_acc = 0;
    d->kn.core_calls = 0;
    d->kn.red_rows = 0;
}

static void drop_schedule(h3_dit *d)
{
    dit_pdd_drop(d);
    free_knob_state(d);
    for (int k = 0; k < 2; k++) {
        free(d->sc.sig[k]);
        free(d->sc.ts[k]);
        d->sc.sig[k] = d->sc.ts[k] = NULL;
    }
    plan_free(d, &d->sc.plan);
    dit_bfree(d, d->sc.tab_blk);
    dit_bfree(d, d->sc.tab_fin);
    free(d->sc.tvals);
    d->sc.tab_blk = d->sc.tab_fin = d->sc.tvals = NULL;
    d->sc.table_bytes = 0;
    d->sc.has_plan = false;
    d->sc.n_steps = 0;
}

void h3_dit_close(h3_dit *d)
{
    if (!d) return;
    dit_sp_free(d);
    drop_schedule(d);
    free_buffers(d);
    h3_dit_layout_free(&d->rq.lay);
    dit_stream_close(d);
    if (d->w.ref)
        for (int i = 0; i < d->w.c.refiner_layers; i++) free_block(d, &d->w.ref[i]);
    if (d->w.blk)
        for (int i = 0; i < d->w.c.layers; i++) free_block(d, &d->w.blk[i]);
    free(d->w.ref);
    free(d->w.blk);
    free(d->kn.run);
    h3_bw *ws[] = {&d->w.cond, &d->w.vout, &d->w.aout, &d->w.vproj, &d->w.aproj};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) dit_wfree(d, ws[i]);
    /* after every handle made from them is gone */
    for (int i = 0; i < d->w.n_owned; i++) h3_free_aligned(d->w.owned[i].data);
    free(d->w.owned);
    h3_lora_free(d->w.lora);
    float *bv[] = {d->w.cond_b, d->w.fin_norm, d->w.vout_b, d->w.aout_b, d->w.vproj_b, d->w.aproj_b, d->w.ref_final};
    for (size_t i = 0; i < sizeof bv / sizeof *bv; i++) dit_bfree(d, bv[i]);
    float *hv[] = {d->w.te_in_b, d->w.te_out_b, d->w.fin_ada_b, d->w.inv_freq, d->w.curve};
    for (size_t i = 0; i < sizeof hv / sizeof *hv; i++) h3_free_aligned(hv[i]);
    free(d);
}

/* ---- buffers, layout, RoPE ------------------------------------------------------------- */

static int ensure_buffers(h3_dit *d, int64_t rows)
{
    if (d->rq.buf_rows >= rows) return 0;
    const h3_dit_cfg *c = &d->w.c;
    const int64_t H = c->hidden, A = d->w.A, F = c->ffn;
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
    void **dst[6] = {&d->rq.x, &d->rq.nb, &d->rq.tmp, &d->rq.big, &d->rq.qkv3, &d->rq.ob};
    for (int i = 0; i < 6; i++) {
        dit_bfree(d, *dst[i]);
        *dst[i] = nx[i];
    }
    d->rq.buf_rows = rows;
    return 0;
}

/* RoPE cos/sin rows [n][3F] for (t, h, w) positions pos [n][3]. diffusers MiniMaxH3RotaryPosEmbed:
   fp64 positions cast to f32, times inv_freq in f32, laid out [t | h | w] x F; cos/sin in f32. The
   table holds 3F columns: the second half of torch's cat((freqs, freqs)) repeats them. */
void dit_rope_rows(const h3_dit *d, const double *pos, int64_t n, float *hc, float *hs)
{
    const int F = d->w.c.rope_freq;
    for (int64_t r = 0; r < n; r++)
        for (int a = 0; a < 3; a++) {
            const float p = (float)pos[r * 3 + a];
            for (int f = 0; f < F; f++) {
                const float ang = p * d->w.inv_freq[f];
                hc[r * d->w.F3 + a * F + f] = cosf(ang);
                hs[r * d->w.F3 + a * F + f] = sinf(ang);
            }
        }
}

void dit_run_all_blocks(h3_dit *d)
{
    for (int i = 0; i < d->w.c.layers; i++) d->kn.run[i] = i;
    d->kn.n_run = d->w.c.layers;
}

/* Exactly the blocks of the run list hold their GEMM weights: missing ones load (a lazy open, or a
   block an earlier schedule dropped), dropped ones let theirs go. */
int dit_ensure_run_blocks(h3_dit *d)
{
    const int L = d->w.c.layers;
    bool *keep = h3_calloc((size_t)(L ? L : 1), sizeof *keep);
    if (!keep) return -H3_E_NOMEM;
    for (int k = 0; k < d->kn.n_run; k++) keep[d->kn.run[k]] = true;
    int rc = 0;
    for (int b = 0; b < L && !rc; b++) {
        if (keep[b] && !d->w.blk[b].loaded)
            rc = d->w.blk[b].streamed ? dit_stream_stage(d, b) : dit_load_block_weights(d, &d->w.blk[b], "blocks", b);
        else if (!keep[b] && d->w.blk[b].loaded)
            d->w.blk[b].streamed ? dit_stream_unstage(d, b) : dit_unload_block_weights(d, b);
    }
    free(keep);
    return rc;
}

int h3_dit_set_layout(h3_dit *d, const h3_dit_layout *l)
{
    const h3_dit_cfg *c = &d->w.c;
    h3_backend *be = d->be;
    /* Unique across transformers: a render must notice when its transformer was replaced by one
       reopened for another LoRA set, not only when its layout was replaced. */
    d->rq.generation = atomic_fetch_add(&g_generation, 1) + 1;
    /* a new request starts exact: knobs are set per prepared schedule */
    memset(&d->kn.knobs, 0, sizeof d->kn.knobs);
    dit_run_all_blocks(d);
    bool keep_text = d->rq.has_text && d->rq.has_layout && d->rq.lay.n_text == l->n_text;
    float *text = keep_text ? d->rq.text : NULL;
    if (keep_text) d->rq.text = NULL;
    drop_schedule(d);
    free_buffers(d);
    h3_dit_layout_free(&d->rq.lay);
    d->rq.has_layout = false;
    int rc = h3_dit_layout_copy(&d->rq.lay, l);
    if (!rc) rc = ensure_buffers(d, l->seq);
    if (!rc) {
        d->rq.vo = be->mem->alloc(be, sizeof(float) * (size_t)(l->n_video * d->w.P + 1));
        d->rq.ao = be->mem->alloc(be, sizeof(float) * (size_t)(l->n_audio * c->audio_ch + 1));
        d->rq.d_text_idx = h3_backend_dup(be, l->text_idx, sizeof(int64_t) * (size_t)l->n_text);
        d->rq.d_video_idx = h3_backend_dup(be, l->video_idx, sizeof(int64_t) * (size_t)l->n_video);
        d->rq.d_audio_idx = h3_backend_dup(be, l->audio_idx, sizeof(int64_t) * (size_t)l->n_audio);
        if (!d->rq.vo || !d->rq.ao || !d->rq.d_text_idx || !d->rq.d_video_idx || !d->rq.d_audio_idx) rc = -H3_E_NOMEM;
    }
    if (!rc && d->w.F3 > 0) {
        /* Built on the host, then uploaded. */
        const size_t n = (size_t)(l->seq * d->w.F3);
        float *hc = h3_alloc_aligned(sizeof(float) * n), *hs = h3_alloc_aligned(sizeof(float) * n);
        if (!hc || !hs) rc = -H3_E_NOMEM;
        if (!rc) dit_rope_rows(d, l->pos, l->seq, hc, hs);
        if (!rc) {
            d->rq.rcos = h3_backend_dup(be, hc, sizeof(float) * n);
            d->rq.rsin = h3_backend_dup(be, hs, sizeof(float) * n);
            if (!d->rq.rcos || !d->rq.rsin) rc = -H3_E_NOMEM;
        }
        h3_free_aligned(hc);
        h3_free_aligned(hs);
    }
    if (rc) {
        dit_bfree(d, text);
        free_buffers(d);
        h3_dit_layout_free(&d->rq.lay);
        return rc;
    }
    d->rq.has_layout = true;
    if (keep_text) {
        d->rq.text = text;
        d->rq.has_text = true;
    }
    return 0;
}

/* ---- one transformer block (shared by the refiner and the main stack) ------------------ */

/* x += gate * y, then out = the modulated norm of x: one backend pass where it fuses the two. */
static int add_then_norm(h3_backend *be, const h3_dit_cfg *c, const h3_bt *x, const h3_bt *y, const h3_bmod *gate,
                         const float *w, const h3_bmod *mod, const h3_bt *out)
{
    const h3_backend_ops *o = be->ops;
    const float eps = (float)c->norm_eps;
    if (h3_backend_supports(be, H3_OP_gated_add_norm)) return o->gated_add_norm(be, x, y, gate, w, mod, eps, out);
    int rc = o->gated_add(be, x, y, gate);
    return rc ? rc : o->norm_mod(be, x, NULL, w, mod, eps, out);
}

/* Runs block b over `rows` rows of the exec's x from its row e->r0 on (one device: all of them from 0;
   a rank of a sequence-parallel group: its slice, models/dit_sp.c). tab/row_mod: AdaLN table of this
   block and the per-row entry of every sequence row (NULL for the plain refiner block); cos/sin:
   RoPE rows of the whole sequence (NULL in the refiner).
   The last residual add may be left to the next block, which folds it into its first norm
   (run_stack: the same sums, one pass over the residual stream less): `defer` leaves e->tmp
   unadded; `pending` says the previous block did, with its table prev_tab (same row entries). */
static int run_block(h3_dit *d, const dit_exec *e, const dit_block *b, int64_t rows, const float *tab,
                     const int32_t *row_mod, const float *cos, const float *sin, bool pending, const float *prev_tab,
                     bool defer)
{
    const h3_dit_cfg *c = &d->w.c;
    h3_backend *be = e->be;
    const h3_backend_ops *o = be->ops;
    const int64_t H = c->hidden, A = d->w.A, F = c->ffn;
    int rc;
    double t = now_ms();
    if (row_mod) row_mod += e->r0;
    if (cos) cos += e->r0 * d->w.F3, sin += e->r0 * d->w.F3;
    const h3_bt x = f32((float *)e->x + e->r0 * H, rows, H, H), tmp = f32(e->tmp, rows, H, H),
                nb = act(d, e->nb, rows, H, H);
    h3_bmod mod = {tab, row_mod, 6, 0};
    if (pending) {
        const h3_bmod prev = {prev_tab, row_mod, 6, 5};
        rc = add_then_norm(be, c, &x, &tmp, &prev, b->norm1, &mod, &nb);
    } else {
        rc = o->norm_mod(be, &x, NULL, b->norm1, &mod, (float)c->norm_eps, &nb);
    }
    if (rc) return rc;
    echarge(d, e, H3_DIT_PART_NORM, &t);
    const h3_bt qkv = act(d, e->big, rows, 3 * A, 3 * A);
    if ((rc = o->linear(be, &nb, &b->qkv, NULL, &qkv))) return rc;
    echarge(d, e, H3_DIT_PART_LINEAR, &t);
    const h3_bt Q = act(d, e->qkv3, rows, A, A), K = act(d, act_at(d, e->qkv3, rows * A), rows, A, A),
                V = act(d, act_at(d, e->qkv3, 2 * rows * A), rows, A, A);
    /* The fused projection's rows hold per head [q | k | v]: q, k and v are views of them at
       offsets 0, D and 2D, with heads 3D apart. */
    const int64_t D = c->head_dim;
    const h3_bt ki = act(d, act_at(d, e->big, D), rows, 3 * A - D, 3 * A),
                vi = act(d, act_at(d, e->big, 2 * D), rows, 3 * A - 2 * D, 3 * A);
    const h3_bt ob = act(d, e->ob, rows, A, A);
    if (e->sp) {
        /* a rank of a sequence-parallel group: its heads of the whole sequence (models/dit_sp.c) */
        if ((rc = dit_sp_attention(d, e, b, &qkv, rows, cos, sin, tab != NULL, &ob))) return rc;
    } else {
        if ((rc = o->qk_norm_rope(be, &qkv, &ki, &vi, 3 * c->head_dim, b->qn, b->kn, cos, sin, c->heads, c->heads,
                                  c->head_dim, cos ? d->w.F3 : 0, (float)c->qk_eps, &Q, &K, &V)))
            return rc;
        echarge(d, e, H3_DIT_PART_QKV, &t);
        /* fp8 attention (H3_OPT_FP8_ATTENTION) in the main blocks only: they have an AdaLN table, the
           refiner's blocks do not. */
        be->attn_precision = tab && (d->flags & H3_OPT_FP8_ATTENTION) ? H3_PRECISION_FP8 : H3_PRECISION_DEFAULT;
        rc = o->attention(be, &Q, &K, &V, c->heads, c->heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), false,
                          &ob);
        be->attn_precision = H3_PRECISION_DEFAULT;
        if (rc) return rc;
    }
    echarge(d, e, H3_DIT_PART_ATTENTION, &t);
    if ((rc = o->linear(be, &ob, &b->out, NULL, &tmp))) return rc;
    echarge(d, e, H3_DIT_PART_LINEAR, &t);
    const h3_bmod gate1 = {tab, row_mod, 6, 2};
    mod.slot = 3;
    if ((rc = add_then_norm(be, c, &x, &tmp, &gate1, b->norm2, &mod, &nb))) return rc;
    echarge(d, e, H3_DIT_PART_NORM, &t);
    const h3_bt gu = act(d, e->big, rows, 2 * F, 2 * F);
    if ((rc = o->linear(be, &nb, &b->fc1, NULL, &gu))) return rc;
    echarge(d, e, H3_DIT_PART_LINEAR, &t);
    /* fc1 rows are [gate | up] (diffusers' SwiGLU with its halves swapped). */
    const h3_bt gate = act(d, e->big, rows, F, 2 * F), up = act(d, act_at(d, e->big, F), rows, F, 2 * F),
                hid = act(d, e->qkv3, rows, F, F);
    if ((rc = o->swiglu(be, &gate, &up, &hid))) return rc;
    echarge(d, e, H3_DIT_PART_ELTWISE, &t);
    if ((rc = o->linear(be, &hid, &b->fc2, NULL, &tmp))) return rc;
    echarge(d, e, H3_DIT_PART_LINEAR, &t);
    if (defer) return 0;
    mod.slot = 5;
    if ((rc = o->gated_add(be, &x, &tmp, &mod))) return rc;
    echarge(d, e, H3_DIT_PART_ELTWISE, &t);
    return 0;
}

int h3_dit_set_text(h3_dit *d, const float *text_states, int64_t n)
{
    if (!d->rq.has_layout) return h3_err(H3_E_INVALID, "transformer: set a layout before the text");
    if (n != d->rq.lay.n_text)
        return h3_err(H3_E_INVALID, "transformer: %lld text rows, but the layout has %lld", (long long)n,
                      (long long)d->rq.lay.n_text);
    double t0 = now_ms();
    const h3_dit_cfg *c = &d->w.c;
    h3_backend *be = d->be;
    const int64_t H = c->hidden;
    int rc;
    if (!d->rq.text) {
        d->rq.text = be->mem->alloc(be, sizeof(float) * (size_t)(n * H + 1));
        if (!d->rq.text) return -H3_E_NOMEM;
    }
    d->rq.has_text = false;
    float *in = h3_backend_dup(be, text_states, sizeof(float) * (size_t)(n * c->text_dim));
    if (!in) return -H3_E_NOMEM;
    /* The refiner's time is not part of any forward's breakdown. */
    double saved[H3_DIT_PARTS];
    memcpy(saved, d->stats.part_ms, sizeof saved);
    const h3_bt X = f32(in, n, c->text_dim, c->text_dim), x = f32(d->rq.x, n, H, H), txt = f32(d->rq.text, n, H, H);
    rc = be->ops->linear(be, &X, &d->w.cond, d->w.cond_b, &x);
    const dit_exec ex = dit_exec_local(d);
    for (int i = 0; !rc && i < c->refiner_layers; i++)
        rc = run_block(d, &ex, &d->w.ref[i], n, NULL, NULL, NULL, NULL, false, NULL, false);
    if (!rc) rc = be->ops->norm_mod(be, &x, NULL, d->w.ref_final, NULL, (float)c->final_eps, &txt);
    if (!rc) rc = be->mem->sync(be);
    dit_bfree(d, in);
    memcpy(d->stats.part_ms, saved, sizeof saved);
    if (rc) return rc;
    d->rq.has_text = true;
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
    const h3_dit_cfg *c = &d->w.c;
    if (d->w.curve) {
        /* Pruned form: linear interpolation of the table at t clamped to [0, 1] (the SiLU is in it). */
        const int64_t G = d->w.curve_grid, E = c->temb_dim;
        for (int64_t m = 0; m < M; m++) {
            const float tc = t[m] < 0.0f ? 0.0f : t[m] > 1.0f ? 1.0f : t[m];
            const float pos = tc * (float)(G - 1);
            int64_t lo = (int64_t)floorf(pos);
            if (lo > G - 2) lo = G - 2;
            const float w = pos - (float)lo;
            const float *a = d->w.curve + lo * E, *b = a + E;
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
    int rc = h3_host_linear(d->pool, sin_emb, M, c->freq_dim, &d->w.te_in, d->w.te_in_b, h, c->temb_hidden);
    for (int64_t i = 0; !rc && i < M * c->temb_hidden; i++) h[i] = h3_silu(h[i]);
    if (!rc) rc = h3_host_linear(d->pool, h, M, c->temb_hidden, &d->w.te_out, d->w.te_out_b, out, c->temb_dim);
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
    const h3_dit_cfg *c = &d->w.c;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    /* tables for the blocks a forward runs, in its order (all blocks unless layers are dropped) */
    const int64_t H = c->hidden, E = c->temb_dim, L = d->kn.n_run, nc = p->n_combo, nf = p->n_fin;
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
        const dit_block *bk = &d->w.blk[d->kn.run[b]];
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
            snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.weight", d->kn.run[b]);
            h3_store_release_tensor(d->st, name);
            snprintf(name, sizeof name, "blocks.%d.adaln_proj.linear.bias", d->kn.run[b]);
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
        rc = be->weights->weight_load(be, d->w.fin_ada.data, d->w.fin_ada.dtype, 2 * H, E, &W);
        if (!rc) rc = be->mem->upload(be, Xd, X, sizeof(float) * (size_t)(rows * E));
        if (!rc) rc = be->mem->upload(be, bd, d->w.fin_ada_b, sizeof(float) * (size_t)(2 * H));
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
    const int64_t H = d->w.c.hidden;
    int rc = 0;
    for (int b = 0; !rc && b < d->w.c.layers; b++)
        if (!d->w.blk[b].ada_b) rc = get_vec(d, &d->w.blk[b].ada_b, 18 * H, "blocks.%d.adaln_proj.linear.bias", b);
    if (!rc && !d->w.fin_ada_b) rc = get_vec(d, &d->w.fin_ada_b, 2 * H, "final_layer.adaln_proj.linear.bias");
    return rc;
}

static void release_ada_bias(h3_dit *d)
{
    for (int b = 0; b < d->w.c.layers; b++) {
        h3_free_aligned(d->w.blk[b].ada_b);
        d->w.blk[b].ada_b = NULL;
    }
    h3_free_aligned(d->w.fin_ada_b);
    d->w.fin_ada_b = NULL;
}

/* The plan's per-row entries on the backend, for the norm and gate kernels. */
static int plan_upload(h3_dit *d, dit_plan *p)
{
    const size_t n = sizeof(int32_t) * (size_t)d->rq.lay.seq;
    p->d_row_combo = h3_backend_dup(d->be, p->row_combo, n);
    p->d_row_fin = h3_backend_dup(d->be, p->row_fin, n);
    return p->d_row_combo && p->d_row_fin ? 0 : -H3_E_NOMEM;
}

/* ---- the forward ----------------------------------------------------------------------- */

/* A forward's input rows: x <- refined text | video_patch_proj(video) | audio_patch_proj(audio). */
static int forward_inputs(h3_dit *d, const float *video_rows, const float *audio_rows)
{
    const h3_dit_cfg *c = &d->w.c;
    const h3_dit_layout *l = &d->rq.lay;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    const int64_t H = c->hidden, L = l->seq;
    int rc = 0;
    const h3_bt x = f32(d->rq.x, L, H, H);
    /* Rows no index names stay zero (diffusers scatters into a zero buffer). */
    if (l->n_text + l->n_video + l->n_audio < L && (rc = be->mem->zero(be, d->rq.x, sizeof(float) * (size_t)(L * H))))
        return rc;
    const h3_bt text = f32(d->rq.text, l->n_text, H, H);
    if (l->n_text && (rc = o->scatter_rows(be, &text, d->rq.d_text_idx, &x))) return rc;
    if (l->n_video) {
        const h3_bt in = f32((void *)video_rows, l->n_video, d->w.P, d->w.P), tmp = f32(d->rq.tmp, l->n_video, H, H);
        if ((rc = o->linear(be, &in, &d->w.vproj, d->w.vproj_b, &tmp)) ||
            (rc = o->scatter_rows(be, &tmp, d->rq.d_video_idx, &x)))
            return rc;
    }
    if (l->n_audio) {
        const h3_bt in = f32((void *)audio_rows, l->n_audio, c->audio_ch, c->audio_ch),
                    tmp = f32(d->rq.tmp, l->n_audio, H, H);
        if ((rc = o->linear(be, &in, &d->w.aproj, d->w.aproj_b, &tmp)) ||
            (rc = o->scatter_rows(be, &tmp, d->rq.d_audio_idx, &x)))
            return rc;
    }
    return 0;
}

/* Token reduction, entering the reduced span: snapshot the full state, pool it into the first
   red_rows rows of x, and keep the pooled entry state as the baseline of the restore. */
static int enter_reduced(h3_dit *d)
{
    h3_backend *be = d->be;
    const int64_t H = d->w.c.hidden, L = d->rq.lay.seq, Lr = d->kn.red_rows;
    const h3_bt full = f32(d->kn.snap, L, H, H), red = f32(d->rq.x, Lr, H, H);
    int rc = be->ops->extrapolate(be, d->kn.snap, d->rq.x, NULL, L * H, 0.0f);
    if (!rc) rc = be->ops->pool_pairs(be, &full, d->kn.d_pairs, &red);
    if (!rc) rc = be->ops->extrapolate(be, d->kn.red_base, d->rq.x, NULL, Lr * H, 0.0f);
    return rc;
}

/* Leaving it: every full row becomes its entry state plus its pair's change (single rows take the
   reduced result itself), then x holds the full sequence again. */
static int leave_reduced(h3_dit *d)
{
    h3_backend *be = d->be;
    const int64_t H = d->w.c.hidden, L = d->rq.lay.seq, Lr = d->kn.red_rows;
    const h3_bt full = f32(d->kn.snap, L, H, H), red = f32(d->rq.x, Lr, H, H), base = f32(d->kn.red_base, Lr, H, H);
    int rc = be->ops->unpool_pairs(be, &red, &base, d->kn.d_pairs, &full);
    if (!rc) rc = be->ops->extrapolate(be, d->rq.x, d->kn.snap, NULL, L * H, 0.0f);
    return rc;
}

/* The block stack over the exec's x: the blocks of the run list with their tables (in run-list order),
   the blocks of token reduction's span on the reduced sequence. step < 0: outside a schedule (no
   reduction). `rows`: the rows from e->r0 on that this exec computes (the whole sequence on one
   device; a rank's slice, which token reduction never runs on: dit_sp.c refuses the pair). */
int dit_run_stack_exec(h3_dit *d, const dit_exec *e, const dit_plan *p, const float *tab_blk, int step, int64_t rows)
{
    const int64_t H = d->w.c.hidden, L = rows, stride = (int64_t)p->n_combo * 6 * H;
    const bool reduce = d->kn.red_rows > 0 && step >= 0 && !e->sp;
    const int end = step >= 0 && step < 10 ? d->kn.tr_end_early : d->kn.tr_end;
    bool in = false, pending = false;
    int rc = 0, j = 0;
    /* Streamed blocks: a pass over them in run order (their slots fill ahead of their turn). */
    if (d->ws.n_streamed > 0) {
        int *seq = h3_malloc(sizeof *seq * (size_t)(d->kn.n_run ? d->kn.n_run : 1)), n = 0;
        if (!seq) return -H3_E_NOMEM;
        for (int k = 0; k < d->kn.n_run; k++)
            if (d->w.blk[d->kn.run[k]].streamed) seq[n++] = d->kn.run[k];
        rc = n ? dit_stream_begin(d, seq, n) : 0;
        free(seq);
    }
    for (int k = 0; k < d->kn.n_run && !rc; k++) {
        const int b = d->kn.run[k];
        const bool streamed = d->w.blk[b].streamed;
        dit_block view;
        const dit_block *blk = &d->w.blk[b];
        if (streamed) {
            if ((rc = dit_stream_acquire(d, j, b, &view))) break;
            blk = &view;
        }
        const bool want = reduce && b >= d->kn.tr_first && b < end;
        if (want != in) {
            rc = want ? enter_reduced(d) : leave_reduced(d);
            in = want;
        }
        /* The next block runs on the same rows: it takes this block's last residual add. */
        const int nb = k + 1 < d->kn.n_run ? d->kn.run[k + 1] : -1;
        const bool defer = nb >= 0 && (reduce && nb >= d->kn.tr_first && nb < end) == want;
        const float *prev = k > 0 ? tab_blk + (k - 1) * stride : NULL;
        if (!rc)
            rc = in ? run_block(d, e, blk, d->kn.red_rows, tab_blk + k * stride, d->kn.d_red_combo, d->kn.red_cos,
                                d->kn.red_sin, pending, prev, defer)
                    : run_block(d, e, blk, L, tab_blk + k * stride, p->d_row_combo, d->rq.rcos, d->rq.rsin, pending, prev,
                                defer);
        if (!rc && streamed) rc = dit_stream_release(d, j++);
        pending = defer;
    }
    if (!rc && in) rc = leave_reduced(d);
    return rc;
}

static int run_stack(h3_dit *d, const dit_plan *p, const float *tab_blk, int step)
{
    if (d->sp) return dit_sp_run_stack(d, p, tab_blk, step);
    const dit_exec e = dit_exec_local(d);
    return dit_run_stack_exec(d, &e, p, tab_blk, step, d->rq.lay.seq);
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
    const h3_dit_cfg *c = &d->w.c;
    const h3_dit_layout *l = &d->rq.lay;
    h3_backend *be = d->be;
    const h3_backend_ops *o = be->ops;
    const int64_t H = c->hidden, L = l->seq;
    int rc = 0;
    const h3_bt x = f32(d->rq.x, L, H, H);
    if (!inputs_ready && (rc = forward_inputs(d, video_rows, audio_rows))) return rc;
    if (core == CORE_REUSE) {
        const h3_bmod none = {0};
        const h3_bt delta = f32(d->kn.core_delta, L, H, H);
        if ((rc = o->gated_add(be, &x, &delta, &none))) return rc;
    } else {
        if (core == CORE_SAVE && (rc = o->extrapolate(be, d->kn.core_delta, d->rq.x, NULL, L * H, 0.0f))) return rc;
        /* The block stack is timed on its own (a wait before and after it): benchmarks compare it
           with one block of other engines, without the patch projections and heads. */
        if ((rc = be->mem->sync(be))) return rc;
        const double tb = now_ms();
        if ((rc = run_stack(d, p, tab_blk, step))) return rc;
        if ((rc = be->mem->sync(be))) return rc;
        const double stack_ms = now_ms() - tb;
        if (!d->stats.block_runs || stack_ms < d->stats.stack_ms_min) d->stats.stack_ms_min = stack_ms;
        d->stats.stack_ms_total += stack_ms;
        if (core == CORE_SAVE && (rc = o->sub(be, d->kn.core_delta, d->rq.x, d->kn.core_delta, L * H))) return rc;
        d->stats.block_runs++;
    }
    /* Final norm + heads on the output rows only (diffusers runs both heads over every row and
       selects afterwards; the selected values are the same). */
    const h3_bmod fm = {tab_fin, p->d_row_fin, 2, 0};
    /* a PDD LoRA's heads of this step (h3_dit_forward_t's explicit timesteps keep the model's) */
    const bool pdd = d->sc.pdd_n > 0 && step >= 0 && step < d->sc.pdd_n;
    if (l->n_video) {
        const h3_bt nb = act(d, d->rq.nb, l->n_video, H, H), out = f32(video_out, l->n_video, d->w.P, d->w.P);
        if ((rc = o->norm_mod(be, &x, d->rq.d_video_idx, d->w.fin_norm, &fm, (float)c->final_eps, &nb)) ||
            (rc = o->linear(be, &nb, pdd ? &d->sc.pdd_w[0][step] : &d->w.vout, pdd ? d->sc.pdd_b[0][step] : d->w.vout_b,
                            &out)))
            return rc;
    }
    if (l->n_audio) {
        const h3_bt nb = act(d, d->rq.nb, l->n_audio, H, H), out = f32(audio_out, l->n_audio, c->audio_ch, c->audio_ch);
        if ((rc = o->norm_mod(be, &x, d->rq.d_audio_idx, d->w.fin_norm, &fm, (float)c->final_eps, &nb)) ||
            (rc = o->linear(be, &nb, pdd ? &d->sc.pdd_w[1][step] : &d->w.aout, pdd ? d->sc.pdd_b[1][step] : d->w.aout_b,
                            &out)))
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
    if (!d->rq.has_layout || !d->rq.has_text)
        return h3_err(H3_E_INVALID, "transformer: the forward needs a layout and its text first");
    if (n_t < 1 || n_t > 1 << 20) return h3_err(H3_E_INVALID, "forward: %d timesteps", n_t);
    for (int i = 0; i < n_t; i++)
        if (!isfinite(t_values[i]))
            return h3_err(H3_E_INVALID, "forward: timestep[%d] is not finite", i);
    dit_plan p;
    int rc = plan_build(&p, &d->rq.lay, row_t, n_t);
    if (rc) return rc;
    h3_backend *be = d->be;
    const h3_dit_layout *l = &d->rq.lay;
    const int64_t H = d->w.c.hidden, Ca = d->w.c.audio_ch;
    const size_t vbytes = sizeof(float) * (size_t)(l->n_video * d->w.P),
                 abytes = sizeof(float) * (size_t)(l->n_audio * Ca);
    float *blk = be->mem->alloc(be, sizeof(float) * (size_t)((int64_t)d->w.c.layers * p.n_combo * 6 * H + 1));
    float *fin = be->mem->alloc(be, sizeof(float) * (size_t)((int64_t)p.n_fin * 2 * H + 1));
    float *vin = l->n_video ? h3_backend_dup(be, video_rows, vbytes) : NULL;
    float *ain = l->n_audio ? h3_backend_dup(be, audio_rows, abytes) : NULL;
    rc = (!blk || !fin || (l->n_video && !vin) || (l->n_audio && !ain)) ? -H3_E_NOMEM : plan_upload(d, &p);
    /* explicit timesteps run the whole model, whatever a previous schedule dropped */
    dit_run_all_blocks(d);
    if (!rc) rc = dit_ensure_run_blocks(d);
    if (!rc) rc = ensure_ada_bias(d);
    if (!rc) rc = compute_tables(d, &p, t_values, 1, blk, fin, false);
    if (!rc) rc = forward(d, &p, blk, fin, vin, ain, d->rq.vo, d->rq.ao, false, -1, CORE_PLAIN);
    if (!rc && l->n_video) rc = be->mem->download(be, video_out, d->rq.vo, vbytes);
    if (!rc && l->n_audio) rc = be->mem->download(be, audio_out, d->rq.ao, abytes);
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
    if (!d->rq.has_layout) return h3_err(H3_E_INVALID, "transformer: set a layout before preparing a schedule");
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
    const h3_dit_cfg *c = &d->w.c;
    const h3_dit_layout *l = &d->rq.lay;
    int n[2] = {n_sigmas, n_sigmas};
    const float *given[2] = {sigmas_video, sigmas_audio};
    for (int k = 0; k < 2 && !rc; k++) {
        d->sc.sig[k] = h3_malloc(sizeof(float) * (size_t)n_sigmas);
        d->sc.ts[k] = h3_malloc(sizeof(float) * (size_t)n_sigmas);
        if (!d->sc.sig[k] || !d->sc.ts[k]) rc = -H3_E_NOMEM;
        if (!rc) memcpy(d->sc.sig[k], given[k], sizeof(float) * (size_t)n_sigmas);
        if (!rc) h3_sched_timesteps(d->sc.sig[k], n[k], d->sc.ts[k]);
    }
    int32_t *row_t = rc ? NULL : h3_malloc(sizeof(int32_t) * (size_t)l->seq);
    if (!rc && !row_t) rc = -H3_E_NOMEM;
    for (int64_t r = 0; !rc && r < l->seq; r++) row_t[r] = l->role[r];
    if (!rc) rc = plan_build(&d->sc.plan, l, row_t, H3_ROLES);
    free(row_t);
    if (!rc) rc = plan_upload(d, &d->sc.plan);
    const int evals = n[0] - 1;
    /* H3_OPT_DIT_PER_STEP keeps diffusers' structure: the modulation of a step is computed from
       the adaln_proj weights when the step runs, and nothing is released. */
    d->sc.per_step = (d->flags & H3_OPT_DIT_PER_STEP) != 0;
    const int sets = d->sc.per_step ? 1 : evals;
    if (!rc && !(d->sc.tvals = h3_malloc(sizeof(float) * (size_t)evals * H3_ROLES))) rc = -H3_E_NOMEM;
    float *tv = d->sc.tvals;
    for (int s = 0; !rc && s < evals; s++) {
        /* build_row_timesteps: conditioning video rows at max(t, 0.999), reference audio at 1. */
        const float t = d->sc.ts[0][s];
        tv[s * H3_ROLES + H3_ROLE_VIDEO] = t;
        tv[s * H3_ROLES + H3_ROLE_AUDIO] = d->sc.ts[1][s];
        tv[s * H3_ROLES + H3_ROLE_COND_VIDEO] = (float)((double)t > H3_KEYFRAME_NOISE_AUG ? (double)t : H3_KEYFRAME_NOISE_AUG);
        tv[s * H3_ROLES + H3_ROLE_COND_AUDIO] = 1.0f;
    }
    if (d->sc.per_step) release_adaln = false;
    if (!rc) rc = ensure_ada_bias(d);
    /* The speed knobs decide which blocks run (only those get tables) and set up their caches. */
    if (!rc) rc = dit_apply_knobs(d, tv, evals, release_adaln);
    if (!rc) {
        const int64_t H = c->hidden;
        uint64_t blk_n = (uint64_t)sets * d->kn.n_run * d->sc.plan.n_combo * 6 * H;
        uint64_t fin_n = (uint64_t)sets * d->sc.plan.n_fin * 2 * H;
        d->sc.tab_blk = d->be->mem->alloc(d->be, sizeof(float) * (size_t)(blk_n + 1));
        d->sc.tab_fin = d->be->mem->alloc(d->be, sizeof(float) * (size_t)(fin_n + 1));
        if (!d->sc.tab_blk || !d->sc.tab_fin) rc = -H3_E_NOMEM;
        d->sc.table_bytes = (blk_n + fin_n) * sizeof(float);
    }
    if (!rc && !d->sc.per_step)
        rc = compute_tables(d, &d->sc.plan, tv, evals, d->sc.tab_blk, d->sc.tab_fin, release_adaln);
    if (!rc && h3_lora_pdd_intervals(d->w.lora)) rc = dit_pdd_build(d, evals);
    if (rc) {
        drop_schedule(d);
        return rc;
    }
    if (release_adaln) {
        release_ada_bias(d);
        d->w.adaln_released = true;
    }
    d->sc.n_steps = evals;
    d->sc.has_plan = true;
    d->stats.layers_run = d->kn.n_run;
    d->stats.prepare_ms = now_ms() - t0;
    return evals;
}

int h3_dit_num_steps(const h3_dit *d) { return d->sc.has_plan ? d->sc.n_steps : 0; }

const int *h3_dit_blocks_run(const h3_dit *d, int *n, int64_t *reduced_rows)
{
    *n = d->kn.n_run;
    if (reduced_rows) *reduced_rows = d->kn.red_rows;
    return d->kn.run;
}

const float *h3_dit_sigmas(const h3_dit *d, int modality_audio)
{
    return d->sc.has_plan ? d->sc.sig[modality_audio ? 1 : 0] : NULL;
}

/* The step cache's test: the relative L1 change of the first block's modulated input since the
   previous step, added to what has accumulated since the last evaluation. x holds this step's input
   rows afterwards. */
static int cache_test(h3_dit *d, const float *blk, const float *video_rows, const float *audio_rows)
{
    h3_backend *be = d->be;
    const int64_t H = d->w.c.hidden, L = d->rq.lay.seq;
    int rc = forward_inputs(d, video_rows, audio_rows);
    const h3_bt x = f32(d->rq.x, L, H, H), y = f32(d->kn.mod_cur, L, H, H);
    const h3_bmod mod = {blk, d->sc.plan.d_row_combo, 6, 0};
    if (!rc) rc = be->ops->norm_mod(be, &x, NULL, d->w.blk[d->kn.run[0]].norm1, &mod, (float)d->w.c.norm_eps, &y);
    if (!rc && d->kn.has_mod_prev) {
        double diff, ref;
        rc = be->ops->abs_diff_sum(be, d->kn.mod_cur, d->kn.mod_prev, L * H, &diff, &ref);
        if (!rc) d->kn.cache_acc += ref > 0 ? diff / ref : 0;
    }
    float *t = d->kn.mod_prev;
    d->kn.mod_prev = d->kn.mod_cur;
    d->kn.mod_cur = t;
    d->kn.has_mod_prev = true;
    return rc;
}

int h3_dit_step(h3_dit *d, int i, float *video_rows, float *audio_rows)
{
    if (!d->sc.has_plan) return h3_err(H3_E_INVALID, "transformer: no schedule prepared");
    if (!d->rq.has_text) return h3_err(H3_E_INVALID, "transformer: no text set for this layout");
    if (i < 0 || i >= d->sc.n_steps)
        return h3_err(H3_E_INVALID, "transformer: step %d is outside the schedule of %d steps", i, d->sc.n_steps);
    const double t_step = now_ms();
    const h3_dit_cfg *c = &d->w.c;
    const h3_dit_layout *l = &d->rq.lay;
    h3_backend *be = d->be;
    const int64_t H = c->hidden;
    const int set = d->sc.per_step ? 0 : i;
    const float *blk = d->sc.tab_blk + (int64_t)set * d->kn.n_run * d->sc.plan.n_combo * 6 * H;
    const float *fin = d->sc.tab_fin + (int64_t)set * d->sc.plan.n_fin * 2 * H;
    const h3_dit_knobs *k = &d->kn.knobs;
    const int last = d->sc.n_steps - 1;
    const bool history = k->reuse > 1 || k->cache_threshold > 0;
    int rc = 0;
    if (d->sc.per_step) {
        rc = ensure_ada_bias(d);
        if (!rc)
            rc = compute_tables(d, &d->sc.plan, d->sc.tvals + (int64_t)i * H3_ROLES, 1, d->sc.tab_blk, d->sc.tab_fin,
                                false);
    }
    /* Which steps run the transformer: all, unless step reuse or the step cache skips some (the
       first and the last always run). */
    bool eval = true, ready = false;
    if (!rc && k->reuse > 1) {
        eval = i == 0 || i == last || i % k->reuse == 0;
    } else if (!rc && k->cache_threshold > 0) {
        rc = cache_test(d, blk, video_rows, audio_rows);
        ready = true;
        eval = i == 0 || i == last || d->kn.n_vel == 0 || d->kn.cache_acc >= k->cache_threshold;
        if (eval) d->kn.cache_acc = 0;
    }
    if (rc) return rc;
    const int64_t P = d->w.P, Ca = c->audio_ch;
    const float *vo = d->rq.vo, *ao = d->rq.ao;
    if (eval) {
        int core = CORE_PLAIN;
        if (k->core_reuse > 1)
            core = d->kn.core_calls == 0 || i == last || d->kn.core_calls % k->core_reuse == 0 ? CORE_SAVE : CORE_REUSE;
        float *vout = d->rq.vo, *aout = d->rq.ao;
        if (history) { /* the oldest velocity's buffers take the new one */
            vout = d->kn.vel[0][1];
            aout = d->kn.vel[1][1];
        }
        rc = forward(d, &d->sc.plan, blk, fin, video_rows, audio_rows, vout, aout, ready, i, core);
        if (rc) return rc;
        d->kn.core_calls++;
        if (history) {
            for (int m = 0; m < 2; m++) {
                float *t = d->kn.vel[m][1];
                d->kn.vel[m][1] = d->kn.vel[m][0];
                d->kn.vel[m][0] = t;
                d->kn.vel_sig[m][1] = d->kn.vel_sig[m][0];
                d->kn.vel_sig[m][0] = d->sc.sig[m][i];
            }
            if (d->kn.n_vel < 2) d->kn.n_vel++;
        }
        vo = vout;
        ao = aout;
    } else if (k->reuse > 1 && d->kn.n_vel >= 2) {
        /* v = v1 + r (v1 - v0), r = (sigma - sigma1) / (sigma1 - sigma0) per modality, within [-2, 2] */
        const int64_t n[2] = {l->n_video * P, l->n_audio * Ca};
        float *out[2] = {d->rq.vo, d->rq.ao};
        for (int m = 0; m < 2 && !rc; m++) {
            const double s1 = d->kn.vel_sig[m][0], s0 = d->kn.vel_sig[m][1], den = s1 - s0;
            double r = den != 0 ? ((double)d->sc.sig[m][i] - s1) / den : 0.0;
            r = r < -2 ? -2 : r > 2 ? 2 : r;
            rc = be->ops->extrapolate(be, out[m], d->kn.vel[m][0], d->kn.vel[m][1], n[m], (float)r);
        }
        if (rc) return rc;
        d->stats.skipped_steps++;
    } else {
        /* after a single evaluation, and in the step cache: hold the last velocity */
        vo = d->kn.vel[0][0];
        ao = d->kn.vel[1][0];
        d->stats.skipped_steps++;
    }
    /* Euler on the generated rows only; conditioning rows ride through unchanged. */
    if ((rc = be->ops->euler(be, video_rows + l->n_cond_video * P, vo + l->n_cond_video * P,
                             (l->n_video - l->n_cond_video) * P, d->sc.ts[0][i], d->sc.sig[0][i],
                             d->sc.sig[0][i + 1])) ||
        (rc = be->ops->euler(be, audio_rows + l->n_cond_audio * Ca, ao + l->n_cond_audio * Ca,
                             (l->n_audio - l->n_cond_audio) * Ca, d->sc.ts[1][i], d->sc.sig[1][i],
                             d->sc.sig[1][i + 1])))
        return rc;
    d->stats.transformer_ms += now_ms() - t_step;
    return d->sc.n_steps - i - 1;
}

void h3_dit_adaln_bytes(const h3_dit *d, uint64_t *weights, uint64_t *tables, bool *released)
{
    if (weights) *weights = d->w.adaln_weight_bytes;
    if (tables) *tables = d->sc.table_bytes;
    if (released) *released = d->w.adaln_released;
}

void h3_dit_get_stats(const h3_dit *d, h3_dit_stats *s) { *s = d->stats; }
