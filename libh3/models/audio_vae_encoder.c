/*
 * Audio VAE encoder: diffusers' AutoencoderKLMiniMaxH3Audio.encode(sample).latent_dist.mode().
 * The autoencoder is mono: each channel of the input is its own batch item, encoded one after
 * the other (MiniMax-H3 passes a stereo reference as batch 2). Model logic only: every
 * computation on activations is a backend op (backend/backend.h).
 *
 * Data flow per channel (activations time-major [time, channels], as in audio_vae.c):
 *   zero-pad to a multiple of the hop -> WN conv k7 (1 -> dim0) -> per block: three residual
 *   units (Snake, WN conv k7 dilation 1/3/9, Snake, WN conv k1, + shortcut), Snake, WN conv
 *   k 2s stride s (channels doubled) -> Snake, WN conv k3 -> pre_block -> mean_proj.
 * pre_block (on rows [T, latent_dim]): h = proj(LN3 x) + attn(LN1 x); h += GeGLU(LN_mlp(LN2 h)).
 * attn: qkv (bias q_bias | zero_k_bias | v_bias), causal attention, the heads mean-pooled away,
 * adaptive_avg_pool1d of the head dimension to latent_channels, proj.
 *
 * Every convolution is conv_gemm over a zero-margined buffer whose rows overlap (no im2col
 * copy): a dilated one runs once per time phase, a strided one reads windows s rows apart. The
 * Snakes write straight into those buffers, zeros included.
 *
 * Weight norm is folded at load as torch.nn.utils.weight_norm (dim 0) computes it:
 * w = v * (g / ||v_o||) with the norm over each output channel's cin x k values.
 */
#include "models/audio_vae_encoder.h"

#include "core/host.h" /* h3_to_f32: BF16 encoder weights are widened on the host */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SAMPLES ((int64_t)1 << 32) /* ~37 hours at 32 kHz: every buffer size stays far inside int64 */
#define LN_EPS 1e-5f                    /* nn.LayerNorm's default, used by every pre_block norm */
#define N_RES 3                         /* residual units per block, dilations 1, 3, 9 */
static const int RES_DIL[N_RES] = {1, 3, 9};

/* ---- config ---------------------------------------------------------------------------- */

int h3_aenc_cfg_load(h3_model *m, h3_aenc_cfg *c)
{
    memset(c, 0, sizeof *c);
    int rc = h3_model_require(m, H3_COMP_AUDIO_VAE, "audio encoding");
    if (rc || (rc = h3_avae_cfg_load(m, &c->av))) return rc;
    h3_comp *k = &m->comp[H3_COMP_AUDIO_VAE];
    const h3_json *md = &k->config2;
    const h3j *kw = h3j_path(md, h3j_root(md), "metadata", "kwargs", NULL);
    char mp[1024];
    snprintf(mp, sizeof mp, "%s/metadata.json", k->dir);
    int64_t v;
    if (h3_cfg_int(md, kw, &v, "encoder_dim", (const char *)NULL) != 0 || v < 1 || v > 65536)
        return h3_err(H3_E_FORMAT, "%s: \"encoder_dim\" must be an integer in [1, 65536]", mp);
    c->dim0 = (int)v;
    c->heads = 8; /* the release's converter hard-codes 8 and writes nothing */
    if (h3_cfg_int(md, kw, &v, "num_attention_heads", (const char *)NULL) == 0) {
        if (v < 1 || v > 1024) return h3_err(H3_E_FORMAT, "%s: \"num_attention_heads\" = %lld is out of range", mp, (long long)v);
        c->heads = (int)v;
    }
    const h3j *a = h3j_get(md, kw, "encoder_rates");
    if (!a || a->type != H3J_ARR || a->len < 1 || a->len > 16)
        return h3_err(H3_E_FORMAT, "%s: \"encoder_rates\" must be a list of 1 to 16 integers", mp);
    c->hop = 1;
    for (const h3j *x = h3j_first(md, a); x; x = h3j_next(md, x)) {
        if (x->type != H3J_NUM || !x->is_int || x->i < 1 || x->i > 64)
            return h3_err(H3_E_FORMAT, "%s: \"encoder_rates\"[%d] must be an integer in [1, 64]", mp, c->n_blocks);
        c->rates[c->n_blocks++] = (int)x->i;
        c->hop *= x->i;
    }
    const int D = c->av.latent_dim;
    /* The trunk doubles encoder_dim per block; its last convolution maps that width to latent_dim. */
    if (((int64_t)c->dim0 << c->n_blocks) > 65536)
        return h3_err(H3_E_FORMAT, "%s: encoder_dim %d doubled over %d blocks is too wide", mp, c->dim0, c->n_blocks);
    if (D % c->heads || D / c->heads > 4096)
        return h3_err(H3_E_UNSUPPORTED, "%s: latent_dim %d is not %d heads of at most 4096", mp, D, c->heads);
    return 0;
}

