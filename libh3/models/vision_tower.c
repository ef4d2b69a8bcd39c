/*
 * Qwen3-VL's vision tower and the FL2VA presentation (vision_tower.h). The oracle is transformers'
 * Qwen3VLVisionModel and Qwen3VLModel.forward as diffusers' get_qwen3vl_prompt_embeds calls them:
 *
 *   x = pixels W_patch^T + b                 (the Conv3d with stride = kernel is a GEMM over patches)
 *   x += bilinear(pos_embed)                 (the side x side table resampled, corners aligned)
 *   per block: x += proj(attn(rope(qkv(LN1 x))))  full attention within the image, 2-D RoPE
 *              x += fc2(gelu_tanh(fc1(LN2 x)))
 *              after deepstack block k: ds_k = fc2(gelu(fc1(LN(x viewed as [N/4, 4C]))))
 *   embeds = fc2(gelu(fc1(LN(x) viewed as [N/4, 4C])))
 *
 * Tokens are in 2x2-merge-block order (the processor's), so the merge is a reinterpretation of
 * four consecutive rows as one. Each image runs through the tower on its own: transformers'
 * attention is block-diagonal over images (cu_seqlens) and everything else is per token.
 */
#include "models/vision_tower.h"
#include "core/host.h" /* h3_to_f32: norm weights and biases are widened on the host */
#include "core/geometry.h"
#include "core/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VT_PREFIX "model.visual."

/* ---- config --------------------------------------------------------------------------------- */

