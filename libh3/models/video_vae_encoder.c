/*
 * Video VAE encoder: diffusers' MiniMaxH3VideoEncoder3d + quant_conv over spatial tiles and
 * temporal clips, as AutoencoderKLMiniMaxH3.encode runs them (see video_vae_encoder.h for the
 * contract).
 *
 * Official tensor layout read here (video_vae/source/model.safetensors; diffusers' names after
 * the arrow):
 *   encoder.conv_in.{weight [ch0, 3, 3, 3, 3], bias}
 *   encoder.down.{l}.block.{b}.{norm1, conv1, norm2, conv2}     -> down_blocks.l.resnets.b
 *   encoder.down.{l}.block.{b}.nin_shortcut (1x1x1, where the channel count changes) -> conv_shortcut
 *   encoder.down.{l}.downsample.conv (3x3x3, where a level downsamples) -> downsamplers.0.conv
 *   encoder.norm_out.{weight, bias}, encoder.conv_out.{weight [2C, chL, 3, 3, 3], bias}
 *   quant_conv.{weight [2C, 2C, 1, 1, 1], bias}
 *
 * Activations are channel-last video [frames][rows][cols][channels] in backend memory; every
 * convolution is the backend's conv3d (im2col + GEMM on the CPU), every norm its group_norm. The
 * moments of a tile (a few KB) come back to the host, where the tiles are blended and the clips
 * concatenated exactly as `_stitch_tiles` and `_encode` do.
 */
#include "models/video_vae_encoder.h"
#include "core/host.h" /* h3_to_f32: bf16/f16 checkpoints are widened on the host */
#include "core/schedule.h"   /* h3_noise */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PHASE "video_encode"

_Static_assert(H3_VENC_UNTILED == H3_VIDEO_UNTILED, "flag values differ");

/* ImageNet statistics, as MiniMaxH3ModularPipeline.pixel_mean / pixel_std declare them. */
static const float k_pixel_mean[3] = {0.485f, 0.456f, 0.406f};
static const float k_pixel_std[3] = {0.229f, 0.224f, 0.225f};

/* ---- config ----------------------------------------------------------------------------- */

static int cfg_ints(const h3_json *d, const h3j *obj, const char *path, const char *key, int *out, int lo, int hi)
{
    const h3j *a = h3j_get(d, obj, key);
    if (!a || a->type != H3J_ARR || a->len < 1 || a->len > H3_VENC_MAX_LEVELS)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" must be an array of 1 to %d integers", path, key, H3_VENC_MAX_LEVELS);
    int i = 0;
    for (const h3j *x = h3j_first(d, a); x; x = h3j_next(d, x), i++) {
        if (x->type != H3J_NUM || !x->is_int || x->i < lo || x->i > hi)
            return h3_err(H3_E_FORMAT, "%s: \"%s\"[%d] must be an integer in [%d, %d]", path, key, i, lo, hi);
        out[i] = (int)x->i;
    }
    return i;
}

