/*
 * Audio VAE decoder: diffusers' AutoencoderKLMiniMaxH3Audio.decode (dec_in_proj, then the BigVGAN
 * decoder) preceded by the per-channel de-normalisation of MiniMaxH3AudioDecodeStep. The two
 * stereo sides are independent batch items, decoded one after the other. Model logic only: every
 * computation on activations is an op of the backend (backend/backend.h).
 *
 * Data flow per side (activations time-major [time, channels]):
 *   x*std+mean -> dec_in_proj (1x1) -> conv_pre (k7) -> for each stage: ConvTranspose1d, then the
 *   mean of the stage's AMP blocks -> activation_post -> conv_post -> clamp [-1, 1].
 * Every convolution is one im2col-free GEMM per phase (the backend's conv_gemm, weights folded once
 * at load): a dilated convolution splits time into `dilation` phases that are ordinary
 * convolutions; a transposed convolution of stride u splits its output into u phases that are
 * ordinary convolutions over consecutive input rows. Zero padding is real zero rows around each
 * phase, so a GEMM input row is just a pointer into the activation buffer; the activations
 * (snake_aa) write their output straight into that phased layout.
 *
 * Weight norm is folded at load (w = v * (g / ||v||), the arithmetic of torch's fused CPU
 * kernel); the file mapping is dropped before decoding starts.
 */
#include "models/audio_vae.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES (1 << 20) /* ~7 hours at 40 Hz: keeps every length well inside int64 */
#define ACT_COST 40          /* progress units per activation output value, next to 1 per MAC */
#define PRE_K 7              /* conv_pre / conv_post kernel size (fixed by diffusers) */

/* A convolution weight: host floats [cout][k * cin] (column t * cin + i is tap t of input channel
   i), weight norm folded in, and the handle the backend made of them (a view on the CPU). */
typedef struct {
    float *host;
    h3_bw w;
    float *bias; /* backend f32 [cout] or NULL */
    int cin, cout, k, dil;
} conv_w;

typedef struct {
    int u, k, p, cin, cout;
    float *host[64];     /* per output phase r: [cout][ntap[r] * cin], input rows in time order */
    h3_bw w[64];
    int ntap[64], c[64]; /* phase r reads input rows q + c[r] - ntap[r] + 1 .. q + c[r] */
    float *bias;         /* backend */
} tconv_w;

typedef struct {
    int C;
    float *a, *rb;     /* backend [C]: exp(alpha), 1 / (exp(beta) + 1e-9) */
    float *fup, *fdown; /* backend [H3_AA_TAPS] */
} act_w;

typedef struct {
    int k, ndil;
    conv_w c1[8], c2[8];
    act_w a1[8], a2[8];
} amp_w;

typedef struct {
    h3_avae_cfg cfg;
    h3_backend *be;
    conv_w in_proj, pre;
    tconv_w ups[16];
    amp_w *res; /* [n_up * n_res], diffusers' resblocks index i * n_res + j */
    act_w post;
    float *post_w; /* backend: conv_post folded, [PRE_K * C]: tap k of channel i at k * C + i */
} decoder;

/* ---- geometry --------------------------------------------------------------------------- */

static int stage_ch(const h3_avae_cfg *c, int i) { return c->decoder_dim >> i; }

/* ConvTranspose1d output length for stage i (padding (k - u) // 2, no output padding). */
static int64_t up_len(const h3_avae_cfg *c, int i, int64_t lin)
{
    int u = c->rates[i], k = c->kernels[i], p = (k - u) / 2;
    return (lin - 1) * u - 2 * (int64_t)p + k;
}

/*
 * Output phase r of a transposed convolution (stride u, kernel k, padding p): output q*u + r takes
 * taps kr, kr + u, ... (kr = (r + p) % u) from input rows q + c - j, j = 0..ntap-1.
 */
static void tphase(int u, int k, int r, int *ntap, int *c)
{
    int p = (k - u) / 2, kr = (r + p) % u;
    *ntap = kr < k ? (k - kr + u - 1) / u : 0;
    *c = (r + p) / u;
}

/* Rows of zero margin stage i's transposed convolution reads before and after its lin input rows. */
static void tconv_margins(const h3_avae_cfg *cf, int i, int64_t lin, int64_t *left, int64_t *right)
{
    const int u = cf->rates[i];
    const int64_t lout = up_len(cf, i, lin);
    *left = *right = 0;
    for (int r = 0; r < u && r < lout; r++) {
        int n, c;
        tphase(u, cf->kernels[i], r, &n, &c);
        if (!n) continue;
        int64_t Q = (lout - r + u - 1) / u, lo = c - n + 1, hi = Q - 1 + c;
        if (-lo > *left) *left = -lo;
        if (hi - (lin - 1) > *right) *right = hi - (lin - 1);
    }
}