static int cfg_int(const h3_json *d, const h3j *o, const char *path, const char *key, int dflt, int lo, int hi,
                   int *out)
{
    int64_t v;
    if (h3_cfg_int(d, o, &v, key, (const char *)NULL) != 0) {
        const h3j *x = h3j_get(d, o, key);
        if (x && x->type != H3J_NULL) return h3_err(H3_E_FORMAT, "%s: \"%s\" must be an integer", path, key);
        if (dflt < lo) return h3_err(H3_E_FORMAT, "%s: missing integer \"%s\"", path, key);
        *out = dflt;
        return 0;
    }
    if (v < lo || v > hi)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" = %lld is out of range [%d, %d]", path, key, (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

/* An integer list of up to `cap` entries; absent: the defaults stay. */
static int cfg_list(const h3_json *d, const h3j *o, const char *path, const char *key, int *out, int cap, int *n)
{
    const h3j *a = h3j_get(d, o, key);
    if (!a || a->type == H3J_NULL) return 0;
    if (a->type != H3J_ARR || (int)a->len > cap)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" must be a list of at most %d integers", path, key, cap);
    int i = 0;
    for (const h3j *e = h3j_first(d, a); e; e = h3j_next(d, e), i++) {
        if (e->type != H3J_NUM || !e->is_int || e->i < 0 || e->i > (1 << 20))
            return h3_err(H3_E_FORMAT, "%s: \"%s\"[%d] must be a non-negative integer", path, key, i);
        out[i] = (int)e->i;
    }
    *n = i;
    return 0;
}

int h3_vision_cfg_load(h3_model *m, h3_vision_cfg *c)
{
    memset(c, 0, sizeof *c);
    h3_text_cfg tc;
    int rc = h3_text_cfg_load(m, &tc);
    if (rc) return rc;
    h3_comp *k = &m->comp[H3_COMP_TEXT_ENCODER];
    const h3_json *d = &k->config;
    const h3j *root = h3j_root(d), *v = h3j_get(d, root, "vision_config");
    const char *p = k->config_path;
    if (!v || v->type != H3J_OBJ)
        return h3_err(H3_E_FORMAT, "%s: no \"vision_config\" object: this text encoder has no vision tower, so it "
                      "cannot encode keyframes", p);
    c->text_hidden = tc.hidden;
    /* Defaults are Qwen3VLVisionConfig's and Qwen3VLConfig's. */
    if ((rc = cfg_int(d, v, p, "depth", 27, 1, 4096, &c->depth)) ||
        (rc = cfg_int(d, v, p, "hidden_size", 1152, 1, 1 << 16, &c->hidden)) ||
        (rc = cfg_int(d, v, p, "num_heads", 16, 1, 4096, &c->heads)) ||
        (rc = cfg_int(d, v, p, "intermediate_size", 4304, 1, 1 << 18, &c->inter)) ||
        (rc = cfg_int(d, v, p, "in_channels", 3, 3, 3, &c->in_ch)) ||
        (rc = cfg_int(d, v, p, "patch_size", 16, 1, 1024, &c->patch)) ||
        (rc = cfg_int(d, v, p, "temporal_patch_size", 2, 1, 64, &c->temporal_patch)) ||
        (rc = cfg_int(d, v, p, "spatial_merge_size", 2, 1, 64, &c->merge)) ||
        (rc = cfg_int(d, v, p, "out_hidden_size", 3584, 1, 1 << 18, &c->out_hidden)) ||
        (rc = cfg_int(d, v, p, "num_position_embeddings", 2304, 1, 1 << 24, &c->num_pos)) ||
        (rc = cfg_int(d, root, p, "image_token_id", 151655, 0, 1 << 24, &c->image_token_id)) ||
        (rc = cfg_int(d, root, p, "video_token_id", 151656, 0, 1 << 24, &c->video_token_id)) ||
        (rc = cfg_int(d, root, p, "vision_start_token_id", 151652, 0, 1 << 24, &c->vision_start_id)) ||
        (rc = cfg_int(d, root, p, "vision_end_token_id", 151653, 0, 1 << 24, &c->vision_end_id)))
        return rc;
    static const int ds_default[3] = {8, 16, 24};
    memcpy(c->deepstack, ds_default, sizeof ds_default);
    c->n_deepstack = 3;
    if ((rc = cfg_list(d, v, p, "deepstack_visual_indexes", c->deepstack, H3_VISION_MAX_DEEPSTACK, &c->n_deepstack)))
        return rc;
    for (int i = 0; i < c->n_deepstack; i++) {
        if (c->deepstack[i] >= c->depth)
            return h3_err(H3_E_FORMAT, "%s: deepstack_visual_indexes[%d] = %d is not a block (depth %d)", p, i,
                          c->deepstack[i], c->depth);
        for (int j = 0; j < i; j++)
            if (c->deepstack[j] == c->deepstack[i])
                return h3_err(H3_E_FORMAT, "%s: deepstack_visual_indexes lists block %d twice", p, c->deepstack[i]);
    }
    const h3j *act = h3j_get(d, v, "hidden_act");
    if (act && (act->type != H3J_STR || strcmp(h3j_str(d, act), "gelu_pytorch_tanh") != 0))
        return h3_err(H3_E_UNSUPPORTED, "%s: vision hidden_act '%s' is not supported (Qwen3-VL uses "
                      "\"gelu_pytorch_tanh\")", p, act->type == H3J_STR ? h3j_str(d, act) : "?");
    c->rope_theta = 10000.0;
    const h3j *vr = h3j_get(d, v, "rope_parameters");
    if (vr && vr->type == H3J_OBJ) {
        const h3j *rt = h3j_get(d, vr, "rope_type");
        if (rt && (rt->type != H3J_STR || strcmp(h3j_str(d, rt), "axial") != 0))
            return h3_err(H3_E_UNSUPPORTED, "%s: vision rope_type '%s' is not supported (only \"axial\")", p,
                          rt->type == H3J_STR ? h3j_str(d, rt) : "?");
        h3_cfg_num(d, vr, &c->rope_theta, "rope_theta", (const char *)NULL);
    }
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return h3_err(H3_E_FORMAT, "%s: vision rope_theta must be a positive number", p);
    /* The language side's multimodal rotary layout (Qwen3VLTextRotaryEmbedding's default [24, 20, 20]). */
    c->mrope_section[0] = 24, c->mrope_section[1] = 20, c->mrope_section[2] = 20;
    const h3j *t = h3j_get(d, root, "text_config");
    const h3j *tr = t ? h3j_get(d, t, "rope_parameters") : NULL;
    if (tr && tr->type == H3J_OBJ) {
        int n = 3, sec[3] = {24, 20, 20};
        if ((rc = cfg_list(d, tr, p, "mrope_section", sec, 3, &n))) return rc;
        if (n != 3) return h3_err(H3_E_FORMAT, "%s: mrope_section must hold 3 integers", p);
        memcpy(c->mrope_section, sec, sizeof sec);
    }
    if (c->hidden % c->heads)
        return h3_err(H3_E_FORMAT, "%s: vision hidden_size %d is not a multiple of num_heads %d", p, c->hidden, c->heads);
    c->head_dim = c->hidden / c->heads;
    /* The axial RoPE concatenates head_dim/4 h frequencies, head_dim/4 w frequencies and the same
       again: transformers can only apply it when head_dim is a multiple of 4. */
    if (c->head_dim % 4 || c->head_dim > 4096)
        return h3_err(H3_E_FORMAT, "%s: vision head dim %d is not a multiple of 4 up to 4096", p, c->head_dim);
    c->pos_side = (int)lround(sqrt((double)c->num_pos));
    if (c->pos_side * c->pos_side != c->num_pos)
        return h3_err(H3_E_FORMAT, "%s: num_position_embeddings %d is not a square", p, c->num_pos);
    if (c->out_hidden != tc.hidden)
        return h3_err(H3_E_FORMAT, "%s: vision out_hidden_size %d differs from the language hidden size %d", p,
                      c->out_hidden, tc.hidden);
    return 0;
}

/* ---- weights ------------------------------------------------------------------------------- */

typedef struct { h3_bw w; float *b; } vt_lin;   /* b: backend f32, or NULL */
typedef struct { float *w, *b; } vt_ln;         /* backend f32 */
typedef struct { vt_ln n1, n2; vt_lin qkv, proj, fc1, fc2; } vt_block;
typedef struct { vt_ln norm; vt_lin fc1, fc2; } vt_merger;

typedef struct {
    h3_vision_cfg c;
    h3_backend *be;
    h3_store *store;
    vt_lin patch;
    float *pos;                /* host f32 [num_pos][hidden] */
    vt_block *blocks;
    vt_merger merger, ds[H3_VISION_MAX_DEEPSTACK];
    float *stage;              /* host scratch for widening vectors */
} vt_model;

/* A float vector of `n` values, widened to f32 on the host and uploaded. */
static int load_vec(vt_model *v, const char *name, int64_t n, float **out)
{
    h3_dtype dt;
    const void *src = h3_store_get_float(v->store, name, 1, &n, &dt);
    if (!src) return -H3_E_SCHEMA;
    h3_to_f32(src, dt, v->stage, n);
    if (!(*out = h3_backend_dup(v->be, v->stage, sizeof(float) * (size_t)n)))
        return h3_err(H3_E_NOMEM, "vision tower: cannot hold '%s'", name);
    return 0;
}

static int load_lin(vt_model *v, const char *base, int64_t rows, int64_t cols, vt_lin *l)
{
    char name[192];
    int64_t shape[2] = {rows, cols};
    h3_dtype dt;
    snprintf(name, sizeof name, VT_PREFIX "%s.weight", base);
    const void *w = h3_store_get_float(v->store, name, 2, shape, &dt);
    if (!w) return -H3_E_SCHEMA;
    int rc = v->be->weights->weight_load(v->be, w, dt, rows, cols, &l->w);
    if (rc) return rc;
    snprintf(name, sizeof name, VT_PREFIX "%s.bias", base);
    return load_vec(v, name, rows, &l->b);
}

static int load_ln(vt_model *v, const char *base, int64_t n, vt_ln *l)
{
    char name[192];
    snprintf(name, sizeof name, VT_PREFIX "%s.weight", base);
    int rc = load_vec(v, name, n, &l->w);
    if (rc) return rc;
    snprintf(name, sizeof name, VT_PREFIX "%s.bias", base);
    return load_vec(v, name, n, &l->b);
}

static void free_lin(vt_model *v, vt_lin *l)
{
    if (l->w.data || l->w.priv) v->be->weights->weight_free(v->be, &l->w);
    v->be->mem->release(v->be, l->b);
    memset(l, 0, sizeof *l);
}

static void free_ln(vt_model *v, vt_ln *l)
{
    v->be->mem->release(v->be, l->w);
    v->be->mem->release(v->be, l->b);
    memset(l, 0, sizeof *l);
}

static void free_merger(vt_model *v, vt_merger *g)
{
    free_ln(v, &g->norm);
    free_lin(v, &g->fc1);
    free_lin(v, &g->fc2);
}

static void vt_free(vt_model *v)
{
    if (!v->be) return;
    free_lin(v, &v->patch);
    if (v->blocks)
        for (int i = 0; i < v->c.depth; i++) {
            vt_block *b = &v->blocks[i];
            free_ln(v, &b->n1), free_ln(v, &b->n2);
            free_lin(v, &b->qkv), free_lin(v, &b->proj), free_lin(v, &b->fc1), free_lin(v, &b->fc2);
        }
    free_merger(v, &v->merger);
    for (int i = 0; i < v->c.n_deepstack; i++) free_merger(v, &v->ds[i]);
    free(v->blocks);
    free(v->pos);
    free(v->stage);
    /* The shards were mapped for this pass only (the language model streams its layers with pread). */
    if (v->store) h3_store_release(v->store);
    memset(v, 0, sizeof *v);
}

static int load_merger(vt_model *v, const char *base, bool postshuffle, vt_merger *g)
{
    const int64_t C = v->c.hidden, M = C * v->c.merge * v->c.merge;
    char name[128];
    int rc;
    snprintf(name, sizeof name, "%s.norm", base);
    if ((rc = load_ln(v, name, postshuffle ? M : C, &g->norm))) return rc;
    snprintf(name, sizeof name, "%s.linear_fc1", base);
    if ((rc = load_lin(v, name, M, M, &g->fc1))) return rc;
    snprintf(name, sizeof name, "%s.linear_fc2", base);
    return load_lin(v, name, v->c.out_hidden, M, &g->fc2);
}

/* Every tensor of the tower, shapes checked against the config before any compute. */
static int vt_load(h3_model *m, h3_backend *be, vt_model *v)
{
    memset(v, 0, sizeof *v);
    int rc;
    if ((rc = h3_vision_cfg_load(m, &v->c)) || (rc = h3_model_headers(m, H3_COMP_TEXT_ENCODER))) return rc;
    v->be = be;
    v->store = &m->comp[H3_COMP_TEXT_ENCODER].store;
    const h3_vision_cfg *c = &v->c;
    const int64_t C = c->hidden, M = C * c->merge * c->merge;
    int64_t big = M > c->inter ? M : c->inter;
    if (3 * C > big) big = 3 * C;
    if (c->out_hidden > big) big = c->out_hidden;
    v->stage = h3_malloc(sizeof(float) * (size_t)big);
    v->pos = h3_malloc(sizeof(float) * (size_t)c->num_pos * (size_t)C);
    v->blocks = h3_calloc((size_t)c->depth, sizeof *v->blocks);
    if (!v->stage || !v->pos || !v->blocks) {
        vt_free(v);
        return -H3_E_NOMEM;
    }
    /* patch_embed.proj: a Conv3d [C, in, T, P, P] whose flattened rows match the processor's
       [channel][time][py][px] patch vectors. */
    const int64_t pd = (int64_t)c->in_ch * c->temporal_patch * c->patch * c->patch;
    const int64_t pshape[5] = {C, c->in_ch, c->temporal_patch, c->patch, c->patch};
    const int64_t posshape[2] = {c->num_pos, C};
    h3_dtype dt;
    const void *pw = h3_store_get_float(v->store, VT_PREFIX "patch_embed.proj.weight", 5, pshape, &dt);
    if (!pw || (rc = be->weights->weight_load(be, pw, dt, C, pd, &v->patch.w)) ||
        (rc = load_vec(v, VT_PREFIX "patch_embed.proj.bias", C, &v->patch.b)))
        goto fail;
    const void *pe = h3_store_get_float(v->store, VT_PREFIX "pos_embed.weight", 2, posshape, &dt);
    if (!pe) goto fail;
    h3_to_f32(pe, dt, v->pos, (int64_t)c->num_pos * C);
    for (int i = 0; i < c->depth && !rc; i++) {
        char base[96], name[128];
        vt_block *b = &v->blocks[i];
        snprintf(base, sizeof base, "blocks.%d", i);
        snprintf(name, sizeof name, "%s.norm1", base);
        if ((rc = load_ln(v, name, C, &b->n1))) break;
        snprintf(name, sizeof name, "%s.norm2", base);
        if ((rc = load_ln(v, name, C, &b->n2))) break;
        snprintf(name, sizeof name, "%s.attn.qkv", base);
        if ((rc = load_lin(v, name, 3 * C, C, &b->qkv))) break;
        snprintf(name, sizeof name, "%s.attn.proj", base);
        if ((rc = load_lin(v, name, C, C, &b->proj))) break;
        snprintf(name, sizeof name, "%s.mlp.linear_fc1", base);
        if ((rc = load_lin(v, name, c->inter, C, &b->fc1))) break;
        snprintf(name, sizeof name, "%s.mlp.linear_fc2", base);
        rc = load_lin(v, name, C, c->inter, &b->fc2);
    }
    if (rc || (rc = load_merger(v, "merger", false, &v->merger))) goto fail;
    for (int i = 0; i < c->n_deepstack; i++) {
        char base[64];
        snprintf(base, sizeof base, "deepstack_merger_list.%d", i);
        if ((rc = load_merger(v, base, true, &v->ds[i]))) goto fail;
    }
    return 0;
fail:
    if (!rc) rc = -H3_E_SCHEMA;
    vt_free(v);
    return rc;
}

/* ---- forward ------------------------------------------------------------------------------- */

static h3_bt f32v(float *p, int64_t rows, int64_t cols, int64_t ld) { return h3_bt_make(p, H3_DT_F32, rows, cols, ld); }

/* (row, col) of token k of a gh x gw grid in merge-block order. */
static void token_rc(int k, int gw, int merge, int *row, int *col)
{
    const int mm = merge * merge, bw = gw / merge;
    const int blk = k / mm, in = k % mm;
    *row = (blk / bw) * merge + in / merge;
    *col = (blk % bw) * merge + in % merge;
}

/* transformers' bilinear taps of one axis, corners aligned, in f32 as it forms them. */
static void axis_taps(int idx, int size, int side, int tap[2], float w[2])
{
    const float src = (float)idx * (float)(side - 1) / (float)(size - 1 > 1 ? size - 1 : 1);
    const float fl = floorf(src);
    for (int o = 0; o < 2; o++) {
        int t = (int)fl + o;
        tap[o] = t < 0 ? 0 : t > side - 1 ? side - 1 : t;
        const float dist = fabsf(src - fl - (float)o);
        const float wv = 1.0f - dist;
        w[o] = wv > 0 ? wv : 0.0f;
    }
}

/* Host tables of one image: the resampled position embeddings [N][C] and the rotary cos/sin
   [N][head_dim/2] (slots [0, hd/4) rotate by the row, [hd/4, hd/2) by the column). */
static void image_tables(const vt_model *v, int gh, int gw, float *pos, float *cs, float *sn)
{
    const h3_vision_cfg *c = &v->c;
    const int N = gh * gw, C = c->hidden, half = c->head_dim / 2, q = c->head_dim / 4, S = c->pos_side;
    float inv[1024];
    for (int j = 0; j < q && j < 1024; j++)
        inv[j] = 1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)half);
    for (int k = 0; k < N; k++) {
        int r, col, th[2], tw[2];
        float wh[2], ww[2];
        token_rc(k, gw, c->merge, &r, &col);
        axis_taps(r, gh, S, th, wh);
        axis_taps(col, gw, S, tw, ww);
        float *o = pos + (size_t)k * C;
        for (int i = 0; i < C; i++) o[i] = 0.0f;
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                const float wt = wh[a] * ww[b];
                const float *e = v->pos + ((size_t)th[a] * S + tw[b]) * C;
                for (int i = 0; i < C; i++) o[i] += e[i] * wt;
            }
        for (int j = 0; j < half; j++) {
            const float ang = j < q ? (float)r * inv[j] : (float)col * inv[j - q];
            cs[(size_t)k * half + j] = (float)cos((double)ang);
            sn[(size_t)k * half + j] = (float)sin((double)ang);
        }
    }
}

