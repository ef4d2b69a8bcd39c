/*
 * Video VAE decoder: a non-causal ViT over the latent voxels of a temporal window, run per spatial
 * tile and blended into the output as diffusers' AutoencoderKLMiniMaxH3 `_decode`/`_decode_clip`
 * do (see video_vae.h for the contract and the memory bound).
 *
 * Official tensor layout read here (video_vae/source/model.safetensors):
 *   post_quant_conv.{weight [C,C,1,1,1], bias}
 *   decoder.x_embedder.{weight [D,C], bias}          (diffusers decoder.proj_in)
 *   decoder.register_tokens [1,R,D]
 *   decoder.transformer_blocks.{i}.norm1.weight, norm2.weight, scale1, scale2   [D]
 *   decoder.transformer_blocks.{i}.attn.to_qkv.{weight [3D,D], bias}  rows per head: q k v
 *   decoder.transformer_blocks.{i}.attn.to_out.{weight [D,D], bias}
 *   decoder.transformer_blocks.{i}.ff.w1.{weight [2I,D], bias}       rows: [gate; up]
 *   decoder.transformer_blocks.{i}.ff.w2.{weight [D,I], bias}
 *   decoder.norm_out.{weight, bias}, decoder.proj_out.{weight [out*pt*ps*ps, D], bias}
 * encoder.*, quant_conv.* and decoder.mask_token are not used by decoding.
 *
 * Rounding follows torch's op order wherever it is cheap to do so (x*std then +mean, layer-scale
 * products before the residual add, the blend weights 1 - p/n and p/n): each is written as
 * separate statements so no compiler contracts them into an FMA that torch does not use.
 */
#include "models/video_vae.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PHASE "video_decode"

_Static_assert(H3_VVAE_RAW == H3_VIDEO_RAW && H3_VVAE_UNTILED == H3_VIDEO_UNTILED, "flag values differ");
#define ROWS_BLOCK 256 /* rows per FFN / proj_out block: bounds those buffers independently of L */

static const float k_pixel_mean[3] = {0.485f, 0.456f, 0.406f}; /* ImageNet, as the decode step */
static const float k_pixel_std[3] = {0.229f, 0.224f, 0.225f};

/* ---- plan ------------------------------------------------------------------------------- */

/* Python's (-a) % b for b > 0. */
static int neg_mod(int a, int b) { return ((-a) % b + b) % b; }

/*
 * diffusers `_split_tiles`: the fewest tiles of `tile` pixels covering `length` with overlaps of at
 * least `min_ov`, the slack spread round-robin over the overlaps in whole `ratio` steps.
 * Writes n starts and n-1 overlaps (arrays sized by the caller via split_count).
 */
static int split_count(int length, int tile, int min_ov)
{
    if (tile >= length) return 1;
    int n = (length + tile - 1) / tile;
    while ((int64_t)tile * n - (int64_t)min_ov * (n - 1) - length < 0) n++;
    return n;
}

static void split_tiles(int length, int tile, int min_ov, int ratio, int n, int *start, int *ov)
{
    start[0] = 0;
    if (n == 1) return;
    for (int i = 0; i < n - 1; i++) ov[i] = min_ov;
    int64_t remaining = (int64_t)tile * n - (int64_t)min_ov * (n - 1) - length;
    for (int64_t i = 0; i < remaining / ratio; i++) ov[i % (n - 1)] += ratio;
    for (int i = 0; i < n - 1; i++) start[i + 1] = start[i] + tile - ov[i];
}

/*
 * Per-tile buffers. The block's big activations overlay each other (7 L x D floats, not 8):
 *   X  [L, D]   residual stream
 *   S  [L, 3D]  qkv projection -> attention output -> norm2 output / norm_out output
 *   T  [L, 3D]  norm1 output -> Q | K | V -> to_out output -> w2 output
 * Each use starts after the previous one is dead (see decode_tile).
 */
typedef struct {
    float *lat, *lat2, *X, *S, *T, *H1, *A, *P, *rope, *tile, *above, *left, *carry;
} vv_bufs;

/* Carve the workspace (base != NULL) or just measure it. One layout serves both, so the size the
   API reports is exactly what a decode allocates. */
static size_t vv_layout(const h3_vvae_cfg *c, const h3_vvae_plan *p, vv_bufs *b, char *base)
{
    size_t off = 0;
    vv_bufs dummy;
    if (!b) b = &dummy;
#define TAKE(field, count)                                                                 \
    do {                                                                                   \
        size_t n_ = (size_t)(count) * sizeof(float);                                      \
        b->field = base && n_ ? (float *)(base + off) : NULL;                              \
        off += (n_ + 63) & ~(size_t)63;                                                    \
    } while (0)
    size_t D = (size_t)c->dec_heads * c->dec_head_dim, I = D * (size_t)c->dec_ffn_mult;
    size_t L = (size_t)p->tokens, G = (size_t)p->grid, RB = (size_t)p->rows_block, C = (size_t)c->latent_ch;
    size_t oc = (size_t)c->out_ch, pix = oc * p->pt * p->ps * p->ps;
    size_t K = (size_t)p->keep0 + p->keep1, th = (size_t)p->tile_h, tw = (size_t)p->tile_w;
    size_t nf = 64; /* rope tables: sized for the largest supported frequency count */
    TAKE(lat, G * C);
    TAKE(lat2, G * C);
    TAKE(X, L * D);
    TAKE(S, L * 3 * D);
    TAKE(T, L * 3 * D);
    TAKE(H1, RB * 2 * I);
    TAKE(A, RB * I);
    TAKE(P, RB * pix);
    TAKE(rope, 2 * nf * ((size_t)p->win + th / p->ps + tw / p->ps));
    TAKE(tile, K * oc * th * tw);
    TAKE(above, p->ny > 1 ? (size_t)(p->col_major ? 1 : p->nx) * K * oc * p->max_ovy * tw : 0);
    TAKE(left, p->nx > 1 ? (size_t)(p->col_major ? p->ny : 1) * K * oc * th * p->max_ovx : 0);
    TAKE(carry, p->windows > 1 && p->keep1 > 0 ? (size_t)p->keep1 * oc * p->height * p->width : 0);
#undef TAKE
    return off;
}

