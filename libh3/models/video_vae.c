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
#include "core/host.h" /* h3_to_f32: bf16/f16 vectors are widened on the host before upload */

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
 * Per-tile buffers, in backend memory. The block's big activations overlay each other (7 L x D
 * floats, not 8):
 *   X  [L, D]   residual stream
 *   S  [L, 3D]  qkv projection -> attention output -> norm2 output / norm_out output
 *   T  [L, 3D]  norm1 output -> Q | K | V -> to_out output -> w2 output
 * Each use starts after the previous one is dead (see decode_tile). The RoPE table, the frame map
 * and the all-zero row entries are set once per decode.
 */
typedef struct {
    float *lat, *lat2, *X, *S, *T, *H1, *A, *P, *rope, *tile, *above, *left, *carry;
    int32_t *kmap, *zero_entry;
} vv_bufs;

/* Rotary frequencies per axis (diffusers: rope dim = int(head_dim * rope_dim_ratio), split over 3
   axes of sin/cos pairs; torch.arange(0, 1, 6 / rd) has ceil(rd / 6) entries); 0 when the config's
   width is unusable (vv_load reports it). */
static int rope_freqs(const h3_vvae_cfg *c)
{
    int rd = (int)(c->dec_head_dim * c->dec_rope_ratio);
    if (rd <= 0 || rd % 6 || rd > c->dec_head_dim) return 0;
    return (int)ceil(1.0 / (6.0 / rd));
}

/* Carve the workspace (base != NULL) or just measure it. One layout serves both, so the size the
   API reports is exactly what a decode allocates on the backend (the host adds a few KB while it
   builds the RoPE table). */