/* Backend buffers of one image of N tokens. */
typedef struct {
    float *px, *x, *xn, *qkv, *att, *mlp, *mg, *mh, *mo, *pos, *cs, *sn;
    void *block;
} vt_act;

static float *carve(float **cur, int64_t n)
{
    float *p = *cur;
    *cur += (n + 15) / 16 * 16;
    return p;
}

static int act_alloc(const vt_model *v, int64_t N, vt_act *a)
{
    memset(a, 0, sizeof *a);
    const h3_vision_cfg *c = &v->c;
    const int64_t C = c->hidden, pd = (int64_t)c->in_ch * c->temporal_patch * c->patch * c->patch;
    const int64_t Nm = N / (c->merge * c->merge), M = C * c->merge * c->merge, half = c->head_dim / 2;
    const int64_t sizes[12] = {N * pd, N * C, N * C, N * 3 * C, N * C, N * c->inter, Nm * M, Nm * M,
                               Nm * c->out_hidden, N * C, N * half, N * half};
    int64_t total = 0;
    for (int i = 0; i < 12; i++) total += (sizes[i] + 15) / 16 * 16;
    float *cur = a->block = v->be->mem->alloc(v->be, sizeof(float) * (size_t)total);
    if (!cur)
        return h3_err(H3_E_NOMEM, "vision tower: cannot allocate %lld MiB of activations for %lld patches",
                      (long long)(total * 4 >> 20), (long long)N);
    float **slots[12] = {&a->px, &a->x, &a->xn, &a->qkv, &a->att, &a->mlp, &a->mg, &a->mh, &a->mo, &a->pos, &a->cs,
                         &a->sn};
    for (int i = 0; i < 12; i++) *slots[i] = carve(&cur, sizes[i]);
    return 0;
}

