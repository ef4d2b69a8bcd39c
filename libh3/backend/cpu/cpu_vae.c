/*
 * The CPU backend's VAE decoder ops (contracts in backend.h): the video decoder's channels_last,
 * unpatchify and vae_stitch, the audio decoder's snake_aa, conv_gemm and conv1_clamp. They split
 * work over output rows (or pixels) only, never over a sum, so results do not depend on the
 * thread count. The arithmetic is written as separate statements wherever torch rounds between
 * operations (products before sums, a sum before a division); builds pin -ffp-contract=off, so no
 * compiler fuses them.
 */
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_vae.h"
#include "backend/cpu/avae_kern.h"

#include <math.h>
#include <string.h>

#define SCRATCH_SLOT 3 /* per-thread rows of vae_stitch and snake_aa (h3_linear uses slot 3 of thread 0
                          only inside its own call) */
#define ACT_TILE 128   /* snake_aa output rows per scratch tile (17 KB: 16 channels at a time) */

/* Per-thread scratch of `bytes` in `slot`, taken before a parallel loop because a task cannot fail. */
static int reserve(h3_pool *p, int slot, size_t bytes)
{
    for (int t = 0; t < h3_pool_threads(p); t++)
        if (!h3_pool_scratch(p, t, slot, bytes)) return -H3_E_NOMEM;
    return 0;
}

/* ---- channels_last --------------------------------------------------------------------- */

typedef struct {
    const float *x, *scale, *shift;
    float *y;
    int64_t cs, ts, rs, ldy;
    int t_avail, ny, nx, C;
} cl_job;

static void cl_task(void *a, int64_t r0, int64_t r1, int thread)
{
    cl_job *j = a;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = r / ((int64_t)j->ny * j->nx), i = (r / j->nx) % j->ny, k = r % j->nx;
        if (t > j->t_avail - 1) t = j->t_avail - 1;
        const float *src = j->x + t * j->ts + i * j->rs + k;
        float *dst = j->y + r * j->ldy;
        for (int c = 0; c < j->C; c++) {
            float v = src[c * j->cs] * j->scale[c]; /* x * std, then + mean: two roundings, as torch */
            dst[c] = v + j->shift[c];
        }
    }
}

int h3_cpu_channels_last(h3_backend *be, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt, int t_avail,
                         int ny, int nx, const float *scale, const float *shift, const h3_bt *y)
{
    int rc = h3_cpu_need_f32("channels_last", y);
    if (rc) return rc;
    if (t_avail < 1 || nt < 0 || ny < 1 || nx < 1 || y->rows != (int64_t)nt * ny * nx)
        return h3_err(H3_E_INVALID, "cpu backend: channels_last of %d x %d x %d (%d frames present) into %lld rows",
                      nt, ny, nx, t_avail, (long long)y->rows);
    cl_job j = {x, scale, shift, y->data, cs, ts, rs, y->ld, t_avail, ny, nx, (int)y->cols};
    h3_parallel_for(h3_cpu_backend_pool(be), y->rows, 64, cl_task, &j);
    return 0;
}

/* ---- unpatchify ------------------------------------------------------------------------ */

typedef struct {
    const float *src;
    float *dst;
    const int32_t *fmap;
    int64_t tok0, lds;
    int gh, gw, C, pt, ps;
} unpatch_job;

/* Token (t, y, x) holds [C][pt][ps][ps] pixels of frames t*pt .. t*pt+pt-1; dropped frames are
   skipped. */
static void unpatch_task(void *arg, int64_t i0, int64_t i1, int thread)
{
    unpatch_job *j = arg;
    const int ps = j->ps, pt = j->pt, th = j->gh * ps, tw = j->gw * ps;
    (void)thread;
    for (int64_t i = i0; i < i1; i++) {
        int64_t tok = j->tok0 + i;
        int t = (int)(tok / ((int64_t)j->gh * j->gw)), y = (int)((tok / j->gw) % j->gh), x = (int)(tok % j->gw);
        const float *src = j->src + i * j->lds;
        for (int co = 0; co < j->C; co++)
            for (int a = 0; a < pt; a++) {
                int k = j->fmap[t * pt + a];
                if (k < 0) continue;
                const float *s = src + ((int64_t)co * pt + a) * ps * ps;
                float *dst = j->dst + (((int64_t)k * j->C + co) * th + (int64_t)y * ps) * tw + (int64_t)x * ps;
                for (int by = 0; by < ps; by++) memcpy(dst + (int64_t)by * tw, s + by * ps, sizeof(float) * (size_t)ps);
            }
    }
}