void h3_vvae_plan_free(h3_vvae_plan *p)
{
    free(p->y0);
    free(p->x0);
    free(p->ovy);
    free(p->ovx);
    p->y0 = p->x0 = p->ovy = p->ovx = NULL;
}

int h3_vvae_plan_make(const h3_vvae_cfg *c, int T, int h, int w, int tile_px, int overlap_px, unsigned flags,
                      h3_vvae_plan *p)
{
    memset(p, 0, sizeof *p);
    if (T < 1 || h < 1 || w < 1 || T > (1 << 20) || h > 4096 || w > 4096)
        return h3_err(H3_E_INVALID, "video decode: impossible latent shape T=%d h=%d w=%d", T, h, w);
    if (tile_px < 0 || overlap_px < 0)
        return h3_err(H3_E_INVALID, "video decode: negative tile size %d or overlap %d", tile_px, overlap_px);
    p->T = T, p->h = h, p->w = w;
    p->ps = c->spatial, p->pt = c->temporal;
    p->height = h * p->ps, p->width = w * p->ps;

    /* Temporal windows, as diffusers derives them from clip_length and token_drop. */
    int clip = c->clip_length, drop = c->token_drop, pt = p->pt;
    p->chunk = (clip + pt - 1) / pt;
    p->pre = neg_mod(clip, pt);
    if (drop >= p->chunk)
        return h3_err(H3_E_UNSUPPORTED, "video decode: vae_token_drop %d must be smaller than the %d-latent chunk",
                      drop, p->chunk);
    int tok_ov = neg_mod(drop, p->chunk);
    p->win = p->chunk + tok_ov;
    int ntok = T + drop;
    p->pad_tokens = neg_mod(ntok, p->chunk);
    p->windows = (ntok + p->pad_tokens) / p->chunk - (drop > 0);
    if (p->windows < 1)
        return h3_err(H3_E_INVALID, "video decode: %d latent frame%s cannot be decoded (at least %d needed)", T,
                      T == 1 ? "" : "s", drop > 0 ? p->chunk - drop + 1 : 1);
    p->keep0 = p->chunk * pt - p->pre;
    p->keep1 = drop > 0 ? p->win * pt - p->chunk * pt - p->pre : 0;
    if (p->keep1 < 0) p->keep1 = 0;
    int frame_ov = tok_ov * pt - p->pre > 0 ? tok_ov * pt - p->pre : 0;
    p->blend_t = p->keep1 < p->keep0 ? p->keep1 : p->keep0;
    if (frame_ov < p->blend_t) p->blend_t = frame_ov;
    int intra = clip % pt;
    for (int k = 0; k < p->pad_tokens; k++) p->pad_frames += intra && (T + k) % p->chunk == 0 ? intra : pt;
    int64_t frames = (int64_t)p->windows * p->keep0 + p->keep1 - p->pad_frames;
    if (frames < 1 || frames > (1 << 24))
        return h3_err(H3_E_INVALID, "video decode: %d latent frames give %lld frames", T, (long long)frames);
    p->frames = (int)frames;

    /* Spatial tiles, laid out in pixels as `_decode_clip` does. */
    int tile = tile_px ? tile_px : c->tile_size, ov = overlap_px ? overlap_px : c->tile_overlap;
    if (flags & H3_VVAE_UNTILED) {
        p->ny = p->nx = 1;
        p->tile_h = p->height, p->tile_w = p->width;
    } else {
        if (tile % p->ps || ov % p->ps || tile > (1 << 16))
            return h3_err(H3_E_INVALID, "video decode: tile size %d and overlap %d must be multiples of %d pixels",
                          tile, ov, p->ps);
        if (ov >= tile)
            return h3_err(H3_E_INVALID, "video decode: tile overlap %d must be smaller than the tile size %d", ov,
                          tile);
        p->ny = split_count(p->height, tile, ov);
        p->nx = split_count(p->width, tile, ov);
        p->tile_h = tile < p->height ? tile : p->height;
        p->tile_w = tile < p->width ? tile : p->width;
    }
    p->y0 = calloc((size_t)p->ny, sizeof(int));
    p->ovy = calloc((size_t)p->ny, sizeof(int));
    p->x0 = calloc((size_t)p->nx, sizeof(int));
    p->ovx = calloc((size_t)p->nx, sizeof(int));
    if (!p->y0 || !p->ovy || !p->x0 || !p->ovx) {
        h3_vvae_plan_free(p);
        return h3_err(H3_E_NOMEM, "video decode: out of memory planning %d x %d tiles", p->ny, p->nx);
    }
    split_tiles(p->height, p->tile_h, ov, p->ps, p->ny, p->y0, p->ovy);
    split_tiles(p->width, p->tile_w, ov, p->ps, p->nx, p->x0, p->ovx);
    for (int i = 0; i + 1 < p->ny; i++) p->max_ovy = p->ovy[i] > p->max_ovy ? p->ovy[i] : p->max_ovy;
    for (int i = 0; i + 1 < p->nx; i++) p->max_ovx = p->ovx[i] > p->max_ovx ? p->ovx[i] : p->max_ovx;
    if (p->max_ovy >= p->tile_h || p->max_ovx >= p->tile_w) {
        h3_vvae_plan_free(p);
        return h3_err(H3_E_INVALID, "video decode: %dx%d px tiles cannot cover %dx%d px with overlap %d",
                      p->tile_h, p->tile_w, p->height, p->width, ov);
    }
    /* Blending needs the bottom strip of every tile in the previous row (row-major order) or the
       right strip of every tile in the previous column (column-major): take the smaller. */
    int64_t strips_row = (int64_t)p->nx * p->max_ovy * p->tile_w + (int64_t)p->tile_h * p->max_ovx;
    int64_t strips_col = (int64_t)p->ny * p->max_ovx * p->tile_h + (int64_t)p->tile_w * p->max_ovy;
    p->col_major = strips_col < strips_row;
    int64_t grid = (int64_t)p->win * (p->tile_h / p->ps) * (p->tile_w / p->ps);
    if (grid > (1 << 26)) {
        h3_vvae_plan_free(p);
        return h3_err(H3_E_INVALID, "video decode: a %dx%d px tile of %d latent frames is %lld tokens, too many "
                      "for one attention (tile the decode)", p->tile_h, p->tile_w, p->win, (long long)grid);
    }
    p->grid = (int)grid;
    p->tokens = p->grid + c->dec_registers + 1;
    p->rows_block = p->tokens < ROWS_BLOCK ? p->tokens : ROWS_BLOCK;
    p->workspace_bytes = vv_layout(c, p, NULL, NULL);
    return 0;
}