/* A merger: LN (over C before the merge, or over merge^2 C after it), fc1, exact GELU, fc2.
   Rows of x are N tokens of C; the merged view takes merge^2 consecutive rows as one. */
static int merger_run(const vt_model *v, const vt_merger *g, bool postshuffle, vt_act *a, const float *x, int64_t N,
                      float *dst_host)
{
    const h3_backend_ops *o = v->be->ops;
    const h3_vision_cfg *c = &v->c;
    const int64_t C = c->hidden, mm = c->merge * c->merge, Nm = N / mm, M = C * mm;
    const float eps = 1e-6f;
    int rc;
    const h3_bt mg = f32v(a->mg, Nm, M, M), mh = f32v(a->mh, Nm, M, M), mo = f32v(a->mo, Nm, c->out_hidden, c->out_hidden);
    if (postshuffle) {
        const h3_bt xm = f32v((float *)x, Nm, M, M);
        rc = o->layernorm(v->be, &xm, g->norm.w, g->norm.b, eps, &mg);
    } else {
        const h3_bt xt = f32v((float *)x, N, C, C), mt = f32v(a->mg, N, C, C);
        rc = o->layernorm(v->be, &xt, g->norm.w, g->norm.b, eps, &mt);
    }
    if (rc || (rc = o->linear(v->be, &mg, &g->fc1.w, g->fc1.b, &mh)) || (rc = o->gelu(v->be, &mh, false, &mh)) ||
        (rc = o->linear(v->be, &mh, &g->fc2.w, g->fc2.b, &mo)))
        return rc;
    return v->be->mem->download(v->be, dst_host, a->mo, sizeof(float) * (size_t)(Nm * c->out_hidden));
}

