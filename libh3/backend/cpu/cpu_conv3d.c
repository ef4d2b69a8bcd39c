/*
 * The video VAE encoder's ops on the CPU (backend.h: conv3d, group_norm).
 *
 * conv3d is im2col + the shared GEMM: a block of output voxels gets its windows gathered into
 * rows of kt*kh*kw*cin floats (zeros for the causal frames, reflected indices for the padded
 * rows and columns), and h3_linear_blocked multiplies the block by the weight. The block size
 * depends on the geometry only, never on the thread count, and h3_linear_blocked sums every row
 * the same way at any M, so the bits are the same on any number of threads.
 *
 * group_norm takes each (frame, group)'s statistics in double, in a fixed order, on one thread,
 * then normalises row by row.
 */
#include "backend/cpu/cpu_conv3d.h"
#include "backend/cpu/cpu_common.h" /* h3_cpu_backend_pool */
#include "backend/cpu/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of gathered windows per GEMM call: big enough that the GEMM's per-task packing of the
   weight is a small share of its work, small enough to stay a heap block (glibc serves it
   without a fresh mmap after the first call) next to the activations. */
#define COL_BYTES ((size_t)16 << 20)
#define COL_MIN_ROWS 96

/* torch's "reflect" padding: -1 -> 1, n -> n - 2 (the caller keeps pads below n). */
static inline int reflect(int i, int n)
{
    if (i < 0) return -i;
    if (i >= n) return 2 * (n - 1) - i;
    return i;
}

typedef struct {
    const float *x;
    const h3_bconv3d *g;
    float *col;
    int64_t m0, K;
    int Ho, Wo;
} col_job;

static void col_task(void *arg, int64_t b, int64_t e, int thread)
{
    (void)thread;
    const col_job *j = arg;
    const h3_bconv3d *g = j->g;
    const size_t row = (size_t)g->cin * sizeof(float);
    const int64_t plane = (int64_t)j->Ho * j->Wo;
    for (int64_t r = b; r < e; r++) {
        const int64_t m = j->m0 + r;
        const int to = (int)(m / plane), yo = (int)(m % plane / j->Wo), xo = (int)(m % j->Wo);
        float *dst = j->col + r * j->K;
        for (int dt = 0; dt < g->kt; dt++) {
            const int ti = to * g->st + dt - g->pad_t;
            if (ti < 0) { /* a causal zero frame */
                memset(dst, 0, row * (size_t)(g->kh * g->kw));
                dst += (int64_t)g->kh * g->kw * g->cin;
                continue;
            }
            for (int dy = 0; dy < g->kh; dy++) {
                const int yi = reflect(yo * g->sh + dy - g->pad_top, g->H);
                const float *src = j->x + ((int64_t)ti * g->H + yi) * g->W * g->cin;
                for (int dx = 0; dx < g->kw; dx++) {
                    const int xi = reflect(xo * g->sw + dx - g->pad_left, g->W);
                    memcpy(dst, src + (int64_t)xi * g->cin, row);
                    dst += g->cin;
                }
            }
        }
    }
}

int h3_cpu_conv3d(h3_backend *be, const float *x, const h3_bconv3d *g, const h3_bw *W, const float *bias, float *y)
{
    int To, Ho, Wo;
    h3_bconv3d_out(g, &To, &Ho, &Wo);
    const int64_t K = (int64_t)g->kt * g->kh * g->kw * g->cin;
    if (g->T < 1 || g->H < 1 || g->W < 1 || g->cin < 1 || g->cout < 1 || g->kt < 1 || g->kh < 1 || g->kw < 1 ||
        g->pad_t < 0 || g->pad_top < 0 || g->pad_bottom < 0 || g->pad_left < 0 || g->pad_right < 0 || To < 1 ||
        Ho < 1 || Wo < 1)
        return h3_err(H3_E_INVALID, "conv3d: impossible geometry %dx%dx%d x %d -> %d, kernel %dx%dx%d, stride "
                      "%dx%dx%d", g->T, g->H, g->W, g->cin, g->cout, g->kt, g->kh, g->kw, g->st, g->sh, g->sw);
    if (g->pad_top >= g->H || g->pad_bottom >= g->H || g->pad_left >= g->W || g->pad_right >= g->W)
        return h3_err(H3_E_INVALID, "conv3d: reflect padding %d/%d x %d/%d needs more than %dx%d pixels", g->pad_top,
                      g->pad_bottom, g->pad_left, g->pad_right, g->H, g->W);
    if (W->dtype != H3_DT_F32 && W->dtype != H3_DT_BF16 && W->dtype != H3_DT_F16)
        return h3_err(H3_E_UNSUPPORTED, "conv3d: %s weights are not supported (f32, bf16 or f16)",
                      h3_dtype_name(W->dtype));
    if (W->rows != g->cout || W->cols != K)
        return h3_err(H3_E_INVALID, "conv3d: weight is [%lld, %lld], the geometry needs [%d, %lld]",
                      (long long)W->rows, (long long)W->cols, g->cout, (long long)K);
    h3_pool *pool = h3_cpu_backend_pool(be);
    const int64_t M = (int64_t)To * Ho * Wo;
    int64_t rows = (int64_t)(COL_BYTES / sizeof(float)) / K;
    if (rows < COL_MIN_ROWS) rows = COL_MIN_ROWS;
    if (rows > M) rows = M;
    float *col = h3_alloc_aligned(sizeof(float) * (size_t)(rows * K));
    if (!col) return h3_err(H3_E_NOMEM, "conv3d: out of memory for %lld x %lld windows", (long long)rows, (long long)K);
    const h3_mat wm = {W->data, W->dtype, W->rows, W->cols};
    int rc = 0;
    for (int64_t m0 = 0; m0 < M && !rc; m0 += rows) {
        const int64_t n = M - m0 < rows ? M - m0 : rows;
        col_job j = {x, g, col, m0, K, Ho, Wo};
        h3_parallel_for(pool, n, 16, col_task, &j);
        rc = h3_linear_blocked(pool, col, n, K, &wm, bias, y + m0 * g->cout, g->cout);
    }
    h3_free_aligned(col);
    if (rc) h3_err_prefix("conv3d");
    return rc;
}