/* ---- weights ---------------------------------------------------------------------------- */

typedef struct {
    h3_mat qkv, out, w1, w2;
    const float *qkv_b, *out_b, *w1_b, *w2_b, *norm1, *norm2, *scale1, *scale2;
} vv_layer;

typedef struct {
    h3_vvae_cfg cfg;
    int C, D, heads, dh, I, R, rd, nf, pix, nlayers;
    h3_mat pq, emb, proj;
    const float *pq_b, *emb_b, *reg, *nout_w, *nout_b, *proj_b;
    float inv_freq[64];
    vv_layer *layers;
    float *arena; /* f32 copies of every vector parameter */
    size_t arena_n, arena_cap;
    void **owned; /* aligned copies of matrices whose mapping is misaligned */
    int nowned;
    h3_store *store;
} vv_model;

static void vv_model_free(vv_model *M)
{
    for (int i = 0; i < M->nowned; i++) h3_free_aligned(M->owned[i]);
    free(M->owned);
    free(M->layers);
    h3_free_aligned(M->arena);
    if (M->store) h3_store_release(M->store);
    memset(M, 0, sizeof *M);
}

/* A vector parameter of n values (shape given), as f32 in the arena. */
static const float *vv_vec(vv_model *M, const char *name, int ndim, const int64_t *shape, size_t n)
{
    h3_dtype dt;
    const void *src = h3_store_get_float(M->store, name, ndim, shape, &dt);
    if (!src) return NULL;
    if (M->arena_n + n > M->arena_cap) {
        h3_err(H3_E_SCHEMA, "video VAE: parameter space exhausted at '%s'", name); /* sizing bug guard */
        return NULL;
    }
    float *dst = M->arena + M->arena_n;
    M->arena_n += n;
    if (dt == H3_DT_F32)
        memcpy(dst, src, n * sizeof(float)); /* memcpy: the mapping may be misaligned */
    else
        for (size_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, (const uint8_t *)src + 2 * i, 2);
            h3_to_f32(&v, dt, dst + i, 1);
        }
    return dst;
}

static const float *vv_vec1(vv_model *M, const char *name, int64_t n)
{
    return vv_vec(M, name, 1, &n, (size_t)n);
}

/* A weight matrix [rows, cols] (trailing singleton dims allowed via ndim/shape). */
static int vv_mat(vv_model *M, const char *name, int ndim, const int64_t *shape, h3_mat *out)
{
    h3_dtype dt;
    const void *src = h3_store_get_float(M->store, name, ndim, shape, &dt);
    if (!src) return -H3_E_SCHEMA;
    size_t es = h3_dtype_size(dt), n = (size_t)shape[0] * (size_t)shape[1];
    if ((uintptr_t)src % es) {
        /* The kernels read weights in place; an oddly aligned tensor gets an aligned copy. */
        void **o = realloc(M->owned, sizeof(void *) * (size_t)(M->nowned + 1));
        if (!o) return h3_err(H3_E_NOMEM, "out of memory");
        M->owned = o;
        void *copy = h3_alloc_aligned(n * es);
        if (!copy) return -H3_E_NOMEM;
        memcpy(copy, src, n * es);
        M->owned[M->nowned++] = copy;
        src = copy;
    }
    *out = (h3_mat){src, dt, shape[0], shape[1]};
    return 0;
}