static int block_run(const vt_model *v, const vt_block *b, vt_act *a, int64_t N)
{
    const h3_backend_ops *o = v->be->ops;
    const h3_vision_cfg *c = &v->c;
    const int64_t C = c->hidden;
    const int H = c->heads, D = c->head_dim;
    const float eps = 1e-6f;
    const h3_bt x = f32v(a->x, N, C, C), xn = f32v(a->xn, N, C, C), qkv = f32v(a->qkv, N, 3 * C, 3 * C);
    const h3_bt q = f32v(a->qkv, N, C, 3 * C), k = f32v(a->qkv + C, N, C, 3 * C), vv = f32v(a->qkv + 2 * C, N, C, 3 * C);
    const h3_bt att = f32v(a->att, N, C, C), mlp = f32v(a->mlp, N, c->inter, c->inter);
    int rc;
    if ((rc = o->layernorm(v->be, &x, b->n1.w, b->n1.b, eps, &xn)) ||
        (rc = o->linear(v->be, &xn, &b->qkv.w, b->qkv.b, &qkv)) ||
        (rc = o->rope(v->be, &q, H, D, D / 2, a->cs, a->sn)) || (rc = o->rope(v->be, &k, H, D, D / 2, a->cs, a->sn)) ||
        (rc = o->attention(v->be, &q, &k, &vv, H, H, D, (float)(1.0 / sqrt((double)D)), false, &att)) ||
        (rc = o->linear(v->be, &att, &b->proj.w, b->proj.b, &xn)) || (rc = o->gated_add(v->be, &x, &xn, NULL)))
        return rc;
    if ((rc = o->layernorm(v->be, &x, b->n2.w, b->n2.b, eps, &xn)) ||
        (rc = o->linear(v->be, &xn, &b->fc1.w, b->fc1.b, &mlp)) || (rc = o->gelu(v->be, &mlp, true, &mlp)) ||
        (rc = o->linear(v->be, &mlp, &b->fc2.w, b->fc2.b, &xn)) || (rc = o->gated_add(v->be, &x, &xn, NULL)))
        return rc;
    return 0;
}

/* The ops this tower needs beyond the text encoder's, named when a backend lacks one. */
static int check_ops(h3_backend *be)
{
    static const h3_op need[] = {H3_OP_layernorm, H3_OP_gelu, H3_OP_rope};
    return h3_backend_need(be, need, (int)(sizeof need / sizeof *need), "the vision tower");
}

/* One image through a loaded tower. progress: blocks done so far (`done0` before this image). */
static int vt_image(const vt_model *v, const float *pixels, int gh, int gw, float *embeds, float *deepstack,
                    h3_progress_fn progress, void *user, int done0, int total)
{
    const h3_vision_cfg *c = &v->c;
    const h3_backend_ops *o = v->be->ops;
    if (gh < 1 || gw < 1 || gh % c->merge || gw % c->merge)
        return h3_err(H3_E_INVALID, "vision tower: grid %dx%d is not a multiple of the merge size %d", gh, gw,
                      c->merge);
    const int64_t N = (int64_t)gh * gw, C = c->hidden, Nm = N / (c->merge * c->merge);
    const int64_t pd = (int64_t)c->in_ch * c->temporal_patch * c->patch * c->patch, half = c->head_dim / 2;
    vt_act a;
    float *host = h3_malloc(sizeof(float) * (size_t)(N * (C + 2 * half)));
    int rc = host ? act_alloc(v, N, &a) : -H3_E_NOMEM;
    if (rc) {
        free(host);
        return rc;
    }
    float *pos = host, *cs = host + N * C, *sn = cs + N * half;
    image_tables(v, gh, gw, pos, cs, sn);
    const h3_bt px = f32v(a.px, N, pd, pd), x = f32v(a.x, N, C, C), pv = f32v(a.pos, N, C, C);
    if ((rc = v->be->mem->upload(v->be, a.px, pixels, sizeof(float) * (size_t)(N * pd))) ||
        (rc = v->be->mem->upload(v->be, a.pos, pos, sizeof(float) * (size_t)(N * C))) ||
        (rc = v->be->mem->upload(v->be, a.cs, cs, sizeof(float) * (size_t)(N * half))) ||
        (rc = v->be->mem->upload(v->be, a.sn, sn, sizeof(float) * (size_t)(N * half))) ||
        (rc = o->linear(v->be, &px, &v->patch.w, v->patch.b, &x)) || (rc = o->gated_add(v->be, &x, &pv, NULL)))
        goto done;
    int ds_done = 0;
    for (int i = 0; i < c->depth && !rc; i++) {
        if ((rc = block_run(v, &v->blocks[i], &a, N))) break;
        for (int k = 0; k < c->n_deepstack; k++)
            if (c->deepstack[k] == i && deepstack) {
                rc = merger_run(v, &v->ds[k], true, &a, a.x, N, deepstack + (size_t)ds_done * Nm * c->out_hidden);
                ds_done++;
            }
        if (!rc) rc = h3_progress_check(progress, user, "vision_encoder", done0 + i + 1, total);
    }
    if (!rc) rc = merger_run(v, &v->merger, false, &a, a.x, N, embeds);
done:
    v->be->mem->release(v->be, a.block);
    free(host);
    return rc;
}

/* ---- the FL2VA presentation ------------------------------------------------------------------ */

typedef struct {
    int32_t *ids;
    uint8_t *tags;
    int n, cap;
} id_buf;