int h3_cpu_unpatchify(h3_backend *be, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt, int ps,
                      const int32_t *fmap, float *dst)
{
    int rc = h3_cpu_need_f32("unpatchify", src);
    if (rc) return rc;
    if (src->cols != (int64_t)C * pt * ps * ps)
        return h3_err(H3_E_INVALID, "cpu backend: unpatchify rows of %lld values, patches of %d", (long long)src->cols,
                      C * pt * ps * ps);
    unpatch_job j = {src->data, dst, fmap, tok0, src->ld, gh, gw, C, pt, ps};
    h3_parallel_for(h3_cpu_backend_pool(be), src->rows, 4, unpatch_task, &j);
    return 0;
}

/* ---- vae_stitch ------------------------------------------------------------------------ */

/* One finished row of `n` pixels of channel co, frame g, at canvas (y, x0): to the caller's
   buffers. */
static void emit_row(const h3_bstitch *s, int g, int y, int x0, int co, const float *v, int n)
{
    if (g >= s->frames) return; /* frames of padded latents are cut, as `_decode` does */
    int64_t H = s->H, W = s->W;
    if (s->raw && s->pixels)
        memcpy(s->pixels + (((int64_t)co * s->frames + g) * H + y) * W + x0, v, sizeof(float) * (size_t)n);
    if (s->raw && !s->rgb) return;
    /* video * pixel_std + pixel_mean, clamp(0, 1), then the processor's (x * 255).round(). */
    float sd = s->pix_std[co], mu = s->pix_mean[co];
    int64_t o = (((int64_t)g * H + y) * W + x0) * s->C + co;
    float *pf = s->pixels && !s->raw ? s->pixels + o : NULL;
    uint8_t *pu = s->rgb ? s->rgb + o : NULL;
    for (int x = 0; x < n; x++) {
        float f = v[x] * sd;
        f = f + mu;
        f = f < 0.0f ? 0.0f : (f > 1.0f ? 1.0f : f);
        if (pf) pf[(int64_t)s->C * x] = f;
        if (pu) {
            /* Round half to even like numpy's round(): for 0 <= q < 2^23, adding and removing 2^23
               leaves q rounded in the default rounding mode (no libm call per pixel). */
            float q = f * 255.0f;
            q = q + 8388608.0f;
            q = q - 8388608.0f;
            pu[(int64_t)s->C * x] = q >= 0.0f ? (uint8_t)q : 0; /* NaN -> 0 */
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

typedef struct {
    const h3_bstitch *s;
    h3_pool *pool;
} stitch_job;

static void stitch_task(void *arg, int64_t r0, int64_t r1, int thread)
{
    const stitch_job *j = arg;
    const h3_bstitch *s = j->s;
    const int oc = s->C, th = s->th, tw = s->tw, K = s->K, n = s->own_w;
    const int e_top = s->ov_top, e_left = s->ov_left, nl = e_left < n ? e_left : n, gx = s->x0;
    const bool last = s->window == s->windows - 1;
    const int64_t HW = (int64_t)s->H * s->W;
    float *v = h3_pool_scratch(j->pool, thread, SCRATCH_SLOT, 0); /* reserved by h3_cpu_vae_stitch */
    for (int64_t ry = r0; ry < r1; ry++) {
        int y = s->y0 + (int)ry;
        float p_top = e_top ? (float)ry / (float)e_top : 0.0f;
        for (int k = 0; k < K; k++)
            for (int co = 0; co < oc; co++) {
                memcpy(v, s->tile + (((int64_t)k * oc + co) * th + ry) * tw, sizeof(float) * (size_t)n);
                if (ry < e_top)
                    fade(v, s->above + ((((int64_t)s->slot_above * K + k) * oc + co) * s->max_ovy + ry) * tw, n, p_top);
                if (nl) {
                    const float *a = s->left + ((((int64_t)s->slot_left * K + k) * oc + co) * th + ry) * s->max_ovx;
                    for (int x = 0; x < nl; x++) {
                        float p = (float)x / (float)e_left;
                        float f = a[x] * (1.0f - p);
                        float t = v[x] * p;
                        v[x] = f + t;
                    }
                }
                int64_t pix = (int64_t)y * s->W + gx;
                if (k < s->keep0) {
                    if (s->window > 0 && k < s->blend_t) {
                        int o = s->keep1 - s->blend_t + k; /* _blend uses the overlap's last frames */
                        fade(v, s->carry + ((int64_t)o * oc + co) * HW + pix, n, (float)k / (float)s->blend_t);
                    }
                    emit_row(s, s->window * s->keep0 + k, y, gx, co, v, n);
                } else if (last) {
                    emit_row(s, s->windows * s->keep0 + (k - s->keep0), y, gx, co, v, n);
                } else {
                    memcpy(s->carry + ((int64_t)(k - s->keep0) * oc + co) * HW + pix, v, sizeof(float) * (size_t)n);
                }
            }
    }
}

/* Keep the strips of this tile that its right and lower neighbours blend with (original values). */
static void save_strips(const h3_bstitch *s)
{
    const int oc = s->C, th = s->th, tw = s->tw, K = s->K;
    if (s->ov_bottom) {
        const int e = s->ov_bottom;
        for (int k = 0; k < K; k++)
            for (int co = 0; co < oc; co++)
                memcpy(s->above + (((int64_t)s->slot_above * K + k) * oc + co) * s->max_ovy * tw,
                       s->tile + (((int64_t)k * oc + co) * th + th - e) * tw, sizeof(float) * (size_t)e * tw);
    }
    if (s->ov_right) {
        const int e = s->ov_right;
        for (int k = 0; k < K; k++)
            for (int co = 0; co < oc; co++)
                for (int y = 0; y < th; y++)
                    memcpy(s->left + ((((int64_t)s->slot_left * K + k) * oc + co) * th + y) * s->max_ovx,
                           s->tile + (((int64_t)k * oc + co) * th + y) * tw + tw - e, sizeof(float) * (size_t)e);
    }
}

int h3_cpu_vae_stitch(h3_backend *be, const h3_bstitch *s)
{
    h3_pool *pool = h3_cpu_backend_pool(be);
    if (s->ov_bottom > s->max_ovy || s->ov_right > s->max_ovx || s->own_w > s->tw || s->own_h > s->th ||
        (s->C != 3 && (s->rgb || (s->pixels && !s->raw))))
        return h3_err(H3_E_INVALID, "cpu backend: vae_stitch of a %dx%d tile owning %dx%d, overlaps %d/%d",
                      s->th, s->tw, s->own_h, s->own_w, s->ov_bottom, s->ov_right);
    int rc = reserve(pool, SCRATCH_SLOT, sizeof(float) * (size_t)s->tw);
    if (rc) return rc;
    stitch_job j = {s, pool};
    h3_parallel_for(pool, s->own_h, 2, stitch_task, &j);
    /* After the blend: the slots it read are this tile's to overwrite now. */
    save_strips(s);
    return 0;
}

/* ---- snake_aa ------------------------------------------------------------------------- */

typedef struct {
    const h3_avae_act *a;
    h3_pool *pool;
    const h3_avae_kernels *k;
} act_job;

static void act_task(void *arg, int64_t b, int64_t e, int thread)
{
    act_job *j = arg;
    float *z = h3_pool_scratch(j->pool, thread, SCRATCH_SLOT, 0); /* reserved by h3_cpu_snake_aa */
    for (int64_t m = b; m < e; m += ACT_TILE) j->k->act_rows(j->a, m, m + ACT_TILE < e ? m + ACT_TILE : e, z);
}

int64_t h3_cpu_snake_scratch_bytes(void) { return (int64_t)sizeof(float) * (2 * ACT_TILE + H3_AA_TAPS) * 16; }

/* Zero the margins and phase tails of a phased destination for L rows of C channels. */
static void dst_zero(const h3_bphased *d, int64_t L, int C)
{
    for (int r = 0; r < d->d; r++) {
        int64_t rows = r < L ? (L - r + d->d - 1) / d->d : 0;
        float *ph = d->p + (int64_t)r * d->phase_rows * C;
        memset(ph, 0, (size_t)(d->margin * C) * sizeof(float));
        int64_t tail = d->margin + rows;
        memset(ph + tail * C, 0, (size_t)((d->phase_rows - tail) * C) * sizeof(float));
    }
}

int h3_cpu_snake_aa(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const float *fup,
                    const float *fdown, const h3_bphased *dst)
{
    h3_pool *pool = h3_cpu_backend_pool(be);
    int rc = h3_cpu_need_f32("snake_aa", x);
    if (rc) return rc;
    const int C = (int)x->cols;
    const int64_t L = x->rows;
    if (x->ld != C || C < 1 || dst->d < 1 || dst->phase_rows < (L + dst->d - 1) / dst->d + dst->margin)
        return h3_err(H3_E_INVALID, "cpu backend: snake_aa of %lld x %d (row stride %lld) into %d phases of %lld rows",
                      (long long)L, C, (long long)x->ld, dst->d, (long long)dst->phase_rows);
    if ((rc = reserve(pool, SCRATCH_SLOT, (size_t)h3_cpu_snake_scratch_bytes()))) return rc;
    /* The kernel runs the C % 8 tail channels' SnakeBeta on flattened [rows, R] tiles, whole vectors:
       their parameters repeated to a period of lcm(R, 8). */
    const int R = C % 8;
    const int period = R == 0 ? 8 : (R % 4 == 0 ? 2 * R : (R % 2 == 0 ? 4 * R : 8 * R));
    float ta[H3_AVAE_MAX_TAIL], trb[H3_AVAE_MAX_TAIL];
    for (int i = 0; i < period; i++) {
        ta[i] = R ? a[C - R + i % R] : 0.0f;
        trb[i] = R ? rb[C - R + i % R] : 0.0f;
    }
    dst_zero(dst, L, C);
    h3_avae_act act = {x->data, L, C, a, rb, ta, trb, period, fup, fdown, *dst};
    act_job j = {&act, pool, h3_avae_kern()};
    h3_parallel_for(pool, L, ACT_TILE, act_task, &j);
    return 0;
}

/* ---- conv_gemm, conv1_clamp ------------------------------------------------------------ */

int h3_cpu_conv_gemm(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("conv_gemm", X)) || (rc = h3_cpu_need_f32("conv_gemm", Y))) return rc;
    h3_mat m = {W->data, W->dtype, W->rows, W->cols};
    return h3_linear_blocked(h3_cpu_backend_pool(be), X->data, Y->rows, X->ld, &m, bias, Y->data, Y->ld);
}

typedef struct {
    const h3_avae_kernels *k;
    const float *X, *w;
    float *y;
    int64_t ldx;
    int n;
} post_job;

static void post_task(void *arg, int64_t b, int64_t e, int thread)
{
    (void)thread;
    post_job *j = arg;
    j->k->post_rows(j->X, j->ldx, j->n, j->w, j->y, b, e);
}

int h3_cpu_conv1_clamp(h3_backend *be, const h3_bt *X, const float *w, float *y)
{
    int rc = h3_cpu_need_f32("conv1_clamp", X);
    if (rc) return rc;
    post_job j = {h3_avae_kern(), X->data, w, y, X->ld, (int)X->cols};
    h3_parallel_for(h3_cpu_backend_pool(be), X->rows, 4096, post_task, &j);
    return 0;
}