static int vv_load(h3_model *m, vv_model *M)
{
    memset(M, 0, sizeof *M);
    int rc;
    if ((rc = h3_vvae_cfg_load(m, &M->cfg)) || (rc = h3_model_headers(m, H3_COMP_VIDEO_VAE))) return rc;
    const h3_vvae_cfg *c = &M->cfg;
    M->store = &m->comp[H3_COMP_VIDEO_VAE].store;
    M->C = c->latent_ch, M->heads = c->dec_heads, M->dh = c->dec_head_dim;
    M->D = M->heads * M->dh, M->I = M->D * c->dec_ffn_mult, M->R = c->dec_registers;
    M->nlayers = c->dec_layers;
    M->pix = c->out_ch * c->temporal * c->spatial * c->spatial;
    /* diffusers: rope dim = int(head_dim * rope_dim_ratio), split over 3 axes of sin/cos pairs. */
    int rd = (int)(M->dh * c->dec_rope_ratio);
    if (rd <= 0 || rd % 6 || rd > M->dh)
        return h3_err(H3_E_UNSUPPORTED,
                      "%s/config.json: rotary width %d (dim_head %d x rope_dim_ratio %g) must be a positive "
                      "multiple of 6 not above dim_head", m->comp[H3_COMP_VIDEO_VAE].weights_dir, rd, M->dh,
                      c->dec_rope_ratio);
    /* inv_freq = 1 / theta ** torch.arange(0, 1, 6 / rd): float32 values computed in double, with
       ceil(rd / 6) entries as torch counts them (one more than rd / 6 for a few widths). The rotated
       width is what the tables span: 6 x entries. */
    double step = 6.0 / rd;
    M->nf = (int)ceil(1.0 / step);
    M->rd = 6 * M->nf;
    if (M->rd > M->dh || M->nf > 64)
        return h3_err(H3_E_UNSUPPORTED, "video VAE: %d rotary dims exceed dim_head %d", M->rd, M->dh);
    for (int f = 0; f < M->nf; f++) {
        float e = (float)(f * step);
        M->inv_freq[f] = 1.0f / powf((float)c->dec_rope_theta, e);
    }
    int64_t D = M->D, C = M->C, I = M->I;
    M->arena_cap = (size_t)(C + D + M->R * D + 2 * D + M->pix) + (size_t)M->nlayers * (size_t)(3 * D + D + 2 * I + D + 4 * D);
    M->arena = h3_alloc_aligned(M->arena_cap * sizeof(float));
    M->layers = calloc((size_t)(M->nlayers ? M->nlayers : 1), sizeof(vv_layer));
    if (!M->arena || !M->layers) {
        vv_model_free(M);
        return h3_err(H3_E_NOMEM, "out of memory loading the video VAE decoder");
    }
    int64_t s5[5] = {C, C, 1, 1, 1}, s2[2], s3[3] = {1, M->R, D};
    if ((rc = vv_mat(M, "post_quant_conv.weight", 5, s5, &M->pq))) goto fail;
    s2[0] = D, s2[1] = C;
    if ((rc = vv_mat(M, "decoder.x_embedder.weight", 2, s2, &M->emb))) goto fail;
    s2[0] = M->pix, s2[1] = D;
    if ((rc = vv_mat(M, "decoder.proj_out.weight", 2, s2, &M->proj))) goto fail;
    rc = -H3_E_SCHEMA;
    if (!(M->pq_b = vv_vec1(M, "post_quant_conv.bias", C)) ||
        !(M->emb_b = vv_vec1(M, "decoder.x_embedder.bias", D)) ||
        !(M->reg = M->R ? vv_vec(M, "decoder.register_tokens", 3, s3, (size_t)(M->R * D)) : M->arena) ||
        !(M->nout_w = vv_vec1(M, "decoder.norm_out.weight", D)) ||
        !(M->nout_b = vv_vec1(M, "decoder.norm_out.bias", D)) ||
        !(M->proj_b = vv_vec1(M, "decoder.proj_out.bias", M->pix)))
        goto fail;
    for (int i = 0; i < M->nlayers; i++) {
        vv_layer *l = &M->layers[i];
        char n[160];
#define NAME(suffix) (snprintf(n, sizeof n, "decoder.transformer_blocks.%d.%s", i, suffix), n)
        s2[0] = 3 * D, s2[1] = D;
        if ((rc = vv_mat(M, NAME("attn.to_qkv.weight"), 2, s2, &l->qkv))) goto fail;
        s2[0] = D, s2[1] = D;
        if ((rc = vv_mat(M, NAME("attn.to_out.weight"), 2, s2, &l->out))) goto fail;
        s2[0] = 2 * I, s2[1] = D;
        if ((rc = vv_mat(M, NAME("ff.w1.weight"), 2, s2, &l->w1))) goto fail;
        s2[0] = D, s2[1] = I;
        if ((rc = vv_mat(M, NAME("ff.w2.weight"), 2, s2, &l->w2))) goto fail;
        rc = -H3_E_SCHEMA;
        if (!(l->qkv_b = vv_vec1(M, NAME("attn.to_qkv.bias"), 3 * D)) ||
            !(l->out_b = vv_vec1(M, NAME("attn.to_out.bias"), D)) ||
            !(l->w1_b = vv_vec1(M, NAME("ff.w1.bias"), 2 * I)) ||
            !(l->w2_b = vv_vec1(M, NAME("ff.w2.bias"), D)) ||
            !(l->norm1 = vv_vec1(M, NAME("norm1.weight"), D)) ||
            !(l->norm2 = vv_vec1(M, NAME("norm2.weight"), D)) ||
            !(l->scale1 = vv_vec1(M, NAME("scale1"), D)) ||
            !(l->scale2 = vv_vec1(M, NAME("scale2"), D)))
            goto fail;
#undef NAME
    }
    return 0;
fail:
    h3_err_prefix("video VAE decoder");
    vv_model_free(M);
    return rc;
}

/* ---- one tile through the ViT ----------------------------------------------------------- */