static int buf_reserve(id_buf *b, int64_t more)
{
    if ((int64_t)b->n + more > H3_TEXT_MAX_TOKENS)
        return h3_err(H3_E_INVALID, "text encoder: the presentation exceeds %d tokens", H3_TEXT_MAX_TOKENS);
    if (b->n + more <= b->cap) return 0;
    int cap = b->cap ? b->cap : 64;
    while (cap < b->n + more) cap *= 2;
    int32_t *ids = h3_realloc(b->ids, sizeof *ids * (size_t)cap);
    if (!ids) return -H3_E_NOMEM;
    b->ids = ids;
    uint8_t *tags = h3_realloc(b->tags, (size_t)cap);
    if (!tags) return -H3_E_NOMEM;
    b->tags = tags;
    b->cap = cap;
    return 0;
}

/* Append the tokens of `text` (as tokenizer(text, add_special_tokens=False)), tagged `tag`. */
static int buf_text(id_buf *b, h3_tokenizer *tok, const char *text, uint8_t tag)
{
    const size_t len = strlen(text);
    int64_t want = (int64_t)len + 16;
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = buf_reserve(b, want);
        if (rc) return rc;
        int64_t got = h3_tokenize(tok, text, len, b->ids + b->n, b->cap - b->n);
        if (got < 0) return (int)got;
        if (got <= b->cap - b->n) {
            memset(b->tags + b->n, tag, (size_t)got);
            b->n += (int)got;
            return 0;
        }
        want = got;
    }
    return h3_err(H3_E_INVALID, "text encoder: token count changed between calls");
}

static int buf_token(id_buf *b, int32_t id, int64_t count, uint8_t tag)
{
    int rc = buf_reserve(b, count);
    if (rc) return rc;
    for (int64_t i = 0; i < count; i++) {
        b->ids[b->n] = id;
        b->tags[b->n++] = tag;
    }
    return 0;
}

void h3_vl_prompt_free(h3_vl_prompt *p)
{
    free(p->ids);
    free(p->tags);
    free(p->start);
    free(p->grid_h);
    free(p->grid_w);
    free(p->item);
    free(p->sampled);
    free(p->frame);
    memset(p, 0, sizeof *p);
}

/* A vision token of the tokenizer, which must be the id the model's config names (transformers
   finds the placeholders by the config's id, diffusers writes the tokenizer's). */
static int vision_token(h3_tokenizer *tok, const char *name, int want, const char *key, int32_t *out)
{
    const int32_t id = h3_token_id(tok, name);
    if (id < 0) return h3_err(H3_E_FORMAT, "tokenizer: no %s token, needed to present keyframes", name);
    if (id != want)
        return h3_err(H3_E_FORMAT, "tokenizer: %s is id %d but the text encoder's config says %s = %d", name, (int)id,
                      key, want);
    *out = id;
    return 0;
}

int h3_vl_prompt_build(h3_model *m, h3_tokenizer *tok, const char *prompt, int n_images, const int *widths,
                       const int *heights, h3_vl_prompt *out)
{
    return h3_vl_prompt_build_refs(m, tok, prompt, n_images, widths, heights, NULL, NULL, out);
}

/* Audio labels are text segments of their own, tokenized apart from their neighbours as diffusers
   emits them (a concatenated string could merge tokens across the boundary). */
static int audio_labels(id_buf *b, h3_tokenizer *tok, int n, int *counter)
{
    int rc = 0;
    for (int j = 0; j < n && !rc; j++) {
        char label[32];
        snprintf(label, sizeof label, "<Audio %d>: ", ++*counter);
        rc = buf_text(b, tok, label, H3_TAG_TEXT);
    }
    return rc;
}

int h3_vl_video_sample(int frames, int *indices, int cap)
{
    /* diffusers' _sample_video_condition_frames: a cursor stepping fps / sample_fps frames, each
       round(cursor) (half-to-even) kept once. */
    const double stride = (double)H3_FPS / H3_VL_VIDEO_SAMPLE_FPS;
    int n = 0;
    for (double cursor = 0.0; nearbyint(cursor) < frames; cursor += stride) {
        const int at = (int)nearbyint(cursor);
        if (n && at <= indices[n - 1]) continue;
        if (n == cap) return h3_err(H3_E_INVALID, "video reference: more than %d sampled frames", cap);
        indices[n++] = at;
    }
    return n;
}

/* Grow the per-span arrays to hold one more span (tp frame slots each). */
static int span_reserve(h3_vl_prompt *p, int *cap, int tp)
{
    if (p->n_spans < *cap) return 0;
    const int c = *cap ? 2 * *cap : 16;
    int *st = h3_realloc(p->start, sizeof(int) * (size_t)c);
    if (st) p->start = st;
    int *gh = st ? h3_realloc(p->grid_h, sizeof(int) * (size_t)c) : NULL;
    if (gh) p->grid_h = gh;
    int *gw = gh ? h3_realloc(p->grid_w, sizeof(int) * (size_t)c) : NULL;
    if (gw) p->grid_w = gw;
    int *it = gw ? h3_realloc(p->item, sizeof(int) * (size_t)c) : NULL;
    if (it) p->item = it;
    int *sa = it ? h3_realloc(p->sampled, sizeof(int) * (size_t)c) : NULL;
    if (sa) p->sampled = sa;
    int *fr = sa ? h3_realloc(p->frame, sizeof(int) * (size_t)c * (size_t)tp) : NULL;
    if (!fr) return -H3_E_NOMEM;
    p->frame = fr;
    *cap = c;
    return 0;
}

/* A new vision span: its label as text, then <|vision_start|> (a video row); the span's rows start after
   them, on grid (t, h, w) of request item `item` with `sampled` frames read from it (0: an image). */
static int span_open(h3_vl_prompt *p, int *cap, int tp, id_buf *b, h3_tokenizer *tok, const char *label, int32_t vs,
                     const int *grid, int item, int sampled, int *span)
{
    int rc;
    if ((rc = span_reserve(p, cap, tp)) || (rc = buf_text(b, tok, label, H3_TAG_TEXT)) ||
        (rc = buf_token(b, vs, 1, H3_TAG_VIDEO)))
        return rc;
    const int s = p->n_spans++;
    p->start[s] = b->n;
    p->grid_h[s] = grid[1];
    p->grid_w[s] = grid[2];
    p->item[s] = item;
    p->sampled[s] = sampled;
    *span = s;
    return 0;
}