int h3_avae_check_geometry(const h3_avae_cfg *c, const char *path)
{
    if (c->n_up < 1 || c->n_up > 16 || c->n_res < 1 || c->n_dil < 1)
        return h3_err(H3_E_FORMAT, "%s: the decoder needs at least one stage, resblock and dilation", path);
    for (int i = 0; i < c->n_up; i++) {
        if (c->kernels[i] < c->rates[i] || c->rates[i] > 64)
            return h3_err(H3_E_UNSUPPORTED, "%s: upsampling stage %d has kernel %d below its rate %d", path, i,
                          c->kernels[i], c->rates[i]);
    }
    for (int j = 0; j < c->n_res; j++)
        if (c->res_kernels[j] % 2 == 0)
            return h3_err(H3_E_UNSUPPORTED, "%s: resblock kernel %d is even (its convolutions would change the "
                          "length; diffusers fails on it too)", path, c->res_kernels[j]);
    return 0;
}

int64_t h3_avae_samples(const h3_avae_cfg *c, int64_t frames)
{
    if (frames < 1 || frames > MAX_FRAMES)
        return h3_err(H3_E_INVALID, "audio latent frames must be between 1 and %d, got %lld", MAX_FRAMES,
                      (long long)frames);
    int64_t L = frames;
    for (int i = 0; i < c->n_up; i++) L = up_len(c, i, L);
    if (L < 1) return h3_err(H3_E_INVALID, "audio decoder: %lld frames decode to no samples", (long long)frames);
    return L;
}

/* ---- loading ---------------------------------------------------------------------------- */