typedef struct {
    const vv_model *M;
    const h3_vvae_plan *P;
    const h3_vvae_request *rq;
    h3_pool *pool;
    vv_bufs b;
    int th, tw;            /* tile size in latents */
    const float *cos_t, *sin_t, *cos_y, *sin_y, *cos_x, *sin_x;
    int kmap[512];         /* decoded frame of a window -> kept frame index, -1 dropped */
} vv_run;

/* Per-axis RoPE tables for a tile of win x th x tw latents: angle = 2pi * coord * inv_freq, coord
   the cell centre in [-1, 1), computed in float32 with torch's rounding order. */
static void rope_axis(const vv_model *M, int n, float *cs, float *sn)
{
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    for (int i = 0; i < n; i++) {
        float q = (0.5f + (float)i) / (float)n;
        float pos = 2.0f * q;
        pos = pos - 1.0f;
        float a = pos * two_pi;
        for (int f = 0; f < M->nf; f++) {
            float ang = a * M->inv_freq[f];
            cs[i * M->nf + f] = cosf(ang);
            sn[i * M->nf + f] = sinf(ang);
        }
    }
}

typedef struct {
    vv_run *r;
    int64_t grid;
    float eps;
} qkv_job;

/* Split the per-head interleaved qkv rows into Q, K, V; RMS-normalise q and k per head (no affine,
   float32 as diffusers) and rotate the first rd dims of grid tokens (extra tokens sit at position
   0: identity). */
static void qkv_task(void *arg, int64_t t0, int64_t t1, int thread)
{
    qkv_job *j = arg;
    const vv_run *r = j->r;
    const vv_model *M = r->M;
    int dh = M->dh, D = M->D, nf = M->nf, half = M->rd / 2, th = r->th, tw = r->tw;
    int64_t L = r->P->tokens;
    float cs[384], sn[384];
    (void)thread;
    for (int64_t t = t0; t < t1; t++) {
        const float *row = r->b.S + t * 3 * D;
        bool rot = t < j->grid;
        if (rot) {
            int64_t ti = t / (th * tw), yi = (t / tw) % th, xi = t % tw;
            /* angles: [t freqs, y freqs, x freqs] duplicated -> rd values */
            for (int f = 0; f < nf; f++) {
                cs[f] = r->cos_t[ti * nf + f], sn[f] = r->sin_t[ti * nf + f];
                cs[nf + f] = r->cos_y[yi * nf + f], sn[nf + f] = r->sin_y[yi * nf + f];
                cs[2 * nf + f] = r->cos_x[xi * nf + f], sn[2 * nf + f] = r->sin_x[xi * nf + f];
            }
            for (int d = 0; d < half; d++) cs[half + d] = cs[d], sn[half + d] = sn[d];
        }
        for (int h = 0; h < M->heads; h++) {
            const float *src = row + (int64_t)h * 3 * dh;
            float *dsts[2] = {r->b.T + t * D + h * dh, r->b.T + (L + t) * D + h * dh};
            for (int w = 0; w < 2; w++) {
                const float *x = src + w * dh;
                float *y = dsts[w];
                double ss = 0;
                for (int d = 0; d < dh; d++) ss += (double)x[d] * x[d];
                float inv = (float)(1.0 / sqrt(ss / dh + j->eps));
                float nx[512];
                for (int d = 0; d < dh; d++) nx[d] = x[d] * inv;
                if (rot) {
                    for (int d = 0; d < M->rd; d++) {
                        float other = d < half ? -nx[d + half] : nx[d - half];
                        float a = nx[d] * cs[d];
                        float b = other * sn[d];
                        y[d] = a + b;
                    }
                    for (int d = M->rd; d < dh; d++) y[d] = nx[d];
                } else {
                    memcpy(y, nx, sizeof(float) * (size_t)dh);
                }
            }
            memcpy(r->b.T + (2 * L + t) * D + h * dh, src + 2 * dh, sizeof(float) * (size_t)dh);
        }
    }
}

typedef struct {
    float *X;
    const float *Y, *scale;
    int64_t D, ldy;
} resid_job;

/* X += Y * scale (layer scale): the gated residual kernel the transformer uses, with the scale as
   the gate (product rounded before the add, as torch does: C11 builds do not contract to FMA). */
static void resid_task(void *arg, int64_t r0, int64_t r1, int thread)
{
    resid_job *j = arg;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) h3_gated_add(j->X + r * j->D, j->scale, j->Y + r * j->ldy, j->D);
}

static void residual(h3_pool *pool, float *X, const float *Y, int64_t ldy, const float *scale, int64_t rows,
                     int64_t D)
{
    resid_job j = {X, Y, scale, D, ldy};
    h3_parallel_for(pool, rows, 8, resid_task, &j);
}

typedef struct {
    const vv_run *r;
    int64_t tok0;
} scatter_job;

/* Un-patchify proj_out rows: token (t, y, x) holds [out_ch][pt][ps][ps] pixels of decoded frames
   t*pt .. t*pt+pt-1; frames the window drops are skipped. */
static void scatter_task(void *arg, int64_t i0, int64_t i1, int thread)
{
    scatter_job *j = arg;
    const vv_run *r = j->r;
    const h3_vvae_plan *P = r->P;
    int ps = P->ps, pt = P->pt, oc = r->M->cfg.out_ch, th = P->tile_h, tw = P->tile_w;
    (void)thread;
    for (int64_t i = i0; i < i1; i++) {
        int64_t tok = j->tok0 + i;
        int t = (int)(tok / (r->th * r->tw)), y = (int)((tok / r->tw) % r->th), x = (int)(tok % r->tw);
        const float *src = r->b.P + i * r->M->pix;
        for (int co = 0; co < oc; co++)
            for (int a = 0; a < pt; a++) {
                int k = r->kmap[t * pt + a];
                if (k < 0) continue;
                const float *s = src + ((int64_t)co * pt + a) * ps * ps;
                float *dst = r->b.tile + (((int64_t)k * oc + co) * th + (int64_t)y * ps) * tw + (int64_t)x * ps;
                for (int by = 0; by < ps; by++) memcpy(dst + (int64_t)by * tw, s + by * ps, sizeof(float) * (size_t)ps);
            }
    }
}