int h3_vl_prompt_build_refs(h3_model *m, h3_tokenizer *tok, const char *prompt, int n_images, const int *widths,
                            const int *heights, const int *frames, const int *audio_before, h3_vl_prompt *out)
{
    memset(out, 0, sizeof *out);
    if (!tok || !prompt) return h3_err(H3_E_INVALID, "text encoder: NULL tokenizer or prompt");
    if (n_images < 0 || n_images > H3_VL_MAX_IMAGES)
        return h3_err(H3_E_INVALID, "text encoder: %d keyframes (0 to %d)", n_images, H3_VL_MAX_IMAGES);
    if (n_images && (!widths || !heights)) return h3_err(H3_E_INVALID, "text encoder: NULL image sizes");
    int rc = 0, cap = 0;
    int32_t vs = 0, pad = 0, vpad = 0, ve = 0;
    int n_audio = 0, n_pic = 0, n_vid = 0; /* labels are numbered per modality over the whole presentation */
    bool videos = false;
    for (int i = 0; frames && i < n_images; i++) videos |= frames[i] > 0;
    id_buf b = {0};
    if (n_images) {
        if ((rc = h3_vision_cfg_load(m, &out->vc)) || (rc = h3_image_proc_cfg_load(m, &out->pc)) ||
            (videos && (rc = h3_video_proc_cfg_load(m, &out->vpc))))
            return rc;
        const h3_vision_cfg *c = &out->vc;
        for (int k = 0; k < (videos ? 2 : 1); k++) {
            const h3_image_proc_cfg *pc = k ? &out->vpc : &out->pc;
            if (pc->patch_size != c->patch || pc->temporal_patch_size != c->temporal_patch ||
                pc->merge_size != c->merge)
                return h3_err(H3_E_FORMAT, "%s: patch %d, temporal patch %d, merge %d do not match the vision tower's "
                              "%d, %d, %d", pc->source[0] ? pc->source : k ? "video processor defaults" :
                              "image processor defaults", pc->patch_size, pc->temporal_patch_size, pc->merge_size,
                              c->patch, c->temporal_patch, c->merge);
        }
        if ((rc = vision_token(tok, "<|vision_start|>", c->vision_start_id, "vision_start_token_id", &vs)) ||
            (rc = vision_token(tok, "<|image_pad|>", c->image_token_id, "image_token_id", &pad)) ||
            (videos && (rc = vision_token(tok, "<|video_pad|>", c->video_token_id, "video_token_id", &vpad))) ||
            (rc = vision_token(tok, "<|vision_end|>", c->vision_end_id, "vision_end_token_id", &ve)))
            return rc;
    }
    out->n_images = n_images;
    const int tp = out->vc.temporal_patch, mm = out->vc.merge * out->vc.merge;
    for (int i = 0; i < n_images && !rc; i++) {
        int grid[3];
        char label[48];
        const bool video = frames && frames[i] > 0;
        if (audio_before && (rc = audio_labels(&b, tok, audio_before[i], &n_audio))) break;
        if (!video) {
            if ((rc = h3_image_grid(&out->pc, widths[i], heights[i], grid, NULL))) {
                h3_err_prefix("keyframe %d", i + 1);
                break;
            }
            const int64_t tokens = (int64_t)grid[1] * grid[2] / mm;
            /* diffusers: the label as text, then <|vision_start|>, the pads, <|vision_end|> as video rows */
            snprintf(label, sizeof label, "<Picture %d>: ", ++n_pic);
            int s;
            if ((rc = span_open(out, &cap, tp, &b, tok, label, vs, grid, i, 0, &s))) break;
            if ((rc = buf_token(&b, pad, tokens, H3_TAG_VIDEO)) || (rc = buf_token(&b, ve, 1, H3_TAG_VIDEO))) break;
            out->tokens += (int)tokens;
            continue;
        }
        /* A video: "<Video k>: ", then per temporal block of the frames sampled at 2 fps its
           timestamp "<{mean:.1f} seconds>" and a vision block of video pads. */
        int idx[H3_VL_MAX_SAMPLED];
        const int ns = h3_vl_video_sample(frames[i], idx, H3_VL_MAX_SAMPLED);
        if (ns < 0) {
            rc = ns;
            break;
        }
        if (ns < tp) {
            const int need = (int)nearbyint((tp - 1) * ((double)H3_FPS / H3_VL_VIDEO_SAMPLE_FPS)) + 1;
            rc = h3_err(H3_E_INVALID, "video reference: %d frames at %d fps; the text encoder reads it at %g fps in "
                        "groups of %d, so it needs at least %d frames", frames[i], H3_FPS, H3_VL_VIDEO_SAMPLE_FPS, tp,
                        need);
            break;
        }
        if ((rc = h3_video_grid(&out->vpc, ns, widths[i], heights[i], grid, NULL))) break;
        const int64_t tokens = (int64_t)grid[1] * grid[2] / mm;
        snprintf(label, sizeof label, "<Video %d>: ", ++n_vid);
        if ((rc = buf_text(&b, tok, label, H3_TAG_TEXT))) break;
        for (int blk = 0; blk < grid[0] && !rc; blk++) {
            /* timestamps j / sample_fps, the last repeated to fill the block; the block's is the mean
               of its first and last, printed as Python's "{:.1f}" (exact binary value, half-to-even) */
            const int j0 = blk * tp, j1 = j0 + tp - 1 < ns ? j0 + tp - 1 : ns - 1;
            const double ts = (j0 / H3_VL_VIDEO_SAMPLE_FPS + j1 / H3_VL_VIDEO_SAMPLE_FPS) / 2;
            snprintf(label, sizeof label, "<%.1f seconds>", ts);
            int s;
            if ((rc = span_open(out, &cap, tp, &b, tok, label, vs, grid, i, ns, &s))) break;
            for (int t = 0; t < tp; t++) out->frame[s * tp + t] = idx[j0 + t < ns ? j0 + t : ns - 1];
            if ((rc = buf_token(&b, vpad, tokens, H3_TAG_VIDEO)) || (rc = buf_token(&b, ve, 1, H3_TAG_VIDEO))) break;
            out->tokens += (int)tokens;
        }
    }
    if (!rc && audio_before) rc = audio_labels(&b, tok, audio_before[n_images], &n_audio);
    if (!rc && (rc = buf_text(&b, tok, prompt, H3_TAG_TEXT))) h3_err_prefix("prompt");
    if (!rc && b.n == 0)
        rc = h3_err(H3_E_INVALID, "text encoder: empty prompt and no keyframes: nothing to encode");
    out->ids = b.ids;
    out->tags = b.tags;
    out->n = b.n;
    if (rc) h3_vl_prompt_free(out);
    return rc;
}