static int cfg_int(const h3_json *d, const h3j *obj, const char *path, const char *key, int def, int lo, int hi,
                   int *out)
{
    int64_t v;
    if (h3_cfg_int(d, obj, &v, key, (const char *)NULL) != 0) {
        if (h3j_get(d, obj, key)) return h3_err(H3_E_FORMAT, "%s: \"%s\" must be an integer", path, key);
        if (def < 0) return h3_err(H3_E_FORMAT, "%s: missing \"%s\"", path, key);
        v = def;
    }
    if (v < lo || v > hi) return h3_err(H3_E_FORMAT, "%s: \"%s\" %lld is outside [%d, %d]", path, key, (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

/* A flag of the original config that must be true (or absent) for this encoder to be the one
   described: isolated per-frame norms, a causal 3-D encoder. */
static int cfg_true(const h3_json *d, const h3j *obj, const char *path, const char *key)
{
    const h3j *v = h3j_get(d, obj, key);
    if (v && v->type != H3J_TRUE)
        return h3_err(H3_E_UNSUPPORTED, "%s: \"%s\" is not true: only the causal 3-D encoder with per-frame "
                      "GroupNorm is implemented", path, key);
    return 0;
}

int h3_venc_cfg_load(h3_model *m, h3_venc_cfg *c)
{
    int rc = h3_model_require(m, H3_COMP_VIDEO_VAE, "video encoding");
    if (rc) return rc;
    h3_vvae_cfg v;
    if ((rc = h3_vvae_cfg_load(m, &v))) return rc;
    memset(c, 0, sizeof *c);
    c->latent_ch = v.latent_ch;
    c->clip_length = v.clip_length, c->token_drop = v.token_drop;
    c->tile_size = v.tile_size, c->tile_overlap = v.tile_overlap;
    memcpy(c->latents_mean, v.latents_mean, sizeof c->latents_mean);
    memcpy(c->latents_std, v.latents_std, sizeof c->latents_std);

    h3_comp *k = &m->comp[H3_COMP_VIDEO_VAE];
    const h3_json *s = &k->config2;
    const h3j *sr = h3j_root(s);
    char sp[1024];
    snprintf(sp, sizeof sp, "%s/config.json", k->weights_dir);
    int ch, mult[H3_VENC_MAX_LEVELS], n1, n2, n3;
    if ((rc = cfg_int(s, sr, sp, "in_channels", 3, 1, 64, &c->in_ch)) ||
        (rc = cfg_int(s, sr, sp, "ch", -1, 1, 1 << 16, &ch)) ||
        (rc = cfg_int(s, sr, sp, "num_res_blocks", -1, 1, 64, &c->res_blocks)) ||
        (rc = cfg_int(s, sr, sp, "norm_num_groups", 32, 1, 1 << 16, &c->groups)) ||
        (rc = cfg_true(s, sr, sp, "use_3d_conv")) || (rc = cfg_true(s, sr, sp, "use_t_isolated_gn")) ||
        (rc = cfg_true(s, sr, sp, "causal_encoder")))
        return rc;
    if ((n1 = cfg_ints(s, sr, sp, "ch_mult", mult, 1, 1 << 10)) < 0) return n1;
    if ((n2 = cfg_ints(s, sr, sp, "space_down", c->space, 1, 16)) < 0) return n2;
    if ((n3 = cfg_ints(s, sr, sp, "time_down", c->time, 1, 16)) < 0) return n3;
    if (n1 != n2 || n1 != n3)
        return h3_err(H3_E_FORMAT, "%s: ch_mult, space_down and time_down have %d, %d and %d levels", sp, n1, n2, n3);
    c->levels = n1;
    c->spatial = c->temporal = 1;
    for (int l = 0; l < c->levels; l++) {
        c->ch[l] = ch * mult[l];
        if (c->ch[l] > (1 << 16) || c->ch[l] % c->groups)
            return h3_err(H3_E_FORMAT, "%s: level %d has %d channels, not a multiple of norm_num_groups %d", sp, l,
                          c->ch[l], c->groups);
        c->spatial *= c->space[l], c->temporal *= c->time[l];
    }
    if (c->spatial != v.spatial || c->temporal != v.temporal)
        return h3_err(H3_E_FORMAT, "%s: the encoder compresses %dx (space) and %dx (time), the config says %d and %d",
                      sp, c->spatial, c->temporal, v.spatial, v.temporal);
    c->eps = 1e-6;
    if (h3j_get(s, sr, "norm_eps") && (h3_cfg_num(s, sr, &c->eps, "norm_eps", (const char *)NULL) || !(c->eps >= 0) ||
                                       c->eps > 1))
        return h3_err(H3_E_FORMAT, "%s: \"norm_eps\" must be a number in [0, 1]", sp);
    const h3j *pm = h3j_get(s, sr, "padding_mode");
    if (pm && (pm->type != H3J_STR || strcmp(h3j_str(s, pm), "reflect") != 0))
        return h3_err(H3_E_UNSUPPORTED, "%s: padding_mode must be \"reflect\" (the released encoder's); other "
                      "modes are not implemented", sp);
    if (c->in_ch != 3)
        return h3_err(H3_E_UNSUPPORTED, "%s: in_channels %d: the encoder takes RGB (3 channels)", sp, c->in_ch);
    return 0;
}

/* ---- geometry --------------------------------------------------------------------------- */

/* diffusers `_split_tiles` (pixels): the fewest `tile`-pixel tiles covering `length` with overlaps
   of at least `min_ov`, the slack spread round-robin in whole `ratio` steps. Returns the count;
   with start/ov non-NULL, writes n starts and n - 1 overlaps. */
static int split_tiles(int length, int tile, int min_ov, int ratio, int *start, int *ov)
{
    if (tile >= length) {
        if (start) start[0] = 0;
        return 1;
    }
    int n = (length + tile - 1) / tile;
    while ((int64_t)tile * n - (int64_t)min_ov * (n - 1) - length < 0) n++;
    if (start) {
        for (int i = 0; i < n - 1; i++) ov[i] = min_ov;
        int64_t remaining = (int64_t)tile * n - (int64_t)min_ov * (n - 1) - length;
        for (int64_t i = 0; i < remaining / ratio; i++) ov[i % (n - 1)] += ratio;
        start[0] = 0;
        for (int i = 0; i < n - 1; i++) start[i + 1] = start[i] + tile - ov[i];
    }
    return n;
}

/* A 3x3x3 causal convolution with reflect padding 1 (conv_in, the ResNet convs, conv_out), or the
   downsampler's (no padding but one reflected row and column at the bottom and right when the
   spatial stride is 2). `spatial`: the one-frame encoder, only the last temporal tap. */
static h3_bconv3d conv_geom(int T, int H, int W, int cin, int cout, bool spatial, bool down, int st, int s)
{
    h3_bconv3d g = {T, H, W, cin, cout, spatial ? 1 : 3, 3, 3, spatial ? 1 : st, s, s, spatial ? 0 : 2, 1, 1, 1, 1};
    if (down) g.pad_top = g.pad_left = 0, g.pad_bottom = g.pad_right = s == 2;
    return g;
}

typedef struct {
    int T, H, W; /* latent frames and grid */
    int64_t max_el; /* largest activation (floats) */
} tile_geom;

/* ---- weights ---------------------------------------------------------------------------- */

typedef struct {
    h3_bw w;
    const float *b;
    int cin, cout;
} venc_conv;

typedef struct {
    const float *n1w, *n1b, *n2w, *n2b;
    venc_conv c1, c2, sc;
    bool has_sc;
} venc_res;

typedef struct {
    h3_venc_cfg cfg;
    h3_backend *be;
    h3_store *store;
    bool spatial;
    venc_conv conv_in, conv_out, quant, down[H3_VENC_MAX_LEVELS];
    bool has_down[H3_VENC_MAX_LEVELS];
    const float *now, *nob;
    venc_res *res; /* [levels][res_blocks] */
    void **host;   /* reordered f32 weights the CPU views in place */
    int nhost;
    void **dev;    /* backend copies of the vectors */
    int ndev;
} venc_model;

static int track(void ***list, int *n, void *p)
{
    void **l = realloc(*list, sizeof(void *) * (size_t)(*n + 1));
    if (!l) return h3_err(H3_E_NOMEM, "out of memory");
    *list = l;
    l[(*n)++] = p;
    return 0;
}

static void conv_free(venc_model *M, venc_conv *c)
{
    if (c->w.data || c->w.priv) M->be->weights->weight_free(M->be, &c->w);
}

static void venc_free(venc_model *M)
{
    if (M->be) {
        conv_free(M, &M->conv_in), conv_free(M, &M->conv_out), conv_free(M, &M->quant);
        for (int l = 0; l < M->cfg.levels; l++) conv_free(M, &M->down[l]);
        for (int i = 0; M->res && i < M->cfg.levels * M->cfg.res_blocks; i++) {
            conv_free(M, &M->res[i].c1), conv_free(M, &M->res[i].c2), conv_free(M, &M->res[i].sc);
        }
        for (int i = 0; i < M->ndev; i++) M->be->mem->release(M->be, M->dev[i]);
    }
    for (int i = 0; i < M->nhost; i++) h3_free_aligned(M->host[i]);
    free(M->host);
    free(M->dev);
    free(M->res);
    if (M->store) h3_store_release(M->store);
    memset(M, 0, sizeof *M);
}

/* A float tensor of the given shape as f32 in a fresh aligned host buffer (the mapping may be
   misaligned and in bf16/f16). */
static float *tensor_f32(venc_model *M, const char *name, int ndim, const int64_t *shape)
{
    h3_dtype dt;
    const void *src = h3_store_get_float(M->store, name, ndim, shape, &dt);
    if (!src) return NULL;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    float *dst = h3_alloc_aligned(sizeof(float) * (n ? n : 1));
    if (!dst) {
        h3_err(H3_E_NOMEM, "out of memory reading '%s'", name);
        return NULL;
    }
    if (dt == H3_DT_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else {
        uint16_t *tmp = h3_alloc_aligned(sizeof(uint16_t) * (n ? n : 1));
        if (!tmp) {
            h3_free_aligned(dst);
            h3_err(H3_E_NOMEM, "out of memory reading '%s'", name);
            return NULL;
        }
        memcpy(tmp, src, n * sizeof(uint16_t));
        h3_to_f32(tmp, dt, dst, (int64_t)n);
        h3_free_aligned(tmp);
    }
    return dst;
}

/* A vector parameter [n] in backend memory. */
static const float *vec(venc_model *M, const char *name, int64_t n)
{
    float *h = tensor_f32(M, name, 1, &n);
    if (!h) return NULL;
    float *d = h3_backend_dup(M->be, h, sizeof(float) * (size_t)n);
    h3_free_aligned(h);
    if (!d || track(&M->dev, &M->ndev, d)) {
        if (d) M->be->mem->release(M->be, d);
        return NULL;
    }
    return d;
}

/* Convolution `pre`.weight [cout, cin, k, k, k] (+ bias) as a conv3d / linear weight: columns in
   (dt, dy, dx, c) order; in the one-frame encoder only the last temporal tap (dt = k - 1), the
   one that meets the frame behind the two causal zero frames. An f32 checkpoint is read straight
   from the mapping (which may be misaligned: element copies), others are widened first. */
static int conv_load(venc_model *M, const char *pre, int cin, int cout, int k, venc_conv *cv)
{
    char n[192];
    snprintf(n, sizeof n, "%s.weight", pre);
    const int64_t shape[5] = {cout, cin, k, k, k};
    h3_dtype dt;
    const void *src = h3_store_get_float(M->store, n, 5, shape, &dt);
    if (!src) return -H3_E_SCHEMA;
    float *wide = NULL;
    if (dt != H3_DT_F32 && !(wide = tensor_f32(M, n, 5, shape))) return -H3_E_NOMEM;
    const unsigned char *w = wide ? (const unsigned char *)wide : src;
    const int t0 = M->spatial ? k - 1 : 0, kt = k - t0, kk = k * k, taps = kt * kk;
    const int64_t K = (int64_t)taps * cin, per_c = (int64_t)k * kk;
    float *r = h3_alloc_aligned(sizeof(float) * (size_t)(K * cout));
    if (!r) {
        h3_free_aligned(wide);
        return h3_err(H3_E_NOMEM, "out of memory reordering '%s'", n);
    }
    /* Row o: torch's [cin][k][k][k] -> ours [tap][cin]; a row (at most a few hundred KB) stays in
       cache while it is transposed. */
    for (int o = 0; o < cout; o++) {
        const unsigned char *wo = w + sizeof(float) * (size_t)((int64_t)o * cin * per_c);
        float *ro = r + (int64_t)o * K;
        for (int c = 0; c < cin; c++)
            for (int t = 0; t < taps; t++)
                memcpy(ro + (int64_t)t * cin + c, wo + sizeof(float) * (size_t)(c * per_c + t0 * kk + t), sizeof(float));
    }
    h3_free_aligned(wide);
    int rc = track(&M->host, &M->nhost, r);
    if (rc) {
        h3_free_aligned(r);
        return rc;
    }
    if ((rc = M->be->weights->weight_load(M->be, r, H3_DT_F32, cout, K, &cv->w))) return rc;
    snprintf(n, sizeof n, "%s.bias", pre);
    if (!(cv->b = vec(M, n, cout))) return -H3_E_SCHEMA;
    cv->cin = cin, cv->cout = cout;
    return 0;
}

static int venc_load(h3_model *m, h3_backend *be, bool spatial, venc_model *M)
{
    memset(M, 0, sizeof *M);
    M->be = be;
    M->spatial = spatial;
    int rc;
    if ((rc = h3_venc_cfg_load(m, &M->cfg)) || (rc = h3_model_headers(m, H3_COMP_VIDEO_VAE))) return rc;
    M->store = &m->comp[H3_COMP_VIDEO_VAE].store;
    if (!h3_store_find(M->store, "encoder.conv_in.weight")) {
        h3_err(H3_E_SCHEMA, "model has no video VAE encoder weights (%s holds no encoder.conv_in.weight; encoding "
               "images or videos needs them)", M->store->nfiles ? M->store->files[0].path : "video_vae");
        M->store = NULL; /* nothing mapped */
        return -H3_E_SCHEMA;
    }
    const h3_venc_cfg *c = &M->cfg;
    M->res = calloc((size_t)(c->levels * c->res_blocks), sizeof(venc_res));
    if (!M->res) return h3_err(H3_E_NOMEM, "out of memory");
    const int L2 = 2 * c->latent_ch;
    char pre[160];
    if ((rc = conv_load(M, "encoder.conv_in", c->in_ch, c->ch[0], 3, &M->conv_in))) goto fail;
    for (int l = 0; l < c->levels; l++) {
        for (int b = 0; b < c->res_blocks; b++) {
            venc_res *r = &M->res[l * c->res_blocks + b];
            const int cin = b == 0 ? (l == 0 ? c->ch[0] : c->ch[l - 1]) : c->ch[l], cout = c->ch[l];
#define P(suffix) (snprintf(pre, sizeof pre, "encoder.down.%d.block.%d.%s", l, b, suffix), pre)
            rc = -H3_E_SCHEMA;
            if (!(r->n1w = vec(M, P("norm1.weight"), cin)) || !(r->n1b = vec(M, P("norm1.bias"), cin)) ||
                !(r->n2w = vec(M, P("norm2.weight"), cout)) || !(r->n2b = vec(M, P("norm2.bias"), cout)))
                goto fail;
            if ((rc = conv_load(M, P("conv1"), cin, cout, 3, &r->c1)) ||
                (rc = conv_load(M, P("conv2"), cout, cout, 3, &r->c2)))
                goto fail;
            if ((r->has_sc = cin != cout) && (rc = conv_load(M, P("nin_shortcut"), cin, cout, 1, &r->sc))) goto fail;
#undef P
        }
        if ((M->has_down[l] = c->space[l] * c->time[l] > 1)) {
            snprintf(pre, sizeof pre, "encoder.down.%d.downsample.conv", l);
            if ((rc = conv_load(M, pre, c->ch[l], c->ch[l], 3, &M->down[l]))) goto fail;
        }
    }
    rc = -H3_E_SCHEMA;
    if (!(M->now = vec(M, "encoder.norm_out.weight", c->ch[c->levels - 1])) ||
        !(M->nob = vec(M, "encoder.norm_out.bias", c->ch[c->levels - 1])))
        goto fail;
    if ((rc = conv_load(M, "encoder.conv_out", c->ch[c->levels - 1], L2, 3, &M->conv_out)) ||
        (rc = conv_load(M, "quant_conv", L2, L2, 1, &M->quant)))
        goto fail;
    return 0;
fail:
    h3_err_prefix("video VAE encoder");
    venc_free(M);
    return rc;
}

/* ---- one tile through the encoder ------------------------------------------------------- */

/* One walk through the network serves two purposes: with M == NULL it only follows the shapes,
   checks that every reflect pad fits and measures the largest activation (the plan); with the
   model it runs the ops. */
typedef struct {
    const h3_venc_cfg *c;
    const venc_model *M; /* NULL: measure and validate only */
    h3_backend *be;
    bool spatial;
    int th, tw;          /* the tile in pixels, for messages */
    float *X, *A, *B;    /* activations, each max_el floats (unused when measuring) */
    float *out;          /* after a run: the tile's moments [T][h][w][2C] (one of X, A, B) */
    int64_t max_el;
} venc_pass;

static h3_bt f32v(float *p, int64_t rows, int64_t cols) { return h3_bt_make(p, H3_DT_F32, rows, cols, cols); }

static void grow(venc_pass *p, int64_t el)
{
    if (el > p->max_el) p->max_el = el;
}

static int pass_conv(venc_pass *p, const venc_conv *cv, const h3_bconv3d *g, const float *in, float *out, int level)
{
    int To, Ho, Wo;
    h3_bconv3d_out(g, &To, &Ho, &Wo);
    if (g->pad_top >= g->H || g->pad_bottom >= g->H || g->pad_left >= g->W || g->pad_right >= g->W || To < 1 ||
        Ho < 1 || Wo < 1)
        return h3_err(H3_E_INVALID, "video encode: a %dx%d-pixel tile is too small for the encoder (level %d works "
                      "on %dx%d pixels, too few for its 3x3 convolutions and their reflect padding)",
                      p->tw, p->th, level, g->W, g->H);
    grow(p, (int64_t)To * Ho * Wo * g->cout);
    if (!p->M) return 0;
    return p->be->dec->conv3d(p->be, in, g, &cv->w, cv->b, out);
}

static int pass_norm(venc_pass *p, const float *x, int T, int64_t pixels, int C, const float *w, const float *b,
                     float *y)
{
    if (!p->M) return 0;
    return p->be->dec->group_norm(p->be, x, T, pixels, C, p->c->groups, w, b, (float)p->c->eps, true, y);
}

/* The tile `in` ([T][H][W][3] in backend memory) -> moments in p->out; the latent shape in *geo. */
static int pass_tile(venc_pass *p, const float *in, int T, int H, int W, tile_geom *geo)
{
    const h3_venc_cfg *c = p->c;
    const venc_model *M = p->M;
    const h3_backend_ops *o = p->be ? p->be->ops : NULL;
    float *X = p->X, *A = p->A, *B = p->B, *t;
    int rc, C = c->ch[0];
    h3_bconv3d g = conv_geom(T, H, W, c->in_ch, C, p->spatial, false, 1, 1);
    if ((rc = pass_conv(p, M ? &M->conv_in : NULL, &g, in, X, 0))) return rc;
    for (int l = 0; l < c->levels; l++) {
        for (int b = 0; b < c->res_blocks; b++) {
            const venc_res *r = M ? &M->res[l * c->res_blocks + b] : NULL;
            const int cout = c->ch[l];
            const int64_t px = (int64_t)H * W, rows = T * px;
            grow(p, rows * (C > cout ? C : cout));
            /* h = conv1(silu(norm1(x))); h = conv2(silu(norm2(h))); x = shortcut(x) + h */
            if ((rc = pass_norm(p, X, T, px, C, r ? r->n1w : NULL, r ? r->n1b : NULL, A))) return rc;
            g = conv_geom(T, H, W, C, cout, p->spatial, false, 1, 1);
            if ((rc = pass_conv(p, r ? &r->c1 : NULL, &g, A, B, l)) ||
                (rc = pass_norm(p, B, T, px, cout, r ? r->n2w : NULL, r ? r->n2b : NULL, B)))
                return rc;
            g = conv_geom(T, H, W, cout, cout, p->spatial, false, 1, 1);
            if ((rc = pass_conv(p, r ? &r->c2 : NULL, &g, B, A, l))) return rc;
            if (M) {
                /* The sum is commutative in floating point: A + B has torch's residual + h bits. */
                const h3_bt y = f32v(A, rows, cout), xs = f32v(X, rows, C), sc = f32v(B, rows, cout);
                if (r->has_sc && ((rc = o->linear(p->be, &xs, &r->sc.w, r->sc.b, &sc)) ||
                                  (rc = o->add_div(p->be, &y, &sc, 1.0f))))
                    return rc;
                if (!r->has_sc && (rc = o->add_div(p->be, &y, &xs, 1.0f))) return rc;
            }
            t = X, X = A, A = t;
            C = cout;
        }
        if (c->space[l] * c->time[l] > 1) {
            g = conv_geom(T, H, W, C, C, p->spatial, true, c->time[l], c->space[l]);
            if ((rc = pass_conv(p, M ? &M->down[l] : NULL, &g, X, A, l))) return rc;
            h3_bconv3d_out(&g, &T, &H, &W);
            t = X, X = A, A = t;
        }
    }
    const int L2 = 2 * c->latent_ch;
    const int64_t px = (int64_t)H * W, rows = T * px;
    if ((rc = pass_norm(p, X, T, px, C, M ? M->now : NULL, M ? M->nob : NULL, A))) return rc;
    g = conv_geom(T, H, W, C, L2, p->spatial, false, 1, 1);
    if ((rc = pass_conv(p, M ? &M->conv_out : NULL, &g, A, B, c->levels - 1))) return rc;
    if (M) {
        const h3_bt x = f32v(B, rows, L2), y = f32v(X, rows, L2);
        if ((rc = o->linear(p->be, &x, &M->quant.w, M->quant.b, &y))) return rc;
    }
    p->out = X;
    geo->T = T, geo->H = H, geo->W = W;
    return 0;
}

/* ---- plan ------------------------------------------------------------------------------- */

typedef struct {
    int T, H, W;        /* input */
    int Tc, clips, Tlc; /* frames per clip, clips, latent frames per clip */
    int Tl, Hl, Wl;     /* output */
    bool spatial;       /* one-frame clips: the spatial encoder */
    int ny, nx;
    int *y0, *x0, *ovy, *ovx; /* tile starts and overlaps, pixels (overlap i: tiles i and i + 1) */
    int *th, *tw, *lh, *lw;   /* tile rows' / columns' pixel and latent sizes */
    int64_t max_el, max_in;   /* largest activation and largest input tile, floats */
} venc_plan;

static void plan_free(venc_plan *p)
{
    free(p->y0);
    memset(p, 0, sizeof *p);
}

static int plan_make(const h3_venc_cfg *c, int T, int H, int W, int tile_px, int overlap_px, unsigned flags,
                     venc_plan *p)
{
    memset(p, 0, sizeof *p);
    if (T < 1 || H < 1 || W < 1 || T > (1 << 16) || H > (1 << 15) || W > (1 << 15))
        return h3_err(H3_E_INVALID, "video encode: impossible input shape %d frames of %dx%d pixels", T, W, H);
    if (flags & ~H3_VENC_UNTILED) return h3_err(H3_E_INVALID, "video encode: unknown flags 0x%x", flags);
    if (tile_px < 0 || overlap_px < 0)
        return h3_err(H3_E_INVALID, "video encode: negative tile size %d or overlap %d", tile_px, overlap_px);
    p->T = T, p->H = H, p->W = W;
    /* `_encode`: one frame is one clip; more are clip_length-frame clips. */
    p->Tc = T == 1 ? 1 : c->clip_length;
    p->clips = T == 1 ? 1 : (T + c->clip_length - 1) / c->clip_length;
    p->spatial = p->Tc == 1;
    const int tile = tile_px ? tile_px : c->tile_size, ov = overlap_px ? overlap_px : c->tile_overlap;
    const int ratio = c->spatial;
    if (flags & H3_VENC_UNTILED) {
        p->ny = p->nx = 1;
    } else {
        if (tile % ratio || ov % ratio || tile > (1 << 16) || ov < ratio)
            return h3_err(H3_E_INVALID, "video encode: tile size %d and overlap %d must be multiples of %d pixels "
                          "(the overlap at least one)", tile, ov, ratio);
        if (ov >= tile)
            return h3_err(H3_E_INVALID, "video encode: tile overlap %d must be smaller than the tile size %d", ov,
                          tile);
        p->ny = split_tiles(H, tile, ov, ratio, NULL, NULL);
        p->nx = split_tiles(W, tile, ov, ratio, NULL, NULL);
    }
    int *buf = calloc((size_t)(6 * (p->ny + p->nx)), sizeof(int));
    if (!buf) return h3_err(H3_E_NOMEM, "video encode: out of memory planning %d x %d tiles", p->ny, p->nx);
    p->y0 = buf, p->ovy = buf + p->ny, p->th = buf + 2 * p->ny, p->lh = buf + 3 * p->ny;
    int *xb = buf + 4 * p->ny;
    p->x0 = xb, p->ovx = xb + p->nx, p->tw = xb + 2 * p->nx, p->lw = xb + 3 * p->nx;
    if (flags & H3_VENC_UNTILED) {
        p->th[0] = H, p->tw[0] = W;
    } else {
        split_tiles(H, tile, ov, ratio, p->y0, p->ovy);
        split_tiles(W, tile, ov, ratio, p->x0, p->ovx);
        /* A tile is the slice x[y0 : y0 + tile]: the last one may stop at the frame's edge. */
        for (int i = 0; i < p->ny; i++) p->th[i] = H - p->y0[i] < tile ? H - p->y0[i] : tile;
        for (int j = 0; j < p->nx; j++) p->tw[j] = W - p->x0[j] < tile ? W - p->x0[j] : tile;
    }
    /* Every tile's latent shape and activations (a dry walk each: arithmetic only). */
    int rc = 0;
    for (int i = 0; i < p->ny && !rc; i++)
        for (int j = 0; j < p->nx && !rc; j++) {
            venc_pass ps = {.c = c, .spatial = p->spatial, .th = p->th[i], .tw = p->tw[j]};
            tile_geom g;
            if (!(rc = pass_tile(&ps, NULL, p->Tc, p->th[i], p->tw[j], &g))) {
                p->lh[i] = g.H, p->lw[j] = g.W, p->Tlc = g.T;
                if (ps.max_el > p->max_el) p->max_el = ps.max_el;
            }
        }
    if (rc) {
        plan_free(p);
        return rc;
    }
    p->max_in = (int64_t)p->Tc * p->th[0] * p->tw[0] * c->in_ch;
    /* `_stitch_tiles`: every tile but the last of an axis loses its overlap (overlap // ratio latents). */
    for (int i = 0; i < p->ny; i++) {
        const int cut = i + 1 < p->ny ? p->ovy[i] / ratio : 0;
        if (p->lh[i] <= cut) rc = h3_err(H3_E_INVALID, "video encode: tiles of %d latent rows cannot lose an overlap "
                                         "of %d", p->lh[i], cut);
        p->Hl += p->lh[i] - cut;
    }
    for (int j = 0; j < p->nx; j++) {
        const int cut = j + 1 < p->nx ? p->ovx[j] / ratio : 0;
        if (p->lw[j] <= cut) rc = h3_err(H3_E_INVALID, "video encode: tiles of %d latent columns cannot lose an "
                                         "overlap of %d", p->lw[j], cut);
        p->Wl += p->lw[j] - cut;
    }
    /* `_encode` drops the last token_drop latent frames of a multi-frame encode. */
    p->Tl = T == 1 ? p->Tlc : p->clips * p->Tlc - c->token_drop;
    if (!rc && p->Tl < 1)
        rc = h3_err(H3_E_INVALID, "video encode: %d frames give %d latent frames per %d-frame clip, all dropped by "
                    "vae_token_drop %d", T, p->Tlc, p->Tc, c->token_drop);
    if (rc) plan_free(p);
    return rc;
}

int h3_venc_shape(const h3_venc_cfg *c, int T, int H, int W, int tile_px, int overlap_px, unsigned flags, int *C,
                  int *Tl, int *h, int *w)
{
    venc_plan p;
    int rc = plan_make(c, T, H, W, tile_px, overlap_px, flags, &p);
    if (rc) return rc;
    if (C) *C = c->latent_ch;
    if (Tl) *Tl = p.Tl;
    if (h) *h = p.Hl;
    if (w) *w = p.Wl;
    plan_free(&p);
    return 0;
}

/* ---- stitching (host) ------------------------------------------------------------------- */

static int min3(int a, int b, int c)
{
    int m = a < b ? a : b;
    return m < c ? m : c;
}

/* `_blend` at distance q into an overlap of n: a * (1 - q/n) + b * (q/n) in float32, the weights
   and each product rounded before the sum, as torch evaluates it. */
static inline float blend(float a, float b, int q, int n)
{
    const float w = (float)q / (float)n;
    const float wa = 1.0f - w;
    const float pa = a * wa, pb = b * w;
    return pa + pb;
}

/* Write clip `clip`'s tiles (host, [Tlc][lh][lw][2C] each) into mean / logvar as `_stitch_tiles`
   composes them: a tile's top rows blended with the original tile above, then its left columns
   with the original tile to the left; every tile but an axis' last loses its overlap. Latent
   frames past Tl (token_drop) are dropped; the log-variance is clamped to [-30, 20] (NaN stays,
   as torch.clamp keeps it). */
static void stitch(const h3_venc_cfg *c, const venc_plan *p, float *const *tiles, int clip, float *mean,
                   float *logvar)
{
    const int L = c->latent_ch, L2 = 2 * L, ratio = c->spatial;
    const int64_t plane = (int64_t)p->Hl * p->Wl, cs = (int64_t)p->Tl * plane;
    int Y = 0;
    for (int i = 0; i < p->ny; i++) {
        const int hi = p->lh[i], own_h = hi - (i + 1 < p->ny ? p->ovy[i] / ratio : 0);
        const int hu = i > 0 ? p->lh[i - 1] : 0, ey = i > 0 ? min3(hu, hi, p->ovy[i - 1] / ratio) : 0;
        int X = 0;
        for (int j = 0; j < p->nx; j++) {
            const int wj = p->lw[j], own_w = wj - (j + 1 < p->nx ? p->ovx[j] / ratio : 0);
            const int wl = j > 0 ? p->lw[j - 1] : 0, ex = j > 0 ? min3(wl, wj, p->ovx[j - 1] / ratio) : 0;
            const float *tl = tiles[i * p->nx + j];
            const float *up = i > 0 ? tiles[(i - 1) * p->nx + j] : NULL, *lf = j > 0 ? tiles[i * p->nx + j - 1] : NULL;
            for (int f = 0; f < p->Tlc && clip * p->Tlc + f < p->Tl; f++) {
                const int64_t gf = (int64_t)clip * p->Tlc + f;
                for (int y = 0; y < own_h; y++)
                    for (int x = 0; x < own_w; x++) {
                        const float *v = tl + (((int64_t)f * hi + y) * wj + x) * L2;
                        const float *a = y < ey ? up + (((int64_t)f * hu + hu - ey + y) * wj + x) * L2 : NULL;
                        const float *l = x < ex ? lf + (((int64_t)f * hi + y) * wl + wl - ex + x) * L2 : NULL;
                        const int64_t o = gf * plane + (int64_t)(Y + y) * p->Wl + X + x;
                        for (int ch = 0; ch < L2; ch++) {
                            float val = v[ch];
                            if (a) val = blend(a[ch], val, y, ey);
                            if (l) val = blend(l[ch], val, x, ex);
                            if (ch < L) {
                                if (mean) mean[ch * cs + o] = val;
                            } else if (logvar) {
                                logvar[(ch - L) * cs + o] = val < -30.0f ? -30.0f : val > 20.0f ? 20.0f : val;
                            }
                        }
                    }
            }
            X += own_w;
        }
        Y += own_h;
    }
}

/* ---- encode ----------------------------------------------------------------------------- */

static size_t up16(int64_t n) { return ((size_t)n + 15) & ~(size_t)15; }

static int run_encode(const venc_model *M, h3_backend *be, const venc_plan *P, const float *pixels, float *mean,
                      float *logvar, h3_progress_fn progress, void *user)
{
    const h3_venc_cfg *c = &M->cfg;
    static const h3_op need[] = {H3_OP_conv3d, H3_OP_group_norm, H3_OP_channels_last, H3_OP_add_div};
    int nrc = h3_backend_need(be, need, (int)(sizeof need / sizeof *need), "the video VAE encoder");
    if (nrc) return nrc;
    const int L2 = 2 * c->latent_ch, ntiles = P->ny * P->nx;
    size_t host_n = 0;
    for (int i = 0; i < P->ny; i++)
        for (int j = 0; j < P->nx; j++) host_n += (size_t)P->Tlc * P->lh[i] * P->lw[j] * L2;
    float *hbuf = h3_malloc(sizeof(float) * host_n), **tiles = h3_calloc((size_t)ntiles, sizeof(float *));
    /* Backend workspace: the input tile and three activations of the largest size. */
    const size_t nin = up16(P->max_in), nel = up16(P->max_el);
    float *ws = hbuf && tiles ? be->mem->alloc(be, sizeof(float) * (nin + 3 * nel)) : NULL;
    if (!ws) {
        free(hbuf), free(tiles);
        return -H3_E_NOMEM;
    }
    size_t off = 0;
    for (int t = 0; t < ntiles; t++) {
        tiles[t] = hbuf + off;
        off += (size_t)P->Tlc * P->lh[t / P->nx] * P->lw[t % P->nx] * L2;
    }
    float *in = ws, *X = ws + nin, *A = X + nel, *B = A + nel;
    const float one[3] = {1.0f, 1.0f, 1.0f}, zero[3] = {0.0f, 0.0f, 0.0f}; /* channels_last: x * 1 + 0 = x */
    const int64_t plane = (int64_t)P->H * P->W;
    const int total = P->clips * ntiles;
    int done = 0, rc = h3_progress_check(progress, user, PHASE, 0, total);
    for (int k = 0; k < P->clips && !rc; k++) {
        for (int t = 0; t < ntiles && !rc; t++) {
            const int i = t / P->nx, j = t % P->nx, th = P->th[i], tw = P->tw[j];
            /* The clip's frames of the tile, channel-last; a short last clip repeats its last frame. */
            const float *box = pixels + (int64_t)k * P->Tc * plane + (int64_t)P->y0[i] * P->W + P->x0[j];
            const h3_bt tin = h3_bt_make(in, H3_DT_F32, (int64_t)P->Tc * th * tw, c->in_ch, c->in_ch);
            venc_pass ps = {.c = c, .M = M, .be = be, .spatial = P->spatial, .th = th, .tw = tw, .X = X, .A = A, .B = B};
            tile_geom g;
            if ((rc = be->dec->channels_last(be, box, (int64_t)P->T * plane, plane, P->W, P->Tc, P->T - k * P->Tc, th,
                                             tw, one, zero, &tin)) ||
                (rc = pass_tile(&ps, in, P->Tc, th, tw, &g)))
                break;
            if (g.T != P->Tlc || g.H != P->lh[i] || g.W != P->lw[j]) { /* the plan walked the same network */
                rc = h3_err(H3_E_INVALID, "video encode: internal shape mismatch in tile %d", t);
                break;
            }
            if ((rc = be->mem->download(be, tiles[t], ps.out, sizeof(float) * (size_t)g.T * g.H * g.W * L2))) break;
            rc = h3_progress_check(progress, user, PHASE, ++done, total);
        }
        if (!rc) stitch(c, P, tiles, k, mean, logvar);
    }
    be->mem->release(be, ws);
    free(hbuf), free(tiles);
    return rc;
}

static int encode(h3_model *m, h3_backend *be, const venc_plan *P, const float *pixels, float *mean, float *logvar,
                  h3_progress_fn progress, void *user)
{
    venc_model M;
    int rc = venc_load(m, be, P->spatial, &M);
    if (rc) return rc;
    rc = run_encode(&M, be, P, pixels, mean, logvar, progress, user);
    venc_free(&M); /* releases the mapping: the weights live for this call only */
    return rc;
}

int h3_venc_run(h3_model *m, h3_backend *be, const h3_venc_request *rq)
{
    if (!rq->pixels) return h3_err(H3_E_INVALID, "video encode: NULL pixels");
    if (!rq->mean && !rq->logvar) return h3_err(H3_E_INVALID, "video encode: no output buffer given");
    h3_venc_cfg cfg;
    venc_plan P;
    int rc;
    if ((rc = h3_venc_cfg_load(m, &cfg)) ||
        (rc = plan_make(&cfg, rq->T, rq->H, rq->W, rq->tile_px, rq->overlap_px, rq->flags, &P)))
        return rc;
    rc = encode(m, be, &P, rq->pixels, rq->mean, rq->logvar, rq->progress, rq->user);
    plan_free(&P);
    return rc;
}

/* ---- the condition latent of encode_vae_condition --------------------------------------- */

/* f32 -> f16 -> f32, round to nearest even: torch's .to(torch.float16).float(). Overflow gives
   +-inf (65520 and up), NaN stays NaN, subnormal halves are kept. */
static float round_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t a = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
    if (a >= 0x7F800000u) return f;
    if (a >= 0x477FF000u) return sign ? -INFINITY : INFINITY;
    if (a < 0x38800000u) { /* below 2^-14: multiples of 2^-24, the products exact */
        const float q = rintf(fabsf(f) * 16777216.0f) / 16777216.0f;
        return sign ? -q : q;
    }
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    r &= ~0x1FFFu;
    r |= sign;
    float out;
    memcpy(&out, &r, 4);
    return out;
}

int h3_venc_condition(h3_model *m, h3_backend *be, const h3_venc_cond *rq)
{
    if (!rq->rgb || !rq->out) return h3_err(H3_E_INVALID, "video encode condition: NULL frames or output");
    h3_venc_cfg cfg;
    venc_plan P;
    int rc;
    if ((rc = h3_venc_cfg_load(m, &cfg)) || (rc = plan_make(&cfg, rq->T, rq->H, rq->W, 0, 0, 0, &P))) return rc;
    const int64_t npx = (int64_t)rq->T * rq->H * rq->W, n = (int64_t)cfg.latent_ch * P.Tl * P.Hl * P.Wl;
    float *pix = h3_malloc(sizeof(float) * (size_t)(3 * npx));
    float *mean = h3_malloc(sizeof(float) * (size_t)n), *logvar = h3_malloc(sizeof(float) * (size_t)n);
    float *eps = rq->eps ? NULL : h3_malloc(sizeof(float) * (size_t)n);
    if (!pix || !mean || !logvar || (!rq->eps && !eps)) {
        rc = -H3_E_NOMEM;
        goto done;
    }
    /* (rgb / 255 - mean) / std in float32, in torch's order: a true division by 255 (not a
       product with 1/255), then the subtraction, then a true division by the std. */
    for (int64_t p = 0; p < npx; p++)
        for (int ch = 0; ch < 3; ch++) {
            const float v = (float)rq->rgb[p * 3 + ch] / 255.0f;
            const float d = v - k_pixel_mean[ch];
            pix[ch * npx + p] = d / k_pixel_std[ch];
        }
    if ((rc = encode(m, be, &P, pix, mean, logvar, rq->progress, rq->user))) goto done;
    if (!rq->eps) h3_noise(rq->seed, rq->stream, 0, eps, n);
    const float *e = rq->eps ? rq->eps : eps;
    const int64_t cs = (int64_t)P.Tl * P.Hl * P.Wl;
    for (int64_t i = 0; i < n; i++) {
        const int ch = (int)(i / cs);
        const float half = 0.5f * logvar[i];
        const float std = expf(half);
        const float se = std * e[i];
        const float z = round_f16(mean[i] + se);
        const float d = z - cfg.latents_mean[ch];
        rq->out[i] = d / cfg.latents_std[ch];
    }
done:
    free(pix), free(mean), free(logvar), free(eps);
    plan_free(&P);
    return rc;
}