/* Decode the latent tile of window `win_start` at latent (ly0, lx0) into r->b.tile. */
static int decode_tile(vv_run *r, int win_start, int ly0, int lx0)
{
    const vv_model *M = r->M;
    const h3_vvae_plan *P = r->P;
    const h3_vvae_cfg *c = &M->cfg;
    h3_pool *pool = r->pool;
    int64_t C = M->C, D = M->D, I = M->I, G = P->grid, L = P->tokens, RB = P->rows_block;
    int rc;
    float eps = (float)c->dec_eps;

    /* De-normalise (x * std, then + mean) while gathering tokens (t, y, x) x channels; latent frames
       past the end repeat the last one, as `_decode` pads. */
    const float *lat = r->rq->latents;
    int64_t plane = (int64_t)P->h * P->w, tstride = plane, cstride = (int64_t)P->T * plane;
    for (int t = 0; t < P->win; t++) {
        int lt = win_start + t < P->T ? win_start + t : P->T - 1;
        for (int y = 0; y < r->th; y++)
            for (int x = 0; x < r->tw; x++) {
                int64_t tok = ((int64_t)t * r->th + y) * r->tw + x;
                const float *src = lat + lt * tstride + (int64_t)(ly0 + y) * P->w + lx0 + x;
                float *dst = r->b.lat + tok * C;
                for (int64_t ch = 0; ch < C; ch++) {
                    float v = src[ch * cstride] * c->latents_std[ch];
                    dst[ch] = v + c->latents_mean[ch];
                }
            }
    }
    if ((rc = h3_linear(pool, r->b.lat, G, C, &M->pq, M->pq_b, r->b.lat2, C)) ||
        (rc = h3_linear(pool, r->b.lat2, G, C, &M->emb, M->emb_b, r->b.X, D)))
        return rc;
    memcpy(r->b.X + G * D, M->reg, sizeof(float) * (size_t)(M->R * D));
    memset(r->b.X + (G + M->R) * D, 0, sizeof(float) * (size_t)D); /* the all-zero token */

    float scale = (float)(1.0 / sqrt((double)M->dh));
    for (int li = 0; li < M->nlayers; li++) {
        const vv_layer *l = &M->layers[li];
        float *Q = r->b.T, *K = Q + L * D, *V = K + L * D;
        h3_rmsnorm(pool, r->b.X, D, r->b.T, D, L, D, l->norm1, eps);
        if ((rc = h3_linear(pool, r->b.T, L, D, &l->qkv, l->qkv_b, r->b.S, 3 * D))) return rc;
        qkv_job qj = {r, G, eps};
        h3_parallel_for(pool, L, 4, qkv_task, &qj);
        if ((rc = h3_attention(pool, Q, D, K, D, V, D, L, L, M->heads, M->heads, M->dh, scale, false, r->b.S, D)) ||
            (rc = h3_linear(pool, r->b.S, L, D, &l->out, l->out_b, r->b.T, D)))
            return rc;
        residual(pool, r->b.X, r->b.T, D, l->scale1, L, D);
        h3_rmsnorm(pool, r->b.X, D, r->b.S, D, L, D, l->norm2, eps);
        /* FFN in row blocks: its 3x-wide hidden never exists for the whole tile. */
        for (int64_t r0 = 0; r0 < L; r0 += RB) {
            int64_t n = L - r0 < RB ? L - r0 : RB;
            if ((rc = h3_linear(pool, r->b.S + r0 * D, n, D, &l->w1, l->w1_b, r->b.H1, 2 * I))) return rc;
            /* Official w1 rows are [gate; up]: act = up * silu(gate) (diffusers' SwiGLU stores [up; gate]). */
            h3_swiglu(pool, r->b.H1, 2 * I, r->b.H1 + I, 2 * I, r->b.A, I, n, I);
            if ((rc = h3_linear(pool, r->b.A, n, I, &l->w2, l->w2_b, r->b.T, D))) return rc;
            residual(pool, r->b.X + r0 * D, r->b.T, D, l->scale2, n, D);
        }
    }
    /* Registers and the zero token are dropped before proj_out, so only grid rows go on. */
    h3_layernorm(pool, r->b.X, D, r->b.S, D, G, D, M->nout_w, M->nout_b, eps);
    for (int64_t r0 = 0; r0 < G; r0 += RB) {
        int64_t n = G - r0 < RB ? G - r0 : RB;
        if ((rc = h3_linear(pool, r->b.S + r0 * D, n, D, &M->proj, M->proj_b, r->b.P, M->pix))) return rc;
        scatter_job sj = {r, r0};
        h3_parallel_for(pool, n, 4, scatter_task, &sj);
    }
    return 0;
}

/* ---- stitching and output --------------------------------------------------------------- */

typedef struct {
    const vv_run *r;
    int i, j, c; /* tile row, column, window */
    int own_w;
} stitch_job;

/* One finished row of `n` pixels of channel co, frame g, at canvas (y, x0): to the caller's
   buffers. */