/* ---- the whole conditioner ------------------------------------------------------------------ */

int h3_vl_encode(h3_model *m, h3_backend *be, const h3_vl_prompt *p, const uint8_t *const *rgb, const int *widths,
                 const int *heights, float *out, h3_text_run *run)
{
    if (!p || !out || !be) return h3_err(H3_E_INVALID, "text encoder: NULL argument");
    if (p->n_images == 0) return h3_text_forward(m, be, p->ids, p->n, out, run);
    if (!rgb || !widths || !heights) return h3_err(H3_E_INVALID, "text encoder: NULL keyframes");
    int rc;
    for (int i = 0; i < p->n_images; i++) {
        char what[32];
        snprintf(what, sizeof what, "keyframe %d", i + 1);
        if ((rc = h3_image_check(rgb[i], widths[i], heights[i], what))) return rc;
    }
    if ((rc = check_ops(be))) return rc;
    const h3_vision_cfg *c = &p->vc;
    const int64_t H = c->out_hidden, T = p->tokens, nds = c->n_deepstack;
    const int mm = c->merge * c->merge;
    float *embeds = h3_malloc(sizeof(float) * (size_t)(T * H));
    float *ds = nds ? h3_malloc(sizeof(float) * (size_t)(nds * T * H)) : NULL;
    float *px = NULL, *ds1 = NULL;
    int *gh = h3_malloc(sizeof(int) * (size_t)(p->n_spans + 1)), *gw = h3_malloc(sizeof(int) * (size_t)(p->n_spans + 1));
    vt_model v;
    memset(&v, 0, sizeof v);
    if (!embeds || (nds && !ds) || !gh || !gw) {
        rc = -H3_E_NOMEM;
        goto done;
    }
    if ((rc = vt_load(m, be, &v))) goto done;
    h3_progress_fn progress = run ? run->progress : NULL;
    void *user = run ? run->progress_user : NULL;
    const int total = p->n_spans * c->depth, tp = c->temporal_patch;
    if ((rc = h3_progress_check(progress, user, "vision_encoder", 0, total))) goto done;
    int64_t off = 0;
    for (int s = 0; s < p->n_spans && !rc; s++) {
        const int i = p->item[s];
        int grid[3], pd;
        if (p->sampled[s])
            rc = h3_video_grid(&p->vpc, p->sampled[s], widths[i], heights[i], grid, &pd);
        else
            rc = h3_image_grid(&p->pc, widths[i], heights[i], grid, &pd);
        if (rc) break;
        if (grid[1] != p->grid_h[s] || grid[2] != p->grid_w[s]) {
            rc = h3_err(H3_E_INVALID, "keyframe %d: %dx%d is not the size the presentation was built for", i + 1,
                        widths[i], heights[i]);
            break;
        }
        const int64_t N = (int64_t)grid[1] * grid[2], Nm = N / mm;
        free(px);
        free(ds1);
        px = h3_malloc(sizeof(float) * (size_t)(N * pd));
        ds1 = nds ? h3_malloc(sizeof(float) * (size_t)(nds * Nm * H)) : NULL;
        if (!px || (nds && !ds1)) {
            rc = -H3_E_NOMEM;
            break;
        }
        if (p->sampled[s]) {
            /* one temporal block of a video: its frames out of rgb[i] = [frames][h][w][3] */
            const uint8_t *block[64];
            const size_t fsz = (size_t)widths[i] * (size_t)heights[i] * 3;
            for (int t = 0; t < tp && t < 64; t++) block[t] = rgb[i] + (size_t)p->frame[s * tp + t] * fsz;
            rc = h3_video_block_pixels(&p->vpc, p->sampled[s], block, widths[i], heights[i], px);
        } else {
            rc = h3_image_pixels(&p->pc, rgb[i], widths[i], heights[i], px);
        }
        if (rc || (rc = vt_image(&v, px, grid[1], grid[2], embeds + off * H, ds1, progress, user, s * c->depth, total))) {
            h3_err_prefix("%s %d", p->sampled[s] ? "video reference" : "keyframe", i + 1);
            break;
        }
        for (int64_t k = 0; k < nds; k++)
            memcpy(ds + (k * T + off) * H, ds1 + k * Nm * H, sizeof(float) * (size_t)(Nm * H));
        gh[s] = grid[1] / c->merge;
        gw[s] = grid[2] / c->merge;
        off += Nm;
    }
    vt_free(&v); /* the tower's buffers go before the language model's */
    free(px);
    free(ds1);
    px = ds1 = NULL;
    if (!rc) {
        h3_text_vision vis;
        memset(&vis, 0, sizeof vis);
        vis.n_spans = p->n_spans;
        vis.start = p->start;
        vis.grid_h = gh;
        vis.grid_w = gw;
        vis.embeds = embeds;
        vis.n_deepstack = (int)nds;
        vis.deepstack = ds;
        memcpy(vis.mrope_section, c->mrope_section, sizeof vis.mrope_section);
        rc = h3_text_forward_vl(m, be, p->ids, p->n, &vis, out, run);
    }
done:
    vt_free(&v);
    free(px);
    free(ds1);
    free(embeds);
    free(ds);
    free(gh);
    free(gw);
    return rc;
}