/* ---- group_norm ------------------------------------------------------------------------- */

typedef struct {
    const float *x;
    float *y;
    int64_t P;
    int C, G;
    const float *w, *b;
    double eps;
    bool silu;
    double *stat; /* [frames * G][2]: mean, 1 / sqrt(var + eps) */
} gn_job;

/* Sum over a frame's pixels and a group's channels of x (sq = false) or of (x - mean)^2
   (sq = true), in double: four pixels at a time into four partial sums (independent chains; a
   pixel's channels in order), added in a fixed order, so the same bits on any thread. */
static double group_sum(const float *x, int64_t P, int C, int cg, bool sq, double mean)
{
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t p = 0;
    for (; p + 4 <= P; p += 4) {
        const float *r0 = x + p * C, *r1 = r0 + C, *r2 = r1 + C, *r3 = r2 + C;
        if (sq)
            for (int c = 0; c < cg; c++) {
                const double d0 = r0[c] - mean, d1 = r1[c] - mean, d2 = r2[c] - mean, d3 = r3[c] - mean;
                a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
            }
        else
            for (int c = 0; c < cg; c++) a0 += r0[c], a1 += r1[c], a2 += r2[c], a3 += r3[c];
    }
    for (; p < P; p++) {
        const float *r = x + p * C;
        for (int c = 0; c < cg; c++) {
            const double d = sq ? r[c] - mean : r[c];
            a0 += sq ? d * d : d;
        }
    }
    return (a0 + a1) + (a2 + a3);
}

static void gn_stat_task(void *arg, int64_t b, int64_t e, int thread)
{
    (void)thread;
    gn_job *j = arg;
    const int cg = j->C / j->G;
    const double n = (double)j->P * cg;
    for (int64_t t = b; t < e; t++) {
        const int64_t f = t / j->G, g = t % j->G;
        const float *x = j->x + f * j->P * j->C + g * cg;
        /* Mean, then the variance around it in a second pass: no cancellation. */
        const double mean = group_sum(x, j->P, j->C, cg, false, 0.0) / n;
        const double var = group_sum(x, j->P, j->C, cg, true, mean) / n;
        j->stat[2 * t] = mean;
        j->stat[2 * t + 1] = 1.0 / sqrt(var + j->eps);
    }
}

static void gn_apply_task(void *arg, int64_t b, int64_t e, int thread)
{
    (void)thread;
    gn_job *j = arg;
    const int cg = j->C / j->G;
    for (int64_t r = b; r < e; r++) {
        const double *st = j->stat + 2 * (r / j->P) * j->G;
        const float *x = j->x + r * j->C;
        float *y = j->y + r * j->C;
        for (int c = 0; c < j->C; c++) {
            const double *s = st + 2 * (c / cg);
            float v = (float)(((double)x[c] - s[0]) * s[1] * (double)j->w[c] + (double)j->b[c]);
            y[c] = j->silu ? h3_silu(v) : v;
        }
    }
}

int h3_cpu_group_norm(h3_backend *be, const float *x, int frames, int64_t pixels, int C, int groups, const float *w,
                      const float *b, float eps, bool silu, float *y)
{
    if (frames < 1 || pixels < 1 || C < 1 || groups < 1 || C % groups)
        return h3_err(H3_E_INVALID, "group_norm: %d frames of %lld pixels, %d channels in %d groups", frames,
                      (long long)pixels, C, groups);
    if (!w || !b) return h3_err(H3_E_INVALID, "group_norm: NULL weight or bias");
    h3_pool *pool = h3_cpu_backend_pool(be);
    double *stat = h3_malloc(sizeof(double) * 2 * (size_t)frames * (size_t)groups);
    if (!stat) return -H3_E_NOMEM;
    gn_job j = {x, y, pixels, C, groups, w, b, (double)eps, silu, stat};
    h3_parallel_for(pool, (int64_t)frames * groups, 1, gn_stat_task, &j);
    h3_parallel_for(pool, (int64_t)frames * pixels, 64, gn_apply_task, &j);
    free(stat);
    return 0;
}