static void emit_row(const vv_run *r, int g, int y, int x0, int co, const float *v, int n)
{
    const h3_vvae_plan *P = r->P;
    if (g >= P->frames) return; /* frames of padded latents are cut, as `_decode` does */
    const h3_vvae_request *rq = r->rq;
    int64_t H = P->height, W = P->width;
    bool raw = rq->flags & H3_VVAE_RAW;
    if (raw && rq->pixels) memcpy(rq->pixels + (((int64_t)co * P->frames + g) * H + y) * W + x0, v, sizeof(float) * (size_t)n);
    if (raw && !rq->rgb) return;
    /* video * pixel_std + pixel_mean, clamp(0, 1), then the processor's (x * 255).round(). */
    float sd = k_pixel_std[co], mu = k_pixel_mean[co];
    int64_t o = (((int64_t)g * H + y) * W + x0) * 3 + co;
    float *pf = rq->pixels && !raw ? rq->pixels + o : NULL;
    uint8_t *pu = rq->rgb ? rq->rgb + o : NULL;
    for (int x = 0; x < n; x++) {
        float s = v[x] * sd;
        s = s + mu;
        s = s < 0.0f ? 0.0f : (s > 1.0f ? 1.0f : s);
        if (pf) pf[3 * x] = s;
        if (pu) {
            /* Round half to even like numpy's round(): for 0 <= q < 2^23, adding and removing 2^23
               leaves q rounded in the default rounding mode (no libm call per pixel). */
            float q = s * 255.0f;
            q = q + 8388608.0f;
            q = q - 8388608.0f;
            pu[3 * x] = q >= 0.0f ? (uint8_t)q : 0; /* NaN -> 0 */
        }
    }
}

/* v = a * (1 - p) + v * p for n values, with the weights and products rounded as torch does. */
static inline void fade(float *v, const float *a, int n, float p)
{
    float wa = 1.0f - p;
    for (int x = 0; x < n; x++) {
        float s = a[x] * wa;
        float t = v[x] * p;
        v[x] = s + t;
    }
}

/*
 * Blend tile (i, j) of window c into the output over the rows and columns it owns, exactly as
 * `_stitch_tiles` then `_decode` do: the top overlap with the original tile above, then the left
 * overlap with the original tile to the left (weights 1 - p/n and p/n), then the temporal
 * cross-fade of the window's first frames with the previous window's overlap frames.
 */
static void stitch_task(void *arg, int64_t r0, int64_t r1, int thread)
{
    stitch_job *j = arg;
    const vv_run *r = j->r;
    const h3_vvae_plan *P = r->P;
    int oc = r->M->cfg.out_ch, th = P->tile_h, tw = P->tile_w, K = P->keep0 + P->keep1, n = j->own_w;
    int e_top = j->i > 0 ? P->ovy[j->i - 1] : 0, e_left = j->j > 0 ? P->ovx[j->j - 1] : 0;
    int nl = e_left < n ? e_left : n, gx = P->x0[j->j];
    int slot_above = P->col_major ? 0 : j->j, slot_left = P->col_major ? j->i : 0;
    bool last = j->c == P->windows - 1;
    int64_t HW = (int64_t)P->height * P->width;
    float *v = h3_pool_scratch(r->pool, thread, 3, sizeof(float) * (size_t)tw); /* reserved up front */
    for (int64_t ry = r0; ry < r1; ry++) {
        int y = P->y0[j->i] + (int)ry;
        float p_top = e_top ? (float)ry / (float)e_top : 0.0f;
        for (int k = 0; k < K; k++)
            for (int co = 0; co < oc; co++) {
                memcpy(v, r->b.tile + (((int64_t)k * oc + co) * th + ry) * tw, sizeof(float) * (size_t)n);
                if (ry < e_top)
                    fade(v, r->b.above + ((((int64_t)slot_above * K + k) * oc + co) * P->max_ovy + ry) * tw, n, p_top);
                if (nl) {
                    const float *a = r->b.left + ((((int64_t)slot_left * K + k) * oc + co) * th + ry) * P->max_ovx;
                    for (int x = 0; x < nl; x++) {
                        float p = (float)x / (float)e_left;
                        float s = a[x] * (1.0f - p);
                        float t = v[x] * p;
                        v[x] = s + t;
                    }
                }
                int64_t pix = (int64_t)y * P->width + gx;
                if (k < P->keep0) {
                    if (j->c > 0 && k < P->blend_t) {
                        int o = P->keep1 - P->blend_t + k; /* _blend uses the overlap's last frames */
                        fade(v, r->b.carry + ((int64_t)o * oc + co) * HW + pix, n, (float)k / (float)P->blend_t);
                    }
                    emit_row(r, j->c * P->keep0 + k, y, gx, co, v, n);
                } else if (last) {
                    emit_row(r, P->windows * P->keep0 + (k - P->keep0), y, gx, co, v, n);
                } else {
                    memcpy(r->b.carry + ((int64_t)(k - P->keep0) * oc + co) * HW + pix, v, sizeof(float) * (size_t)n);
                }
            }
    }
}