static size_t vv_layout(const h3_vvae_cfg *c, const h3_vvae_plan *p, vv_bufs *b, char *base)
{
    size_t off = 0;
    vv_bufs dummy;
    if (!b) b = &dummy;
#define TAKE(field, count)                                                                 \
    do {                                                                                   \
        size_t n_ = (size_t)(count) * sizeof(*b->field);                                  \
        b->field = base && n_ ? (void *)(base + off) : NULL;                               \
        off += (n_ + 63) & ~(size_t)63;                                                    \
    } while (0)
    size_t D = (size_t)c->dec_heads * c->dec_head_dim, I = D * (size_t)c->dec_ffn_mult;
    size_t L = (size_t)p->tokens, G = (size_t)p->grid, RB = (size_t)p->rows_block, C = (size_t)c->latent_ch;
    size_t oc = (size_t)c->out_ch, pix = oc * p->pt * p->ps * p->ps;
    size_t K = (size_t)p->keep0 + p->keep1, th = (size_t)p->tile_h, tw = (size_t)p->tile_w;
    size_t half = 3 * (size_t)rope_freqs(c); /* rotated dims / 2: t, y and x frequencies */
    TAKE(lat, G * C);
    TAKE(lat2, G * C);
    TAKE(X, L * D);
    TAKE(S, L * 3 * D);
    TAKE(T, L * 3 * D);
    TAKE(H1, RB * 2 * I);
    TAKE(A, RB * I);
    TAKE(P, RB * pix);
    TAKE(rope, 2 * G * half);
    TAKE(tile, K * oc * th * tw);
    TAKE(above, p->ny > 1 ? (size_t)(p->col_major ? 1 : p->nx) * K * oc * p->max_ovy * tw : 0);
    TAKE(left, p->nx > 1 ? (size_t)(p->col_major ? p->ny : 1) * K * oc * th * p->max_ovx : 0);
    TAKE(carry, p->windows > 1 && p->keep1 > 0 ? (size_t)p->keep1 * oc * p->height * p->width : 0);
    TAKE(kmap, (size_t)p->win * p->pt);
    TAKE(zero_entry, L);
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

void h3_vvae_plan_for_backend(const h3_vvae_cfg *c, const h3_backend *be, h3_vvae_plan *p)
{
    /* Blocks of ROWS_BLOCK rows bound the CPU's FFN buffers. On a GPU they would leave most of the
       SMs idle in the down projection (256 rows x 2048 outputs is a few dozen output tiles, and
       determinism excludes split-K), so a tile's rows go through in one GEMM each; the hidden
       buffers grow to the tile (about 200 MB at the release's widths and 256 px tiles). */
    if (be->act_dtype == H3_DT_F32 || p->rows_block == p->tokens) return;
    p->rows_block = p->tokens;
    p->workspace_bytes = vv_layout(c, p, NULL, NULL);
}

/* ---- weights ---------------------------------------------------------------------------- */

typedef struct {
    h3_bw qkv, out, w1, w2;
    const float *qkv_b, *out_b, *w1_b, *w2_b, *norm1, *norm2, *scale1, *scale2;
} vv_layer;

typedef struct {
    h3_vvae_cfg cfg;
    h3_backend *be;
    int C, D, heads, dh, I, R, rd, nf, pix, nlayers;
    h3_bw pq, emb, proj;
    const float *pq_b, *emb_b, *reg, *nout_w, *nout_b, *proj_b; /* backend f32 vectors */
    float inv_freq[64];
    vv_layer *layers;
    float *arena;    /* host: f32 copies of every vector parameter, uploaded once loaded */
    float *barena;   /* the arena on the backend: the vectors above point into it */
    size_t arena_n, arena_cap;
    void **owned; /* aligned copies of matrices whose mapping is misaligned */
    int nowned;
    h3_store *store;
    uint64_t dev_bytes; /* backend bytes of the weights (matrices as the backend holds them + vectors) */
    int precision;      /* h3_vvae_request.precision it was loaded with */
} vv_model;

struct h3_vvae_keep {
    vv_model M;
};

static void vv_free_w(vv_model *M, h3_bw *w)
{
    if (w->data || w->priv) M->be->weights->weight_free(M->be, w);
}

static void vv_model_free(vv_model *M)
{
    if (M->be) {
        vv_free_w(M, &M->pq);
        vv_free_w(M, &M->emb);
        vv_free_w(M, &M->proj);
        for (int i = 0; M->layers && i < M->nlayers; i++) {
            vv_free_w(M, &M->layers[i].qkv);
            vv_free_w(M, &M->layers[i].out);
            vv_free_w(M, &M->layers[i].w1);
            vv_free_w(M, &M->layers[i].w2);
        }
        M->be->mem->release(M->be, M->barena);
    }
    for (int i = 0; i < M->nowned; i++) h3_free_aligned(M->owned[i]);
    free(M->owned);
    free(M->layers);
    h3_free_aligned(M->arena);
    if (M->store) h3_store_release(M->store);
    memset(M, 0, sizeof *M);
}

/* A vector parameter of n values (shape given), as f32 in the host arena. */
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

/* A weight matrix [rows, cols] (trailing singleton dims allowed via ndim/shape), handed to the
   backend (on the CPU a view of the mapping). */
static int vv_mat(vv_model *M, const char *name, int ndim, const int64_t *shape, h3_bw *out)
{
    h3_dtype dt;
    const void *src = h3_store_get_float(M->store, name, ndim, shape, &dt);
    if (!src) return -H3_E_SCHEMA;
    size_t es = h3_dtype_size(dt), n = (size_t)shape[0] * (size_t)shape[1];
    /* bf16 on a GPU (weight_load's copy), as stored on the CPU (a view) */
    M->dev_bytes += (uint64_t)n * (M->be->is_host ? es : 2);
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
    int rc = M->be->weights->weight_load(M->be, src, dt, shape[0], shape[1], out);
    if (!rc && out->dtype == H3_DT_F8_E4M3) M->dev_bytes -= (uint64_t)n; /* one byte a value, not bf16's two */
    return rc;
}

/* The vectors' pointers moved from the host arena to its backend copy. */
static const float *on_backend(const vv_model *M, const float *host)
{
    return host ? M->barena + (host - M->arena) : NULL;
}

static int vv_load(h3_model *m, h3_backend *be, vv_model *M, int precision)
{
    memset(M, 0, sizeof *M);
    M->be = be;
    M->precision = precision;
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
    M->nf = rope_freqs(c);
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
    /* fp8 (h3_vvae_request.precision) for the layers' GEMMs only: proj_in / proj_out / post_quant_conv
       are a sliver of the work and proj_in's 24 latent channels are no fp8 width. */
    const int keep_precision = be->weight_precision;
    be->weight_precision = precision;
    for (int i = 0; i < M->nlayers; i++) {
        vv_layer *l = &M->layers[i];
        char n[160];
#define NAME(suffix) (snprintf(n, sizeof n, "decoder.transformer_blocks.%d.%s", i, suffix), n)
        s2[0] = 3 * D, s2[1] = D;
        if ((rc = vv_mat(M, NAME("attn.to_qkv.weight"), 2, s2, &l->qkv))) goto fail_layers;
        s2[0] = D, s2[1] = D;
        if ((rc = vv_mat(M, NAME("attn.to_out.weight"), 2, s2, &l->out))) goto fail_layers;
        s2[0] = 2 * I, s2[1] = D;
        if ((rc = vv_mat(M, NAME("ff.w1.weight"), 2, s2, &l->w1))) goto fail_layers;
        s2[0] = D, s2[1] = I;
        if ((rc = vv_mat(M, NAME("ff.w2.weight"), 2, s2, &l->w2))) goto fail_layers;
        rc = -H3_E_SCHEMA;
        if (!(l->qkv_b = vv_vec1(M, NAME("attn.to_qkv.bias"), 3 * D)) ||
            !(l->out_b = vv_vec1(M, NAME("attn.to_out.bias"), D)) ||
            !(l->w1_b = vv_vec1(M, NAME("ff.w1.bias"), 2 * I)) ||
            !(l->w2_b = vv_vec1(M, NAME("ff.w2.bias"), D)) ||
            !(l->norm1 = vv_vec1(M, NAME("norm1.weight"), D)) ||
            !(l->norm2 = vv_vec1(M, NAME("norm2.weight"), D)) ||
            !(l->scale1 = vv_vec1(M, NAME("scale1"), D)) ||
            !(l->scale2 = vv_vec1(M, NAME("scale2"), D)))
            goto fail_layers;
#undef NAME
    }
    be->weight_precision = keep_precision;
    /* Every vector to the backend in one upload; the host arena goes. */
    if (!(M->barena = h3_backend_dup(be, M->arena, (M->arena_n ? M->arena_n : 1) * sizeof(float)))) {
        rc = -H3_E_NOMEM;
        goto fail;
    }
    M->pq_b = on_backend(M, M->pq_b), M->emb_b = on_backend(M, M->emb_b), M->reg = on_backend(M, M->reg);
    M->nout_w = on_backend(M, M->nout_w), M->nout_b = on_backend(M, M->nout_b), M->proj_b = on_backend(M, M->proj_b);
    for (int i = 0; i < M->nlayers; i++) {
        vv_layer *l = &M->layers[i];
        l->qkv_b = on_backend(M, l->qkv_b), l->out_b = on_backend(M, l->out_b), l->w1_b = on_backend(M, l->w1_b);
        l->w2_b = on_backend(M, l->w2_b), l->norm1 = on_backend(M, l->norm1), l->norm2 = on_backend(M, l->norm2);
        l->scale1 = on_backend(M, l->scale1), l->scale2 = on_backend(M, l->scale2);
    }
    M->dev_bytes += (uint64_t)M->arena_n * sizeof(float);
    h3_free_aligned(M->arena);
    M->arena = NULL;
    return 0;
fail_layers:
    be->weight_precision = keep_precision;
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
    h3_backend *be;
    vv_bufs b;
    int th, tw; /* tile size in latents */
} vv_run;

static h3_bt f32(float *p, int64_t rows, int64_t cols, int64_t ld) { return h3_bt_make(p, H3_DT_F32, rows, cols, ld); }

/* Angle of frequency f at cell i of an axis of n cells: 2pi * coord * inv_freq, coord the cell
   centre in [-1, 1), computed in float32 with torch's rounding order. */
static float axis_angle(const vv_model *M, int i, int n, int f)
{
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    float q = (0.5f + (float)i) / (float)n;
    float pos = 2.0f * q;
    pos = pos - 1.0f;
    float a = pos * two_pi;
    return a * M->inv_freq[f];
}

#define ROPE_ROWS 256 /* grid tokens per upload of the RoPE table */

/* The RoPE table of a tile's grid tokens (t, y, x): row t holds [t freqs | y freqs | x freqs] of
   cos (then of sin), the half the rotation pairs with itself. Registers and the zero token sit at
   position 0 and are not rotated. Built on the host ROPE_ROWS rows at a time and uploaded. */
static int rope_table(vv_run *r)
{
    const vv_model *M = r->M;
    const int nf = M->nf, half = 3 * nf, th = r->th, tw = r->tw, win = r->P->win;
    const int64_t G = r->P->grid;
    float *cs = h3_malloc(sizeof(float) * 2 * ROPE_ROWS * (size_t)(half ? half : 1)), *sn = cs + ROPE_ROWS * half;
    if (!cs) return -H3_E_NOMEM;
    int rc = 0;
    for (int64_t t0 = 0; t0 < G && !rc; t0 += ROPE_ROWS) {
        const int64_t rows = G - t0 < ROPE_ROWS ? G - t0 : ROPE_ROWS;
        for (int64_t k = 0; k < rows; k++) {
            const int64_t t = t0 + k;
            const int cell[3] = {(int)(t / (th * tw)), (int)((t / tw) % th), (int)(t % tw)}, len[3] = {win, th, tw};
            for (int ax = 0; ax < 3; ax++)
                for (int f = 0; f < nf; f++) {
                    float ang = axis_angle(M, cell[ax], len[ax], f);
                    cs[k * half + ax * nf + f] = cosf(ang);
                    sn[k * half + ax * nf + f] = sinf(ang);
                }
        }
        const size_t bytes = sizeof(float) * (size_t)(rows * half);
        float *dc = r->b.rope + t0 * half, *ds = r->b.rope + G * half + t0 * half;
        if (!(rc = r->be->mem->upload(r->be, dc, cs, bytes))) rc = r->be->mem->upload(r->be, ds, sn, bytes);
    }
    free(cs);
    return rc;
}

/* Views of rows [r0, r0 + n) of the qkv projection in S (per head [q | k | v], heads 3 dh apart):
   in[0..2] the q, k and v parts, out[0..2] their head-major rows in T (Q | K | V, L rows each). */
static void qkv_views(const vv_run *r, int64_t r0, int64_t n, h3_bt in[3], h3_bt out[3])
{
    const int64_t D = r->M->D, dh = r->M->dh, L = r->P->tokens;
    for (int s = 0; s < 3; s++) {
        in[s] = f32(r->b.S + r0 * 3 * D + s * dh, n, 3 * D - s * dh, 3 * D);
        out[s] = f32(r->b.T + (s * L + r0) * D, n, D, D);
    }
}

/* Decode the latent tile of window `win_start` at latent (ly0, lx0) into r->b.tile. */
static int decode_tile(vv_run *r, int win_start, int ly0, int lx0)
{
    const vv_model *M = r->M;
    const h3_vvae_plan *P = r->P;
    const h3_vvae_cfg *c = &M->cfg;
    h3_backend *be = r->be;
    const h3_backend_ops *o = be->ops;
    const int64_t C = M->C, D = M->D, I = M->I, G = P->grid, L = P->tokens, RB = P->rows_block;
    const float eps = (float)c->dec_eps;
    int rc;

    /* De-normalise (x * std, then + mean) while gathering tokens (t, y, x) x channels; latent frames
       past the end repeat the last one, as `_decode` pads. */
    const int64_t plane = (int64_t)P->h * P->w;
    const float *box = r->rq->latents + (int64_t)win_start * plane + (int64_t)ly0 * P->w + lx0;
    const h3_bt lat = f32(r->b.lat, G, C, C), lat2 = f32(r->b.lat2, G, C, C), Xg = f32(r->b.X, G, D, D);
    if ((rc = be->dec->channels_last(be, box, (int64_t)P->T * plane, plane, P->w, P->win, P->T - win_start, r->th,
                                     r->tw, c->latents_std, c->latents_mean, &lat)) ||
        (rc = o->linear(be, &lat, &M->pq, M->pq_b, &lat2)) || (rc = o->linear(be, &lat2, &M->emb, M->emb_b, &Xg)))
        return rc;
    /* The register tokens, then the all-zero token. */
    const h3_bt reg = f32((float *)M->reg, M->R, D, D), Xr = f32(r->b.X + G * D, M->R, D, D);
    if (M->R && (rc = o->copy(be, &reg, &Xr))) return rc;
    if ((rc = be->mem->zero(be, r->b.X + (G + M->R) * D, sizeof(float) * (size_t)D))) return rc;

    const float scale = (float)(1.0 / sqrt((double)M->dh));
    const h3_bt X = f32(r->b.X, L, D, D), T = f32(r->b.T, L, D, D), S = f32(r->b.S, L, 3 * D, 3 * D),
                SD = f32(r->b.S, L, D, D);
    /* Grid tokens are rotated by the table; the registers and the zero token (position 0) are not. */
    h3_bt gi[3], go[3], ei[3], eo[3], all[3], qkv[3];
    qkv_views(r, 0, G, gi, go);
    qkv_views(r, G, L - G, ei, eo);
    qkv_views(r, 0, L, all, qkv);
    const int half = M->rd / 2, hs = 3 * M->dh;
    const float *cosg = r->b.rope, *sing = r->b.rope + G * half;
    for (int li = 0; li < M->nlayers; li++) {
        const vv_layer *l = &M->layers[li];
        /* Layer scale as a gated residual: one "modulation" row, entry 0 for every token. */
        const h3_bmod ls1 = {l->scale1, r->b.zero_entry, 0, 0}, ls2 = {l->scale2, r->b.zero_entry, 0, 0};
        /* q/k: RMSNorm over each head without weight (float32, as diffusers), then RoPE. */
        if ((rc = o->norm_mod(be, &X, NULL, l->norm1, NULL, eps, &T)) ||
            (rc = o->linear(be, &T, &l->qkv, l->qkv_b, &S)) ||
            (rc = o->qk_norm_rope(be, &gi[0], &gi[1], &gi[2], hs, NULL, NULL, cosg, sing, M->heads, M->heads, M->dh,
                                  half, eps, &go[0], &go[1], &go[2])) ||
            (rc = o->qk_norm_rope(be, &ei[0], &ei[1], &ei[2], hs, NULL, NULL, NULL, NULL, M->heads, M->heads, M->dh,
                                  0, eps, &eo[0], &eo[1], &eo[2])) ||
            (rc = o->attention(be, &qkv[0], &qkv[1], &qkv[2], M->heads, M->heads, M->dh, scale, false, &SD)) ||
            (rc = o->linear(be, &SD, &l->out, l->out_b, &T)) || (rc = o->gated_add(be, &X, &T, &ls1)) ||
            (rc = o->norm_mod(be, &X, NULL, l->norm2, NULL, eps, &SD)))
            return rc;
        /* FFN in row blocks: its 3x-wide hidden never exists for the whole tile. Official w1 rows
           are [gate; up]: act = up * silu(gate) (diffusers' SwiGLU stores [up; gate]). */
        for (int64_t r0 = 0; r0 < L; r0 += RB) {
            const int64_t n = L - r0 < RB ? L - r0 : RB;
            const h3_bt in = f32(r->b.S + r0 * D, n, D, D), h1 = f32(r->b.H1, n, 2 * I, 2 * I),
                        gate = f32(r->b.H1, n, I, 2 * I), up = f32(r->b.H1 + I, n, I, 2 * I),
                        act = f32(r->b.A, n, I, I), out = f32(r->b.T, n, D, D), xr = f32(r->b.X + r0 * D, n, D, D);
            if ((rc = o->linear(be, &in, &l->w1, l->w1_b, &h1)) || (rc = o->swiglu(be, &gate, &up, &act)) ||
                (rc = o->linear(be, &act, &l->w2, l->w2_b, &out)) || (rc = o->gated_add(be, &xr, &out, &ls2)))
                return rc;
        }
    }
    /* Registers and the zero token are dropped before proj_out, so only grid rows go on. */
    const h3_bt SG = f32(r->b.S, G, D, D);
    if ((rc = o->layernorm(be, &Xg, M->nout_w, M->nout_b, eps, &SG))) return rc;
    for (int64_t r0 = 0; r0 < G; r0 += RB) {
        const int64_t n = G - r0 < RB ? G - r0 : RB;
        const h3_bt in = f32(r->b.S + r0 * D, n, D, D), px = f32(r->b.P, n, M->pix, M->pix);
        if ((rc = o->linear(be, &in, &M->proj, M->proj_b, &px)) ||
            (rc = be->dec->unpatchify(be, &px, r0, r->th, r->tw, c->out_ch, P->pt, P->ps, r->b.kmap, r->b.tile)))
            return rc;
    }
    return 0;
}

/* ---- stitching and output --------------------------------------------------------------- */

static int run_decode(const vv_model *M, h3_backend *be, const h3_vvae_plan *P, const h3_vvae_request *rq)
{
    vv_run r;
    memset(&r, 0, sizeof r);
    r.M = M, r.P = P, r.rq = rq, r.be = be;
    r.th = P->tile_h / P->ps, r.tw = P->tile_w / P->ps;
    int32_t kmap[512]; /* decoded frame of a window -> kept frame index, -1 dropped */
    if (P->win * P->pt > (int)(sizeof kmap / sizeof kmap[0]))
        return h3_err(H3_E_UNSUPPORTED, "video decode: a window of %d frames is beyond this build", P->win * P->pt);
    for (int f = 0; f < P->win * P->pt; f++) {
        int cf = P->chunk * P->pt;
        if (f >= P->pre && f < cf)
            kmap[f] = f - P->pre;
        else if (P->keep1 > 0 && f >= cf + P->pre)
            kmap[f] = P->keep0 + f - cf - P->pre;
        else
            kmap[f] = -1;
    }
    char *ws = be->mem->alloc(be, P->workspace_bytes);
    if (!ws) return -H3_E_NOMEM;
    vv_layout(&M->cfg, P, &r.b, ws);
    int rc;
    if ((rc = be->mem->upload(be, r.b.kmap, kmap, sizeof(int32_t) * (size_t)(P->win * P->pt))) ||
        (rc = be->mem->zero(be, r.b.zero_entry, sizeof(int32_t) * (size_t)P->tokens)) || (rc = rope_table(&r))) {
        be->mem->release(be, ws);
        return rc;
    }
    int ntiles = P->ny * P->nx, total = P->windows * ntiles, done = 0;
    rc = h3_progress_check(rq->progress, rq->user, PHASE, 0, total); /* the shared hook starts at 0 */
    for (int c = 0; c < P->windows && !rc; c++)
        for (int t = 0; t < ntiles && !rc; t++) {
            /* Each tile is blended with the originals of its upper and left neighbours, so any order
               that visits those first gives the same result. */
            int i = P->col_major ? t % P->ny : t / P->nx, j = P->col_major ? t / P->ny : t % P->nx;
            if ((rc = decode_tile(&r, c * P->chunk, P->y0[i] / P->ps, P->x0[j] / P->ps))) break;
            h3_bstitch s = {
                .tile = r.b.tile, .above = r.b.above, .left = r.b.left, .carry = r.b.carry,
                .C = M->cfg.out_ch, .K = P->keep0 + P->keep1, .keep0 = P->keep0, .keep1 = P->keep1,
                .blend_t = P->blend_t, .th = P->tile_h, .tw = P->tile_w, .max_ovy = P->max_ovy, .max_ovx = P->max_ovx,
                .H = P->height, .W = P->width, .frames = P->frames, .window = c, .windows = P->windows,
                .y0 = P->y0[i], .x0 = P->x0[j],
                .ov_top = i > 0 ? P->ovy[i - 1] : 0, .ov_left = j > 0 ? P->ovx[j - 1] : 0,
                .ov_bottom = i + 1 < P->ny ? P->ovy[i] : 0, .ov_right = j + 1 < P->nx ? P->ovx[j] : 0,
                /* Row by row, the strips above are one per column and the strip to the left is the
                   previous tile's; column by column, the other way round. */
                .slot_above = P->col_major ? 0 : j, .slot_left = P->col_major ? i : 0,
                .raw = (rq->flags & H3_VVAE_RAW) != 0, .rgb = rq->rgb, .pixels = rq->pixels,
                .pix_mean = k_pixel_mean, .pix_std = k_pixel_std};
            s.own_h = s.th - s.ov_bottom, s.own_w = s.tw - s.ov_right;
            if ((rc = be->dec->vae_stitch(be, &s))) break;
            rc = h3_progress_check(rq->progress, rq->user, PHASE, ++done, total);
        }
    be->mem->release(be, ws);
    return rc;
}

int h3_vvae_run(h3_model *m, h3_backend *be, const h3_vvae_request *rq)
{
    if (!rq->latents) return h3_err(H3_E_INVALID, "video decode: NULL latents");
    if (!rq->rgb && !rq->pixels) return h3_err(H3_E_INVALID, "video decode: no output buffer given");
    static const h3_op need[] = {H3_OP_channels_last, H3_OP_unpatchify, H3_OP_vae_stitch, H3_OP_layernorm, H3_OP_copy};
    int rc = h3_backend_need(be, need, (int)(sizeof need / sizeof *need), "the video VAE decoder");
    if (rc) return rc;
    h3_vvae_cfg cfg;
    if ((rc = h3_vvae_cfg_load(m, &cfg))) return rc;
    if (rq->C != cfg.latent_ch)
        return h3_err(H3_E_INVALID, "video decode: latents have %d channels, the video VAE (%s) expects %d", rq->C,
                      m->comp[H3_COMP_VIDEO_VAE].config_path, cfg.latent_ch);
    if (cfg.out_ch != 3 && (rq->rgb || !(rq->flags & H3_VVAE_RAW)))
        return h3_err(H3_E_UNSUPPORTED, "video decode: %d output channels have no RGB conversion (use the raw "
                      "float output)", cfg.out_ch);
    h3_vvae_plan plan;
    if ((rc = h3_vvae_plan_make(&cfg, rq->T, rq->h, rq->w, rq->tile_px, rq->overlap_px, rq->flags, &plan)))
        return rc;
    h3_vvae_plan_for_backend(&cfg, be, &plan);
    /* A backend that copies the weights (bf16 on a GPU) can keep them for the next call: the video
       decoder of the release is 9.7 GB of f32 on disk, seconds of conversion and upload per call.
       A host-memory backend (the CPU) computes on views of the mapping: nothing to keep there. */
    const bool keep = rq->keep && !be->is_host;
    if (keep && *rq->keep && ((*rq->keep)->M.be != be || (*rq->keep)->M.precision != rq->precision)) {
        h3_vvae_keep_free(*rq->keep);
        *rq->keep = NULL;
    }
    if (keep && *rq->keep) {
        rc = run_decode(&(*rq->keep)->M, be, &plan, rq);
    } else if (keep) {
        h3_vvae_keep *k = h3_calloc(1, sizeof *k);
        if (!k) rc = -H3_E_NOMEM;
        else if ((rc = vv_load(m, be, &k->M, rq->precision)) == 0) {
            /* Everything now lives on the backend: the mapping and its page cache can go. */
            h3_store_release(k->M.store);
            k->M.store = NULL;
            *rq->keep = k;
            rc = run_decode(&k->M, be, &plan, rq);
        } else {
            free(k);
        }
    } else {
        vv_model M;
        if ((rc = vv_load(m, be, &M, rq->precision)) == 0) {
            rc = run_decode(&M, be, &plan, rq);
            vv_model_free(&M); /* releases the mapping: the weights live for this phase only */
        }
    }
    h3_vvae_plan_free(&plan);
    return rc;
}

void h3_vvae_keep_free(h3_vvae_keep *k)
{
    if (!k) return;
    vv_model_free(&k->M);
    free(k);
}

uint64_t h3_vvae_keep_bytes(const h3_vvae_keep *k) { return k ? k->M.dev_bytes : 0; }