/* Output length of the strided convolution of a block (kernel 2s, padding ceil(s/2)). */
static int64_t down_len(int64_t L, int s)
{
    const int64_t p = (s + 1) / 2, n = L + 2 * p - 2 * s;
    return n < 0 ? 0 : n / s + 1;
}

int64_t h3_aenc_frames(const h3_aenc_cfg *c, int64_t samples)
{
    if (samples < 1 || samples > MAX_SAMPLES)
        return h3_err(H3_E_INVALID, "audio encode: samples per channel must be between 1 and %lld, got %lld",
                      (long long)MAX_SAMPLES, (long long)samples);
    int64_t L = (samples + c->hop - 1) / c->hop * c->hop;
    for (int i = 0; i < c->n_blocks; i++) L = down_len(L, c->rates[i]);
    if (L < 1) return h3_err(H3_E_INVALID, "audio encode: %lld samples encode to no latent frame", (long long)samples);
    return L;
}

/* ---- loading ---------------------------------------------------------------------------- */

typedef struct {
    float *host; /* folded [cout][k * cin]: column t * cin + i is tap t of input channel i */
    h3_bw w;
    float *bias; /* backend [cout] or NULL */
    int cin, cout, k;
} econv;

typedef struct {
    float *a, *rb; /* backend [C]: alpha, 1 / (alpha + 1e-9) */
} esnake;

typedef struct {
    esnake s1, s2;
    econv c1, c2;
} eres;

typedef struct {
    eres r[N_RES];
    esnake s;
    econv down;
} eblock;

typedef struct {
    float *w, *b; /* backend [n] */
} enorm;

typedef struct {
    h3_aenc_cfg c;
    h3_backend *be;
    econv conv0, conv_f;
    eblock blk[16];
    esnake snake_f;
    enorm n1, n2, n3, mlp_n;
    econv qkv, proj, aproj, w0, w1, w2, meanp; /* linears as k = 1 "convolutions" */
} encoder;

/* Copy a tensor of exactly this shape, F32 or BF16, as f32 (the mapping may be unaligned). BF16 is
   widened exactly: h3-tiny stores its encoder in BF16 to fit its package budget. */