/* Keep the strips of this tile that its right and lower neighbours blend with (original values). */
static void save_strips(vv_run *r, int i, int j)
{
    const h3_vvae_plan *P = r->P;
    int oc = r->M->cfg.out_ch, th = P->tile_h, tw = P->tile_w, K = P->keep0 + P->keep1;
    if (i + 1 < P->ny) {
        int e = P->ovy[i];
        for (int k = 0; k < K; k++)
            for (int co = 0; co < oc; co++)
                memcpy(r->b.above + (((int64_t)(P->col_major ? 0 : j) * K + k) * oc + co) * P->max_ovy * tw,
                       r->b.tile + (((int64_t)k * oc + co) * th + th - e) * tw, sizeof(float) * (size_t)e * tw);
    }
    if (j + 1 < P->nx) {
        int e = P->ovx[j];
        for (int k = 0; k < K; k++)
            for (int co = 0; co < oc; co++)
                for (int y = 0; y < th; y++)
                    memcpy(r->b.left + ((((int64_t)(P->col_major ? i : 0) * K + k) * oc + co) * th + y) * P->max_ovx,
                           r->b.tile + (((int64_t)k * oc + co) * th + y) * tw + tw - e, sizeof(float) * (size_t)e);
    }
}

static int run_decode(const vv_model *M, h3_pool *pool, const h3_vvae_plan *P, const h3_vvae_request *rq)
{
    vv_run r;
    memset(&r, 0, sizeof r);
    r.M = M, r.P = P, r.rq = rq, r.pool = pool;
    r.th = P->tile_h / P->ps, r.tw = P->tile_w / P->ps;
    if (P->win * P->pt > (int)(sizeof r.kmap / sizeof r.kmap[0]) || M->dh > 512 || M->rd > 384)
        return h3_err(H3_E_UNSUPPORTED, "video decode: window of %d frames or head width %d is beyond this build",
                      P->win * P->pt, M->dh);
    for (int f = 0; f < P->win * P->pt; f++) {
        int cf = P->chunk * P->pt;
        if (f >= P->pre && f < cf)
            r.kmap[f] = f - P->pre;
        else if (P->keep1 > 0 && f >= cf + P->pre)
            r.kmap[f] = P->keep0 + f - cf - P->pre;
        else
            r.kmap[f] = -1;
    }
    char *ws = h3_alloc_aligned(P->workspace_bytes);
    if (!ws) return -H3_E_NOMEM;
    vv_layout(&M->cfg, P, &r.b, ws);
    int nf = M->nf;
    float *rp = r.b.rope;
    r.cos_t = rp, r.sin_t = rp + P->win * nf, rp += 2 * P->win * nf;
    r.cos_y = rp, r.sin_y = rp + r.th * nf, rp += 2 * r.th * nf;
    r.cos_x = rp, r.sin_x = rp + r.tw * nf;
    rope_axis(M, P->win, (float *)r.cos_t, (float *)r.sin_t);
    rope_axis(M, r.th, (float *)r.cos_y, (float *)r.sin_y);
    rope_axis(M, r.tw, (float *)r.cos_x, (float *)r.sin_x);

    /* The stitcher's per-thread row buffer, reserved here because a task cannot fail. */
    for (int t = 0; t < h3_pool_threads(pool); t++)
        if (!h3_pool_scratch(pool, t, 3, sizeof(float) * (size_t)P->tile_w)) {
            h3_free_aligned(ws);
            return -H3_E_NOMEM;
        }
    int ntiles = P->ny * P->nx, total = P->windows * ntiles, done = 0;
    int rc = h3_progress_check(rq->progress, rq->user, PHASE, 0, total); /* the shared hook starts at 0 */
    for (int c = 0; c < P->windows && !rc; c++)
        for (int t = 0; t < ntiles && !rc; t++) {
            /* Each tile is blended with the originals of its upper and left neighbours, so any order
               that visits those first gives the same result. */
            int i = P->col_major ? t % P->ny : t / P->nx, j = P->col_major ? t / P->ny : t % P->nx;
            if ((rc = decode_tile(&r, c * P->chunk, P->y0[i] / P->ps, P->x0[j] / P->ps))) break;
            int own_h = P->tile_h - (i + 1 < P->ny ? P->ovy[i] : 0);
            stitch_job sj = {&r, i, j, c, P->tile_w - (j + 1 < P->nx ? P->ovx[j] : 0)};
            h3_parallel_for(pool, own_h, 2, stitch_task, &sj);
            save_strips(&r, i, j);
            rc = h3_progress_check(rq->progress, rq->user, PHASE, ++done, total);
        }
    h3_free_aligned(ws);
    return rc;
}

int h3_vvae_decode(h3_model *m, h3_pool *pool, const h3_vvae_request *rq)
{
    if (!rq->latents) return h3_err(H3_E_INVALID, "video decode: NULL latents");
    if (!rq->rgb && !rq->pixels) return h3_err(H3_E_INVALID, "video decode: no output buffer given");
    h3_vvae_cfg cfg;
    int rc = h3_vvae_cfg_load(m, &cfg);
    if (rc) return rc;
    if (rq->C != cfg.latent_ch)
        return h3_err(H3_E_INVALID, "video decode: latents have %d channels, the video VAE (%s) expects %d", rq->C,
                      m->comp[H3_COMP_VIDEO_VAE].config_path, cfg.latent_ch);
    if (cfg.out_ch != 3 && (rq->rgb || !(rq->flags & H3_VVAE_RAW)))
        return h3_err(H3_E_UNSUPPORTED, "video decode: %d output channels have no RGB conversion (use the raw "
                      "float output)", cfg.out_ch);
    h3_vvae_plan plan;
    if ((rc = h3_vvae_plan_make(&cfg, rq->T, rq->h, rq->w, rq->tile_px, rq->overlap_px, rq->flags, &plan)))
        return rc;
    vv_model M;
    if ((rc = vv_load(m, &M)) == 0) {
        rc = run_decode(&M, pool, &plan, rq);
        vv_model_free(&M); /* releases the mapping: the weights live for this phase only */
    }
    h3_vvae_plan_free(&plan);
    return rc;
}