/* Copy a tensor that must be F32 with exactly this shape (the mapping may be unaligned). */
static int read_f32(h3_store *s, const char *name, int ndim, const int64_t *shape, float *out)
{
    const void *p = h3_store_get(s, name, H3_DT_F32, ndim, shape);
    if (!p) {
        /* h3_store_get recorded the message; it fails on a schema mismatch or a mapping error. */
        const h3_tensor *t = h3_store_find(s, name);
        bool schema = !t || t->dtype != H3_DT_F32 || t->ndim != ndim;
        for (int i = 0; t && !schema && i < ndim; i++) schema = t->shape[i] != shape[i];
        return schema ? -H3_E_SCHEMA : -H3_E_IO;
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    memcpy(out, p, (size_t)n * sizeof(float));
    h3_store_release_tensor(s, name);
    return 0;
}

static float *falloc(int64_t n) { return h3_malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

/*
 * Weight norm (torch.nn.utils.weight_norm, dim 0): w = v * (g / ||v_row||), rows along dim 0.
 * Reads v [rows, d1, d2] into `v` and returns each row's factor in `scale`; the packing applies
 * it. torch's CPU _weight_norm_interface computes the row norm, then g / norm, then one product
 * per element: the same here, except that the norm is summed in double (torch sums float lanes),
 * a difference far below the rounding of the convolutions themselves.
 */
static int weight_norm(h3_store *s, const char *base, float *v, int64_t rows, int64_t d1, int64_t d2, float *scale)
{
    char name[256];
    int64_t vshape[3] = {rows, d1, d2}, gshape[3] = {rows, 1, 1}, per_row = d1 * d2;
    int rc;
    snprintf(name, sizeof name, "%s.weight_v", base);
    if ((rc = read_f32(s, name, 3, vshape, v))) return rc;
    snprintf(name, sizeof name, "%s.weight_g", base);
    if ((rc = read_f32(s, name, 3, gshape, scale))) return rc;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = v + r * per_row;
        double acc[8] = {0}; /* eight partial sums: no serial dependency chain */
        int64_t j = 0;
        for (; j + 8 <= per_row; j += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)row[j + l] * row[j + l];
        for (; j < per_row; j++) acc[0] += (double)row[j] * row[j];
        double ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        float norm = (float)sqrt(ss);
        scale[r] = scale[r] / norm; /* g / ||v|| */
    }
    return 0;
}

static int read_bias(h3_store *s, const char *base, int n, float **out)
{
    char name[256];
    int64_t shape[1] = {n};
    snprintf(name, sizeof name, "%s.bias", base);
    if (!(*out = falloc(n))) return -H3_E_NOMEM;
    return read_f32(s, name, 1, shape, *out);
}

/* A host array of n floats (freed here) as backend memory, in *dst. */
static int to_backend(h3_backend *be, float *host, int64_t n, float **dst)
{
    *dst = h3_backend_dup(be, host, sizeof(float) * (size_t)(n > 0 ? n : 1));
    free(host);
    return *dst ? 0 : -H3_E_NOMEM;
}

/* The bias of `base` as a backend vector. */
static int load_bias(h3_backend *be, h3_store *s, const char *base, int n, float **dst)
{
    float *host = NULL;
    int rc = read_bias(s, base, n, &host);
    if (rc) {
        free(host);
        return rc;
    }
    return to_backend(be, host, n, dst);
}

/* The backend's handle of a folded convolution weight (host f32 [rows, cols], kept by the caller).
   A backend whose GEMMs run in f32 (the CPU) takes it with weight_load, a view of the host copy.
   Any other (a GPU, whose weight_load rounds to bf16) gets an f32 copy in its memory, which
   conv_gemm sums in f32 (backend.h): diffusers keeps this decoder in f32 at any pipeline dtype,
   and BigVGAN's long chain of convolutions is where bf16 rounding would be heard. */
static int conv_weight(h3_backend *be, const float *host, int64_t rows, int64_t cols, h3_bw *w)
{
    if (be->act_dtype == H3_DT_F32) return be->weights->weight_load(be, host, H3_DT_F32, rows, cols, w);
    memset(w, 0, sizeof *w);
    void *d = h3_backend_dup(be, host, sizeof(float) * (size_t)(rows > 0 ? rows : 1) * (size_t)(cols > 0 ? cols : 1));
    if (!d) return -H3_E_NOMEM;
    w->data = d;
    w->dtype = H3_DT_F32;
    w->rows = rows;
    w->cols = cols;
    return 0;
}

static void conv_weight_free(h3_backend *be, h3_bw *w)
{
    if (!w->data && !w->priv) return;
    if (be->act_dtype == H3_DT_F32)
        be->weights->weight_free(be, w);
    else
        be->mem->release(be, (void *)w->data);
    memset(w, 0, sizeof *w);
}

/* A Conv1d, weight-normed (`wn`) or plain, with or without bias, as [cout][k * cin + i]. */
static int load_conv(h3_backend *be, h3_store *s, const char *base, int cout, int cin, int k, int dil, bool wn,
                     bool bias, conv_w *cv)
{
    float *v = falloc((int64_t)cout * cin * k), *scale = falloc(cout);
    int rc = v && scale ? 0 : -H3_E_NOMEM;
    if (!rc && wn) {
        rc = weight_norm(s, base, v, cout, cin, k, scale);
    } else if (!rc) {
        char name[256];
        int64_t shape[3] = {cout, cin, k};
        snprintf(name, sizeof name, "%s.weight", base);
        rc = read_f32(s, name, 3, shape, v);
    }
    if (!rc && !(cv->host = h3_alloc_aligned(sizeof(float) * (size_t)cout * (size_t)cin * (size_t)k))) rc = -H3_E_NOMEM;
    if (!rc) {
        float *dst = cv->host;
        for (int o = 0; o < cout; o++)
            for (int t = 0; t < k; t++)
                for (int i = 0; i < cin; i++) {
                    float x = v[((int64_t)o * cin + i) * k + t];
                    *dst++ = wn ? x * scale[o] : x;
                }
        rc = conv_weight(be, cv->host, cout, (int64_t)k * cin, &cv->w);
    }
    free(v), free(scale);
    cv->cin = cin, cv->cout = cout, cv->k = k, cv->dil = dil;
    if (!rc && bias) rc = load_bias(be, s, base, cout, &cv->bias);
    return rc;
}

/* ConvTranspose1d [cin, cout, k] with weight norm over dim 0 (input channels), split in phases. */
static int load_tconv(h3_backend *be, h3_store *s, const char *base, int cin, int cout, int k, int u, tconv_w *t)
{
    t->u = u, t->k = k, t->p = (k - u) / 2, t->cin = cin, t->cout = cout;
    float *v = falloc((int64_t)cin * cout * k), *scale = falloc(cin);
    int rc = v && scale ? weight_norm(s, base, v, cin, cout, k, scale) : -H3_E_NOMEM;
    for (int r = 0; !rc && r < u; r++) {
        int n;
        tphase(u, k, r, &n, &t->c[r]);
        t->ntap[r] = n;
        if (!n) continue;
        const int kr = (r + t->p) % u;
        if (!(t->host[r] = h3_alloc_aligned(sizeof(float) * (size_t)cout * (size_t)n * (size_t)cin))) {
            rc = -H3_E_NOMEM;
            break;
        }
        /* Column block e holds input row s0 + e, i.e. tap j = n - 1 - e (taps run backwards in
           time); the weight-norm factor belongs to the input channel (dim 0 of [cin, cout, k]). */
        float *dst = t->host[r];
        for (int o = 0; o < cout; o++)
            for (int e = 0; e < n; e++) {
                const int kk = kr + (n - 1 - e) * u;
                for (int i = 0; i < cin; i++) *dst++ = v[((int64_t)i * cout + o) * k + kk] * scale[i];
            }
        rc = conv_weight(be, t->host[r], cout, (int64_t)n * cin, &t->w[r]);
    }
    free(scale);
    free(v);
    if (!rc) rc = load_bias(be, s, base, cout, &t->bias);
    return rc;
}

static int load_act(h3_backend *be, h3_store *s, const char *base, int C, act_w *w)
{
    char name[256];
    int64_t cs[1] = {C}, fs[3] = {1, 1, H3_AA_TAPS};
    w->C = C;
    float *a = falloc(C), *rb = falloc(C), *fup = falloc(H3_AA_TAPS), *fdown = falloc(H3_AA_TAPS);
    int rc = a && rb && fup && fdown ? 0 : -H3_E_NOMEM;
    if (!rc) {
        snprintf(name, sizeof name, "%s.act.alpha", base);
        rc = read_f32(s, name, 1, cs, a);
    }
    if (!rc) {
        snprintf(name, sizeof name, "%s.act.beta", base);
        rc = read_f32(s, name, 1, cs, rb);
    }
    /* Each activation reads its own filter buffers: diffusers registers them per activation
       (persistent) and loads whatever the checkpoint holds. */
    if (!rc) {
        snprintf(name, sizeof name, "%s.upsample.filter", base);
        rc = read_f32(s, name, 3, fs, fup);
    }
    if (!rc) {
        snprintf(name, sizeof name, "%s.downsample.lowpass.filter", base);
        rc = read_f32(s, name, 3, fs, fdown);
    }
    if (rc) {
        free(a), free(rb), free(fup), free(fdown);
        return rc;
    }
    /* SnakeBeta stores log-scale parameters; torch evaluates exp and (beta + 1e-9)^-1 in f32. */
    for (int c = 0; c < C; c++) {
        a[c] = expf(a[c]);
        rb[c] = 1.0f / (expf(rb[c]) + 1e-9f);
    }
    int r1 = to_backend(be, a, C, &w->a), r2 = to_backend(be, rb, C, &w->rb);
    int r3 = to_backend(be, fup, H3_AA_TAPS, &w->fup), r4 = to_backend(be, fdown, H3_AA_TAPS, &w->fdown);
    return r1 ? r1 : r2 ? r2 : r3 ? r3 : r4;
}

static void free_conv(h3_backend *be, conv_w *c)
{
    conv_weight_free(be, &c->w);
    h3_free_aligned(c->host);
    be->mem->release(be, c->bias);
}

static void free_act(h3_backend *be, act_w *a)
{
    be->mem->release(be, a->a);
    be->mem->release(be, a->rb);
    be->mem->release(be, a->fup);
    be->mem->release(be, a->fdown);
}

static void dec_free(decoder *d)
{
    if (!d) return;
    h3_backend *be = d->be;
    free_conv(be, &d->in_proj);
    free_conv(be, &d->pre);
    for (int i = 0; i < 16; i++) {
        for (int r = 0; r < 64; r++) {
            conv_weight_free(be, &d->ups[i].w[r]);
            h3_free_aligned(d->ups[i].host[r]);
        }
        be->mem->release(be, d->ups[i].bias);
    }
    if (d->res) {
        for (int g = 0; g < d->cfg.n_up * d->cfg.n_res; g++) {
            amp_w *b = &d->res[g];
            for (int j = 0; j < 8; j++) {
                free_conv(be, &b->c1[j]);
                free_conv(be, &b->c2[j]);
                free_act(be, &b->a1[j]);
                free_act(be, &b->a2[j]);
            }
        }
        free(d->res);
    }
    free_act(be, &d->post);
    be->mem->release(be, d->post_w);
    free(d);
}

static int dec_load(h3_model *m, h3_backend *be, decoder **out)
{
    *out = NULL;
    decoder *d = h3_calloc(1, sizeof *d);
    if (!d) return -H3_E_NOMEM;
    d->be = be;
    int rc = h3_avae_cfg_load(m, &d->cfg);
    const h3_avae_cfg *c = &d->cfg;
    if (!rc) rc = h3_avae_check_geometry(c, m->comp[H3_COMP_AUDIO_VAE].config_path);
    if (!rc) rc = h3_model_headers(m, H3_COMP_AUDIO_VAE);
    if (rc) {
        dec_free(d);
        return rc;
    }
    h3_store *s = &m->comp[H3_COMP_AUDIO_VAE].store;
    char base[160];
    rc = load_conv(be, s, "dec_in_proj", c->latent_dim, c->latent_ch, 1, 1, false, true, &d->in_proj);
    if (!rc)
        rc = load_conv(be, s, "decoder.conv_pre", c->decoder_dim, c->latent_dim, PRE_K, 1, true, true, &d->pre);
    for (int i = 0; !rc && i < c->n_up; i++) {
        snprintf(base, sizeof base, "decoder.ups.%d.0", i);
        rc = load_tconv(be, s, base, stage_ch(c, i), stage_ch(c, i + 1), c->kernels[i], c->rates[i], &d->ups[i]);
    }
    if (!rc && !(d->res = h3_calloc((size_t)(c->n_up * c->n_res), sizeof *d->res))) rc = -H3_E_NOMEM;
    for (int i = 0; !rc && i < c->n_up; i++) {
        int ch = stage_ch(c, i + 1);
        for (int j = 0; !rc && j < c->n_res; j++) {
            int g = i * c->n_res + j, k = c->res_kernels[j];
            amp_w *b = &d->res[g];
            b->k = k, b->ndil = c->n_dil;
            for (int e = 0; !rc && e < c->n_dil; e++) {
                snprintf(base, sizeof base, "decoder.resblocks.%d.convs1.%d", g, e);
                rc = load_conv(be, s, base, ch, ch, k, c->res_dil[j][e], true, true, &b->c1[e]);
                snprintf(base, sizeof base, "decoder.resblocks.%d.convs2.%d", g, e);
                if (!rc) rc = load_conv(be, s, base, ch, ch, k, 1, true, true, &b->c2[e]);
                /* activations[::2] precede convs1, activations[1::2] precede convs2. */
                snprintf(base, sizeof base, "decoder.resblocks.%d.activations.%d", g, 2 * e);
                if (!rc) rc = load_act(be, s, base, ch, &b->a1[e]);
                snprintf(base, sizeof base, "decoder.resblocks.%d.activations.%d", g, 2 * e + 1);
                if (!rc) rc = load_act(be, s, base, ch, &b->a2[e]);
            }
        }
    }
    int cl = stage_ch(c, c->n_up);
    if (!rc) rc = load_act(be, s, "decoder.activation_post", cl, &d->post);
    if (!rc) {
        /* One output: conv_post's single row of folded weights is all conv1_clamp takes. */
        conv_w post = {0};
        rc = load_conv(be, s, "decoder.conv_post", 1, cl, PRE_K, 1, true, false, &post);
        if (!rc && !(d->post_w = h3_backend_dup(be, post.host, sizeof(float) * (size_t)PRE_K * (size_t)cl)))
            rc = -H3_E_NOMEM;
        free_conv(be, &post);
    }
    /* The folded copies are all that is needed now: drop the mapping and its page cache. */
    h3_store_release(s);
    if (rc) {
        dec_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* ---- execution helpers ------------------------------------------------------------------ */

typedef struct {
    h3_backend *be;
    h3_progress_fn progress;
    void *user;
    int64_t done, total;
    int reported; /* last permille passed to progress, -1 before the first */
} runner;

static int tick(runner *r, int64_t units)
{
    r->done += units;
    /* Work is counted in multiply-adds (int64); the shared hook reports permille. */
    int permille = r->total > 0 ? (int)((double)r->done * 1000.0 / (double)r->total) : 1000;
    if (permille > 1000) permille = 1000;
    /* Report each permille once: a progress bar needs no more, and callbacks into Python cost. */
    if (permille == r->reported) return 0;
    r->reported = permille;
    if (r->progress && r->progress(r->user, "audio_decode", permille, 1000))
        return h3_err(H3_E_CANCELLED, "audio decode: cancelled by the progress callback");
    return 0;
}

static h3_bt f32(const float *p, int64_t rows, int64_t cols, int64_t ld)
{
    return h3_bt_make((void *)p, H3_DT_F32, rows, cols, ld);
}

/* Y [M, N] (row stride ldy) = bias + X . W^T with X's M rows of W->cols floats at stride ldx
   (they overlap: a convolution over time-major rows). */
static int run_gemm(runner *r, const float *X, int64_t M, int64_t ldx, const h3_bw *w, const float *bias, float *Y,
                    int64_t ldy)
{
    if (M <= 0) return 0;
    const h3_bt x = f32(X, M, w->cols, ldx), y = f32(Y, M, w->rows, ldy);
    return r->be->ops->conv_gemm(r->be, &x, w, bias, &y);
}

static int run_act(runner *r, const act_w *w, const float *x, int64_t L, h3_bphased dst)
{
    const h3_bt xv = f32(x, L, w->C, w->C);
    int rc = r->be->dec->snake_aa(r->be, &xv, w->a, w->rb, w->fup, w->fdown, &dst);
    return rc ? rc : tick(r, L * w->C * ACT_COST);
}

/* A phased destination for a convolution of kernel k and dilation d over L rows (in `buf`). */
static h3_bphased conv_dst(float *buf, int64_t L, int k, int d)
{
    int64_t h = (k - 1) / 2;
    return (h3_bphased){buf, d, (L + d - 1) / d + 2 * h, h};
}

static int64_t conv_dst_floats(int64_t L, int k, int d, int C)
{
    return (int64_t)d * ((L + d - 1) / d + (k - 1)) * C;
}

/* The largest convolution input any AMP block of a stage needs (L rows of ch channels). */
static int64_t amp_dst_floats(const h3_avae_cfg *c, int64_t L, int ch)
{
    int64_t f = 0;
    for (int j = 0; j < c->n_res; j++)
        for (int e = 0; e < c->n_dil; e++) {
            int64_t f1 = conv_dst_floats(L, c->res_kernels[j], c->res_dil[j][e], ch),
                    f2 = conv_dst_floats(L, c->res_kernels[j], 1, ch);
            f = f1 > f ? f1 : f;
            f = f2 > f ? f2 : f;
        }
    return f;
}

/* y [L, cout] (row stride ldy) = conv(P) where P was filled through conv_dst(P, L, k, dil). */
static int run_conv(runner *r, const conv_w *cv, const float *P, int64_t L, float *y, int64_t ldy)
{
    const int d = cv->dil;
    const int64_t phase_rows = (L + d - 1) / d + (cv->k - 1);
    int rc = 0;
    for (int ph = 0; ph < d && ph < L && !rc; ph++) {
        int64_t M = (L - ph + d - 1) / d;
        rc = run_gemm(r, P + ph * phase_rows * cv->cin, M, cv->cin, &cv->w, cv->bias, y + ph * ldy, ldy * d);
    }
    return rc ? rc : tick(r, L * cv->w.rows * cv->w.cols);
}

/* y [lout, cout] = ConvTranspose1d(U) where U holds lin rows after `left` zero rows. */
static int run_tconv(runner *r, const tconv_w *t, const float *U, int64_t left, int64_t lout, float *y)
{
    int rc = 0;
    int64_t macs = 0;
    for (int ph = 0; ph < t->u && ph < lout && !rc; ph++) {
        int64_t Q = (lout - ph + t->u - 1) / t->u, ldy = (int64_t)t->u * t->cout;
        /* Every phase has a tap: h3_avae_check_geometry keeps kernels at least as long as rates. */
        if (!t->ntap[ph]) return h3_err(H3_E_UNSUPPORTED, "audio decode: transposed convolution phase without taps");
        const float *X = U + (left + t->c[ph] - t->ntap[ph] + 1) * t->cin;
        rc = run_gemm(r, X, Q, t->cin, &t->w[ph], t->bias, y + (int64_t)ph * t->cout, ldy);
        macs += Q * t->w[ph].rows * t->w[ph].cols;
    }
    return rc ? rc : tick(r, macs);
}

/* y += x over L rows of ch channels, or y = (y + x) / div (the mean of the resblocks). */
static int add_rows(runner *r, float *y, const float *x, int64_t L, int ch, bool divide, float div)
{
    const h3_bt yv = f32(y, L, ch, ch), xv = f32(x, L, ch, ch);
    return divide ? r->be->ops->add_div(r->be, &yv, &xv, div) : r->be->ops->gated_add(r->be, &yv, &xv, NULL);
}

/* ---- one stereo side -------------------------------------------------------------------- */

/* Progress units of one side (must mirror decode_side exactly). */
static int64_t side_cost(const decoder *d, int64_t T)
{
    const h3_avae_cfg *c = &d->cfg;
    int64_t u = T * d->in_proj.w.rows * d->in_proj.w.cols + T * d->pre.w.rows * d->pre.w.cols, L = T;
    for (int i = 0; i < c->n_up; i++) {
        const tconv_w *t = &d->ups[i];
        int64_t lout = up_len(c, i, L);
        for (int ph = 0; ph < t->u && ph < lout; ph++)
            if (t->ntap[ph]) u += (lout - ph + t->u - 1) / t->u * t->w[ph].rows * t->w[ph].cols;
        L = lout;
        int ch = stage_ch(c, i + 1);
        for (int j = 0; j < c->n_res; j++) {
            const amp_w *b = &d->res[i * c->n_res + j];
            for (int e = 0; e < b->ndil; e++)
                u += 2 * L * ch * ACT_COST + L * b->c1[e].w.rows * b->c1[e].w.cols +
                     L * b->c2[e].w.rows * b->c2[e].w.cols;
        }
    }
    return u + L * d->post.C * ACT_COST + L * (int64_t)d->post.C * PRE_K;
}

/* One AMP block in place on h [L, ch]; P and tmp are scratch buffers. */
static int run_amp(runner *r, const amp_w *b, float *h, int64_t L, int ch, float *P, float *tmp)
{
    int rc = 0;
    for (int e = 0; !rc && e < b->ndil; e++) {
        /* residual = conv1(act1(h)); residual = conv2(act2(residual)); h = residual + h */
        if ((rc = run_act(r, &b->a1[e], h, L, conv_dst(P, L, b->k, b->c1[e].dil))) ||
            (rc = run_conv(r, &b->c1[e], P, L, tmp, ch)) ||
            (rc = run_act(r, &b->a2[e], tmp, L, conv_dst(P, L, b->k, 1))) ||
            (rc = run_conv(r, &b->c2[e], P, L, tmp, ch)))
            break;
        rc = add_rows(r, h, tmp, L, ch, false, 0);
    }
    return rc;
}

/*
 * Working buffers in backend memory, kept across stages and both sides (so each is faulted in
 * once) and grown on demand. Roles: ACC holds conv_pre's output, then each stage's accumulator,
 * which is the next stage's input; X the stage input; TMP the latents, then convolution outputs,
 * last the PCM of the side; P the zero-margined convolution inputs; H the middle resblocks' state.
 */
enum { SL_ACC, SL_X, SL_TMP, SL_P, SL_H, SL_COUNT };
typedef struct {
    float *p[SL_COUNT];
    int64_t n[SL_COUNT];
} slots;

static float *slot(h3_backend *be, slots *s, int i, int64_t floats)
{
    if (s->n[i] < floats) {
        be->mem->release(be, s->p[i]);
        s->p[i] = be->mem->alloc(be, sizeof(float) * (size_t)(floats > 0 ? floats : 1));
        s->n[i] = s->p[i] ? floats : 0;
    }
    return s->p[i];
}

/* Zero `before` rows ahead of and `after` rows behind `rows` rows of `ch` floats at p. */
static int zero_margins(h3_backend *be, float *p, int64_t before, int64_t rows, int64_t after, int64_t ch)
{
    int rc = be->mem->zero(be, p, sizeof(float) * (size_t)(before * ch));
    return rc ? rc : be->mem->zero(be, p + (before + rows) * ch, sizeof(float) * (size_t)(after * ch));
}

static int decode_side(runner *r, const decoder *d, slots *sl, const float *lat, int64_t T, float *pcm)
{
    const h3_avae_cfg *c = &d->cfg;
    h3_backend *be = r->be;
    const int C = c->latent_ch, D = c->latent_dim, D0 = c->decoder_dim, H = PRE_K / 2;
    int rc = 0;
    int64_t left, right, L = T;
    tconv_margins(c, 0, T, &left, &right);
    float *A = slot(be, sl, SL_TMP, T * C), *B = slot(be, sl, SL_P, (T + 2 * H) * D);
    float *U = slot(be, sl, SL_ACC, (left + T + right) * D0);
    if (!A || !B || !U) return -H3_E_NOMEM;

    /* De-normalise ([C, T] -> time-major [T, C]): latents * std + mean, two f32 roundings. */
    const h3_bt Av = f32(A, T, C, C);
    if ((rc = be->dec->channels_last(be, lat, T, 1, 0, (int)T, (int)T, 1, 1, c->latents_std, c->latents_mean, &Av)))
        return rc;
    /* dec_in_proj into the zero-margined input of conv_pre, whose output is stage 0's input. */
    if ((rc = zero_margins(be, B, H, T, H, D)) ||
        (rc = run_gemm(r, A, T, C, &d->in_proj.w, d->in_proj.bias, B + H * D, D)) ||
        (rc = tick(r, T * d->in_proj.w.rows * d->in_proj.w.cols)) || (rc = zero_margins(be, U, left, T, right, D0)) ||
        (rc = run_conv(r, &d->pre, B, T, U + left * D0, D0)))
        return rc;

    for (int i = 0; i < c->n_up; i++) {
        const int ch = stage_ch(c, i + 1);
        const int64_t lout = up_len(c, i, L);
        float *x = slot(be, sl, SL_X, lout * ch);
        if (!x) return -H3_E_NOMEM;
        if ((rc = run_tconv(r, &d->ups[i], U, left, lout, x))) return rc;
        L = lout;

        /* The stage output doubles as the next stage's zero-margined input (U is consumed). */
        int64_t nl = 0, nr = 0;
        if (i + 1 < c->n_up) tconv_margins(c, i + 1, L, &nl, &nr);
        float *acc = slot(be, sl, SL_ACC, (nl + L + nr) * ch), *tmp = slot(be, sl, SL_TMP, L * ch);
        float *P = slot(be, sl, SL_P, amp_dst_floats(c, L, ch)), *h = c->n_res > 2 ? slot(be, sl, SL_H, L * ch) : NULL;
        if (!acc || !tmp || !P || (c->n_res > 2 && !h)) return -H3_E_NOMEM;
        if ((rc = zero_margins(be, acc, nl, L, nr, ch))) return rc;
        /* Block 0 runs on the accumulator, middle blocks on h, the last one on x itself (its
           input is not needed afterwards); the sum is in diffusers' order, then divided. */
        float *acc0 = acc + nl * ch;
        for (int j = 0; j < c->n_res; j++) {
            const amp_w *b = &d->res[i * c->n_res + j];
            bool last = j == c->n_res - 1 && j > 0;
            float *cur = j == 0 ? acc0 : (last ? x : h);
            const h3_bt xv = f32(x, L, ch, ch), cv = f32(cur, L, ch, ch);
            if ((cur != x && (rc = be->ops->copy(be, &xv, &cv))) || (rc = run_amp(r, b, cur, L, ch, P, tmp)) ||
                (j > 0 && (rc = add_rows(r, acc0, cur, L, ch, last, (float)c->n_res))))
                return rc;
        }
        /* With one resblock diffusers divides by 1, which changes no value. */
        U = acc;
        left = nl;
    }

    /* activation_post -> conv_post (no bias) -> clamp, into TMP (free by now), then to the host. */
    float *P = slot(be, sl, SL_P, conv_dst_floats(L, PRE_K, 1, d->post.C)), *out = slot(be, sl, SL_TMP, L);
    if (!P || !out) return -H3_E_NOMEM;
    const h3_bt Pv = f32(P, L, (int64_t)PRE_K * d->post.C, d->post.C);
    if ((rc = run_act(r, &d->post, U, L, conv_dst(P, L, PRE_K, 1))) ||
        (rc = be->dec->conv1_clamp(be, &Pv, d->post_w, out)) ||
        (rc = be->mem->download(be, pcm, out, sizeof(float) * (size_t)L)))
        return rc;
    return tick(r, L * (int64_t)d->post.C * PRE_K);
}

/* Working memory of the decode (floats): the largest size each slot of decode_side reaches. */
static int64_t slots_floats(const h3_avae_cfg *c, int64_t T)
{
    const int64_t C = c->latent_ch, D = c->latent_dim, D0 = c->decoder_dim;
    int64_t left, right, L = T, n[SL_COUNT] = {0};
#define GROW(i, v) n[i] = (v) > n[i] ? (v) : n[i]
    tconv_margins(c, 0, T, &left, &right);
    GROW(SL_TMP, T * C);
    GROW(SL_P, (T + PRE_K - 1) * D);
    GROW(SL_ACC, (left + T + right) * D0);
    for (int i = 0; i < c->n_up; i++) {
        const int64_t ch = stage_ch(c, i + 1);
        L = up_len(c, i, L);
        int64_t nl = 0, nr = 0;
        if (i + 1 < c->n_up) tconv_margins(c, i + 1, L, &nl, &nr);
        GROW(SL_X, L * ch);
        GROW(SL_ACC, (nl + L + nr) * ch);
        GROW(SL_TMP, L * ch);
        GROW(SL_P, amp_dst_floats(c, L, (int)ch));
        if (c->n_res > 2) GROW(SL_H, L * ch);
    }
    GROW(SL_P, conv_dst_floats(L, PRE_K, 1, stage_ch(c, c->n_up)));
    GROW(SL_TMP, L);
#undef GROW
    int64_t sum = 0;
    for (int i = 0; i < SL_COUNT; i++) sum += n[i];
    return sum;
}

int64_t h3_avae_work_bytes(const h3_avae_cfg *c, int64_t frames, int64_t backend_scratch)
{
    if (h3_avae_samples(c, frames) < 0) return -H3_E_INVALID;
    /* Sides are decoded one after the other; add the backend's activation tiles. */
    return 4 * slots_floats(c, frames) + backend_scratch;
}

/* ---- entry points ----------------------------------------------------------------------- */

struct h3_avae_keep {
    decoder *d;
};

void h3_avae_keep_free(h3_avae_keep *k)
{
    if (!k) return;
    dec_free(k->d);
    free(k);
}

int h3_avae_run(h3_model *m, h3_backend *be, const float *latents, int channels, int64_t frames, float *pcm,
                int64_t pcm_cap, h3_progress_fn progress, void *user)
{
    return h3_avae_run_keep(m, be, latents, channels, frames, pcm, pcm_cap, progress, user, NULL);
}

int h3_avae_run_keep(h3_model *m, h3_backend *be, const float *latents, int channels, int64_t frames, float *pcm,
                     int64_t pcm_cap, h3_progress_fn progress, void *user, h3_avae_keep **keep)
{
    if (!latents || !pcm || !be) return h3_err(H3_E_INVALID, "audio decode: NULL latents, PCM buffer or backend");
    static const h3_op need[] = {H3_OP_channels_last, H3_OP_snake_aa, H3_OP_conv_gemm, H3_OP_conv1_clamp, H3_OP_add_div,
                                 H3_OP_copy};
    int rc = h3_backend_need(be, need, (int)(sizeof need / sizeof *need), "the audio VAE decoder");
    if (rc) return rc;
    h3_avae_cfg cfg;
    if ((rc = h3_avae_cfg_load(m, &cfg))) return rc;
    if ((rc = h3_avae_check_geometry(&cfg, m->comp[H3_COMP_AUDIO_VAE].config_path))) return rc;
    if (channels != cfg.latent_ch)
        return h3_err(H3_E_INVALID, "audio decode: latents have %d channels, the audio VAE (%s) expects %d",
                      channels, m->comp[H3_COMP_AUDIO_VAE].config_path, cfg.latent_ch);
    int64_t S = h3_avae_samples(&cfg, frames);
    if (S < 0) return (int)S;
    if (pcm_cap < 2 * S)
        return h3_err(H3_E_INVALID, "audio decode: the PCM buffer holds %lld floats, %lld frames need 2 x %lld",
                      (long long)pcm_cap, (long long)frames, (long long)S);
    /* Kept only where the weights were copied to the backend (the CPU decodes from host copies it
       would rebuild cheaply; keeping them there would only pin host memory). */
    if (keep && be->is_host) keep = NULL;
    if (keep && *keep && (*keep)->d->be != be) {
        h3_avae_keep_free(*keep);
        *keep = NULL;
    }
    decoder *d = keep && *keep ? (*keep)->d : NULL;
    if (!d && (rc = dec_load(m, be, &d))) return rc;
    if (keep && !*keep) {
        if (!(*keep = h3_calloc(1, sizeof **keep))) {
            dec_free(d);
            return -H3_E_NOMEM;
        }
        (*keep)->d = d;
    }
    runner r = {be, progress, user, 0, 2 * side_cost(d, frames), -1};
    slots sl = {{0}, {0}};
    for (int side = 0; !rc && side < 2; side++)
        rc = decode_side(&r, d, &sl, latents + (int64_t)side * channels * frames, frames, pcm + side * S);
    for (int i = 0; i < SL_COUNT; i++) be->mem->release(be, sl.p[i]);
    if (!keep) dec_free(d);
    return rc;
}