static int read_f32(h3_store *s, const char *name, int ndim, const int64_t *shape, float *out)
{
    h3_dtype dt;
    const void *p = h3_store_get_float(s, name, ndim, shape, &dt);
    if (!p) {
        const h3_tensor *t = h3_store_find(s, name);
        return t ? -H3_E_IO : -H3_E_SCHEMA; /* h3_store_get_float recorded the message */
    }
    if (dt != H3_DT_F32 && dt != H3_DT_BF16) {
        const h3_tensor *t = h3_store_find(s, name);
        return h3_err(H3_E_SCHEMA, "%s: tensor '%s' is %s, expected F32 or BF16 (audio VAE encoder)",
                      s->files[t->file].path, name, h3_dtype_name(dt));
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    h3_to_f32(p, dt, out, n);
    h3_store_release_tensor(s, name);
    return 0;
}

static float *falloc(int64_t n) { return h3_malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/* A host array (freed here) as backend memory. */
static int to_backend(h3_backend *be, float *host, int64_t n, float **dst)
{
    *dst = h3_backend_dup(be, host, sizeof(float) * (size_t)(n > 0 ? n : 1));
    free(host);
    return *dst ? 0 : -H3_E_NOMEM;
}

/* `name` (shape [n] or [1, n, 1]) as a backend vector. */
static int load_vec(h3_backend *be, h3_store *s, const char *name, int ndim, int64_t n, float **dst)
{
    int64_t shape[3] = {ndim == 3 ? 1 : n, n, 1};
    float *host = falloc(n);
    if (!host) return -H3_E_NOMEM;
    int rc = read_f32(s, name, ndim, shape, host);
    if (rc) {
        free(host);
        return rc;
    }
    return to_backend(be, host, n, dst);
}

/* A convolution (or, k = 1 and ndim 2, a linear) named `base`: weight-normed (`wn`: weight_v,
   weight_g) or plain (`weight`), folded to [cout][k * cin]; bias when `bias`. */
static int load_conv(h3_backend *be, h3_store *s, const char *base, int cout, int cin, int k, int ndim, bool wn,
                     bool bias, econv *cv)
{
    char name[256];
    const int64_t n = (int64_t)cout * cin * k;
    float *v = falloc(n), *scale = falloc(cout);
    int rc = v && scale ? 0 : -H3_E_NOMEM;
    int64_t shape[3] = {cout, cin, k};
    if (!rc && wn) {
        const int64_t gshape[3] = {cout, 1, 1};
        snprintf(name, sizeof name, "%s.weight_v", base);
        if (!(rc = read_f32(s, name, 3, shape, v))) {
            snprintf(name, sizeof name, "%s.weight_g", base);
            rc = read_f32(s, name, 3, gshape, scale);
        }
        /* torch's _weight_norm_interface: the norm of each output channel's row, g / norm, then one
           product per element. The sum of squares is taken in double (torch sums f32 lanes): far
           below the rounding of the convolutions themselves. */
        for (int o = 0; !rc && o < cout; o++) {
            double ss = 0.0;
            const float *row = v + (int64_t)o * cin * k;
            for (int64_t j = 0; j < (int64_t)cin * k; j++) ss += (double)row[j] * row[j];
            scale[o] = scale[o] / (float)sqrt(ss);
        }
    } else if (!rc) {
        snprintf(name, sizeof name, "%s.weight", base);
        rc = read_f32(s, name, ndim, shape, v);
    }
    if (!rc && !(cv->host = h3_alloc_aligned(sizeof(float) * (size_t)n))) rc = -H3_E_NOMEM;
    if (!rc) {
        float *dst = cv->host;
        for (int o = 0; o < cout; o++)
            for (int t = 0; t < k; t++)
                for (int i = 0; i < cin; i++) {
                    const float x = v[((int64_t)o * cin + i) * k + t];
                    *dst++ = wn ? x * scale[o] : x;
                }
        rc = be->weights->weight_load(be, cv->host, H3_DT_F32, cout, (int64_t)k * cin, &cv->w);
    }
    free(v), free(scale);
    cv->cin = cin, cv->cout = cout, cv->k = k;
    if (!rc && bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        rc = load_vec(be, s, name, 1, cout, &cv->bias);
    }
    return rc;
}

static int load_snake(h3_backend *be, h3_store *s, const char *base, int C, esnake *sn)
{
    char name[256];
    snprintf(name, sizeof name, "%s.alpha", base);
    int64_t shape[3] = {1, C, 1};
    float *a = falloc(C), *rb = falloc(C);
    int rc = a && rb ? read_f32(s, name, 3, shape, a) : -H3_E_NOMEM;
    if (rc) {
        free(a), free(rb);
        return rc;
    }
    /* (alpha + 1e-9).reciprocal() in f32, as torch evaluates it. */
    for (int c = 0; c < C; c++) rb[c] = 1.0f / (a[c] + 1e-9f);
    int r1 = to_backend(be, a, C, &sn->a), r2 = to_backend(be, rb, C, &sn->rb);
    return r1 ? r1 : r2;
}

static int load_norm(h3_backend *be, h3_store *s, const char *base, int n, enorm *nm)
{
    char name[256];
    snprintf(name, sizeof name, "%s.weight", base);
    int rc = load_vec(be, s, name, 1, n, &nm->w);
    snprintf(name, sizeof name, "%s.bias", base);
    return rc ? rc : load_vec(be, s, name, 1, n, &nm->b);
}

static void free_conv(h3_backend *be, econv *c)
{
    if (c->w.data || c->w.priv) be->weights->weight_free(be, &c->w);
    h3_free_aligned(c->host);
    be->mem->release(be, c->bias);
    memset(c, 0, sizeof *c);
}

static void free_snake(h3_backend *be, esnake *s)
{
    be->mem->release(be, s->a);
    be->mem->release(be, s->rb);
}

static void enc_free(encoder *e)
{
    if (!e) return;
    h3_backend *be = e->be;
    free_conv(be, &e->conv0);
    free_conv(be, &e->conv_f);
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < N_RES; j++) {
            free_snake(be, &e->blk[i].r[j].s1);
            free_snake(be, &e->blk[i].r[j].s2);
            free_conv(be, &e->blk[i].r[j].c1);
            free_conv(be, &e->blk[i].r[j].c2);
        }
        free_snake(be, &e->blk[i].s);
        free_conv(be, &e->blk[i].down);
    }
    free_snake(be, &e->snake_f);
    enorm *ns[4] = {&e->n1, &e->n2, &e->n3, &e->mlp_n};
    for (int i = 0; i < 4; i++) {
        be->mem->release(be, ns[i]->w);
        be->mem->release(be, ns[i]->b);
    }
    econv *ls[7] = {&e->qkv, &e->proj, &e->aproj, &e->w0, &e->w1, &e->w2, &e->meanp};
    for (int i = 0; i < 7; i++) free_conv(be, ls[i]);
    free(e);
}

/* The attention's qkv bias: torch.cat((q_bias, zero_k_bias, v_bias)) as one backend vector. */
static int load_qkv_bias(h3_backend *be, h3_store *s, int D, float **dst)
{
    float *b = falloc(3 * (int64_t)D);
    const int64_t shape[1] = {D};
    int rc = b ? read_f32(s, "pre_block.attn.q_bias", 1, shape, b) : -H3_E_NOMEM;
    if (!rc) rc = read_f32(s, "pre_block.attn.zero_k_bias", 1, shape, b + D);
    if (!rc) rc = read_f32(s, "pre_block.attn.v_bias", 1, shape, b + 2 * D);
    if (rc) {
        free(b);
        return rc;
    }
    return to_backend(be, b, 3 * (int64_t)D, dst);
}

static int enc_load(h3_model *m, h3_backend *be, encoder **out)
{
    *out = NULL;
    encoder *e = h3_calloc(1, sizeof *e);
    if (!e) return -H3_E_NOMEM;
    e->be = be;
    int rc = h3_aenc_cfg_load(m, &e->c);
    if (!rc) rc = h3_model_headers(m, H3_COMP_AUDIO_VAE);
    if (rc) {
        free(e);
        return rc;
    }
    h3_store *s = &m->comp[H3_COMP_AUDIO_VAE].store;
    if (!h3_store_find(s, "encoder.block.0.weight_v")) {
        h3_err(H3_E_SCHEMA, "model has no audio VAE encoder weights (%s holds no encoder.block.0.weight_v; encoding "
               "audio references needs them)", s->nfiles ? s->files[0].path : "audio_vae");
        free(e);
        return -H3_E_SCHEMA;
    }
    const h3_aenc_cfg *c = &e->c;
    const int D = c->av.latent_dim, C = c->av.latent_ch;
    char base[160];
    int ch = c->dim0;
    rc = load_conv(be, s, "encoder.block.0", ch, 1, 7, 3, true, true, &e->conv0);
    for (int i = 0; !rc && i < c->n_blocks; i++, ch *= 2) {
        eblock *b = &e->blk[i];
        for (int j = 0; !rc && j < N_RES; j++) {
            snprintf(base, sizeof base, "encoder.block.%d.block.%d.block.0", i + 1, j);
            rc = load_snake(be, s, base, ch, &b->r[j].s1);
            snprintf(base, sizeof base, "encoder.block.%d.block.%d.block.1", i + 1, j);
            if (!rc) rc = load_conv(be, s, base, ch, ch, 7, 3, true, true, &b->r[j].c1);
            snprintf(base, sizeof base, "encoder.block.%d.block.%d.block.2", i + 1, j);
            if (!rc) rc = load_snake(be, s, base, ch, &b->r[j].s2);
            snprintf(base, sizeof base, "encoder.block.%d.block.%d.block.3", i + 1, j);
            if (!rc) rc = load_conv(be, s, base, ch, ch, 1, 3, true, true, &b->r[j].c2);
        }
        snprintf(base, sizeof base, "encoder.block.%d.block.3", i + 1);
        if (!rc) rc = load_snake(be, s, base, ch, &b->s);
        snprintf(base, sizeof base, "encoder.block.%d.block.4", i + 1);
        if (!rc) rc = load_conv(be, s, base, 2 * ch, ch, 2 * c->rates[i], 3, true, true, &b->down);
    }
    snprintf(base, sizeof base, "encoder.block.%d", c->n_blocks + 1);
    if (!rc) rc = load_snake(be, s, base, ch, &e->snake_f);
    snprintf(base, sizeof base, "encoder.block.%d", c->n_blocks + 2);
    if (!rc) rc = load_conv(be, s, base, D, ch, 3, 3, true, true, &e->conv_f);
    if (!rc) rc = load_norm(be, s, "pre_block.norm1", D, &e->n1);
    if (!rc) rc = load_norm(be, s, "pre_block.norm3", D, &e->n3);
    if (!rc) rc = load_norm(be, s, "pre_block.norm2", C, &e->n2);
    if (!rc) rc = load_norm(be, s, "pre_block.mlp.norm", C, &e->mlp_n);
    if (!rc) rc = load_conv(be, s, "pre_block.attn.qkv", 3 * D, D, 1, 2, false, false, &e->qkv);
    if (!rc) rc = load_qkv_bias(be, s, D, &e->qkv.bias);
    if (!rc) rc = load_conv(be, s, "pre_block.proj", C, D, 1, 2, false, true, &e->proj);
    if (!rc) rc = load_conv(be, s, "pre_block.attn.proj", C, C, 1, 2, false, true, &e->aproj);
    if (!rc) rc = load_conv(be, s, "pre_block.mlp.w0", 2 * C, C, 1, 2, false, true, &e->w0);
    if (!rc) rc = load_conv(be, s, "pre_block.mlp.w1", 2 * C, C, 1, 2, false, true, &e->w1);
    if (!rc) rc = load_conv(be, s, "pre_block.mlp.w2", C, 2 * C, 1, 2, false, true, &e->w2);
    if (!rc) rc = load_conv(be, s, "mean_proj", C, C, 1, 3, false, true, &e->meanp);
    /* The folded copies are all that is needed now: drop the mapping and its page cache. */
    h3_store_release(s);
    if (rc) {
        enc_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* ---- execution -------------------------------------------------------------------------- */

/* Working buffers in backend memory, grown on demand and kept across channels: the current
   activation, the next one, a convolution output, the zero-margined convolution input, and the
   pre_block's rows. */
enum { SL_X, SL_Y, SL_T, SL_P, SL_N, SL_QKV, SL_O, SL_A, SL_B, SL_G0, SL_G1, SL_COUNT };
typedef struct {
    h3_backend *be;
    float *p[SL_COUNT];
    int64_t n[SL_COUNT];
} slots;

static float *slot(slots *s, int i, int64_t floats)
{
    if (s->n[i] < floats) {
        s->be->mem->release(s->be, s->p[i]);
        s->p[i] = s->be->mem->alloc(s->be, sizeof(float) * (size_t)(floats > 0 ? floats : 1));
        s->n[i] = s->p[i] ? floats : 0;
    }
    return s->p[i];
}

static h3_bt f32(const float *p, int64_t rows, int64_t cols, int64_t ld)
{
    return h3_bt_make((void *)p, H3_DT_F32, rows, cols, ld);
}

/* y [L, cout] (row stride ldy) = conv(P), P filled as phased(P, L, k, dil) (same-length output:
   padding (k - 1) dil / 2 per side). Phase ph reads its own rows, the windows one row apart. */
static int run_conv(h3_backend *be, const econv *cv, const float *P, int64_t L, int dil, float *y)
{
    const int64_t phase_rows = (L + dil - 1) / dil + (cv->k - 1);
    for (int ph = 0; ph < dil && ph < L; ph++) {
        const int64_t M = (L - ph + dil - 1) / dil;
        const h3_bt x = f32(P + ph * phase_rows * cv->cin, M, cv->w.cols, cv->cin),
                    yv = f32(y + (int64_t)ph * cv->cout, M, cv->cout, (int64_t)dil * cv->cout);
        int rc = be->ops->conv_gemm(be, &x, &cv->w, cv->bias, &yv);
        if (rc) return rc;
    }
    return 0;
}

static h3_bphased phased(float *P, int64_t L, int k, int dil)
{
    const int64_t h = (int64_t)(k - 1) / 2;
    return (h3_bphased){P, dil, (L + dil - 1) / dil + 2 * h, h};
}

static int snake(h3_backend *be, const esnake *sn, const float *x, int64_t L, int C, h3_bphased dst)
{
    const h3_bt xv = f32(x, L, C, C);
    return be->dec->snake(be, &xv, sn->a, sn->rb, &dst);
}

/* One residual unit in place on x [L, ch]. */
static int run_res(h3_backend *be, const eres *r, int dil, float *x, int64_t L, int ch, float *P, float *T)
{
    int rc;
    if ((rc = snake(be, &r->s1, x, L, ch, phased(P, L, 7, dil))) || (rc = run_conv(be, &r->c1, P, L, dil, T)) ||
        (rc = snake(be, &r->s2, T, L, ch, phased(P, L, 1, 1))) || (rc = run_conv(be, &r->c2, P, L, 1, T)))
        return rc;
    /* The dilated convolution keeps the length: the shortcut is not cropped. */
    const h3_bt xv = f32(x, L, ch, ch), tv = f32(T, L, ch, ch);
    return be->ops->gated_add(be, &xv, &tv, NULL);
}

/* The trunk on one channel: pcm (host, `samples`) -> rows [T, D] in *out (a slot). */
static int run_trunk(const encoder *e, slots *sl, const float *pcm, int64_t samples, int64_t *T_out, float **out,
                     h3_progress_fn progress, void *user, int *done, int total)
{
    const h3_aenc_cfg *c = &e->c;
    h3_backend *be = e->be;
    const int64_t L0 = (samples + c->hop - 1) / c->hop * c->hop;
    int rc;
    /* The input of conv0: 3 zero rows, the waveform, its zero padding to the hop, 3 zero rows. */
    float *P = slot(sl, SL_P, L0 + 6), *X = slot(sl, SL_X, L0 * c->dim0);
    if (!P || !X) return -H3_E_NOMEM;
    if ((rc = be->mem->zero(be, P, sizeof(float) * (size_t)(L0 + 6))) ||
        (rc = be->mem->upload(be, P + 3, pcm, sizeof(float) * (size_t)samples)) ||
        (rc = run_conv(be, &e->conv0, P, L0, 1, X)))
        return rc;
    int64_t L = L0;
    int ch = c->dim0;
    for (int i = 0; i < c->n_blocks; i++, ch *= 2) {
        const eblock *b = &e->blk[i];
        const int s = c->rates[i];
        const int64_t p = (s + 1) / 2, Lout = down_len(L, s);
        int64_t need = (L + 2 * p) * ch;
        for (int j = 0; j < N_RES; j++) {
            const int64_t f = (int64_t)RES_DIL[j] * ((L + RES_DIL[j] - 1) / RES_DIL[j] + 6) * ch;
            need = f > need ? f : need;
        }
        float *Pb = slot(sl, SL_P, need), *T = slot(sl, SL_T, L * ch);
        if (!Pb || !T) return -H3_E_NOMEM;
        X = sl->p[SL_X];
        for (int j = 0; j < N_RES; j++)
            if ((rc = run_res(be, &b->r[j], RES_DIL[j], X, L, ch, Pb, T))) return rc;
        if (Lout < 1) return h3_err(H3_E_INVALID, "audio encode: block %d leaves no frames", i);
        /* Strided convolution: window q starts s rows after window q - 1 in the padded input. */
        float *Y = slot(sl, SL_Y, Lout * 2 * ch);
        if (!Y) return -H3_E_NOMEM;
        const h3_bphased dst = {Pb, 1, L + 2 * p, p};
        const h3_bt xv = f32(Pb, Lout, b->down.w.cols, (int64_t)s * ch), yv = f32(Y, Lout, 2 * ch, 2 * ch);
        if ((rc = snake(be, &b->s, X, L, ch, dst)) || (rc = be->ops->conv_gemm(be, &xv, &b->down.w, b->down.bias, &yv)))
            return rc;
        /* The block's output becomes the current activation. */
        float *tp = sl->p[SL_X];
        int64_t tn = sl->n[SL_X];
        sl->p[SL_X] = sl->p[SL_Y], sl->n[SL_X] = sl->n[SL_Y];
        sl->p[SL_Y] = tp, sl->n[SL_Y] = tn;
        L = Lout;
        if ((rc = h3_progress_check(progress, user, "audio_encode", ++*done, total))) return rc;
    }
    const int D = c->av.latent_dim;
    float *Pf = slot(sl, SL_P, (L + 2) * ch), *Y = slot(sl, SL_Y, L * D);
    if (!Pf || !Y) return -H3_E_NOMEM;
    if ((rc = snake(be, &e->snake_f, sl->p[SL_X], L, ch, phased(Pf, L, 3, 1))) ||
        (rc = run_conv(be, &e->conv_f, Pf, L, 1, Y)))
        return rc;
    *T_out = L;
    *out = Y;
    return 0;
}

/* pre_block and mean_proj on rows x [T, D] -> mean rows [T, C] in *out (a slot). */
static int run_head(const encoder *e, slots *sl, const float *x, int64_t T, float **out)
{
    const h3_aenc_cfg *c = &e->c;
    h3_backend *be = e->be;
    const h3_backend_ops *o = be->ops;
    const int D = c->av.latent_dim, C = c->av.latent_ch, H = c->heads, Dh = D / H;
    float *N = slot(sl, SL_N, T * D), *QKV = slot(sl, SL_QKV, T * 3 * D), *O = slot(sl, SL_O, T * D);
    float *A = slot(sl, SL_A, T * C), *B = slot(sl, SL_B, T * C), *G0 = slot(sl, SL_G0, T * 2 * C),
          *G1 = slot(sl, SL_G1, T * 2 * C);
    if (!N || !QKV || !O || !A || !B || !G0 || !G1) return -H3_E_NOMEM;
    const h3_bt xv = f32(x, T, D, D), nv = f32(N, T, D, D), qkv = f32(QKV, T, 3 * D, 3 * D);
    const h3_bt q = f32(QKV, T, D, 3 * D), k = f32(QKV + D, T, D, 3 * D), v = f32(QKV + 2 * D, T, D, 3 * D);
    const h3_bt ov = f32(O, T, D, D), av = f32(A, T, C, C), bv = f32(B, T, C, C);
    const h3_bt g0 = f32(G0, T, 2 * C, 2 * C), g1 = f32(G1, T, 2 * C, 2 * C);
    int rc;
    /* h = proj(norm3(x)) + attn(norm1(x)) */
    if ((rc = o->layernorm(be, &xv, e->n3.w, e->n3.b, LN_EPS, &nv)) ||
        (rc = o->linear(be, &nv, &e->proj.w, e->proj.bias, &av)) ||
        (rc = o->layernorm(be, &xv, e->n1.w, e->n1.b, LN_EPS, &nv)) ||
        (rc = o->linear(be, &nv, &e->qkv.w, e->qkv.bias, &qkv)) ||
        (rc = o->attention(be, &q, &k, &v, H, H, Dh, (float)(1.0 / sqrt((double)Dh)), true, &ov)) ||
        (rc = be->dec->head_pool(be, &ov, H, Dh, &bv)))
        return rc;
    /* attn.proj from B into the first half of G0 (free until the MLP), then added. */
    const h3_bt pv = f32(G0, T, C, C);
    if ((rc = o->linear(be, &bv, &e->aproj.w, e->aproj.bias, &pv)) || (rc = o->gated_add(be, &av, &pv, NULL)))
        return rc;
    /* h += w2(gelu_tanh(w0(n)) * w1(n)), n = mlp.norm(norm2(h)) */
    if ((rc = o->layernorm(be, &av, e->n2.w, e->n2.b, LN_EPS, &bv)) ||
        (rc = o->layernorm(be, &bv, e->mlp_n.w, e->mlp_n.b, LN_EPS, &bv)) ||
        (rc = o->linear(be, &bv, &e->w0.w, e->w0.bias, &g0)) || (rc = o->linear(be, &bv, &e->w1.w, e->w1.bias, &g1)) ||
        (rc = o->gelu(be, &g0, true, &g0)) || (rc = o->mul(be, &g0, &g1, &g0)) ||
        (rc = o->linear(be, &g0, &e->w2.w, e->w2.bias, &bv)) || (rc = o->gated_add(be, &av, &bv, NULL)) ||
        (rc = o->linear(be, &av, &e->meanp.w, e->meanp.bias, &bv)))
        return rc;
    *out = B;
    return 0;
}

/* The ops this stage needs beyond the always-present ones, named when a backend lacks one. */
static int check_ops(h3_backend *be)
{
    static const h3_op need[] = {H3_OP_snake, H3_OP_head_pool, H3_OP_mul, H3_OP_gelu, H3_OP_layernorm, H3_OP_conv_gemm};
    return h3_backend_need(be, need, (int)(sizeof need / sizeof *need), "the audio VAE encoder");
}

int h3_aenc_run(h3_model *m, h3_backend *be, const float *pcm, int channels, int64_t samples, float *mean,
                int64_t cap, h3_progress_fn progress, void *user)
{
    if (!pcm || !mean || !be) return h3_err(H3_E_INVALID, "audio encode: NULL waveform, output buffer or backend");
    if (channels < 1 || channels > 2)
        return h3_err(H3_E_INVALID, "audio encode: %d channels; the audio VAE encodes mono (1) or stereo (2)",
                      channels);
    h3_aenc_cfg cfg;
    int rc = h3_aenc_cfg_load(m, &cfg);
    if (rc) return rc;
    const int64_t T = h3_aenc_frames(&cfg, samples);
    if (T < 0) return (int)T;
    const int C = cfg.av.latent_ch;
    if (cap < (int64_t)channels * C * T)
        return h3_err(H3_E_INVALID, "audio encode: the output holds %lld floats, %d x %d x %lld are needed",
                      (long long)cap, channels, C, (long long)T);
    if ((rc = check_ops(be))) return rc;
    encoder *e;
    if ((rc = enc_load(m, be, &e))) return rc;
    slots sl = {be, {0}, {0}};
    float *host = falloc(T * C);
    if (!host) rc = -H3_E_NOMEM;
    int done = 0, total = channels * cfg.n_blocks;
    for (int ch = 0; !rc && ch < channels; ch++) {
        int64_t Tt = 0;
        float *rows = NULL, *mrows = NULL;
        if ((rc = run_trunk(e, &sl, pcm + ch * samples, samples, &Tt, &rows, progress, user, &done, total)) ||
            (rc = run_head(e, &sl, rows, Tt, &mrows)) ||
            (rc = be->mem->download(be, host, mrows, sizeof(float) * (size_t)(T * C))))
            break;
        /* Rows [T, C] -> the posterior's [C, T] layout. */
        float *dst = mean + (int64_t)ch * C * T;
        for (int64_t t = 0; t < T; t++)
            for (int c = 0; c < C; c++) dst[(int64_t)c * T + t] = host[t * C + c];
    }
    free(host);
    for (int i = 0; i < SL_COUNT; i++) be->mem->release(be, sl.p[i]);
    enc_free(e);
    return rc;
}

int h3_aenc_rows(const h3_aenc_cfg *c, const float *mean, int channels, int64_t frames, float *rows, int64_t cap)
{
    const int C = c->av.latent_ch;
    if (!mean || !rows) return h3_err(H3_E_INVALID, "audio rows: NULL latents or output");
    if (channels < 1 || channels > 2 || frames < 1)
        return h3_err(H3_E_INVALID, "audio rows: %d channels x %lld frames (1 or 2 channels, at least one frame)",
                      channels, (long long)frames);
    if (cap < (int64_t)channels * frames * C)
        return h3_err(H3_E_INVALID, "audio rows: the output holds %lld floats, %lld rows x %d are needed",
                      (long long)cap, (long long)(channels * frames), C);
    /* Channel-major: all rows of the left channel, then all of the right; one subtraction and one
       true division in f32, as torch evaluates (latents - mean) / std. */
    for (int ch = 0; ch < channels; ch++)
        for (int64_t t = 0; t < frames; t++)
            for (int k = 0; k < C; k++) {
                const float d = mean[((int64_t)ch * C + k) * frames + t] - c->av.latents_mean[k];
                rows[((int64_t)ch * frames + t) * C + k] = d / c->av.latents_std[k];
            }
    return 0;
}
